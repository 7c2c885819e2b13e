package cuda

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/kernels"
	"github.com/gorun/gorun/transformer"
)

// TestDeferredScalars: CrossEntropySum adds to the accumulator what
// CrossEntropy returns, FlagInfNaN raises its flag on an Inf or a NaN and
// only its own, Adam and AdamRows with SkipOnOverflow leave p, m, v bit for
// bit as they were while the overflow flag is raised and update as without
// it otherwise, and all of it waits for the GPU once: at TakeScalars, which
// clears the accumulator and the flags.
func TestDeferredScalars(t *testing.T) {
	b := backend(t)
	r := rand.New(rand.NewPCG(10, 11))
	host := func(n int, sd float64) []float32 {
		h := make([]float32, n)
		for i := range h {
			h[i] = float32(r.NormFloat64() * sd)
		}
		return h
	}
	up := func(h []float32, dims ...int) kernels.Tensor {
		x := b.Alloc(dtype.Float32, dims...)
		b.Upload(x, h)
		return x
	}
	down := func(x kernels.Tensor) []float32 {
		h := make([]float32, x.Len())
		b.Download(h, x)
		return h
	}
	same := func(what string, got, want []float32) {
		t.Helper()
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Errorf("%s: element %d = %g, want %g", what, i, got[i], want[i])
				return
			}
		}
	}
	const N, V = 6, 11
	logits := up(host(N*V, 2), N, V)
	targets := b.Alloc(dtype.Int32, N)
	b.UploadI32(targets, []int32{3, 0, 10, 5, 0, 7}) // two pad rows (0)
	wantSum, wantN := b.CrossEntropy(kernels.Tensor{}, logits, targets, 0.1, 0, 1)

	// What a step queues: the loss of two micro-batches, the checks, the
	// updates; nothing waits until TakeScalars.
	g := up(host(40, 1), 8, 5)
	p0, m0, v0 := host(40, 1), host(40, 0.1), host(40, 0.1)
	for i := range v0 {
		v0[i] = v0[i] * v0[i]
	}
	p, m, v := up(p0, 8, 5), up(m0, 8, 5), up(v0, 8, 5)
	rows := b.Alloc(dtype.Int32, 3)
	b.UploadI32(rows, []int32{1, 4, 6})
	bad := up([]float32{1, float32(math.Inf(-1)), 3}, 3)
	args := kernels.AdamArgs{LR: 0.1, Beta1: 0.9, Beta2: 0.99, Eps: 1e-8, SkipOnOverflow: true}
	b.TakeCounts()
	b.CrossEntropySum(kernels.Tensor{}, logits, targets, 0.1, 0, 1)
	b.CrossEntropySum(kernels.Tensor{}, logits, targets, 0.1, 0, 1)
	b.FlagInfNaN(g, kernels.FlagWeights) // finite: stays down
	b.FlagInfNaN(bad, kernels.FlagOverflow)
	b.Adam(p, g, m, v, args) // cancelled
	b.AdamRows(p, g, m, v, rows, args)
	sum, n, flags := b.TakeScalars()
	if c := b.TakeCounts(); c.Syncs != 1 {
		t.Errorf("the deferred step waited for the GPU %d times, want once (%v)", c.Syncs, c)
	}
	if d := math.Abs(sum - 2*wantSum); d > 1e-12*math.Abs(wantSum) || n != 2*wantN {
		t.Errorf("loss accumulated %.17g over %d rows, want twice CrossEntropy's %.17g over %d", sum, n, wantSum, wantN)
	}
	if !flags[kernels.FlagOverflow] || flags[kernels.FlagWeights] {
		t.Errorf("flags %v after an Inf under FlagOverflow and finite values under FlagWeights", flags)
	}
	same("p after Adam and AdamRows under a raised overflow flag", down(p), p0)
	same("m", down(m), m0)
	same("v", down(v), v0)

	// TakeScalars cleared everything: the same updates now run, as
	// without SkipOnOverflow.
	if sum, n, flags := b.TakeScalars(); sum != 0 || n != 0 || flags != [2]bool{} {
		t.Errorf("a second TakeScalars: %g, %d, %v; want all cleared", sum, n, flags)
	}
	b.Adam(p, g, m, v, args)
	b.AdamRows(p, g, m, v, rows, args)
	b.FlagInfNaN(p, kernels.FlagWeights)
	_, _, flags = b.TakeScalars()
	p2, m2, v2 := up(p0, 8, 5), up(m0, 8, 5), up(v0, 8, 5)
	plain := args
	plain.SkipOnOverflow = false
	b.Adam(p2, g, m2, v2, plain)
	b.AdamRows(p2, g, m2, v2, rows, plain)
	same("p after Adam and AdamRows, flag down", down(p), down(p2))
	same("m, flag down", down(m), down(m2))
	same("v, flag down", down(v), down(v2))
	if flags != [2]bool{} {
		t.Errorf("flags %v after finite updates", flags)
	}
	b.FlagInfNaN(bad, kernels.FlagWeights)
	if _, _, flags = b.TakeScalars(); flags != [2]bool{false, true} {
		t.Errorf("flags %v after an Inf under FlagWeights alone", flags)
	}
	for _, x := range []kernels.Tensor{logits, targets, g, p, m, v, rows, bad, p2, m2, v2} {
		b.Free(x)
	}
}

// TestDeferredStep: a training step on one rank as nmt-train runs it on a
// GPU (DeferLoss, the overflow check and the weights' check queued, the
// update cancelled on the device by an overflow, one synchronisation at
// the end): its loss is the loss of the same step without deferral; with
// fp16 gradients that overflow (a loss scale of 2^40) the weights and
// Adam's moments stay as they were.
func TestDeferredStep(t *testing.T) {
	b := backend(t)
	cfg := transformer.Config{Preset: "test", Vocab: 37, DModel: 32, Heads: 4, FFN: 64, EncLayers: 1, DecLayers: 1,
		AttnDropout: 0.1, ReLUDropout: 0.1, PostDropout: 0.1, LabelSmoothing: 0.1, LNEps: 1e-6}
	b.SetMatmulPrecision(dtype.Float16)
	defer b.SetMatmulPrecision(dtype.Float32)
	batch, err := transformer.PadBatch([][]int32{{5, 6, 7, 8}, {9, 10, 11}}, [][]int32{{12, 13, 1}, {14, 15, 16, 1}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		scale    float32
		overflow bool
	}{{"scale 1024", 1024, false}, {"scale 2^40: fp16 overflows", 1 << 40, true}} {
		t.Run(c.name, func(t *testing.T) {
			m, err := transformer.New(cfg, b, 7)
			if err != nil {
				t.Fatal(err)
			}
			m.Activations, m.LossScale = dtype.Float16, c.scale
			opt := transformer.NewLazyAdam(m)
			defer func() {
				for _, x := range []kernels.Tensor{m.Weights, m.Grads, opt.M, opt.V} {
					b.Free(x)
				}
			}()
			want, err := m.Forward(batch, true)
			if err != nil {
				t.Fatal(err)
			}
			m.DropoutStep-- // the same masks again
			w0 := download(m, m.Weights)
			b.TakeCounts()
			m.DeferLoss = true
			l, err := m.Forward(batch, true)
			if err != nil {
				t.Fatal(err)
			}
			if !math.IsNaN(l.Raw) || l.Tokens != want.Tokens {
				t.Fatalf("deferred Forward returned %+v, want a NaN loss and %d tokens", l, want.Tokens)
			}
			if err := m.Backward(nil); err != nil {
				t.Fatal(err)
			}
			b.Scale(m.Grads, 1/c.scale)
			b.FlagInfNaN(m.Grads, kernels.FlagOverflow)
			opt.SkipOnOverflow = true
			if err := opt.Step(m, 1e-3, nil); err != nil {
				t.Fatal(err)
			}
			b.FlagInfNaN(m.Weights, kernels.FlagWeights)
			sum, n, flags := b.TakeScalars()
			if cnt := b.TakeCounts(); cnt.Syncs != 1 {
				t.Errorf("the step waited for the GPU %d times, want once (%v)", cnt.Syncs, cnt)
			}
			if d := math.Abs(sum/float64(n) - want.Raw); d > 1e-6*want.Raw || n != want.Tokens {
				t.Errorf("deferred loss %.8g over %d tokens, the step without deferral %.8g over %d", sum/float64(n), n, want.Raw, want.Tokens)
			}
			if flags[kernels.FlagOverflow] != c.overflow || flags[kernels.FlagWeights] {
				t.Errorf("flags %v, want overflow %v and finite weights", flags, c.overflow)
			}
			w1 := download(m, m.Weights)
			changed := 0
			for i := range w0 {
				if math.Float32bits(w0[i]) != math.Float32bits(w1[i]) {
					changed++
				}
			}
			if c.overflow && changed > 0 {
				t.Errorf("an overflowing step changed %d weights", changed)
			}
			if !c.overflow && changed < len(w0)/2 {
				t.Errorf("the step changed %d of %d weights", changed, len(w0))
			}
			if c.overflow {
				for _, x := range []kernels.Tensor{opt.M, opt.V} {
					for i, v := range download(m, x) {
						if v != 0 {
							t.Fatalf("an overflowing step left Adam's moments non-zero (element %d = %g)", i, v)
						}
					}
				}
			}
		})
	}
}
