package transformer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/kernels/cpu"
)

func TestBaseParamCount(t *testing.T) {
	cfg, err := Preset("base", 32768)
	if err != nil {
		t.Fatal(err)
	}
	// Count from the parameter list without allocating a model.
	m, err := New(cfg, cpu.New(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.NumParams(); got != 60880896 {
		t.Fatalf("base with 32768 ids has %d parameters, want 60,880,896", got)
	}
	sum := 0
	for i, p := range m.Params {
		if p.Offset != sum {
			t.Fatalf("param %d %s at offset %d, want %d", i, p.Name, p.Offset, sum)
		}
		sum += p.Len
	}
	// ParamList is the same list without a model.
	ps, err := ParamList(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(ps) != fmt.Sprint(m.Params) {
		t.Fatalf("ParamList differs from New's parameters:\n%v\n%v", ps, m.Params)
	}
	if _, err := ParamList(Config{}); err == nil {
		t.Fatal("ParamList of an empty config: no error")
	}
}

func TestSmoothedEntropy(t *testing.T) {
	if h := SmoothedEntropy(32768, 0.1); math.Abs(h-1.3648) > 5e-5 {
		t.Fatalf("smoothed entropy %v, want 1.3648", h)
	}
	if h := SmoothedEntropy(32768, 0); h != 0 {
		t.Fatalf("no smoothing: %v", h)
	}
}

// microConfig is a model small enough for finite differences.
func microConfig() Config {
	return Config{Preset: "micro", Vocab: 13, DModel: 8, Heads: 2, FFN: 12, EncLayers: 2, DecLayers: 2,
		AttnDropout: 0.2, ReLUDropout: 0.2, PostDropout: 0.2, LabelSmoothing: 0.1, LNEps: 1e-6}
}

func microBatch() *Batch {
	return &Batch{B: 3, S: 5, T: 4,
		Src: []int32{4, 5, 6, 7, 1, 8, 9, 1, 0, 0, 10, 11, 12, 4, 1},
		Tgt: []int32{5, 6, 7, 1, 9, 1, 0, 0, 12, 11, 4, 1}}
}

func TestModelGradientFiniteDifferences(t *testing.T) {
	for _, dropout := range []bool{false, true} {
		cfg := microConfig()
		if !dropout {
			cfg = cfg.NoDropout()
		}
		m, err := New(cfg, cpu.New(), 3)
		if err != nil {
			t.Fatal(err)
		}
		b := microBatch()
		loss := func() float64 {
			m.DropoutStep = 7 // same dropout masks every time
			l, err := m.Forward(b, true)
			if err != nil {
				t.Fatal(err)
			}
			return l.Raw
		}
		loss()
		var order []int
		if err := m.Backward(func(i int) { order = append(order, i) }); err != nil {
			t.Fatal(err)
		}
		if len(order) != len(m.Params) {
			t.Fatalf("hook called %d times for %d params", len(order), len(m.Params))
		}
		for k, i := range order {
			if i != len(m.Params)-1-k {
				t.Fatalf("hook order %v is not strictly decreasing", order)
			}
		}
		grad := append([]float32(nil), m.Grads.F32...)
		// a bucket of consecutive parameters is one contiguous gradient slice
		if gs := m.GradSlice(3, 7); gs.Len() != m.Params[7].Offset+m.Params[7].Len-m.Params[3].Offset || &gs.F32[0] != &m.Grads.F32[m.Params[3].Offset] {
			t.Fatalf("GradSlice(3, 7) is %v", gs)
		}
		r := rand.New(rand.NewPCG(1, 2))
		W := m.Weights.F32
		bad := 0
		for pi, p := range m.Params {
			for k := 0; k < 4; k++ {
				j := p.Offset + r.IntN(p.Len)
				if pi == m.emb {
					// rows of ids that occur, so the gather path is covered too
					ids := []int{4, 5, 9, 12, 1}
					j = p.Offset + ids[k]*cfg.DModel + r.IntN(cfg.DModel)
				}
				// Central differences at two step sizes: the larger one can
				// straddle a ReLU kink, the smaller one suffers float32
				// rounding; the analytic gradient must match one of them.
				ana := float64(grad[j])
				ok := false
				var nums []float64
				for _, eps := range []float32{1e-3, 2.5e-4} {
					old := W[j]
					W[j] = old + eps
					lp := loss()
					W[j] = old - eps
					lm := loss()
					W[j] = old
					num := (lp - lm) / (2 * float64(eps))
					nums = append(nums, num)
					if math.Abs(num-ana) <= 1e-3+2e-2*math.Abs(num) {
						ok = true
					}
				}
				if !ok {
					bad++
					t.Errorf("dropout=%v %s[%d]: analytic %.6g numeric %.6g", dropout, p.Name, j-p.Offset, ana, nums)
				}
			}
		}
		if bad > 0 {
			t.Fatalf("%d gradient mismatches", bad)
		}
	}
}

func TestTraceAndBatchErrors(t *testing.T) {
	m, err := New(microConfig(), cpu.New(), 1)
	if err != nil {
		t.Fatal(err)
	}
	var ev []string
	m.Trace = func(layer, phase string, s, e time.Time) {
		if e.Before(s) {
			t.Errorf("%s %s ends before it starts", layer, phase)
		}
		ev = append(ev, phase+" "+layer)
	}
	if _, err := m.Forward(microBatch(), true); err != nil {
		t.Fatal(err)
	}
	if err := m.Backward(nil); err != nil {
		t.Fatal(err)
	}
	want := []string{"forward encoder/layer_0", "forward encoder/layer_1", "forward decoder/layer_0", "forward decoder/layer_1", "forward softmax",
		"backward softmax", "backward decoder/layer_1", "backward decoder/layer_0", "backward encoder/layer_1", "backward encoder/layer_0"}
	if strings.Join(ev, ",") != strings.Join(want, ",") {
		t.Fatalf("trace events %v, want %v", ev, want)
	}
	if err := m.Backward(nil); err == nil {
		t.Fatal("second Backward without Forward accepted")
	}
	bad := microBatch()
	bad.Src[2] = 13
	if _, err := m.Forward(bad, true); err == nil || !strings.Contains(err.Error(), "outside the vocabulary") {
		t.Fatalf("out-of-vocabulary id: %v", err)
	}
	bad = microBatch()
	bad.T = 5
	if _, err := m.Forward(bad, true); err == nil {
		t.Fatal("inconsistent batch sizes accepted")
	}
	if _, err := Preset("huge", 100); err == nil || err.Error() != `unknown preset "huge": --preset takes tiny, small, base or big` {
		t.Fatalf("unknown preset: %v", err)
	}
	if _, err := m.Translate([][]int32{{4, 99}}, DefaultDecode); err == nil {
		t.Fatal("out-of-vocabulary source accepted by Translate")
	}
}
