package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gorun/gorun/kernels"
)

// Float64 reference implementations of the ops, written from their
// definitions. The tests compare the float32 ops' forward outputs with
// them, and the float32 backward ops with central differences of them
// (in float64, so the step can be small and rounding does not matter).

func to64(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

func ln64(x, g, b []float64, N, D int, eps float64) []float64 {
	y := make([]float64, N*D)
	for r := 0; r < N; r++ {
		row := x[r*D : r*D+D]
		var m, v float64
		for _, a := range row {
			m += a
		}
		m /= float64(D)
		for _, a := range row {
			v += (a - m) * (a - m)
		}
		v /= float64(D)
		for j, a := range row {
			y[r*D+j] = (a-m)/math.Sqrt(v+eps)*g[j] + b[j]
		}
	}
	return y
}

// keep64 is the dropout mask's definition: element i is kept when its 16
// random bits are >= round(p*65536).
func keep64(seed uint64, i int, p float64) bool {
	r := uint16(maskWord(seed, i>>2) >> (uint(i&3) * 16))
	return r >= uint16(math.Round(p*65536))
}

func attn64(q, k, v []float64, a kernels.AttnArgs, keyLen []int32) []float64 {
	B, H, Sq, Sk, Dh := a.B, a.H, a.Sq, a.Sk, a.Dh
	D := H * Dh
	o := make([]float64, B*Sq*D)
	for b := 0; b < B; b++ {
		for h := 0; h < H; h++ {
			for i := 0; i < Sq; i++ {
				w := make([]float64, Sk)
				mx := math.Inf(-1)
				ok := make([]bool, Sk)
				for j := 0; j < Sk; j++ {
					ok[j] = !(keyLen != nil && j >= int(keyLen[b])) && !(a.Causal && j > i+Sk-Sq)
					if !ok[j] {
						continue
					}
					var s float64
					for d := 0; d < Dh; d++ {
						s += q[(b*Sq+i)*D+h*Dh+d] * k[(b*Sk+j)*D+h*Dh+d]
					}
					w[j] = s * float64(a.Scale)
					mx = math.Max(mx, w[j])
				}
				var sum float64
				for j := range w {
					if ok[j] {
						w[j] = math.Exp(w[j] - mx)
						sum += w[j]
					} else {
						w[j] = 0
					}
				}
				for j := range w {
					if sum > 0 {
						w[j] /= sum
					}
					if a.Dropout > 0 {
						if keep64(a.Seed, ((b*H+h)*Sq+i)*Sk+j, float64(a.Dropout)) {
							w[j] /= 1 - float64(a.Dropout)
						} else {
							w[j] = 0
						}
					}
				}
				for d := 0; d < Dh; d++ {
					var s float64
					for j := 0; j < Sk; j++ {
						s += w[j] * v[(b*Sk+j)*D+h*Dh+d]
					}
					o[(b*Sq+i)*D+h*Dh+d] = s
				}
			}
		}
	}
	return o
}

func ce64(z []float64, tg []int32, N, V int, ls float64) float64 {
	var loss float64
	for i := 0; i < N; i++ {
		if tg[i] == 0 {
			continue
		}
		row := z[i*V : i*V+V]
		mx := math.Inf(-1)
		for _, v := range row {
			mx = math.Max(mx, v)
		}
		var se float64
		for _, v := range row {
			se += math.Exp(v - mx)
		}
		for j, v := range row {
			t := ls / float64(V-1)
			if j == int(tg[i]) {
				t = 1 - ls
			}
			loss -= t * (v - mx - math.Log(se))
		}
	}
	return loss
}

func dot64(w []float32, y []float64) float64 {
	var s float64
	for i := range y {
		s += float64(w[i]) * y[i]
	}
	return s
}

// fd64Check compares every element of the float32 analytic gradient ana
// of f at x with float64 central differences.
func fd64Check(t *testing.T, name string, x []float64, ana []float32, f func([]float64) float64) {
	t.Helper()
	const eps = 1e-6
	bad := 0
	for i := range x {
		old := x[i]
		x[i] = old + eps
		fp := f(x)
		x[i] = old - eps
		fm := f(x)
		x[i] = old
		num := (fp - fm) / (2 * eps)
		if math.Abs(num-float64(ana[i])) > 1e-4+1e-4*math.Abs(num) {
			if bad++; bad < 5 {
				t.Errorf("%s[%d]: float32 analytic %.7g, float64 numeric %.7g", name, i, ana[i], num)
			}
		}
	}
}

func closeTo64(t *testing.T, name string, got []float32, want []float64, tol float64) {
	t.Helper()
	for i := range want {
		if math.Abs(float64(got[i])-want[i]) > tol*(1+math.Abs(want[i])) {
			t.Fatalf("%s[%d] = %v, float64 reference %v", name, i, got[i], want[i])
		}
	}
}

func TestLayerNormAgainstFloat64(t *testing.T) {
	be := New()
	r := rand.New(rand.NewPCG(11, 1))
	N, D := 4, 9
	x, g, b, w := randn(r, N*D, 2), randn(r, D, 1), randn(r, D, 1), randn(r, N*D, 1)
	y, mean, rstd := make([]float32, N*D), make([]float32, N), make([]float32, N)
	be.LayerNorm(kernels.FromF32(y, N, D), kernels.FromF32(mean, N), kernels.FromF32(rstd, N), kernels.FromF32(x, N, D), kernels.FromF32(g, D), kernels.FromF32(b, D), 1e-6)
	x64, g64, b64 := to64(x), to64(g), to64(b)
	closeTo64(t, "layernorm", y, ln64(x64, g64, b64, N, D, 1e-6), 1e-5)
	dx, dg, db := make([]float32, N*D), make([]float32, D), make([]float32, D)
	be.LayerNormBackward(kernels.FromF32(dx, N, D), kernels.FromF32(dg, D), kernels.FromF32(db, D), kernels.FromF32(w, N, D), kernels.FromF32(x, N, D), kernels.FromF32(mean, N), kernels.FromF32(rstd, N), kernels.FromF32(g, D))
	fd64Check(t, "dx", x64, dx, func(v []float64) float64 { return dot64(w, ln64(v, g64, b64, N, D, 1e-6)) })
	fd64Check(t, "dgamma", g64, dg, func(v []float64) float64 { return dot64(w, ln64(x64, v, b64, N, D, 1e-6)) })
	fd64Check(t, "dbeta", b64, db, func(v []float64) float64 { return dot64(w, ln64(x64, g64, v, N, D, 1e-6)) })
}

func TestAttentionAgainstFloat64(t *testing.T) {
	for _, tc := range []struct {
		name    string
		causal  bool
		keyLen  []int32
		dropout float32
		sq, sk  int
	}{
		{"padding", false, []int32{5, 2}, 0, 3, 5},
		{"causal", true, nil, 0, 4, 4},
		{"causal-offset+dropout", true, nil, 0.3, 2, 5},
		{"padding+dropout", false, []int32{3, 4}, 0.2, 3, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be := New()
			r := rand.New(rand.NewPCG(12, 2))
			B, H, Dh := 2, 2, 3
			D := H * Dh
			q, k, v := randn(r, B*tc.sq*D, 1), randn(r, B*tc.sk*D, 1), randn(r, B*tc.sk*D, 1)
			w := randn(r, B*tc.sq*D, 1)
			a := kernels.AttnArgs{B: B, H: H, Sq: tc.sq, Sk: tc.sk, Dh: Dh, Causal: tc.causal, Scale: 0.7, Dropout: tc.dropout, Seed: 5}
			if tc.keyLen != nil {
				a.KeyLen = kernels.FromI32(tc.keyLen, B)
			}
			T := func(x []float32, s int) kernels.Tensor { return kernels.FromF32(x, B, s, D) }
			o, p := make([]float32, B*tc.sq*D), make([]float32, B*H*tc.sq*tc.sk)
			pt := kernels.FromF32(p, B, H, tc.sq, tc.sk)
			be.Attention(T(o, tc.sq), pt, T(q, tc.sq), T(k, tc.sk), T(v, tc.sk), a)
			q64, k64, v64 := to64(q), to64(k), to64(v)
			closeTo64(t, "attention", o, attn64(q64, k64, v64, a, tc.keyLen), 1e-5)
			dq, dk, dv := make([]float32, len(q)), make([]float32, len(k)), make([]float32, len(v))
			be.AttentionBackward(T(dq, tc.sq), T(dk, tc.sk), T(dv, tc.sk), kernels.FromF32(make([]float32, len(p)), B, H, tc.sq, tc.sk), T(w, tc.sq), T(q, tc.sq), T(k, tc.sk), T(v, tc.sk), pt, a)
			fd64Check(t, "dq", q64, dq, func(x []float64) float64 { return dot64(w, attn64(x, k64, v64, a, tc.keyLen)) })
			fd64Check(t, "dk", k64, dk, func(x []float64) float64 { return dot64(w, attn64(q64, x, v64, a, tc.keyLen)) })
			fd64Check(t, "dv", v64, dv, func(x []float64) float64 { return dot64(w, attn64(q64, k64, x, a, tc.keyLen)) })
		})
	}
}

func TestCrossEntropyAgainstFloat64(t *testing.T) {
	be := New()
	r := rand.New(rand.NewPCG(13, 3))
	N, V := 5, 17
	z := randn(r, N*V, 3)
	tg := []int32{4, 0, 16, 1, 9}
	sum, n := be.CrossEntropy(kernels.Tensor{}, kernels.FromF32(z, N, V), kernels.FromI32(tg, N), 0.1, 0, 1)
	z64 := to64(z)
	if ref := ce64(z64, tg, N, V, 0.1); n != 4 || math.Abs(sum-ref) > 1e-5*math.Abs(ref) {
		t.Fatalf("loss %v over %d, float64 reference %v over 4", sum, n, ref)
	}
	dz := make([]float32, len(z))
	be.CrossEntropy(kernels.FromF32(dz, N, V), kernels.FromF32(z, N, V), kernels.FromI32(tg, N), 0.1, 0, 1)
	fd64Check(t, "dlogits", z64, dz, func(x []float64) float64 { return ce64(x, tg, N, V, 0.1) })
}

func TestEmbeddingBiasAgainstFloat64(t *testing.T) {
	be := New()
	r := rand.New(rand.NewPCG(14, 4))
	N, D, V := 5, 4, 6
	table, w := randn(r, V*D, 1), randn(r, N*D, 1)
	ids := []int32{2, 5, 0, 2, 1}
	emb64 := func(tb []float64) []float64 {
		y := make([]float64, N*D)
		for i, id := range ids {
			for j := 0; j < D && id != 0; j++ {
				y[i*D+j] = tb[int(id)*D+j] * 2.5
			}
		}
		return y
	}
	y := make([]float32, N*D)
	be.Embedding(kernels.FromF32(y, N, D), kernels.FromF32(table, V, D), kernels.FromI32(ids, N), 2.5, 0)
	t64 := to64(table)
	closeTo64(t, "embedding", y, emb64(t64), 1e-6)
	dt := make([]float32, V*D)
	be.EmbeddingBackward(kernels.FromF32(dt, V, D), kernels.FromF32(w, N, D), kernels.FromI32(ids, N), 2.5, 0)
	fd64Check(t, "dtable", t64, dt, func(x []float64) float64 { return dot64(w, emb64(x)) })

	// bias + ReLU: y = max(0, x + b), away from the kink
	x, b := randn(r, N*D, 1), randn(r, D, 0.1)
	for i := range x {
		if math.Abs(float64(x[i])) < 0.3 {
			x[i] += 0.6
		}
	}
	relu64 := func(xx, bb []float64) []float64 {
		out := make([]float64, N*D)
		for i := range out {
			out[i] = math.Max(0, xx[i]+bb[i%D])
		}
		return out
	}
	yr := append([]float32(nil), x...)
	be.BiasReLU(kernels.FromF32(yr, N, D), kernels.FromF32(b, D))
	x64, b64 := to64(x), to64(b)
	closeTo64(t, "bias+relu", yr, relu64(x64, b64), 1e-6)
	dx := append([]float32(nil), w...)
	be.ReLUBackward(kernels.FromF32(dx, N, D), kernels.FromF32(yr, N, D))
	db := make([]float32, D)
	be.BiasGrad(kernels.FromF32(db, D), kernels.FromF32(dx, N, D))
	fd64Check(t, "relu dx", x64, dx, func(v []float64) float64 { return dot64(w, relu64(v, b64)) })
	fd64Check(t, "dbias", b64, db, func(v []float64) float64 { return dot64(w, relu64(x64, v)) })
}
