package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/half"
	"github.com/gorun/gorun/internal/cudaemu"
	"github.com/gorun/gorun/kernels"
	"github.com/gorun/gorun/kernels/cpu"
	"github.com/gorun/gorun/kernels/kerneltest"
	"github.com/gorun/gorun/transformer"
)

// The tests run on a real GPU when this machine has one (/dev/nvidia0),
// else on the CPU emulator of the driver, cuBLAS and NVML in
// internal/cudaemu, which runs kernels.cu compiled by g++: the Go side, the
// kernels' logic and their ABI are then checked everywhere, the GPU's own
// behaviour (timing, memory spaces, concurrency) only on a GPU.
// GORUN_CUDA_TEST_DEVICE=gpu or emu forces one (bench/gpu/run.sh: gpu).
const envTestDevice = "GORUN_CUDA_TEST_DEVICE"

var (
	testMode  string // "gpu" or "emu"
	setupErr  error
	beOnce    sync.Once
	testBE    *Backend
	testBEErr error
)

func TestMain(m *testing.M) {
	testMode = os.Getenv(envTestDevice)
	if testMode == "" {
		testMode = "emu"
		if _, err := os.Stat("/dev/nvidia0"); err == nil {
			testMode = "gpu"
		}
	}
	var dir string
	// TestConformanceASan's child has its emulator; TestFindsCublas's its
	// libraries laid out (libSearchChild); bench/gpu/run.sh's dry run
	// gives the emulator it built (emuGiven)
	if testMode == "emu" && os.Getenv(envASanChild) == "" && !libSearchChild() && !emuGiven() {
		var err error
		dir, err = os.MkdirTemp("", "gorun-cuda-emu")
		if err == nil {
			err = cudaemu.Build(dir, "kernels.cu")
		}
		if err != nil {
			setupErr = fmt.Errorf("building the CUDA emulator: %w", err)
		} else {
			os.Setenv(EnvLibDir, dir)
		}
	}
	code := m.Run()
	if dir != "" {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}

// envSettings is the Settings this test binary's environment asks for, as
// internal/envconf.CUDA reads them for a program (it imports this package,
// so these tests cannot call it): the emulator TestMain built or was
// given, the libraries TestFindsCublas's children lay out, the modes the
// ASan child and bench/gpu/run.sh set.
func envSettings() Settings {
	return Settings{LibDir: os.Getenv(EnvLibDir), CUDAHome: os.Getenv("CUDA_HOME"), CUDAPath: os.Getenv("CUDA_PATH"),
		VirtualEnv: os.Getenv("VIRTUAL_ENV"), CondaPrefix: os.Getenv("CONDA_PREFIX"), PythonPath: os.Getenv("PYTHONPATH"),
		VisibleDevices: os.Getenv(EnvVisibleDevices), ExactAlloc: os.Getenv(EnvExactAlloc) == "1", Profile: os.Getenv(EnvProfile) == "1"}
}

// profiled is envSettings with the profiler on.
func profiled() Settings {
	s := envSettings()
	s.Profile = true
	return s
}

// backend opens the device once for the whole test binary.
func backend(t *testing.T) *Backend {
	t.Helper()
	if setupErr != nil {
		t.Fatal(setupErr)
	}
	beOnce.Do(func() {
		testBE, testBEErr = Open(testIndex(), envSettings())
		if testBEErr == nil {
			fmt.Fprintf(os.Stderr, "cuda tests on %s: %s\n", testMode, testBE.Describe())
		}
	})
	if testBEErr != nil {
		t.Fatalf("%s: %v", testMode, testBEErr)
	}
	return testBE
}

// TestConformance runs the op table every backend passes, against float64
// references.
func TestConformance(t *testing.T) {
	be := backend(t)
	kerneltest.Run(t, be, kerneltest.FP32())
	t.Run("fp16", func(t *testing.T) { kerneltest.Run(t, be, kerneltest.FP16()) })
	t.Run("bf16", func(t *testing.T) { kerneltest.Run(t, be, kerneltest.BF16()) })
	if testMode == "gpu" {
		be.TF32 = true
		defer func() { be.TF32 = false }()
		t.Run("tf32", func(t *testing.T) { kerneltest.Run(t, be, kerneltest.TF32()) })
	}
}

// TestDeviceName says which device the tests ran on.
func TestDeviceName(t *testing.T) {
	be := backend(t)
	emulated := strings.Contains(be.Describe(), "emulator")
	if emulated != (testMode == "emu") {
		t.Fatalf("mode %s but the device is %q", testMode, be.Describe())
	}
	t.Logf("%s", be.Describe())
}

// TestHostStagingRoundTrip sends a gradient to pinned host memory in each
// wire format and back, as the Bucketer does, with the copy stream and
// events in between.
func TestHostStagingRoundTrip(t *testing.T) {
	be := backend(t)
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 1000, 70001} {
		host := make([]float32, n)
		for i := range host {
			host[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(9)-4)))
		}
		host[0] = float32(math.Inf(1))
		g := be.Alloc(dtype.Float32, n)
		be.Upload(g, host)
		for _, wire := range []dtype.DType{dtype.Float32, dtype.Float16, dtype.BFloat16} {
			pin := be.PinnedHost(n * wire.Size())
			for round := 0; round < 2; round++ { // the second reuses the stage
				f := be.CopyOutAsync(pin, g, wire)
				if err := f.Wait(); err != nil {
					t.Fatal(err)
				}
				for i := 0; i < n; i++ {
					var want, got float32
					switch wire {
					case dtype.Float32:
						want, got = host[i], math.Float32frombits(le32(pin[4*i:]))
					case dtype.Float16:
						want, got = half.F16ToF32(half.F32ToF16(host[i])), half.F16ToF32(le16(pin[2*i:]))
					case dtype.BFloat16:
						want, got = half.BF16ToF32(half.F32ToBF16(host[i])), half.BF16ToF32(le16(pin[2*i:]))
					}
					if math.Float32bits(want) != math.Float32bits(got) {
						t.Fatalf("n %d %v: host[%d] = %v, want %v", n, wire, i, got, want)
					}
				}
				back := be.Alloc(dtype.Float32, n)
				be.CopyIn(back, pin, wire)
				out := make([]float32, n)
				be.Download(out, back)
				be.Free(back)
				for i := range out {
					var want float32
					switch wire {
					case dtype.Float32:
						want = host[i]
					case dtype.Float16:
						want = half.F16ToF32(half.F32ToF16(host[i]))
					case dtype.BFloat16:
						want = half.BF16ToF32(half.F32ToBF16(host[i]))
					}
					if math.Float32bits(out[i]) != math.Float32bits(want) {
						t.Fatalf("n %d %v: round trip [%d] = %v, want %v", n, wire, i, out[i], want)
					}
				}
			}
		}
		be.Free(g)
	}
}

func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}
func le16(b []byte) uint16 { return uint16(b[0]) | uint16(b[1])<<8 }

// TestAllocatorReuses checks that freed memory is handed out again and
// that nothing grows in a steady state of free and alloc.
func TestAllocatorReuses(t *testing.T) {
	be := backend(t)
	if be.mem.exact {
		t.Skipf("skipping: %s=1 caches nothing", EnvExactAlloc)
	}
	a := be.Alloc(dtype.Float32, 1000)
	p := a.Ptr
	be.Free(a)
	b := be.Alloc(dtype.Float32, 900) // same 512-byte class rounded: 4000 and 3600 bytes -> 4096
	if b.Ptr != p {
		t.Fatalf("a freed block of the same class was not reused: %#x then %#x", p, b.Ptr)
	}
	host := make([]float32, 900)
	be.Download(host, b)
	for i, v := range host {
		if v != 0 {
			t.Fatalf("Alloc did not zero reused memory: [%d] = %v", i, v)
		}
	}
	be.Free(b)
	_, _, held := be.MemStats()
	for i := 0; i < 50; i++ {
		x := be.Alloc(dtype.Float32, 1<<20-i) // one 4 MiB class
		be.Free(x)
	}
	if _, _, h := be.MemStats(); h > held+int64(class(4<<20)) {
		t.Fatalf("steady alloc/free grew the held memory from %d to %d bytes", held, h)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Free of a view did not panic")
		}
	}()
	v := be.Alloc(dtype.Float32, 10)
	be.Free(v.Slice(2, 4))
}

// TestTransformerStepMatchesCPU trains a small Transformer for a few
// steps on the GPU and on the CPU backend from the same weights and
// batches, dropout on (both backends draw the same masks): loss, every
// gradient and the updated weights must agree to float32 rounding; with
// activations in fp16 or bf16 (mixed precision, the loss scaled for fp16
// as the trainer does), the loss to 1e-3 and the gradients and weights as
// a whole (compareL2). The ops themselves are checked one by one in each
// precision by TestConformance.
func TestTransformerStepMatchesCPU(t *testing.T) {
	for _, c := range []struct {
		name                string
		acts                dtype.DType
		lossScale           float32
		loss, grads, weight float64
	}{
		{"fp32", dtype.Float32, 0, 1e-5, 2e-4, 1e-4},
		// In half precision the gradients differ from float32's by 2-5 %
		// of their norm on this small, freshly initialised model (as with
		// fp16 matrix products alone: 1.5-4 %); the weights after Adam by
		// 0.1 %.
		{"fp16", dtype.Float16, 1024, 1e-3, 0.1, 3e-3},
		{"bf16", dtype.BFloat16, 0, 2e-3, 0.2, 5e-3},
	} {
		t.Run(c.name, func(t *testing.T) {
			be := backend(t)
			be.SetMatmulPrecision(c.acts)
			defer be.SetMatmulPrecision(dtype.Float32)
			stepsMatchCPU(t, be, c.acts, c.lossScale, c.loss, c.grads, c.weight)
		})
	}
}

func stepsMatchCPU(t *testing.T, be *Backend, acts dtype.DType, lossScale float32, lossTol, gradTol, weightTol float64) {
	cfg := transformer.Config{Preset: "test", Vocab: 37, DModel: 32, Heads: 4, FFN: 64, EncLayers: 2, DecLayers: 2,
		AttnDropout: 0.1, ReLUDropout: 0.1, PostDropout: 0.1, LabelSmoothing: 0.1, LNEps: 1e-6}
	mc, err := transformer.New(cfg, cpu.New(), 7)
	if err != nil {
		t.Fatal(err)
	}
	mg, err := transformer.New(cfg, be, 7)
	if err != nil {
		t.Fatal(err)
	}
	mg.Activations, mg.LossScale = acts, lossScale
	oc, og := transformer.NewLazyAdam(mc), transformer.NewLazyAdam(mg)
	r := rand.New(rand.NewPCG(1, 2))
	for step := 0; step < 3; step++ {
		var src, tgt [][]int32
		for i := 0; i < 5; i++ {
			s := make([]int32, 3+r.IntN(9))
			for j := range s {
				s[j] = int32(4 + r.IntN(cfg.Vocab-4))
			}
			g := make([]int32, 2+r.IntN(9))
			for j := range g {
				g[j] = int32(4 + r.IntN(cfg.Vocab-4))
			}
			g[len(g)-1] = transformer.EOS
			src, tgt = append(src, s), append(tgt, g)
		}
		b, err := transformer.PadBatch(src, tgt)
		if err != nil {
			t.Fatal(err)
		}
		lc, err := mc.Forward(b, true)
		if err != nil {
			t.Fatal(err)
		}
		lg, err := mg.Forward(b, true)
		if err != nil {
			t.Fatal(err)
		}
		if d := math.Abs(lc.Raw - lg.Raw); d > lossTol*math.Abs(lc.Raw) || lc.Tokens != lg.Tokens {
			t.Fatalf("step %d: loss cpu %.7f (%d tokens) gpu %.7f (%d)", step, lc.Raw, lc.Tokens, lg.Raw, lg.Tokens)
		}
		t.Logf("step %d: loss cpu %.7f gpu %.7f (relative difference %.2g)", step, lc.Raw, lg.Raw, math.Abs(lc.Raw-lg.Raw)/lc.Raw)
		if err := mc.Backward(nil); err != nil {
			t.Fatal(err)
		}
		if err := mg.Backward(nil); err != nil {
			t.Fatal(err)
		}
		if lossScale > 0 {
			be.Scale(mg.Grads, 1/lossScale)
		}
		cmp := compare
		if be.Precision != dtype.Float32 {
			cmp = compareL2
		}
		cmp(t, fmt.Sprintf("step %d gradients", step), mc, mg, mc.Grads, mg.Grads, gradTol)
		if err := oc.Step(mc, 1e-3, nil); err != nil {
			t.Fatal(err)
		}
		if err := og.Step(mg, 1e-3, nil); err != nil {
			t.Fatal(err)
		}
		// Adam's m/(sqrt(v)+eps) turns rounding differences of gradients
		// near zero into differences of up to lr in the update.
		cmp(t, fmt.Sprintf("step %d weights", step), mc, mg, mc.Weights, mg.Weights, weightTol)
	}
}

// compare checks two flat buffers parameter by parameter, relative to the
// parameter's largest magnitude.
func compare(t *testing.T, what string, mc, mg *transformer.Model, c, g kernels.Tensor, tol float64) {
	t.Helper()
	hc, hg := download(mc, c), download(mg, g)
	worstAll, worstAt := 0.0, ""
	defer func() { t.Logf("%s: worst difference %.3g of the allowed (%s)", what, worstAll, worstAt) }()
	for _, p := range mc.Params {
		var scale, worst float64
		at := 0
		for i := p.Offset; i < p.Offset+p.Len; i++ {
			scale = math.Max(scale, math.Abs(float64(hc[i])))
		}
		for i := p.Offset; i < p.Offset+p.Len; i++ {
			if d := math.Abs(float64(hc[i]) - float64(hg[i])); d > worst || math.IsNaN(d) {
				worst, at = d, i
			}
		}
		if r := worst / (tol * math.Max(scale, 1e-6)); r > worstAll {
			worstAll, worstAt = r, p.Name
		}
		if worst > tol*math.Max(scale, 1e-6) || math.IsNaN(worst) {
			t.Errorf("%s: %s[%d] cpu %v gpu %v (largest |value| %v)", what, p.Name, at-p.Offset, hc[at], hg[at], scale)
		}
	}
}

// compareL2 checks two flat buffers by the norm of their difference
// relative to the norm of c, over all parameters: in half precision a few
// gradients differ much (a ReLU whose input rounds across zero passes or
// stops a whole unit's gradient; a bias gradient, a sum over tokens that
// nearly cancels, keeps the rounding of its terms), the bulk must not.
func compareL2(t *testing.T, what string, mc, mg *transformer.Model, c, g kernels.Tensor, tol float64) {
	t.Helper()
	hc, hg := download(mc, c), download(mg, g)
	var dd, cc float64
	for i := range hc {
		d := float64(hc[i]) - float64(hg[i])
		dd += d * d
		cc += float64(hc[i]) * float64(hc[i])
	}
	r := math.Sqrt(dd / math.Max(cc, 1e-30))
	if !(r <= tol) {
		t.Errorf("%s: differ by %.3g of their norm (allowed %.3g)", what, r, tol)
	}
	t.Logf("%s: relative difference %.3g", what, r)
}

// TestFailure: a GPU call's panic becomes an error, any other panic goes on.
func TestFailure(t *testing.T) {
	e := fmt.Errorf("%w: 4096 bytes requested", &Error{Call: "cuMemAlloc", Name: "CUDA_ERROR_OUT_OF_MEMORY"})
	if err := Failure(e); err == nil || !strings.Contains(err.Error(), "GPU: cuda: cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY") {
		t.Fatalf("Failure(%v) = %v", e, err)
	}
	defer func() {
		if r := recover(); r != "a bug" {
			t.Fatalf("a non-GPU panic was swallowed or changed: %v", r)
		}
	}()
	Failure("a bug")
	t.Fatal("Failure returned on a non-GPU panic")
}

// download copies a tensor of m's backend to the host.
func download(m *transformer.Model, t kernels.Tensor) []float32 {
	h := make([]float32, t.Len())
	m.Backend().Download(h, t)
	return h
}

// With Settings.Profile (GORUN_CUDA_PROFILE=1) every operation queued on
// the compute stream is timed and named (kernels by name, GEMMs by types
// and shape, memsets and copies), TakeProfile sums them by name and starts
// again, and a backend without it profiles nothing. (internal/envconf's
// tests check that another value of the variable is refused.)
func TestProfileNamesEveryOp(t *testing.T) {
	if setupErr != nil {
		t.Fatal(setupErr)
	}
	shared := backend(t) // opened without the profiler
	b, err := Open(0, profiled())
	if err != nil {
		t.Fatal(err)
	}
	if !b.Profiling() || shared.Profiling() {
		t.Fatalf("profiling: %v with the variable, %v without", b.Profiling(), shared.Profiling())
	}
	x, w, y, db := b.Alloc(dtype.Float32, 64, 32), b.Alloc(dtype.Float32, 32, 48), b.Alloc(dtype.Float32, 3000, 48), b.Alloc(dtype.Float32, 48)
	b.Upload(x, make([]float32, 64*32))
	b.Gemm(false, false, 1, x, w, 0, y.Slice(0, 64, 48))
	b.Gemm(true, false, 1, y, y, 0, b.Alloc(dtype.Float32, 48, 48))
	b.BiasGrad(db, y)
	b.BiasGrad(db, y)
	out := make([]float32, 48)
	b.Download(out, db)
	// 3000 rows of 48 columns: the bias gradient runs in splits whose
	// partial sums gr_col_sum_f32 adds up (scratch allocated once)
	want := map[string]int{
		"memset": 6, opHostToDevice: 1, opDeviceToHost: 1, kBiasGrad.of(dtype.Float32).name: 2, kColSum.name: 2,
		"gemm F32,F32->F32 NN m=64 n=48 k=32": 1, "gemm F32,F32->F32 TN m=48 n=48 k=≤4096": 1,
	}
	ops := b.TakeProfile()
	for _, o := range ops {
		if want[o.Op] != o.Calls || !(o.Seconds >= 0) {
			t.Errorf("%q: %d calls, %g s; want %d calls", o.Op, o.Calls, o.Seconds, want[o.Op])
		}
		delete(want, o.Op)
	}
	for op := range want {
		t.Errorf("%q: not in the profile %+v", op, ops)
	}
	table := FormatProfile(ops, 2, 3)
	if !strings.Contains(table, "(4 other operations)") || !strings.Contains(table, "all, on the GPU") {
		t.Errorf("the table lacks its rest and total rows:\n%s", table)
	}
	if again := b.TakeProfile(); len(again) != 0 {
		t.Errorf("a second TakeProfile with nothing queued: %+v", again)
	}
	shared.BiasGrad(db, y)
	if p := shared.TakeProfile(); p != nil {
		t.Errorf("without %s: %+v", EnvProfile, p)
	}
}

// Orthonormalize takes F32 matrices of at most kernels.OrthoMaxCols
// columns.
func TestOrthonormalizeRefuses(t *testing.T) {
	be := backend(t)
	for what, dims := range map[string][]int{"F16": {4, 2}, "1-D": {8}, "65 columns": {2, kernels.OrthoMaxCols + 1}} {
		dt := dtype.Float32
		if what == "F16" {
			dt = dtype.Float16
		}
		p := be.Alloc(dt, dims...)
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: Orthonormalize(%v) did not panic", what, p)
				}
			}()
			be.Orthonormalize(p, 1e-8)
		}()
		be.Free(p)
	}
	p := be.Alloc(dtype.Float32, 3, kernels.OrthoMaxCols) // the most columns allowed: runs
	be.Upload(p, []float32{1, 2, 3})
	be.Orthonormalize(p, 1e-8)
	got := make([]float32, p.Len())
	be.Download(got, p)
	be.Free(p)
	if n := math.Sqrt(float64(got[0]*got[0] + got[64]*got[64] + got[128]*got[128])); math.Abs(n-1) > 1e-6 {
		t.Errorf("3 x 64: column 0 has norm %g after Orthonormalize", n)
	}
}
