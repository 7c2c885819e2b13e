// Package kerneltest is the conformance table of kernels.Backend: every op,
// over a table of cases (odd sizes, rows long enough to need several GPU
// warps and loop iterations, aliasing, views, masks, accumulation), checked
// against a float64 reference written in this package from the op's
// documented definition, never from a backend's code.
//
// It reaches tensors only through the Backend interface (Alloc, Upload,
// UploadI32, Download, Free, the ops themselves), so one table runs on the
// CPU backend, the CUDA backend and the CUDA emulator alike:
//
//	func TestConformance(t *testing.T) { kerneltest.Run(t, cpu.New(), kerneltest.FP32()) }
//
// It is a test helper and imports package testing: only the _test.go files
// of backends import it.
package kerneltest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/kernels"
)

// Tolerance is the error Run allows, by kind of op. Each is a relative
// error: an output element passes when |got-want| <= tol*scale, where scale
// is |want| plus the root mean square of the whole expected tensor (so an
// element that cancels to near zero is judged against the size of its
// neighbours, not against itself). A few outputs have a scale of their
// own, the size of the terms that cancel in them: Gemm's rounding error
// bound, sum_k |alpha*a_ik*b_kj| + |beta*c_ij|; LayerNorm's y against
// (|x|+|mean|)*rstd*|gamma| + |beta| and its mean against the row's
// spread; CrossEntropy's loss against sum |logsumexp| + sum q|z|; Adam's p
// by its change, plus one unit in the last place of p.
//
// Ops that only move, mask or convert data (Copy, Zero, Upload/Download,
// GatherRows, WriteStep, Cast, ReLUBackward, the dropout kept set, the rows
// AdamRows leaves alone, padding rows) are checked exactly whatever the
// tolerance.
type Tolerance struct {
	// F32: element-wise, row-wise and reduction ops computed in float32
	// (AddBias, BiasGrad, BiasReLU, LayerNorm and its backward, Dropout,
	// Embedding and its backward, AddPositional, Adam, Scale, Axpy,
	// SumSquares).
	F32 float64
	// Gemm: Gemm, against its error bound (see above).
	Gemm float64
	// Attention: Attention and AttentionBackward, which are matrix products
	// around a softmax; a GPU backend's TF32 matrix products show here too.
	Attention float64
	// Softmax: CrossEntropy (loss and gradient) and LogSoftmax, whose exp
	// and log are approximations on every backend.
	Softmax float64
	// Ortho: Orthonormalize, times the error amplification of its
	// cancellations (see testOrthonormalize). Its sums are float64 (or as
	// accurate) by contract, so this is tighter than F32.
	Ortho float64
	// Activations is the type the backend's activations are in: F32, or
	// F16 or BF16 for mixed precision (see FP16). Then only the ops over
	// activations run, Gemm among them.
	Activations dtype.DType
}

// FP32 is the tolerance for a backend that computes everything in IEEE
// float32, matrix products included (the CPU backend). Measured on the CPU
// backend, which sums in float32 left to right, the worst errors are:
// F32 ops 1e-6 (LayerNorm's mean over rows of 4097, BiasGrad's sums over
// 1000 rows), Gemm 4.5e-7 of its bound, attention 2e-6, softmax 5.4e-6
// (CrossEntropy's gradient over 4097 logits: the float32 sum of their
// exps). The limits leave 4-20x for other summation orders (a GPU's tree
// reductions, atomics) and other exp and log approximations. Run logs the
// worst error of every op with -v.
func FP32() Tolerance {
	return Tolerance{F32: 1e-5, Gemm: 1e-5, Attention: 2e-5, Softmax: 2e-5, Ortho: 1e-6, Activations: dtype.Float32}
}

// TF32 is FP32 with matrix products on tensor cores in TF32 (10 explicit
// mantissa bits; inputs rounded to a relative 2^-11 or, worst, truncated
// to 2^-10). One product a*b is then off by up to 2*2^-10 of |a*b|, so
// Gemm is allowed 3e-3 of its bound; attention's weights move by about the
// absolute error of the scores. With the CPU backend's products fed
// TF32-truncated inputs (kerneltest's own test) the worst errors are 1.5e-3
// (Gemm, k = 8) and 2e-3 (attention); not yet measured on a GPU.
func TF32() Tolerance {
	t := FP32()
	t.Gemm = 3e-3
	t.Attention = 5e-3
	return t
}

// Run runs the table on be: one subtest per op, named after it, each going
// through its cases. Failures name the op, the case, the output and the
// element, with what was got and what was wanted. Every tensor a case
// allocates is freed when the case ends. With -v each op logs its worst
// error relative to what its tolerance allows.
func Run(t *testing.T, be kernels.Backend, tol Tolerance) {
	if tol.Activations != dtype.Float32 {
		be = &halfActs{Backend: be, dt: tol.Activations}
	}
	for _, op := range ops {
		if tol.Activations != dtype.Float32 && !op.act {
			continue
		}
		t.Run(op.name, func(t *testing.T) {
			e := &env{t: t, be: be, tol: tol, op: op.name, rng: rand.New(rand.NewPCG(0x6b65726e, seedOf(op.name)))}
			op.fn(e)
			if e.worst.ratio > 0 {
				t.Logf("worst error %.3g of the allowed (%s)", e.worst.ratio, e.worst.where)
			}
		})
	}
}

// Ops lists the names of Run's subtests, in order.
func Ops() []string {
	names := make([]string, len(ops))
	for i, op := range ops {
		names[i] = op.name
	}
	return names
}

// ops is the table; act marks the ops over activations (those that run
// again with activations in half precision).
var ops = []struct {
	name string
	fn   func(*env)
	act  bool
}{
	{"AllocUploadDownload", testAllocUpload, false},
	{"Free", testFree, false},
	{"Copy", testCopy, false},
	{"Zero", testZero, false},
	{"Cast", testCast, false},
	{"Scale", testScale, false},
	{"Axpy", testAxpy, false},
	{"HasInfNaN", testHasInfNaN, false},
	{"SumSquares", testSumSquares, false},
	{"Gemm", testGemm, true},
	{"AddBias", testAddBias, true},
	{"BiasGrad", testBiasGrad, true},
	{"BiasReLU", testBiasReLU, true},
	{"ReLUBackward", testReLUBackward, true},
	{"BiasReLUDropout", testBiasReLUDropout, true},
	{"LayerNorm", testLayerNorm, true},
	{"LayerNormBackward", testLayerNormBackward, true},
	{"Dropout", testDropout, true},
	{"DropoutBackward", testDropoutBackward, true},
	{"ResidualDropout", testResidualDropout, true},
	{"ResidualDropoutLayerNorm", testResidualDropoutLayerNorm, true},
	{"Embedding", testEmbedding, true},
	{"EmbeddingBackward", testEmbeddingBackward, true},
	{"AddPositional", testAddPositional, true},
	{"Attention", testAttention, true},
	{"AttentionBackward", testAttentionBackward, true},
	{"CrossEntropy", testCrossEntropy, true},
	{"LogSoftmax", testLogSoftmax, true},
	{"Adam", testAdam, false},
	{"AdamRows", testAdamRows, false},
	{"GatherRows", testGatherRows, true},
	{"WriteStep", testWriteStep, true},
	{"Orthonormalize", testOrthonormalize, false},
}

func seedOf(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * 1099511628211
	}
	return h
}

// env is one op's test: the backend, the current case, the tensors it
// allocated and the worst error seen.
type env struct {
	t     testing.TB
	be    kernels.Backend
	tol   Tolerance
	op    string
	cs    string // current case
	rng   *rand.Rand
	owned []kernels.Tensor
	worst struct {
		ratio float64
		where string
	}
}

// run runs one case; a panic fails the case (not the test binary) and the
// case's tensors are freed in any event.
func (e *env) run(cs string, fn func()) {
	e.cs = cs
	defer func() {
		if r := recover(); r != nil {
			e.t.Errorf("%s/%s: panic: %v\n%s", e.op, cs, r, debug.Stack())
		}
		for _, x := range e.owned {
			e.be.Free(x)
		}
		e.owned = e.owned[:0]
	}()
	fn()
}

func (e *env) errorf(format string, args ...any) {
	e.t.Helper()
	e.t.Errorf("%s/%s: %s", e.op, e.cs, fmt.Sprintf(format, args...))
}

// alloc allocates a tensor the case frees at its end.
func (e *env) alloc(dt dtype.DType, dims ...int) kernels.Tensor {
	x := e.be.Alloc(dt, dims...)
	e.owned = append(e.owned, x)
	return x
}

// up allocates an F32 tensor holding x.
func (e *env) up(x []float32, dims ...int) kernels.Tensor {
	t := e.alloc(dtype.Float32, dims...)
	if t.Len() != len(x) {
		panic(fmt.Sprintf("kerneltest: %d values for %v", len(x), dims))
	}
	if len(x) > 0 {
		e.be.Upload(t, x)
	}
	return t
}

// upI allocates an I32 tensor holding x.
func (e *env) upI(x []int32, dims ...int) kernels.Tensor {
	t := e.alloc(dtype.Int32, dims...)
	if len(x) > 0 {
		e.be.UploadI32(t, x)
	}
	return t
}

// down reads an F32 tensor back.
func (e *env) down(x kernels.Tensor) []float32 {
	out := make([]float32, x.Len())
	if len(out) > 0 {
		e.be.Download(out, x)
	}
	return out
}

// randn returns n normal values of standard deviation sd.
func (e *env) randn(n int, sd float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(e.rng.NormFloat64() * sd)
	}
	return e.act(x)
}

// act rounds x in place to the type of the activations (see FP16), so
// that inputs are the same for the backend and the float64 reference; it
// returns x. The generators (randn, varied) call it; so must a case that
// derives inputs from them by arithmetic.
func (e *env) act(x []float32) []float32 {
	roundTo(e.tol.Activations, x)
	return x
}

// varied returns n normal values whose magnitudes spread over four
// decades around sd (10^-2 to 10^2 times).
func (e *env) varied(n int, sd float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(e.rng.NormFloat64() * sd * math.Pow(10, 4*e.rng.Float64()-2))
	}
	return e.act(x)
}

func to64(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

func clone[T any](x []T) []T { return append([]T(nil), x...) }

func rms(x []float64) float64 {
	var s float64
	for _, v := range x {
		s += v * v
	}
	if len(x) == 0 {
		return 0
	}
	return math.Sqrt(s / float64(len(x)))
}

// near checks got against want with the default scale, |want| + rms(want).
func (e *env) near(what string, got []float32, want []float64, tol float64) {
	e.t.Helper()
	e.nearScale(what, got, want, nil, tol)
}

// nearScale checks |got-want| <= tol*scale[i] for every element; a nil
// scale is the default |want| + rms(want).
func (e *env) nearScale(what string, got []float32, want, scale []float64, tol float64) {
	e.t.Helper()
	if len(got) != len(want) {
		e.errorf("%s: %d elements, want %d", what, len(got), len(want))
		return
	}
	floor := 0.0
	if scale == nil {
		floor = rms(want)
	}
	bad, worst, worstAt := 0, 0.0, -1
	var msgs []string
	for i, w := range want {
		s := floor + math.Abs(w)
		if scale != nil {
			s = scale[i]
		}
		g := float64(got[i])
		d := math.Abs(g - w)
		ok := d <= tol*s
		if math.IsNaN(w) {
			ok = math.IsNaN(g)
		} else if math.IsInf(w, 0) {
			ok = g == w
		} else if math.IsNaN(d) || math.IsInf(d, 0) {
			ok = false
		}
		if r := d / (tol * s); ok && s > 0 && r > worst {
			worst, worstAt = r, i
		}
		if !ok {
			if bad++; bad <= 5 {
				msgs = append(msgs, fmt.Sprintf("%s[%d] = %.8g, want %.8g (error %.3g, allowed %.3g)", what, i, g, w, d, tol*s))
			}
		}
	}
	if bad > 0 {
		more := ""
		if bad > 5 {
			more = fmt.Sprintf("\n\t... %d of %d elements off", bad, len(want))
		}
		e.errorf("%s%s", strings.Join(msgs, "\n\t"), more)
	}
	e.note(worst, what, worstAt)
}

func (e *env) note(ratio float64, what string, at int) {
	if ratio > e.worst.ratio {
		e.worst.ratio = ratio
		e.worst.where = fmt.Sprintf("%s %s[%d]", e.cs, what, at)
	}
}

// scalar checks one number.
func (e *env) scalar(what string, got, want, scale, tol float64) {
	e.t.Helper()
	d := math.Abs(got - want)
	if !(d <= tol*scale) && !(got == want) {
		e.errorf("%s = %.10g, want %.10g (error %.3g, allowed %.3g)", what, got, want, d, tol*scale)
		return
	}
	if scale > 0 {
		e.note(d/(tol*scale), what, 0)
	}
}

// exact checks got bit for bit against want (a NaN matches any NaN);
// with half-precision activations, against want rounded to their type.
func (e *env) exact(what string, got, want []float32) {
	e.t.Helper()
	if len(got) != len(want) {
		e.errorf("%s: %d elements, want %d", what, len(got), len(want))
		return
	}
	if e.tol.Activations != dtype.Float32 {
		want = clone(want)
		roundTo(e.tol.Activations, want)
	}
	e.bits(what, got, want)
}

// bits checks got bit for bit against want (a NaN matches any NaN), as
// they are: for float32 outputs that are no activations (LayerNorm's mean
// and rstd) compared with the same backend's.
func (e *env) bits(what string, got, want []float32) {
	e.t.Helper()
	if len(got) != len(want) {
		e.errorf("%s: %d elements, want %d", what, len(got), len(want))
		return
	}
	bad := 0
	var msgs []string
	for i := range want {
		g, w := got[i], want[i]
		if math.Float32bits(g) == math.Float32bits(w) || (g != g && w != w) {
			continue
		}
		if bad++; bad <= 5 {
			msgs = append(msgs, fmt.Sprintf("%s[%d] = %.8g (%#08x), want %.8g (%#08x) exactly", what, i, g, math.Float32bits(g), w, math.Float32bits(w)))
		}
	}
	if bad > 0 {
		more := ""
		if bad > 5 {
			more = fmt.Sprintf("\n\t... %d of %d elements differ", bad, len(want))
		}
		e.errorf("%s%s", strings.Join(msgs, "\n\t"), more)
	}
}

// numGrad is the central-difference gradient of f at x, in float64 (x is
// restored). Only for small cases: it calls f twice per element.
func numGrad(f func([]float64) float64, x []float64) []float64 {
	g := make([]float64, len(x))
	for i, old := range x {
		h := 1e-6 * max(1, math.Abs(old))
		x[i] = old + h
		fp := f(x)
		x[i] = old - h
		fm := f(x)
		x[i] = old
		g[i] = (fp - fm) / (2 * h)
	}
	return g
}

// fdLimit is the largest number of inputs a case's finite differences run
// over.
const fdLimit = 400

// gradCheck checks a backend gradient got, accumulated onto base (nil:
// zeros), against base + the float64 analytic gradient ana and, where x
// is small, against base + central differences of the float64 forward f
// (which also checks ana itself, tightly).
func (e *env) gradCheck(what string, got, base []float32, ana []float64, f func([]float64) float64, x []float64, tol float64) {
	e.t.Helper()
	plus := func(g []float64) []float64 {
		if base == nil {
			return g
		}
		s := to64(base)
		for i := range s {
			s[i] += g[i]
		}
		return s
	}
	e.near(what, got, plus(ana), tol)
	if f == nil || len(x) > fdLimit {
		return
	}
	num := numGrad(f, x)
	e.near(what+" vs finite differences", got, plus(num), tol)
	// the reference against its own finite differences: a wrong reference
	// would otherwise pass a backend that shares its mistake.
	s := rms(num)
	for i := range num {
		if d := math.Abs(ana[i] - num[i]); d > 1e-6*(math.Abs(num[i])+s)+1e-12 {
			e.errorf("reference %s[%d] = %.10g, finite differences %.10g: the test's float64 backward is wrong", what, i, ana[i], num[i])
			return
		}
	}
}

// dot64 is sum(w*y): a loss whose gradient with respect to y is w.
func dot64(w []float32, y []float64) float64 {
	var s float64
	for i := range y {
		s += float64(w[i]) * y[i]
	}
	return s
}

// f32 is short for kernels.F32.
const f32 = dtype.Float32

func f32s(x []float64) []float32 {
	y := make([]float32, len(x))
	for i, v := range x {
		y[i] = float32(v)
	}
	return y
}
