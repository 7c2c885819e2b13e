package cuda

import (
	"math/rand/v2"
	"os"
	"testing"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/kernels"
	"github.com/gorun/gorun/transformer"
)

// The step TestStepCounts counts, by environment: GORUN_CUDA_COUNT_PRESET
// (a transformer preset, e.g. base; unset: a 2+2-layer model of d 32) and
// GORUN_CUDA_COUNT_PRECISION (fp16, the default, bf16 or fp32).
const (
	envCountPreset    = "GORUN_CUDA_COUNT_PRESET"
	envCountPrecision = "GORUN_CUDA_COUNT_PRECISION"
)

// TestStepCounts counts what one training step queues on the compute
// stream (kernels, GEMMs, memsets, copies) and how often the host waits for
// it, as nmt-train's step runs on one rank (train.trainStep with the plain
// reducer): Forward, Backward, with fp16 the unscaling of the gradients,
// their overflow check, LazyAdam, and the check that the update left the
// weights finite; the scalars deferred (kernels.DeferredScalars: one wait,
// at the end), and, for comparison, read where they are made (as the step
// did before, and does with several ranks). The second of two steps is
// counted (the first allocates). The batch is 4 sentences of 9 to 12
// tokens: under 256 rows, so the column reductions run in one split (no
// gr_col_sum_f32, which real batches add: 2 a bias and 3 a layer norm
// gradient). docs/cuda.md has the counts of Transformer-base:
//
//	GORUN_CUDA_COUNT_PRESET=base go test ./kernels/cuda -run TestStepCounts -v
func TestStepCounts(t *testing.T) {
	be := backend(t)
	cfg := transformer.Config{Preset: "test", Vocab: 37, DModel: 32, Heads: 4, FFN: 64, EncLayers: 2, DecLayers: 2,
		AttnDropout: 0.1, ReLUDropout: 0.1, PostDropout: 0.1, LabelSmoothing: 0.1, LNEps: 1e-6}
	if p := os.Getenv(envCountPreset); p != "" {
		var err error
		if cfg, err = transformer.Preset(p, 32768); err != nil {
			t.Fatal(err)
		}
	}
	acts := map[string]dtype.DType{"": dtype.Float16, "fp16": dtype.Float16, "bf16": dtype.BFloat16, "fp32": dtype.Float32}[os.Getenv(envCountPrecision)]
	if acts == 0 && os.Getenv(envCountPrecision) != "fp32" {
		t.Fatalf("%s=%q: want fp16, bf16 or fp32", envCountPrecision, os.Getenv(envCountPrecision))
	}
	m, err := transformer.New(cfg, be, 7)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Free(m.Weights)
	defer be.Free(m.Grads)
	m.Activations = acts
	be.SetMatmulPrecision(acts)
	defer be.SetMatmulPrecision(dtype.Float32)
	opt := transformer.NewLazyAdam(m)
	defer be.Free(opt.M)
	defer be.Free(opt.V)
	r := rand.New(rand.NewPCG(3, 4))
	var src, tgt [][]int32
	for i := 0; i < 4; i++ {
		s, g := make([]int32, 9+i), make([]int32, 12-i)
		for j := range s {
			s[j] = int32(4 + r.IntN(cfg.Vocab-4))
		}
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
	for _, deferred := range []bool{true, false} {
		var c Counts
		for step := 0; step < 2; step++ {
			be.TakeCounts()
			c = countedStep(t, be, m, opt, b, deferred)
		}
		how := "deferred scalars"
		if !deferred {
			how = "scalars read where made"
		}
		t.Logf("%s (%s activations), batch %dx%d/%d, %s: %s", cfg.Preset, acts, b.B, b.S, b.T, how, c)
		if deferred && c.Syncs != 1 {
			t.Errorf("the step waits for the GPU %d times, want once, at its end", c.Syncs)
		}
	}
}

// countedStep is nmt-train's step on one rank (train.trainStep with the
// plain reducer), with its scalars deferred (the GPU's way) or not, and
// what it queued and waited for.
func countedStep(t *testing.T, be *Backend, m *transformer.Model, opt *transformer.Adam, b *transformer.Batch, deferred bool) Counts {
	t.Helper()
	scaling := m.Activations == dtype.Float16
	if scaling {
		m.LossScale = 1 << 14
	}
	m.DeferLoss = deferred
	defer func() { m.DeferLoss = false }()
	if _, err := m.Forward(b, true); err != nil {
		t.Fatal(err)
	}
	if err := m.Backward(func(int) {}); err != nil {
		t.Fatal(err)
	}
	// plainReducer.Wait on one rank
	if scaling {
		be.Scale(m.Grads, 1/m.LossScale)
	}
	if deferred {
		be.FlagInfNaN(m.Grads, kernels.FlagOverflow)
	} else if scaling && be.HasInfNaN(m.Grads) {
		t.Fatal("overflow")
	}
	opt.SkipOnOverflow = deferred
	if err := opt.Step(m, 1e-4, nil); err != nil {
		t.Fatal(err)
	}
	opt.SkipOnOverflow = false
	if deferred {
		be.FlagInfNaN(m.Weights, kernels.FlagWeights)
		if sum, _, flags := be.TakeScalars(); flags != [2]bool{} || !(sum > 0) {
			t.Fatalf("loss sum %g, flags %v", sum, flags)
		}
	} else if be.HasInfNaN(m.Weights) {
		t.Fatal("the weights are not finite")
	}
	return be.TakeCounts()
}
