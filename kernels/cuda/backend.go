// Package cuda is the NVIDIA GPU backend of kernels.Backend. It calls the
// CUDA driver (libcuda.so.1), cuBLAS and NVML through purego, so gorun's
// binaries stay CGO_ENABLED=0 and find the libraries at run time; its
// kernels are CUDA C (kernels.cu) compiled to PTX by `make ptx` and
// embedded, so a machine with only the NVIDIA driver runs them (the
// driver compiles the PTX for its GPU). docs/cuda.md has the design.
package cuda

import (
	_ "embed"
	"fmt"
	"math"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/kernels"
)

// The kernels as PTX for compute capability 7.0 (V100, the lab's GPU) and
// 8.0 (A100, H100: native bfloat16 conversions). `make ptx` writes them.
var (
	//go:embed ptx/kernels_sm70.ptx
	ptxSM70 []byte
	//go:embed ptx/kernels_sm80.ptx
	ptxSM80 []byte
)

// Backend runs kernels.Backend's ops on one GPU. Work is queued on one
// compute stream in op order; a second stream copies gradient buckets to
// the host (HostStaging) while the compute stream goes on. Like the CPU
// backend it is not safe for concurrent use, except that the Fences of
// CopyOutAsync may be waited on from any goroutine.
type Backend struct {
	// TF32 lets float32 GEMMs use TF32 tensor cores (about 3e-4
	// relative error instead of 1e-6): PyTorch's allow_tf32.
	TF32 bool
	// Precision is the type float32 GEMM inputs are rounded to: unset or
	// Float32 (none), F16 or BF16 (tensor cores, float32 accumulation, like
	// PyTorch's autocast for matrix products). Activations given in F16 or
	// BF16 go to the tensor cores as they are, whatever Precision says.
	Precision dtype.DType

	drv    *driver
	blas   *cublas
	dev    int32
	ctx    uintptr
	stream uintptr // compute
	copy   uintptr // device-to-host copies of gradient buckets
	module uintptr
	sms    int

	name     string
	cc       [2]int
	index    int
	settings Settings // as Open was given them (NewMonitor)
	mem      *allocator
	args     *argBlock
	l        launch
	gemmSc   *[2]float32

	// small device buffer for reductions read back by the host, and the
	// index checks' record (bounds.go)
	redBuf uintptr // redBufBytes
	redOut *reductionOut
	// DeferredScalars' buffer: the loss accumulator and the flags
	// (scalars.go); scalarsOut its host copy
	scalars    uintptr
	scalarsOut *deferredOut
	recPending bool // a kernel that checks indices ran since the last sync

	casts   castCache // 16-bit casts of the weights, kept until a write (castcache.go)
	attn    attnScratch
	colPart kernels.Tensor    // column reductions' partial sums (colOut)
	half    [2]kernels.Tensor // GEMM inputs rounded to Precision
	staging map[uintptr]*stage
	pinned  []uintptr
	prof    *profiler // GORUN_CUDA_PROFILE=1: every operation timed (profile.go)
	counts  Counts    // every operation and host wait counted (profile.go)
	// spinEvents: blocking-sync events were refused; Fences use default ones (events.go)
	spinEvents bool
}

var _ kernels.Backend = (*Backend)(nil)
var _ kernels.HostStaging = (*Backend)(nil)

// Available reports whether a usable GPU is there: the driver loads (from
// where s says), initialises and sees at least one device. Its error says
// what is missing, in one line.
func Available(s Settings) error {
	d, err := loadDriver(s)
	if err != nil {
		return err
	}
	n, err := d.deviceCount()
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("cuda: the driver sees no GPU (%s=%q)", EnvVisibleDevices, s.VisibleDevices)
	}
	return nil
}

// Open starts a backend on device index (as this process numbers them,
// after CUDA_VISIBLE_DEVICES), with the libraries and modes s gives.
func Open(index int, s Settings) (*Backend, error) {
	d, err := loadDriver(s)
	if err != nil {
		return nil, err
	}
	n, err := d.deviceCount()
	if err != nil {
		return nil, err
	}
	if index < 0 || index >= n {
		return nil, fmt.Errorf("cuda: no device %d: this process sees %d GPU(s) (%s=%q)", index, n, EnvVisibleDevices, s.VisibleDevices)
	}
	b := &Backend{drv: d, index: index, settings: s, args: newArgBlock(), gemmSc: new([2]float32), redOut: new(reductionOut),
		scalarsOut: new(deferredOut), staging: map[uintptr]*stage{}}
	var dev int32
	if err := d.check("cuDeviceGet", d.call(d.deviceGet, uintptr(unsafe.Pointer(&dev)), uintptr(index))); err != nil {
		return nil, err
	}
	b.dev = dev
	if err := d.check("cuDevicePrimaryCtxRetain", d.call(d.primaryCtxRetain, uintptr(unsafe.Pointer(&b.ctx)), uintptr(dev))); err != nil {
		return nil, err
	}
	d.ctx = b.ctx
	if err := d.check("cuCtxSetCurrent", d.call(d.ctxSetCurrent, b.ctx)); err != nil {
		return nil, err
	}
	b.name = d.deviceName(dev)
	b.cc = [2]int{d.attribute(dev, attrCCMajor), d.attribute(dev, attrCCMinor)}
	b.sms = max(d.attribute(dev, attrMultiprocessors), 1)
	for _, s := range []*uintptr{&b.stream, &b.copy} {
		if err := d.check("cuStreamCreate", d.call(d.streamCreate, uintptr(unsafe.Pointer(s)), streamNonBlocking)); err != nil {
			return nil, err
		}
	}
	if err := b.loadModule(); err != nil {
		return nil, err
	}
	b.blas, err = loadCublas(s)
	if err != nil {
		return nil, err
	}
	b.blas.drv, b.blas.ctx = d, b.ctx // every cuBLAS call runs with the context current (cublas.call)
	if err := b.blas.check("cublasCreate_v2", b.blas.call(b.blas.create, uintptr(unsafe.Pointer(&b.blas.handle)))); err != nil {
		return nil, err
	}
	if err := b.blas.check("cublasSetStream_v2", b.blas.call(b.blas.setStream, b.blas.handle, b.stream)); err != nil {
		return nil, err
	}
	if err := b.blas.check("cublasSetMathMode", b.blas.call(b.blas.setMathMode, b.blas.handle, cublasDefaultMath)); err != nil {
		return nil, err
	}
	b.mem = newAllocator(b, s.ExactAlloc)
	b.redBuf = b.mem.alloc(redBufBytes)
	b.memset(b.redBuf, redBufBytes)
	b.scalars = b.mem.alloc(scalarBytes)
	b.memset(b.scalars, scalarBytes)
	if s.Profile {
		b.prof = &profiler{d: d, stream: b.stream, sums: map[string]*OpTime{}}
	}
	return b, nil
}

// loadModule loads the embedded PTX that fits the device and resolves
// every kernel.
func (b *Backend) loadModule() error {
	_, ptx := ptxFor(b.cc)
	img := append(append([]byte(nil), ptx...), 0) // cuModuleLoadData reads a C string
	d := b.drv
	if err := d.check("cuModuleLoadData", d.call(d.moduleLoadData, uintptr(unsafe.Pointer(&b.module)), uintptr(unsafe.Pointer(&img[0])))); err != nil {
		return fmt.Errorf("%w (the driver could not compile gorun's PTX for %s, compute capability %d.%d; a driver for CUDA 11.8 or newer is needed)", err, b.name, b.cc[0], b.cc[1])
	}
	for _, kn := range allKernels() {
		name := append([]byte(kn.name), 0)
		var fn uintptr
		if err := d.check("cuModuleGetFunction "+kn.name, d.call(d.moduleGetFunction, uintptr(unsafe.Pointer(&fn)), b.module, uintptr(unsafe.Pointer(&name[0])))); err != nil {
			return err
		}
		kn.fn = fn
	}
	return nil
}

// Name implements kernels.Backend.
func (b *Backend) Name() string { return "cuda" }

// Device implements kernels.Backend.
func (b *Backend) Device() kernels.Device { return kernels.Device{Kind: kernels.CUDA, Index: b.index} }

// Describe names the GPU, for logs and reports: "NVIDIA H100 80GB HBM3
// (compute capability 9.0, 132 SMs, driver 12.4, cuBLAS 120304)".
func (b *Backend) Describe() string {
	v := b.drv.version()
	return fmt.Sprintf("%s (compute capability %d.%d, %d SMs, driver %d.%d, cuBLAS %d)", b.name, b.cc[0], b.cc[1], b.sms,
		v/1000, v%1000/10, b.blas.version())
}

// MemInfo returns the free and total device memory in bytes.
func (b *Backend) MemInfo() (free, total uint64) {
	b.drv.call(b.drv.memGetInfo, uintptr(unsafe.Pointer(&free)), uintptr(unsafe.Pointer(&total)))
	return free, total
}

// Sync implements kernels.Backend: it waits for the compute stream and
// panics with the error of a failed kernel, or with an *IndexError when a
// kernel found an index out of range (bounds.go).
func (b *Backend) Sync() {
	b.copyRecord()
	b.wait()
}

// Alloc implements kernels.Backend.
func (b *Backend) Alloc(dt dtype.DType, dims ...int) kernels.Tensor {
	if dt.Size() == 0 || dt == dtype.Uint8 {
		panic(fmt.Sprintf("cuda: Alloc of a %v tensor (want float32, float16, bfloat16 or int32)", dt))
	}
	t := kernels.Tensor{DType: dt, Rank: len(dims), Dev: b.Device()}
	copy(t.Dims[:], dims)
	n := t.Len() * dt.Size()
	t.Ptr = b.mem.alloc(n)
	b.memset(t.Ptr, n)
	return t
}

// Free implements kernels.Backend.
func (b *Backend) Free(t kernels.Tensor) {
	if t.Ptr != 0 {
		if n, ok := b.mem.size[t.Ptr]; ok && t.Ptr < b.casts.end && t.Ptr+uintptr(n) > b.casts.base {
			b.casts.drop(b)
		}
		b.mem.free(t.Ptr)
	}
}

func (b *Backend) memset(p uintptr, n int) {
	if n > 0 {
		b.begin()
		b.drv.must("cuMemsetD8Async", b.drv.call(b.drv.memsetD8Async, p, 0, uintptr(n), b.stream))
		b.end("memset")
	}
}

func (b *Backend) dev32(t kernels.Tensor, what string) uintptr {
	if t.Dev.Kind != kernels.CUDA || (t.Ptr == 0 && t.Len() > 0) {
		panic(fmt.Sprintf("cuda: %s must be a tensor on the GPU, got %v", what, t))
	}
	if t.DType != dtype.Float32 {
		panic(fmt.Sprintf("cuda: %s must be F32, got %v", what, t))
	}
	return t.Ptr
}

// devA returns the device pointer of an activation tensor: F32, F16 or
// BF16, and of the type dt (an op's activations share one type).
func (b *Backend) devA(t kernels.Tensor, dt dtype.DType, what string) uintptr {
	if t.Dev.Kind != kernels.CUDA || (t.Ptr == 0 && t.Len() > 0) {
		panic(fmt.Sprintf("cuda: %s must be a tensor on the GPU, got %v", what, t))
	}
	if t.DType != dt || (dt != dtype.Float32 && dt != dtype.Float16 && dt != dtype.BFloat16) {
		panic(fmt.Sprintf("cuda: %s must be %v (F32, F16 or BF16, the type of the op's activations), got %v", what, dt, t))
	}
	return t.Ptr
}

func (b *Backend) devI32(t kernels.Tensor, what string) uintptr {
	if t.Dev.Kind != kernels.CUDA || t.DType != dtype.Int32 || (t.Ptr == 0 && t.Len() > 0) {
		panic(fmt.Sprintf("cuda: %s must be an I32 tensor on the GPU, got %v", what, t))
	}
	return t.Ptr
}

func sameLen(a, c kernels.Tensor, op string) {
	if a.Len() != c.Len() {
		panic(fmt.Sprintf("cuda: %s: %v and %v differ in length", op, a, c))
	}
}

// Upload implements kernels.Backend. The copy is queued in order; the
// source may be reused as soon as Upload returns (the driver stages
// pageable memory before returning).
func (b *Backend) Upload(dst kernels.Tensor, src []float32) {
	p := b.dev32(dst, "Upload dst")
	b.wrote(dst)
	n := min(len(src), dst.Len())
	if n > 0 {
		b.begin()
		b.drv.must("cuMemcpyHtoDAsync", b.drv.call(b.drv.memcpyHtoDAsync, p, uintptr(unsafe.Pointer(&src[0])), uintptr(4*n), b.stream))
		b.end(opHostToDevice)
	}
}

// UploadI32 implements kernels.Backend.
func (b *Backend) UploadI32(dst kernels.Tensor, src []int32) {
	p := b.devI32(dst, "UploadI32 dst")
	n := min(len(src), dst.Len())
	if n > 0 {
		b.begin()
		b.drv.must("cuMemcpyHtoDAsync", b.drv.call(b.drv.memcpyHtoDAsync, p, uintptr(unsafe.Pointer(&src[0])), uintptr(4*n), b.stream))
		b.end(opHostToDevice)
	}
}

// Download implements kernels.Backend: it waits for the queued work.
func (b *Backend) Download(dst []float32, src kernels.Tensor) {
	p := b.dev32(src, "Download src")
	n := min(len(dst), src.Len())
	if n > 0 {
		b.begin()
		b.drv.must("cuMemcpyDtoHAsync", b.drv.call(b.drv.memcpyDtoHAsync, uintptr(unsafe.Pointer(&dst[0])), p, uintptr(4*n), b.stream))
		b.end(opDeviceToHost)
	}
	b.Sync()
}

// Copy implements kernels.Backend.
func (b *Backend) Copy(dst, src kernels.Tensor) {
	sameLen(dst, src, "Copy")
	if dst.DType != src.DType {
		panic(fmt.Sprintf("cuda: Copy %v <- %v: types differ (use Cast)", dst, src))
	}
	n := dst.Len() * dst.DType.Size()
	b.wrote(dst)
	if n > 0 && dst.Ptr != src.Ptr {
		b.begin()
		b.drv.must("cuMemcpyDtoDAsync", b.drv.call(b.drv.memcpyDtoDAsync, dst.Ptr, src.Ptr, uintptr(n), b.stream))
		b.end("copy device to device")
	}
}

// Zero implements kernels.Backend.
func (b *Backend) Zero(t kernels.Tensor) {
	b.wrote(t)
	b.memset(t.Ptr, t.Len()*t.DType.Size())
}

func typeName(dt dtype.DType) string {
	switch dt {
	case dtype.Float16:
		return "f16"
	case dtype.BFloat16:
		return "bf16"
	case dtype.Float32:
		return "f32"
	}
	panic(fmt.Sprintf("cuda: Cast of %v", dt))
}

// Cast implements kernels.Backend.
func (b *Backend) Cast(dst, src kernels.Tensor) {
	sameLen(dst, src, "Cast")
	if dst.DType == src.DType {
		b.Copy(dst, src)
		return
	}
	b.wrote(dst)
	b.kern(kCast[[2]string{typeName(src.DType), typeName(dst.DType)}]).ptr(dst.Ptr).ptr(src.Ptr).i64(dst.Len()).flat(dst.Len())
}

// Scale implements kernels.Backend.
func (b *Backend) Scale(x kernels.Tensor, s float32) {
	b.wrote(x)
	b.kern(kScale).ptr(b.dev32(x, "x")).f32(s).i64(x.Len()).flat(x.Len())
}

// Axpy implements kernels.Backend.
func (b *Backend) Axpy(y kernels.Tensor, a float32, x kernels.Tensor) {
	sameLen(y, x, "Axpy")
	b.wrote(y)
	b.kern(kAxpy).ptr(b.dev32(y, "y")).f32(a).ptr(b.dev32(x, "x")).i64(y.Len()).flat(y.Len())
}

// readReduction copies the reduction results to the host, and the index
// record with them when a kernel that checks indices ran (one copy).
func (b *Backend) readReduction() {
	n := uintptr(recordOffset)
	if b.recPending {
		n = redBufBytes
	}
	b.begin()
	b.drv.must("cuMemcpyDtoHAsync", b.drv.call(b.drv.memcpyDtoHAsync, uintptr(unsafe.Pointer(b.redOut)), b.redBuf, n, b.stream))
	b.end(opDeviceToHost)
	b.wait()
}

// HasInfNaN implements kernels.Backend.
func (b *Backend) HasInfNaN(x kernels.Tensor) bool {
	b.memset(b.redBuf, 16)
	b.kern(kInfNaN).ptr(b.redBuf).ptr(b.dev32(x, "x")).i64(x.Len()).flat(x.Len())
	b.readReduction()
	return uint32(b.redOut.sums[0]) != 0
}

// SumSquares implements kernels.Backend.
func (b *Backend) SumSquares(x kernels.Tensor) float64 {
	b.memset(b.redBuf, 16)
	b.kern(kSumSq).ptr(b.redBuf).ptr(b.dev32(x, "x")).i64(x.Len()).flat(x.Len())
	b.readReduction()
	return math.Float64frombits(b.redOut.sums[0])
}

// Gemm implements kernels.Backend.
func (b *Backend) Gemm(transA, transB bool, alpha float32, a, bt kernels.Tensor, beta float32, c kernels.Tensor) {
	g := gemmCall{transA: transA, transB: transB, a: a, b: bt, c: c, alpha: alpha, beta: beta, batch: 1}
	var ar, ac, br, bc int
	if c.Rank >= 3 {
		ar, ac, br, bc = a.Dim(-2), a.Dim(-1), bt.Dim(-2), bt.Dim(-1)
		g.m, g.n = c.Dim(-2), c.Dim(-1)
		g.batch = c.Len() / max(g.m*g.n, 1)
		// a single A or B: the same matrix for every member (stride 0)
		g.sa, g.sb, g.sc = ar*ac, br*bc, g.m*g.n
		if a.Len() == g.sa {
			g.sa = 0
		}
		if bt.Len() == g.sb {
			g.sb = 0
		}
		if (g.sa != 0 && a.Len() != g.batch*g.sa) || (g.sb != 0 && bt.Len() != g.batch*g.sb) {
			panic(fmt.Sprintf("cuda: Gemm shapes %v x %v -> %v (transA %v transB %v)", a, bt, c, transA, transB))
		}
	} else {
		ar, ac, br, bc = a.Rows(), a.Cols(), bt.Rows(), bt.Cols()
		g.m, g.n = c.Rows(), c.Cols()
	}
	g.k = ac
	if transA {
		g.k = ar
	}
	if (transA && ac != g.m) || (!transA && ar != g.m) || (transB && (br != g.n || bc != g.k)) || (!transB && (bc != g.n || br != g.k)) {
		panic(fmt.Sprintf("cuda: Gemm shapes %v x %v -> %v (transA %v transB %v)", a, bt, c, transA, transB))
	}
	if g.m == 0 || g.n == 0 || g.batch == 0 {
		return
	}
	if g.k == 0 {
		if beta == 0 {
			b.Zero(c)
		} else {
			b.Scale(c, beta)
		}
		return
	}
	g.lda, g.ldb, g.ldc = ac, bc, g.n
	b.wrote(c)
	b.gemm(&g)
}

func (b *Backend) gemm(g *gemmCall) {
	if h := b.gemmType(g); h != dtype.Float32 {
		g.a = b.rounded(0, g.a, h)
		g.b = b.rounded(1, g.b, h)
	}
	b.begin()
	if err := b.blas.run(g, b.TF32, b.gemmSc); err != nil {
		panic(err)
	}
	b.counts.GEMMs++
	if b.prof != nil {
		b.prof.end(g.op())
	}
}

// gemmType is the type a product's inputs go to cuBLAS in: that of its
// half-precision operands (activations in F16 or BF16), else Precision.
// Float32 inputs are rounded to it; the output keeps its own type.
func (b *Backend) gemmType(g *gemmCall) dtype.DType {
	h := dtype.Float32
	for _, t := range [3]kernels.Tensor{g.a, g.b, g.c} {
		switch t.DType {
		case dtype.Float32:
		case dtype.Float16, dtype.BFloat16:
			if h != dtype.Float32 && h != t.DType {
				panic(fmt.Sprintf("cuda: Gemm mixes %v and %v operands", h, t.DType))
			}
			h = t.DType
		default:
			panic(fmt.Sprintf("cuda: Gemm of %v", t))
		}
	}
	if h == dtype.Float32 && (b.Precision == dtype.Float16 || b.Precision == dtype.BFloat16) {
		h = b.Precision
	}
	return h
}

// SetMatmulPrecision implements kernels.MixedPrecision.
func (b *Backend) SetMatmulPrecision(dt dtype.DType) { b.Precision = dt }

var _ kernels.MixedPrecision = (*Backend)(nil)

// rounded casts a float32 GEMM operand into half-precision scratch slot i,
// or takes it from the cast cache (castcache.go) when it is a weight.
func (b *Backend) rounded(i int, t kernels.Tensor, p dtype.DType) kernels.Tensor {
	if t.DType != dtype.Float32 {
		return t
	}
	if h, ok := b.cached(t, p); ok {
		return h
	}
	n := t.Len()
	s := &b.half[i]
	if s.Len() < n || s.DType != p || s.Rank == 0 {
		if s.Rank > 0 {
			b.Free(*s)
		}
		*s = b.Alloc(p, n+n/4+1)
	}
	h := *s
	h.Rank, h.Dims = t.Rank, t.Dims
	b.kern(kCast[[2]string{"f32", typeName(p)}]).ptr(h.Ptr).ptr(t.Ptr).i64(n).flat(n)
	return h
}

// AddBias implements kernels.Backend.
func (b *Backend) AddBias(x, bias kernels.Tensor) {
	b.wrote(x)
	d := bias.Len()
	b.kern(kAddBias.of(x.DType)).ptr(b.devA(x, x.DType, "x")).ptr(b.dev32(bias, "bias")).i64(x.Len() / d).i32(d).flat(x.Len())
}

// BiasGrad implements kernels.Backend.
func (b *Backend) BiasGrad(dbias, dy kernels.Tensor) {
	d := dbias.Len()
	rows := dy.Len() / d
	splits, per := colSplits(rows, d)
	db := b.dev32(dbias, "dbias")
	b.wrote(dbias)
	out := b.colOut(splits, d, db)
	b.kern(kBiasGrad.of(dy.DType)).ptr(out[0]).ptr(b.devA(dy, dy.DType, "dy")).i32(rows).i32(d).i32(per).cols(d, splits)
	b.colSum(db, out[0], splits, d)
}

// colOut is where a column reduction in splits writes its outputs (one
// or two, of d columns each): dst itself with one split, else the splits'
// partial sums in the backend's scratch, which colSum then adds to dst.
func (b *Backend) colOut(splits, d int, dst ...uintptr) [2]uintptr {
	var out [2]uintptr
	if splits == 1 {
		copy(out[:], dst)
		return out
	}
	t := b.buf(&b.colPart, dtype.Float32, len(dst)*splits*d)
	for i := range dst {
		out[i] = t.Ptr + uintptr(4*i*splits*d)
	}
	return out
}

// colSum adds a column reduction's partial sums at part to dst, in split
// order (nothing to do with one split: the kernel added to dst itself).
func (b *Backend) colSum(dst, part uintptr, splits, d int) {
	if splits > 1 {
		b.kern(kColSum).ptr(dst).ptr(part).i32(splits).i32(d).flat(d)
	}
}

// BiasReLU implements kernels.Backend: gr_bias_relu_dropout with y = x
// and no dropout (one kernel for both, so that an evaluation runs the
// training step's kernels).
func (b *Backend) BiasReLU(x, bias kernels.Tensor) { b.BiasReLUDropout(x, x, bias, 0, 0) }

// BiasReLUDropout implements kernels.Backend: gr_bias_relu_dropout, one
// pass over x.
func (b *Backend) BiasReLUDropout(y, x, bias kernels.Tensor, p float32, seed uint64) {
	sameLen(y, x, "BiasReLUDropout")
	b.wrote(y, x)
	d := bias.Len()
	dt := x.DType
	th, sc := dropArgs(p)
	b.kern(kBiasReLUDropout.of(dt)).ptr(b.devA(y, dt, "y")).ptr(b.devA(x, dt, "x")).ptr(b.dev32(bias, "bias")).
		i64(x.Len() / d).i32(d).u64(seed).u32(th).f32(sc).flat(x.Len())
}

// ReLUBackward implements kernels.Backend.
func (b *Backend) ReLUBackward(dx, y kernels.Tensor) {
	sameLen(dx, y, "ReLUBackward")
	b.wrote(dx)
	b.kern(kReLUBwd.of(dx.DType)).ptr(b.devA(dx, dx.DType, "dx")).ptr(b.devA(y, dx.DType, "y")).i64(dx.Len()).flat(dx.Len())
}

// LayerNorm implements kernels.Backend.
func (b *Backend) LayerNorm(y, mean, rstd, x, gamma, beta kernels.Tensor, eps float32) {
	b.wrote(y, mean, rstd)
	d := gamma.Len()
	rows := x.Len() / d
	dt := x.DType
	b.kern(kLayerNorm.of(dt)).ptr(b.devA(y, dt, "y")).ptr(b.dev32(mean, "mean")).ptr(b.dev32(rstd, "rstd")).ptr(b.devA(x, dt, "x")).
		ptr(b.dev32(gamma, "gamma")).ptr(b.dev32(beta, "beta")).i32(rows).i32(d).f32(eps).rows(rows, d)
}

// LayerNormBackward implements kernels.Backend.
func (b *Backend) LayerNormBackward(dx, dgamma, dbeta, dy, x, mean, rstd, gamma kernels.Tensor) {
	b.wrote(dx, dgamma, dbeta)
	d := gamma.Len()
	rows := x.Len() / d
	dt := x.DType
	b.kern(kLayerNormBwd.of(dt)).ptr(b.devA(dx, dt, "dx")).ptr(b.devA(dy, dt, "dy")).ptr(b.devA(x, dt, "x")).ptr(b.dev32(mean, "mean")).
		ptr(b.dev32(rstd, "rstd")).ptr(b.dev32(gamma, "gamma")).i32(rows).i32(d).rows(rows, d)
	splits, per := colSplits(rows, d)
	g, bt := b.dev32(dgamma, "dgamma"), b.dev32(dbeta, "dbeta")
	out := b.colOut(splits, d, g, bt)
	b.kern(kLayerNormParams.of(dt)).ptr(out[0]).ptr(out[1]).ptr(dy.Ptr).ptr(x.Ptr).
		ptr(mean.Ptr).ptr(rstd.Ptr).i32(rows).i32(d).i32(per).cols(d, splits)
	b.colSum(g, out[0], splits, d)
	b.colSum(bt, out[1], splits, d)
}

// dropThresh and dropScale are the CPU backend's: an element is kept when
// its 16 random bits are >= round(p*65536) (kept as a uint16, as there),
// and scaled by 1/(1-p) computed in float32.
func dropThresh(p float32) uint32 { return uint32(uint16(math.Round(float64(p) * 65536))) }
func dropScale(p float32) float32 { return 1 / (1 - p) }

// dropArgs are the kernels' threshold and scale for dropout p (p <= 0:
// every element kept, times 1).
func dropArgs(p float32) (uint32, float32) {
	if p > 0 {
		return dropThresh(p), dropScale(p)
	}
	return 0, 1
}

// dropout queues y = res + dropout(x) on activations of type dt; res 0
// means none.
func (b *Backend) dropout(dt dtype.DType, y, res, x uintptr, n int, p float32, seed uint64) {
	th, sc := dropArgs(p)
	b.kern(kDropout.of(dt)).ptr(y).ptr(res).ptr(x).i64(n).u64(seed).u32(th).f32(sc).flat(n)
}

// Dropout implements kernels.Backend.
func (b *Backend) Dropout(y, x kernels.Tensor, p float32, seed uint64) {
	sameLen(y, x, "Dropout")
	b.wrote(y)
	if p <= 0 {
		b.Copy(y, x)
		return
	}
	b.dropout(x.DType, b.devA(y, x.DType, "y"), 0, b.devA(x, x.DType, "x"), y.Len(), p, seed)
}

// DropoutBackward implements kernels.Backend.
func (b *Backend) DropoutBackward(dx, dy kernels.Tensor, p float32, seed uint64) {
	b.Dropout(dx, dy, p, seed)
}

// ResidualDropout implements kernels.Backend.
func (b *Backend) ResidualDropout(out, res, y kernels.Tensor, p float32, seed uint64) {
	sameLen(out, y, "ResidualDropout")
	sameLen(res, y, "ResidualDropout")
	b.wrote(out)
	dt := y.DType
	b.dropout(dt, b.devA(out, dt, "out"), b.devA(res, dt, "res"), b.devA(y, dt, "y"), y.Len(), p, seed)
}

// ResidualDropoutLayerNorm implements kernels.Backend:
// gr_residual_dropout_layernorm, one block a row.
func (b *Backend) ResidualDropoutLayerNorm(out, y, mean, rstd, res, x, gamma, beta kernels.Tensor, p float32, seed uint64, eps float32) {
	sameLen(out, x, "ResidualDropoutLayerNorm")
	sameLen(y, x, "ResidualDropoutLayerNorm")
	b.wrote(out, y, mean, rstd)
	dt := x.DType
	var r uintptr
	if res.Len() > 0 {
		sameLen(res, x, "ResidualDropoutLayerNorm")
		r = b.devA(res, dt, "res")
	}
	d := gamma.Len()
	rows := x.Len() / d
	th, sc := dropArgs(p)
	b.kern(kResidualDropoutLN.of(dt)).ptr(b.devA(out, dt, "out")).ptr(b.devA(y, dt, "y")).ptr(b.dev32(mean, "mean")).
		ptr(b.dev32(rstd, "rstd")).ptr(r).ptr(b.devA(x, dt, "x")).ptr(b.dev32(gamma, "gamma")).ptr(b.dev32(beta, "beta")).
		i32(rows).i32(d).u64(seed).u32(th).f32(sc).f32(eps).rows(rows, d)
}

// Embedding implements kernels.Backend. An id outside the vocabulary
// gives a zero row and is reported at the next sync (bounds.go).
func (b *Backend) Embedding(out, table, ids kernels.Tensor, scale float32, padID int32) {
	b.wrote(out)
	d := table.Cols()
	n := ids.Len()
	b.kern(kEmbedding.of(out.DType)).ptr(b.devA(out, out.DType, "out")).ptr(b.dev32(table, "table")).ptr(b.devI32(ids, "ids")).
		i32(n).i32(d).i32(table.Rows()).f32(scale).i32(int(padID)).ptr(b.indexRecord()).flat(n * d)
}

// EmbeddingBackward implements kernels.Backend. Rows of repeated ids are
// summed with atomic adds, so their order (and last bits) may vary. An id
// outside the vocabulary is skipped and reported at the next sync.
func (b *Backend) EmbeddingBackward(dtable, dout, ids kernels.Tensor, scale float32, padID int32) {
	b.wrote(dtable)
	d := dtable.Cols()
	n := ids.Len()
	b.kern(kEmbeddingBwd.of(dout.DType)).ptr(b.dev32(dtable, "dtable")).ptr(b.devA(dout, dout.DType, "dout")).ptr(b.devI32(ids, "ids")).
		i32(n).i32(d).i32(dtable.Rows()).f32(scale).i32(int(padID)).ptr(b.indexRecord()).flat(n * d)
}

// AddPositional implements kernels.Backend.
func (b *Backend) AddPositional(x, pe kernels.Tensor, t0 int) {
	b.wrote(x)
	T, d := x.Dim(-2), x.Dim(-1)
	rows := x.Len() / d
	if t0+T > pe.Dims[0] {
		panic(fmt.Sprintf("cuda: AddPositional positions %d..%d of a table of %d", t0, t0+T, pe.Dims[0]))
	}
	b.kern(kAddPos.of(x.DType)).ptr(b.devA(x, x.DType, "x")).ptr(b.dev32(pe, "pe")).i64(rows).i32(T).i32(d).i32(t0).flat(x.Len())
}

// LogSoftmax implements kernels.Backend.
func (b *Backend) LogSoftmax(out, x kernels.Tensor) {
	sameLen(out, x, "LogSoftmax")
	b.wrote(out)
	V := x.Cols()
	N := x.Len() / V
	b.kern(kLogSoftmax.of(x.DType)).ptr(b.devA(out, x.DType, "out")).ptr(b.devA(x, x.DType, "x")).i32(N).i32(V).rows(N, V)
}

// CrossEntropy implements kernels.Backend. It waits for the GPU to read
// back the loss; a target outside the vocabulary does not count (its row
// of dlogits is zeroed) and panics here with an *IndexError.
// CrossEntropySum (scalars.go) is the form without the wait.
func (b *Backend) CrossEntropy(dlogits, logits, targets kernels.Tensor, ls float32, padID int32, gradScale float32) (float64, int) {
	b.memset(b.redBuf, 16)
	b.xent(dlogits, logits, targets, ls, padID, gradScale, b.redBuf)
	b.readReduction()
	return math.Float64frombits(b.redOut.sums[0]), int(math.Float64frombits(b.redOut.sums[1]))
}

// xent queues gr_xent adding the loss sum and the count to acc (double[2]).
func (b *Backend) xent(dlogits, logits, targets kernels.Tensor, ls float32, padID int32, gradScale float32, acc uintptr) {
	V := logits.Cols()
	N := logits.Rows()
	if targets.Len() != N {
		panic(fmt.Sprintf("cuda: CrossEntropy: %d targets for logits %v", targets.Len(), logits))
	}
	var dl uintptr
	b.wrote(dlogits)
	if dlogits.Len() > 0 {
		sameLen(dlogits, logits, "CrossEntropy")
		dl = b.devA(dlogits, logits.DType, "dlogits")
	}
	b.kern(kXent.of(logits.DType)).ptr(dl).ptr(b.devA(logits, logits.DType, "logits")).ptr(b.devI32(targets, "targets")).ptr(acc).
		i32(N).i32(V).f32(ls).i32(int(padID)).f32(gradScale).ptr(b.indexRecord()).rows(N, V)
}

// Adam implements kernels.Backend.
func (b *Backend) Adam(p, g, m, v kernels.Tensor, a kernels.AdamArgs) {
	sameLen(p, g, "Adam")
	sameLen(p, m, "Adam")
	sameLen(p, v, "Adam")
	b.wrote(p, m, v)
	b.kern(kAdam).ptr(b.dev32(p, "p")).ptr(b.dev32(g, "g")).ptr(b.dev32(m, "m")).ptr(b.dev32(v, "v")).i64(p.Len()).
		f32(a.LR).f32(a.Beta1).f32(a.Beta2).f32(a.Eps).ptr(b.skipFlag(a)).flat(p.Len())
}

// AdamRows implements kernels.Backend.
func (b *Backend) AdamRows(p, g, m, v, rows kernels.Tensor, a kernels.AdamArgs) {
	sameLen(p, g, "AdamRows")
	sameLen(p, m, "AdamRows")
	sameLen(p, v, "AdamRows")
	b.wrote(p, m, v)
	d := p.Cols()
	n := rows.Len()
	b.kern(kAdamRows).ptr(b.dev32(p, "p")).ptr(b.dev32(g, "g")).ptr(b.dev32(m, "m")).ptr(b.dev32(v, "v")).
		ptr(b.devI32(rows, "rows")).i32(n).i32(d).i32(p.Rows()).f32(a.LR).f32(a.Beta1).f32(a.Beta2).f32(a.Eps).
		ptr(b.indexRecord()).ptr(b.skipFlag(a)).flat(n * d)
}

// GatherRows implements kernels.Backend.
func (b *Backend) GatherRows(dst, src, idx kernels.Tensor, cols int) {
	rl := src.Len() / src.Dims[0]
	dl := dst.Len() / dst.Dims[0]
	n := idx.Len()
	b.wrote(dst)
	if cols > rl || cols > dl || n > dst.Dims[0] {
		panic(fmt.Sprintf("cuda: GatherRows %v <- %v cols %d", dst, src, cols))
	}
	b.kern(kGatherRows.of(src.DType)).ptr(b.devA(dst, src.DType, "dst")).ptr(b.devA(src, src.DType, "src")).ptr(b.devI32(idx, "idx")).
		i32(n).i32(cols).i64(rl).i64(dl).i32(src.Dims[0]).ptr(b.indexRecord()).flat(n * cols)
}

// WriteStep implements kernels.Backend.
func (b *Backend) WriteStep(cache, x kernels.Tensor, t int) {
	R, Tc, D := cache.Dims[0], cache.Dims[1], cache.Dims[2]
	b.wrote(cache)
	if t < 0 || t >= Tc || x.Len() != R*D {
		panic(fmt.Sprintf("cuda: WriteStep %v <- %v at %d", cache, x, t))
	}
	b.kern(kWriteStep.of(x.DType)).ptr(b.devA(cache, x.DType, "cache")).ptr(b.devA(x, x.DType, "x")).i32(R).i32(Tc).i32(D).i32(t).flat(R * D)
}

// callRet calls a C function and returns its first result (pointer
// arguments as in driver.call).
//
//go:uintptrescapes
func callRet(fn uintptr, args ...uintptr) uintptr {
	r, _, _ := purego.SyscallN(fn, args...)
	return r
}

// VisibleIndex is the device a rank uses when it sees several: its local
// rank modulo their number (Horovod's torch.cuda.set_device(local_rank)),
// so ranks that outnumber the GPUs share them. gorun usually leaves each
// rank one GPU through CUDA_VISIBLE_DEVICES; then this is 0.
func VisibleIndex(localRank, count int) int {
	if count <= 0 {
		return 0
	}
	return localRank % count
}

// Count is the number of GPUs this process sees (the driver loaded from
// where s says).
func Count(s Settings) (int, error) {
	d, err := loadDriver(s)
	if err != nil {
		return 0, err
	}
	return d.deviceCount()
}

// Orthonormalize implements kernels.Backend: gr_orthonormalize_f32, one
// block per matrix of the batch.
func (b *Backend) Orthonormalize(p kernels.Tensor, eps float32) {
	if p.Rank < 2 {
		panic(fmt.Sprintf("cuda: Orthonormalize: p must be [rows, cols] or [n, rows, cols], got %v", p))
	}
	rows, cols := p.Dim(-2), p.Dim(-1)
	if cols > kernels.OrthoMaxCols {
		panic(fmt.Sprintf("cuda: Orthonormalize: %v has %d columns, at most %d allowed", p, cols, kernels.OrthoMaxCols))
	}
	if rows*cols == 0 {
		return
	}
	b.wrote(p)
	b.kern(kOrtho).ptr(b.dev32(p, "p")).i32(rows).i32(cols).f32(eps).grid(p.Len()/(rows*cols), 1, orthoThreads(rows), 1)
}

// orthoThreads is gr_orthonormalize_f32's block size for matrices of
// rows rows: a thread per row up to 1024 (a multiple of 32). It depends on
// the shape alone, and so do the kernel's sums and its result.
func orthoThreads(rows int) int {
	return min(1024, max(32, (rows+31)/32*32))
}
