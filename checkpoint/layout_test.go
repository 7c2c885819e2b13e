package checkpoint

import (
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/gorun/gorun/kernels/cpu"
	"github.com/gorun/gorun/transformer"
)

// layoutFixture is a checkpoint of microConfig written by the code of
// 2026-11-28, before the attention projections were computed by one GEMM
// (Q, K, V of self-attention; K, V of encoder-decoder attention) and the
// residual, dropout and layer norm fused: three micro steps from seed 21,
// then saved. GORUN_WRITE_LAYOUT_FIXTURE=1 writes it again (only with the
// code of that date does that make sense: the losses below are its).
const layoutFixture = "testdata/layout-2026-11-28/ckpt-3"

// The losses the code of 2026-11-28 computed from layoutFixture on
// microBatch: an eval forward, a training forward (dropout from the
// checkpoint's seed and dropout step), and an eval forward after one
// training step (backward and LazyAdam from the checkpoint's moments).
var layoutLosses = [3]float64{layoutEval, layoutTrain, layoutAfterStep}

func layoutRun(t *testing.T, m *transformer.Model, opt *transformer.Adam) [3]float64 {
	t.Helper()
	b := microBatch()
	var out [3]float64
	l, err := m.Forward(b, false)
	if err != nil {
		t.Fatal(err)
	}
	out[0] = l.Raw
	if l, err = m.Forward(b, true); err != nil {
		t.Fatal(err)
	}
	out[1] = l.Raw
	if err := m.Backward(nil); err != nil {
		t.Fatal(err)
	}
	if err := opt.Step(m, 1e-2, nil); err != nil {
		t.Fatal(err)
	}
	if l, err = m.Forward(b, false); err != nil {
		t.Fatal(err)
	}
	out[2] = l.Raw
	return out
}

// TestCheckpointLayoutFixture: a checkpoint written before the parameter
// layout was used for fused projections loads into today's model (the
// safetensors names, shapes and the flat layout unchanged) and gives the
// losses it gave then.
func TestCheckpointLayoutFixture(t *testing.T) {
	if os.Getenv("GORUN_WRITE_LAYOUT_FIXTURE") == "1" {
		dir := filepath.Dir(layoutFixture)
		os.RemoveAll(dir)
		m, _ := transformer.New(microConfig(), cpu.New(), 21)
		opt := transformer.NewLazyAdam(m)
		microTrain(t, m, opt, microBatch(), 0, 3)
		if _, err := Save(dir, "fixture", 3, m, opt, "vocab-fixture", nil); err != nil {
			t.Fatal(err)
		}
	}
	m, _ := transformer.New(microConfig(), cpu.New(), 99)
	opt := transformer.NewAdam(m, 0.5, 0.5, 1)
	if _, err := Load(layoutFixture, m, opt, "vocab-fixture"); err != nil {
		t.Fatal(err)
	}
	got := layoutRun(t, m, opt)
	t.Logf("losses %v", got)
	for i, w := range layoutLosses {
		if d := math.Abs(got[i] - w); !(d <= 1e-6*math.Abs(w)) {
			t.Errorf("loss %d = %.17g, the code of 2026-11-28 gave %.17g", i, got[i], w)
		}
	}
}

const (
	layoutEval      = 2.117860988697847
	layoutTrain     = 2.2439041785989255
	layoutAfterStep = 2.1007586128112443
)
