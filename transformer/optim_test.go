package transformer

import (
	"math"
	"math/rand/v2"
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

// TestAdamFloat64Reference runs dense Adam and LazyAdam (the embedding
// row-sparse) for several steps on fresh random gradients and learning
// rates and checks weights and moments against a float64 reference of
// TensorFlow's update, bias correction included:
//
//	m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g
//	p -= lr*sqrt(1-b2^t)/(1-b1^t) * m/(sqrt(v)+eps)
//
// with t counting every step (LazyAdam's untouched rows keep p, m and v,
// but the step count, as TensorFlow's beta powers, goes on).
func TestAdamFloat64Reference(t *testing.T) {
	for _, lazy := range []bool{false, true} {
		m, err := New(microConfig().NoDropout(), cpu.New(), 11)
		if err != nil {
			t.Fatal(err)
		}
		o := NewAdam(m, 0.9, 0.98, 1e-6)
		o.Lazy = lazy
		emb := m.EmbeddingParam()
		ep := m.Params[emb]
		n := m.NumParams()
		p64 := make([]float64, n)
		for i, w := range m.Weights.F32 {
			p64[i] = float64(w)
		}
		m64, v64, mScale := make([]float64, n), make([]float64, n), make([]float64, n)
		r := rand.New(rand.NewPCG(3, uint64(len(p64))))
		for step := 1; step <= 6; step++ {
			lr := 1e-3 * (1 + r.Float64())
			for i := range m.Grads.F32 {
				m.Grads.F32[i] = float32(r.NormFloat64() * math.Pow(10, -3*r.Float64()))
			}
			rows := []int32{int32(step % ep.Shape[0]), int32((step + 5) % ep.Shape[0])} // distinct
			touched := map[int]bool{}
			if lazy {
				o.SparseRows = map[int][]int32{emb: rows}
				for _, row := range rows {
					touched[int(row)] = true
				}
			}
			if err := o.Step(m, lr, nil); err != nil {
				t.Fatal(err)
			}
			tt := float64(step)
			lrT := lr * math.Sqrt(1-math.Pow(0.98, tt)) / (1 - math.Pow(0.9, tt))
			for i := range p64 {
				if lazy && i >= ep.Offset && i < ep.Offset+ep.Len && !touched[(i-ep.Offset)/ep.Shape[1]] {
					continue
				}
				// the moments' betas as the kernels get them (float32)
				b1, b2 := float64(float32(0.9)), float64(float32(0.98))
				g := float64(m.Grads.F32[i])
				// the terms that may cancel, and the rounding of earlier
				// steps carried in m
				mScale[i] = b1*mScale[i] + math.Abs(b1*m64[i]) + math.Abs((1-b1)*g)
				m64[i] = b1*m64[i] + (1-b1)*g
				v64[i] = b2*v64[i] + (1-b2)*g*g
				p64[i] -= lrT * m64[i] / (math.Sqrt(v64[i]) + 1e-6)
			}
			for i := range p64 {
				// p moves by up to ~lr_t a step: judge it by that, plus a
				// float32 unit of p per step (each update rounds p); m by
				// its terms, v by its size
				if d := math.Abs(float64(m.Weights.F32[i]) - p64[i]); d > float64(step)*(1e-5*lrT+1.2e-7*math.Abs(p64[i])) {
					t.Fatalf("lazy=%v step %d: p[%d] = %.9g, float64 reference %.9g", lazy, step, i, m.Weights.F32[i], p64[i])
				}
				if d := math.Abs(float64(o.M.F32[i]) - m64[i]); d > 1e-6*mScale[i]+1e-15 {
					t.Fatalf("lazy=%v step %d: m[%d] = %.9g, float64 reference %.9g", lazy, step, i, o.M.F32[i], m64[i])
				}
				if d := math.Abs(float64(o.V.F32[i]) - v64[i]); d > 1e-6*float64(step)*math.Abs(v64[i])+1e-15 {
					t.Fatalf("lazy=%v step %d: v[%d] = %.9g, float64 reference %.9g", lazy, step, i, o.V.F32[i], v64[i])
				}
			}
		}
	}
}
