package cuda

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/gorun/gorun/dtype"
)

// ptype is the type of one kernel parameter, as the PTX declares it.
type ptype uint8

const (
	pPtr ptype = iota // device pointer: .u64
	pI32              // int: .u32
	pI64              // long long: .u64
	pU32              // unsigned: .u32
	pU64              // unsigned long long: .u64
	pF32              // float: .f32
)

func (p ptype) String() string {
	return [...]string{"ptr", "i32", "i64", "u32", "u64", "f32"}[p]
}

// kernel is one __global__ function of kernels.cu: its name, parameter
// types, and its handle once the module is loaded.
type kernel struct {
	name   string
	params []ptype
	fn     uintptr
}

func k(name string, params ...ptype) *kernel { return &kernel{name: name, params: params} }

// The kernels of kernels.cu (docs/cuda.md, "Kernel ABI"). A test checks
// every entry against the embedded PTX: same name, same parameter types.
var (
	kScale    = k("gr_scale_f32", pPtr, pF32, pI64)
	kAxpy     = k("gr_axpy_f32", pPtr, pF32, pPtr, pI64)
	kInfNaN   = k("gr_infnan_f32", pPtr, pPtr, pI64)
	kSumSq    = k("gr_sumsq_f32", pPtr, pPtr, pI64)
	kAdam     = k("gr_adam_f32", pPtr, pPtr, pPtr, pPtr, pI64, pF32, pF32, pF32, pF32, pPtr)
	kAdamRows = k("gr_adam_rows_f32", pPtr, pPtr, pPtr, pPtr, pPtr, pI32, pI32, pI32, pF32, pF32, pF32, pF32, pPtr, pPtr)
	kColSum   = k("gr_col_sum_f32", pPtr, pPtr, pI32, pI32)
	kOrtho    = k("gr_orthonormalize_f32", pPtr, pI32, pI32, pF32)
	kCast     = map[[2]string]*kernel{}

	kAddBias           = ak("gr_add_bias", pPtr, pPtr, pI64, pI32)
	kBiasReLUDropout   = ak("gr_bias_relu_dropout", pPtr, pPtr, pPtr, pI64, pI32, pU64, pU32, pF32)
	kReLUBwd           = ak("gr_relu_bwd", pPtr, pPtr, pI64)
	kBiasGrad          = ak("gr_bias_grad", pPtr, pPtr, pI32, pI32, pI32)
	kLayerNorm         = ak("gr_layernorm", pPtr, pPtr, pPtr, pPtr, pPtr, pPtr, pI32, pI32, pF32)
	kLayerNormBwd      = ak("gr_layernorm_bwd", pPtr, pPtr, pPtr, pPtr, pPtr, pPtr, pI32, pI32)
	kLayerNormParams   = ak("gr_layernorm_bwd_params", pPtr, pPtr, pPtr, pPtr, pPtr, pPtr, pI32, pI32, pI32)
	kDropout           = ak("gr_dropout", pPtr, pPtr, pPtr, pI64, pU64, pU32, pF32)
	kResidualDropoutLN = ak("gr_residual_dropout_layernorm", pPtr, pPtr, pPtr, pPtr, pPtr, pPtr, pPtr, pPtr, pI32, pI32,
		pU64, pU32, pF32, pF32)
	kEmbedding      = ak("gr_embedding", pPtr, pPtr, pPtr, pI32, pI32, pI32, pF32, pI32, pPtr)
	kEmbeddingBwd   = ak("gr_embedding_bwd", pPtr, pPtr, pPtr, pI32, pI32, pI32, pF32, pI32, pPtr)
	kAddPos         = ak("gr_add_pos", pPtr, pPtr, pI64, pI32, pI32, pI32)
	kSplitHeads     = ak("gr_split_heads", pPtr, pPtr, pI32, pI32, pI32, pI32, pI32)
	kMergeHeads     = ak("gr_merge_heads", pPtr, pPtr, pI32, pI32, pI32, pI32, pI32)
	kAttnSoftmax    = ak("gr_attn_softmax", pPtr, pPtr, pI32, pI32, pI32, pI32, pI32)
	kAttnSoftmaxBwd = ak("gr_attn_softmax_bwd", pPtr, pPtr, pI32, pI32)
	kXent           = ak("gr_xent", pPtr, pPtr, pPtr, pPtr, pI32, pI32, pF32, pI32, pF32, pPtr)
	kLogSoftmax     = ak("gr_log_softmax", pPtr, pPtr, pI32, pI32)
	kGatherRows     = ak("gr_gather_rows", pPtr, pPtr, pPtr, pI32, pI32, pI64, pI64, pI32, pPtr)
	kWriteStep      = ak("gr_write_step", pPtr, pPtr, pI32, pI32, pI32, pI32)
)

// halfNames are the storage types of Cast and of activations, as the
// kernels name them; index i of an actKernel is halfNames[i].
var halfNames = []string{"f32", "f16", "bf16"}

// actKernel is a kernel over activations in its three instances, one per
// activation type: gr_<op>_f32, gr_<op>_f16 and gr_<op>_bf16.
type actKernel [3]*kernel

var actKernels []*actKernel

func ak(op string, params ...ptype) *actKernel {
	var a actKernel
	for i, s := range halfNames {
		a[i] = k(op+"_"+s, params...)
	}
	actKernels = append(actKernels, &a)
	return &a
}

// of is the instance for activations of type dt.
func (a *actKernel) of(dt dtype.DType) *kernel {
	switch dt {
	case dtype.Float32:
		return a[0]
	case dtype.Float16:
		return a[1]
	case dtype.BFloat16:
		return a[2]
	}
	panic(fmt.Sprintf("cuda: %s: activations of type %v", a[0].name, dt))
}

func init() {
	for _, s := range halfNames {
		for _, d := range halfNames {
			if s != d {
				kCast[[2]string{s, d}] = k("gr_cast_"+s+"_"+d, pPtr, pPtr, pI64)
			}
		}
	}
}

// allKernels lists every kernel, for loading and for the ABI test.
func allKernels() []*kernel {
	ks := []*kernel{kScale, kAxpy, kInfNaN, kSumSq, kAdam, kAdamRows, kColSum, kOrtho}
	for _, a := range actKernels {
		ks = append(ks, a[:]...)
	}
	for _, s := range halfNames {
		for _, d := range halfNames {
			if s != d {
				ks = append(ks, kCast[[2]string{s, d}])
			}
		}
	}
	return ks
}

// maxParams bounds a kernel's parameter count.
const maxParams = 16

// argBlock is the parameter block of a launch: cuLaunchKernel reads
// kernelParams[i], a pointer to parameter i's value. It lives on the Go
// heap, which does not move, for the backend's lifetime; the driver copies
// the values at launch, so one block serves every launch.
type argBlock struct {
	vals [maxParams]uint64
	ptrs [maxParams]uintptr
}

func newArgBlock() *argBlock {
	a := &argBlock{}
	for i := range a.ptrs {
		a.ptrs[i] = uintptr(unsafe.Pointer(&a.vals[i]))
	}
	return a
}

// launch builds one kernel launch; its methods append parameters in order
// and panic if a type differs from the kernel's declaration (a Go-side bug
// the conformance tests would otherwise find only on a GPU).
type launch struct {
	be *Backend
	k  *kernel
	n  int
}

func (b *Backend) kern(k *kernel) *launch {
	b.l = launch{be: b, k: k}
	return &b.l
}

func (l *launch) put(t ptype, v uint64) *launch {
	if l.n >= len(l.k.params) || l.k.params[l.n] != t {
		panic(fmt.Sprintf("cuda: %s parameter %d given as %s, declared %v", l.k.name, l.n, t, l.k.params))
	}
	l.be.args.vals[l.n] = v
	l.n++
	return l
}

func (l *launch) ptr(p uintptr) *launch { return l.put(pPtr, uint64(p)) }
func (l *launch) i32(v int) *launch {
	if v < math.MinInt32 || v > math.MaxInt32 {
		panic(fmt.Sprintf("cuda: %s parameter %d = %d does not fit an int", l.k.name, l.n, v))
	}
	return l.put(pI32, uint64(uint32(int32(v))))
}
func (l *launch) i64(v int) *launch     { return l.put(pI64, uint64(int64(v))) }
func (l *launch) u32(v uint32) *launch  { return l.put(pU32, uint64(v)) }
func (l *launch) u64(v uint64) *launch  { return l.put(pU64, v) }
func (l *launch) f32(v float32) *launch { return l.put(pF32, uint64(math.Float32bits(v))) }

// grid launches on the compute stream with a grid of (gx, gy) blocks of
// (bx, by) threads.
func (l *launch) grid(gx, gy, bx, by int) {
	if l.n != len(l.k.params) {
		panic(fmt.Sprintf("cuda: %s launched with %d of its %d parameters", l.k.name, l.n, len(l.k.params)))
	}
	if gx <= 0 || gy <= 0 {
		return // nothing to do
	}
	checkBlock(l.k, bx*by)
	b := l.be
	b.begin()
	b.drv.must("cuLaunchKernel "+l.k.name, b.drv.call(b.drv.launchKernel, l.k.fn, uintptr(gx), uintptr(gy), 1,
		uintptr(bx), uintptr(by), 1, 0, b.stream, uintptr(unsafe.Pointer(&b.args.ptrs[0])), 0))
	b.end(l.k.name)
}

// flat launches over n elements with a grid-stride loop: flatThreads
// (256) threads per block and at most 32 blocks per multiprocessor.
func (l *launch) flat(n int) {
	const block = flatThreads
	g := (n + block - 1) / block
	if mx := 32 * l.be.sms; g > mx {
		g = mx
	}
	l.grid(g, 1, block, 1)
}

// rows launches one block per row of cols elements, the block sized to
// the row (rowThreads): a warp for short rows, up to rowMaxThreads (512)
// for long ones.
func (l *launch) rows(rows, cols int) { l.grid(rows, 1, rowThreads(cols), 1) }

// cols launches a column reduction over d columns in splits of the rows
// (colSplits): blocks of 32x32.
func (l *launch) cols(d, splits int) { l.grid((d+31)/32, splits, 32, 32) }

// Column reductions split their rows so that a reduction over few columns
// still starts enough blocks: about colTargetBlocks in all (a few per
// multiprocessor of the largest GPUs), none with fewer than colMinRows
// rows (8 per thread), at most colMaxSplits.
const (
	colTargetBlocks = 512
	colMinRows      = 256
	colMaxSplits    = 64
)

// colSplits is how many splits of its rows a column reduction over rows x
// d runs in, and the rows of each: a function of the shape alone, so the
// partial sums, and the result, are the same on every GPU.
func colSplits(rows, d int) (splits, per int) {
	blocks := (d + 31) / 32
	splits = max(1, min(rows/colMinRows, (colTargetBlocks+blocks-1)/blocks, colMaxSplits))
	per = (rows + splits - 1) / splits
	if per > 0 {
		splits = (rows + per - 1) / per // no split left empty
	}
	return splits, per
}
