package transformer

import (
	"math"
	"testing"

	"github.com/gorun/gorun/kernels/cpu"
)

func TestTransformerPolicy(t *testing.T) {
	p := TransformerPolicy{LearningRate: 2, DModel: 512, Warmup: 8000}
	for _, c := range []struct {
		step int
		want float64
	}{{7999, 9.882e-4}, {61700, 3.558e-4}, {300000, 1.614e-4}} {
		if got := p.LR(c.step); math.Abs(got-c.want) > 5e-4*c.want {
			t.Errorf("transformer_policy at step %d: %.6g, want %.4g", c.step, got, c.want)
		}
	}
	// warm-up is linear, peak at step warmup-1
	if a, b := p.LR(99), p.LR(199); math.Abs(b/a-2) > 1e-12 {
		t.Errorf("warm-up not linear: %v %v", a, b)
	}
	if p.LR(7998) > p.LR(7999) || p.LR(8001) > p.LR(7999) {
		t.Error("peak is not at step warmup-1")
	}
	is := InverseSqrt{LearningRate: 1e-3, Warmup: 100}
	if got := is.LR(49); math.Abs(got-5e-4) > 1e-12 {
		t.Errorf("inverse_sqrt warm-up: %v", got)
	}
	if got := is.LR(399); math.Abs(got-5e-4) > 1e-12 {
		t.Errorf("inverse_sqrt decay: %v", got)
	}
	if Constant(0.5).LR(12345) != 0.5 {
		t.Error("constant policy")
	}
	if _, err := ParsePolicy("cosine", 1, 512, 10); err == nil {
		t.Error("unknown policy accepted")
	}
}

func TestLazyAdamRows(t *testing.T) {
	cfg := microConfig().NoDropout()
	m, err := New(cfg, cpu.New(), 5)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Forward(microBatch(), true); err != nil {
		t.Fatal(err)
	}
	if err := m.Backward(nil); err != nil {
		t.Fatal(err)
	}
	lazy, dense := NewLazyAdam(m), NewAdam(m, 0.9, 0.997, 1e-9)
	for i := range lazy.M.F32 {
		lazy.M.F32[i], dense.M.F32[i] = 0.01, 0.01
		lazy.V.F32[i], dense.V.F32[i] = 0.02, 0.02
	}
	emb := m.EmbeddingParam()
	lazy.SparseRows = map[int][]int32{emb: {4, 9}}
	w0 := append([]float32(nil), m.Weights.F32...)
	if err := lazy.Step(m, 1e-3, nil); err != nil {
		t.Fatal(err)
	}
	wl := append([]float32(nil), m.Weights.F32...)
	copy(m.Weights.F32, w0)
	if err := dense.Step(m, 1e-3, nil); err != nil {
		t.Fatal(err)
	}
	d := cfg.DModel
	p := m.Params[emb]
	for i := 0; i < p.Len; i++ {
		row := i / d
		j := p.Offset + i
		if row == 4 || row == 9 {
			if wl[j] != m.Weights.F32[j] || lazy.M.F32[j] != dense.M.F32[j] {
				t.Fatalf("touched row %d differs from dense Adam", row)
			}
		} else if wl[j] != w0[j] || lazy.M.F32[j] != 0.01 || lazy.V.F32[j] != 0.02 {
			t.Fatalf("untouched row %d changed (w %v->%v m %v v %v)", row, w0[j], wl[j], lazy.M.F32[j], lazy.V.F32[j])
		}
	}
	// other parameters: identical to dense Adam
	for j := p.Offset + p.Len; j < len(wl); j++ {
		if wl[j] != m.Weights.F32[j] {
			t.Fatalf("dense parameter element %d differs", j)
		}
	}
	if m.Weights.F32[p.Offset] == w0[p.Offset] {
		t.Fatal("dense Adam did not move the embedding")
	}
}
