package transformer

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/gorun/gorun/kernels/cpu"
)

// ref64 is an independent float64 implementation of the model's forward
// pass and loss (no dropout), written from the architecture's definition
// and reading the weights by parameter name.
type ref64 struct {
	cfg Config
	w   map[string][]float64
}

func newRef64(m *Model, W []float64) *ref64 {
	r := &ref64{cfg: m.Cfg, w: map[string][]float64{}}
	for _, p := range m.Params {
		r.w[p.Name] = W[p.Offset : p.Offset+p.Len]
	}
	return r
}

func matmul64(x []float64, N, in int, w []float64, out int) []float64 {
	y := make([]float64, N*out)
	for i := 0; i < N; i++ {
		for k := 0; k < in; k++ {
			a := x[i*in+k]
			for j := 0; j < out; j++ {
				y[i*out+j] += a * w[k*out+j]
			}
		}
	}
	return y
}

func (r *ref64) ln(x []float64, N int, pfx string) []float64 {
	d := r.cfg.DModel
	g, b := r.w[pfx+"/gamma"], r.w[pfx+"/beta"]
	y := make([]float64, len(x))
	for i := 0; i < N; i++ {
		row := x[i*d : i*d+d]
		var m, v float64
		for _, a := range row {
			m += a
		}
		m /= float64(d)
		for _, a := range row {
			v += (a - m) * (a - m)
		}
		v /= float64(d)
		for j, a := range row {
			y[i*d+j] = (a-m)/math.Sqrt(v+float64(r.cfg.LNEps))*g[j] + b[j]
		}
	}
	return y
}

func (r *ref64) embed(ids []int32, B, T int) []float64 {
	d := r.cfg.DModel
	E := r.w["embedding_and_softmax/weights"]
	x := make([]float64, B*T*d)
	half := d / 2
	for i, id := range ids {
		t := i % T
		for j := 0; j < d; j++ {
			if id != PAD {
				x[i*d+j] = E[int(id)*d+j] * math.Sqrt(float64(d))
			}
			c := j % half
			a := float64(t) * math.Exp(-float64(c)*math.Log(1e4)/float64(half-1))
			if j < half {
				x[i*d+j] += math.Sin(a)
			} else {
				x[i*d+j] += math.Cos(a)
			}
		}
	}
	return x
}

func (r *ref64) attn(xq, xkv []float64, B, Sq, Sk int, keyLen []int, causal bool, pfx string) []float64 {
	d, H := r.cfg.DModel, r.cfg.Heads
	dh := d / H
	q := matmul64(xq, B*Sq, d, r.w[pfx+"/q/kernel"], d)
	k := matmul64(xkv, B*Sk, d, r.w[pfx+"/k/kernel"], d)
	v := matmul64(xkv, B*Sk, d, r.w[pfx+"/v/kernel"], d)
	ctx := make([]float64, B*Sq*d)
	for b := 0; b < B; b++ {
		for h := 0; h < H; h++ {
			for i := 0; i < Sq; i++ {
				w := make([]float64, Sk)
				mx := math.Inf(-1)
				n := Sk
				if keyLen != nil {
					n = keyLen[b]
				}
				if causal {
					n = min(n, i+1)
				}
				for j := 0; j < n; j++ {
					var s float64
					for c := 0; c < dh; c++ {
						s += q[(b*Sq+i)*d+h*dh+c] * k[(b*Sk+j)*d+h*dh+c]
					}
					w[j] = s / math.Sqrt(float64(dh))
					mx = math.Max(mx, w[j])
				}
				var sum float64
				for j := 0; j < n; j++ {
					w[j] = math.Exp(w[j] - mx)
					sum += w[j]
				}
				for c := 0; c < dh; c++ {
					var s float64
					for j := 0; j < n; j++ {
						s += w[j] / sum * v[(b*Sk+j)*d+h*dh+c]
					}
					ctx[(b*Sq+i)*d+h*dh+c] = s
				}
			}
		}
	}
	return matmul64(ctx, B*Sq, d, r.w[pfx+"/output_transform/kernel"], d)
}

func (r *ref64) ffn(x []float64, N int, pfx string) []float64 {
	d, F := r.cfg.DModel, r.cfg.FFN
	h := matmul64(x, N, d, r.w[pfx+"/filter_layer/kernel"], F)
	b1 := r.w[pfx+"/filter_layer/bias"]
	for i := range h {
		h[i] = math.Max(0, h[i]+b1[i%F])
	}
	y := matmul64(h, N, F, r.w[pfx+"/output_layer/kernel"], d)
	b2 := r.w[pfx+"/output_layer/bias"]
	for i := range y {
		y[i] += b2[i%d]
	}
	return y
}

func add64(x, y []float64) {
	for i := range x {
		x[i] += y[i]
	}
}

// loss is the mean label-smoothed cross entropy over non-pad targets.
func (r *ref64) loss(b *Batch) float64 {
	c := r.cfg
	d, V := c.DModel, c.Vocab
	B, S, T := b.B, b.S, b.T
	keyLen := make([]int, B)
	for i := 0; i < B; i++ {
		for j := 0; j < S; j++ {
			if b.Src[i*S+j] != PAD {
				keyLen[i] = j + 1
			}
		}
	}
	x := r.embed(b.Src, B, S)
	for l := 0; l < c.EncLayers; l++ {
		p := "encoder/layer_" + string(rune('0'+l)) + "/"
		y := r.ln(x, B*S, p+"self_attention/layer_norm")
		add64(x, r.attn(y, y, B, S, S, keyLen, false, p+"self_attention"))
		add64(x, r.ffn(r.ln(x, B*S, p+"ffn/layer_norm"), B*S, p+"ffn"))
	}
	enc := r.ln(x, B*S, "encoder/layer_norm")
	din := make([]int32, B*T)
	for i := 0; i < B; i++ {
		copy(din[i*T+1:(i+1)*T], b.Tgt[i*T:(i+1)*T-1])
	}
	x = r.embed(din, B, T)
	for l := 0; l < c.DecLayers; l++ {
		p := "decoder/layer_" + string(rune('0'+l)) + "/"
		y := r.ln(x, B*T, p+"self_attention/layer_norm")
		add64(x, r.attn(y, y, B, T, T, nil, true, p+"self_attention"))
		add64(x, r.attn(r.ln(x, B*T, p+"encdec_attention/layer_norm"), enc, B, T, S, keyLen, false, p+"encdec_attention"))
		add64(x, r.ffn(r.ln(x, B*T, p+"ffn/layer_norm"), B*T, p+"ffn"))
	}
	out := r.ln(x, B*T, "decoder/layer_norm")
	E := r.w["embedding_and_softmax/weights"]
	ls := float64(c.LabelSmoothing)
	var sum float64
	n := 0
	for i := 0; i < B*T; i++ {
		y := b.Tgt[i]
		if y == PAD {
			continue
		}
		z := make([]float64, V)
		mx := math.Inf(-1)
		for v := 0; v < V; v++ {
			for j := 0; j < d; j++ {
				z[v] += out[i*d+j] * E[v*d+j]
			}
			mx = math.Max(mx, z[v])
		}
		var se float64
		for _, a := range z {
			se += math.Exp(a - mx)
		}
		for v, a := range z {
			t := ls / float64(V-1)
			if v == int(y) {
				t = 1 - ls
			}
			sum -= t * (a - mx - math.Log(se))
		}
		n++
	}
	return sum / float64(n)
}

// TestModelAgainstFloat64Reference checks the float32 model's loss against
// the float64 reference, and its float32 gradient (every parameter tensor,
// several elements each) against float64 central differences of the
// reference loss.
func TestModelAgainstFloat64Reference(t *testing.T) {
	cfg := microConfig().NoDropout()
	m, err := New(cfg, cpu.New(), 8)
	if err != nil {
		t.Fatal(err)
	}
	b := microBatch()
	l, err := m.Forward(b, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Backward(nil); err != nil {
		t.Fatal(err)
	}
	W := make([]float64, m.NumParams())
	for i, v := range m.Weights.F32 {
		W[i] = float64(v)
	}
	ref := newRef64(m, W)
	if want := ref.loss(b); math.Abs(l.Raw-want) > 1e-5*want {
		t.Fatalf("float32 loss %.8g, float64 reference %.8g", l.Raw, want)
	}
	r := rand.New(rand.NewPCG(4, 4))
	const eps = 1e-6
	bad := 0
	for _, p := range m.Params {
		for k := 0; k < 5; k++ {
			j := p.Offset + r.IntN(p.Len)
			if strings.HasPrefix(p.Name, "embedding") {
				j = p.Offset + []int{4, 5, 9, 12, 1}[k]*cfg.DModel + r.IntN(cfg.DModel)
			}
			old := W[j]
			W[j] = old + eps
			lp := ref.loss(b)
			W[j] = old - eps
			lm := ref.loss(b)
			W[j] = old
			num := (lp - lm) / (2 * eps)
			ana := float64(m.Grads.F32[j])
			if math.Abs(num-ana) > 2e-5+1e-3*math.Abs(num) {
				if bad++; bad < 10 {
					t.Errorf("%s[%d]: float32 analytic %.7g, float64 numeric %.7g", p.Name, j-p.Offset, ana, num)
				}
			}
		}
	}
}
