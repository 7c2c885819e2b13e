package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gorun/gorun/kernels"
)

func randn(r *rand.Rand, n int, sd float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * sd)
	}
	return x
}

// dotLoss is sum(w*y) in float64: a scalar whose gradient wrt y is w.
func dotLoss(w, y []float32) float64 {
	var s float64
	for i := range y {
		s += float64(w[i]) * float64(y[i])
	}
	return s
}

// fdCheck compares analytic gradient ana of f with respect to x against
// central differences at every element of x (or a sample of 40).
func fdCheck(t *testing.T, name string, x, ana []float32, f func() float64, eps, tol float64) {
	t.Helper()
	r := rand.New(rand.NewPCG(9, 9))
	idx := make([]int, 0, 40)
	if len(x) <= 40 {
		for i := range x {
			idx = append(idx, i)
		}
	} else {
		for k := 0; k < 40; k++ {
			idx = append(idx, r.IntN(len(x)))
		}
	}
	bad := 0
	for _, i := range idx {
		old := x[i]
		x[i] = old + float32(eps)
		fp := f()
		x[i] = old - float32(eps)
		fm := f()
		x[i] = old
		num := (fp - fm) / (2 * eps)
		if d := math.Abs(num - float64(ana[i])); d > tol*(1+math.Abs(num)) {
			bad++
			if bad < 6 {
				t.Errorf("%s[%d]: analytic %.6g numeric %.6g", name, i, ana[i], num)
			}
		}
	}
}

func TestLayerNormGrad(t *testing.T) {
	be := New()
	r := rand.New(rand.NewPCG(1, 1))
	N, D := 5, 7
	x, g, b := randn(r, N*D, 1), randn(r, D, 1), randn(r, D, 1)
	w := randn(r, N*D, 1)
	y, mean, rstd := make([]float32, N*D), make([]float32, N), make([]float32, N)
	fwd := func() float64 {
		be.LayerNorm(kernels.FromF32(y, N, D), kernels.FromF32(mean, N), kernels.FromF32(rstd, N), kernels.FromF32(x, N, D), kernels.FromF32(g, D), kernels.FromF32(b, D), 1e-6)
		return dotLoss(w, y)
	}
	fwd()
	dx, dg, db := randn(r, N*D, 1), make([]float32, D), make([]float32, D)
	base := append([]float32(nil), dx...)
	be.LayerNormBackward(kernels.FromF32(dx, N, D), kernels.FromF32(dg, D), kernels.FromF32(db, D), kernels.FromF32(w, N, D), kernels.FromF32(x, N, D), kernels.FromF32(mean, N), kernels.FromF32(rstd, N), kernels.FromF32(g, D))
	for i := range dx {
		dx[i] -= base[i] // backward accumulates
	}
	fdCheck(t, "dx", x, dx, fwd, 1e-2, 2e-3)
	fdCheck(t, "dgamma", g, dg, fwd, 1e-2, 2e-3)
	fdCheck(t, "dbeta", b, db, fwd, 1e-2, 2e-3)
}

func TestAttentionGrad(t *testing.T) {
	for _, tc := range []struct {
		name    string
		causal  bool
		keyLen  []int32
		dropout float32
		sq, sk  int
	}{
		{"plain", false, nil, 0, 3, 4},
		{"padding", false, []int32{4, 2}, 0, 3, 4},
		{"causal", true, nil, 0, 4, 4},
		{"causal+dropout", true, nil, 0.3, 4, 4},
		{"padding+dropout", false, []int32{3, 1}, 0.25, 2, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be := New()
			r := rand.New(rand.NewPCG(2, 3))
			B, H, Dh := 2, 2, 3
			D := H * Dh
			q, k, v := randn(r, B*tc.sq*D, 1), randn(r, B*tc.sk*D, 1), randn(r, B*tc.sk*D, 1)
			w := randn(r, B*tc.sq*D, 1)
			o, p := make([]float32, B*tc.sq*D), make([]float32, B*H*tc.sq*tc.sk)
			a := kernels.AttnArgs{B: B, H: H, Sq: tc.sq, Sk: tc.sk, Dh: Dh, Causal: tc.causal, Scale: 0.6, Dropout: tc.dropout, Seed: 77}
			if tc.keyLen != nil {
				a.KeyLen = kernels.FromI32(tc.keyLen, B)
			}
			T := func(x []float32, s int) kernels.Tensor { return kernels.FromF32(x, B, s, D) }
			fwd := func() float64 {
				be.Attention(T(o, tc.sq), kernels.FromF32(p, B, H, tc.sq, tc.sk), T(q, tc.sq), T(k, tc.sk), T(v, tc.sk), a)
				return dotLoss(w, o)
			}
			fwd()
			// masked keys get zero weight
			for bi := 0; bi < B; bi++ {
				for h := 0; h < H; h++ {
					for i := 0; i < tc.sq; i++ {
						for j := 0; j < tc.sk; j++ {
							masked := (tc.keyLen != nil && j >= int(tc.keyLen[bi])) || (tc.causal && j > i)
							if pv := p[((bi*H+h)*tc.sq+i)*tc.sk+j]; masked && pv != 0 {
								t.Fatalf("masked weight %v at b%d h%d i%d j%d", pv, bi, h, i, j)
							}
						}
					}
				}
			}
			dq, dk, dv := make([]float32, len(q)), make([]float32, len(k)), make([]float32, len(v))
			dp := make([]float32, len(p))
			be.AttentionBackward(T(dq, tc.sq), T(dk, tc.sk), T(dv, tc.sk), kernels.FromF32(dp, B, H, tc.sq, tc.sk), T(w, tc.sq), T(q, tc.sq), T(k, tc.sk), T(v, tc.sk), kernels.FromF32(p, B, H, tc.sq, tc.sk), a)
			fdCheck(t, "dq", q, dq, fwd, 1e-2, 2e-3)
			fdCheck(t, "dk", k, dk, fwd, 1e-2, 2e-3)
			fdCheck(t, "dv", v, dv, fwd, 1e-2, 2e-3)
		})
	}
}

func TestCrossEntropy(t *testing.T) {
	be := New()
	r := rand.New(rand.NewPCG(4, 4))
	N, V := 6, 11
	z := randn(r, N*V, 2)
	tg := []int32{3, 0, 10, 1, 0, 7}
	ls := float32(0.1)
	f := func() float64 {
		s, _ := be.CrossEntropy(kernels.Tensor{}, kernels.FromF32(z, N, V), kernels.FromI32(tg, N), ls, 0, 1)
		return s
	}
	// float64 reference
	var ref float64
	for i := 0; i < N; i++ {
		if tg[i] == 0 {
			continue
		}
		row := z[i*V : i*V+V]
		mx := math.Inf(-1)
		for _, v := range row {
			mx = math.Max(mx, float64(v))
		}
		var se float64
		for _, v := range row {
			se += math.Exp(float64(v) - mx)
		}
		for j, v := range row {
			q := float64(ls) / float64(V-1)
			if j == int(tg[i]) {
				q = 1 - float64(ls)
			}
			ref -= q * (float64(v) - mx - math.Log(se))
		}
	}
	s, n := be.CrossEntropy(kernels.Tensor{}, kernels.FromF32(z, N, V), kernels.FromI32(tg, N), ls, 0, 1)
	if n != 4 || math.Abs(s-ref) > 1e-5*math.Abs(ref) {
		t.Fatalf("loss %v over %d rows, want %v over 4", s, n, ref)
	}
	dz := make([]float32, len(z))
	be.CrossEntropy(kernels.FromF32(dz, N, V), kernels.FromF32(z, N, V), kernels.FromI32(tg, N), ls, 0, 1)
	fdCheck(t, "dlogits", z, dz, f, 1e-2, 2e-3)
	// in place
	z2 := append([]float32(nil), z...)
	be.CrossEntropy(kernels.FromF32(z2, N, V), kernels.FromF32(z2, N, V), kernels.FromI32(tg, N), ls, 0, 1)
	for i := range z2 {
		if z2[i] != dz[i] {
			t.Fatalf("in-place gradient differs at %d", i)
		}
	}
}

func TestBiasReLUEmbeddingGrad(t *testing.T) {
	be := New()
	r := rand.New(rand.NewPCG(5, 5))
	N, D, V := 6, 5, 4
	x, b, w := randn(r, N*D, 1), randn(r, D, 1), randn(r, N*D, 1)
	y := make([]float32, N*D)
	fwd := func() float64 {
		copy(y, x)
		be.BiasReLU(kernels.FromF32(y, N, D), kernels.FromF32(b, D))
		return dotLoss(w, y)
	}
	fwd()
	dx := append([]float32(nil), w...)
	be.ReLUBackward(kernels.FromF32(dx, N, D), kernels.FromF32(y, N, D))
	db := make([]float32, D)
	be.BiasGrad(kernels.FromF32(db, D), kernels.FromF32(dx, N, D))
	fdCheck(t, "relu dx", x, dx, fwd, 1e-3, 2e-3)
	fdCheck(t, "relu dbias", b, db, fwd, 1e-3, 2e-3)

	table := randn(r, V*D, 1)
	ids := []int32{1, 3, 0, 3, 2, 1}
	emb := func() float64 {
		be.Embedding(kernels.FromF32(y, N, D), kernels.FromF32(table, V, D), kernels.FromI32(ids, N), 1.5, 0)
		return dotLoss(w, y)
	}
	emb()
	for j := 0; j < D; j++ {
		if y[2*D+j] != 0 {
			t.Fatal("padding embedding is not zero")
		}
	}
	dt := make([]float32, V*D)
	be.EmbeddingBackward(kernels.FromF32(dt, V, D), kernels.FromF32(w, N, D), kernels.FromI32(ids, N), 1.5, 0)
	fdCheck(t, "embedding", table, dt, emb, 1e-2, 1e-3)
}

func TestDropoutReproducible(t *testing.T) {
	be := New()
	n := 100000
	x := make([]float32, n)
	for i := range x {
		x[i] = 1
	}
	y1, y2 := make([]float32, n), make([]float32, n)
	be.Dropout(kernels.FromF32(y1, n), kernels.FromF32(x, n), 0.1, 42)
	be.Threads = 1
	be.Dropout(kernels.FromF32(y2, n), kernels.FromF32(x, n), 0.1, 42)
	zeros := 0
	for i := range y1 {
		if y1[i] != y2[i] {
			t.Fatal("dropout mask depends on the number of threads")
		}
		switch y1[i] {
		case 0:
			zeros++
		case 1 / 0.9:
		default:
			t.Fatalf("dropout output %v", y1[i])
		}
	}
	if zeros < 9500 || zeros > 10500 {
		t.Fatalf("%d of %d dropped at p=0.1", zeros, n)
	}
	be.Dropout(kernels.FromF32(y2, n), kernels.FromF32(x, n), 0.1, 43)
	same := 0
	for i := range y1 {
		if y1[i] == y2[i] {
			same++
		}
	}
	if same == n {
		t.Fatal("another seed gives the same mask")
	}
	// backward uses the same mask
	g := make([]float32, n)
	be.DropoutBackward(kernels.FromF32(g, n), kernels.FromF32(x, n), 0.1, 42)
	for i := range g {
		if g[i] != y1[i] {
			t.Fatal("dropout backward mask differs from forward")
		}
	}
}

func TestAdamAndRows(t *testing.T) {
	be := New()
	r := rand.New(rand.NewPCG(6, 6))
	R, C := 5, 3
	p, g := randn(r, R*C, 1), randn(r, R*C, 1)
	m, v := randn(r, R*C, 0.1), make([]float32, R*C)
	for i := range v {
		v[i] = float32(r.Float64())
	}
	a := kernels.AdamArgs{LR: 0.01, Beta1: 0.9, Beta2: 0.997, Eps: 1e-9}
	p0, m0, v0 := append([]float32(nil), p...), append([]float32(nil), m...), append([]float32(nil), v...)
	be.AdamRows(kernels.FromF32(p, R, C), kernels.FromF32(g, R, C), kernels.FromF32(m, R, C), kernels.FromF32(v, R, C), kernels.FromI32([]int32{1, 4}, 2), a)
	for i := range p {
		row := i / C
		touched := row == 1 || row == 4
		mi := 0.9*float64(m0[i]) + 0.1*float64(g[i])
		vi := 0.997*float64(v0[i]) + 0.003*float64(g[i])*float64(g[i])
		pi := float64(p0[i]) - 0.01*mi/(math.Sqrt(vi)+1e-9)
		if !touched {
			mi, vi, pi = float64(m0[i]), float64(v0[i]), float64(p0[i])
		}
		if math.Abs(float64(p[i])-pi) > 1e-6 || math.Abs(float64(m[i])-mi) > 1e-6 || math.Abs(float64(v[i])-vi) > 1e-6 {
			t.Fatalf("row %d (touched %v): p %v m %v v %v, want %v %v %v", row, touched, p[i], m[i], v[i], pi, mi, vi)
		}
	}
}

func TestGemmTransposes(t *testing.T) {
	be := New()
	r := rand.New(rand.NewPCG(7, 7))
	M, N, K := 3, 4, 5
	for _, ta := range []bool{false, true} {
		for _, tb := range []bool{false, true} {
			a, b := randn(r, M*K, 1), randn(r, K*N, 1)
			c := randn(r, M*N, 1)
			c0 := append([]float32(nil), c...)
			at := kernels.FromF32(a, M, K)
			if ta {
				at = kernels.FromF32(a, K, M)
			}
			bt := kernels.FromF32(b, K, N)
			if tb {
				bt = kernels.FromF32(b, N, K)
			}
			be.Gemm(ta, tb, 2, at, bt, 0.5, kernels.FromF32(c, M, N))
			for i := 0; i < M; i++ {
				for j := 0; j < N; j++ {
					var s float64
					for p := 0; p < K; p++ {
						av, bv := a[i*K+p], b[p*N+j]
						if ta {
							av = a[p*M+i]
						}
						if tb {
							bv = b[j*K+p]
						}
						s += float64(av) * float64(bv)
					}
					want := 2*s + 0.5*float64(c0[i*N+j])
					if math.Abs(float64(c[i*N+j])-want) > 1e-4 {
						t.Fatalf("transA %v transB %v: C[%d,%d] = %v, want %v", ta, tb, i, j, c[i*N+j], want)
					}
				}
			}
		}
	}
}

func TestLogSoftmaxAndReductions(t *testing.T) {
	be := New()
	r := rand.New(rand.NewPCG(8, 8))
	N, V := 3, 1000
	x := randn(r, N*V, 5)
	out := make([]float32, len(x))
	be.LogSoftmax(kernels.FromF32(out, N, V), kernels.FromF32(x, N, V))
	for i := 0; i < N; i++ {
		mx := math.Inf(-1)
		for _, v := range x[i*V : (i+1)*V] {
			mx = math.Max(mx, float64(v))
		}
		var se float64
		for _, v := range x[i*V : (i+1)*V] {
			se += math.Exp(float64(v) - mx)
		}
		for j, v := range x[i*V : (i+1)*V] {
			want := float64(v) - mx - math.Log(se)
			if math.Abs(float64(out[i*V+j])-want) > 1e-5*(1+math.Abs(want)) {
				t.Fatalf("logsoftmax[%d,%d] = %v, want %v", i, j, out[i*V+j], want)
			}
		}
	}
	big := make([]float32, 1<<17)
	var ss float64
	for i := range big {
		big[i] = float32(i%7) - 3
		ss += float64(big[i]) * float64(big[i])
	}
	bt := kernels.FromF32(big, len(big))
	if got := be.SumSquares(bt); got != ss {
		t.Fatalf("SumSquares %v, want %v", got, ss)
	}
	if be.HasInfNaN(bt) {
		t.Fatal("finite tensor reported Inf/NaN")
	}
	big[99999] = float32(math.Inf(1))
	if !be.HasInfNaN(bt) {
		t.Fatal("Inf not found")
	}
	big[99999] = float32(math.NaN())
	if !be.HasInfNaN(bt) {
		t.Fatal("NaN not found")
	}
	y := []float32{1, 2, 3}
	be.Axpy(kernels.FromF32(y, 3), 2, kernels.FromF32([]float32{1, 1, -1}, 3))
	be.Scale(kernels.FromF32(y, 3), 0.5)
	if y[0] != 1.5 || y[1] != 2 || y[2] != 0.5 {
		t.Fatalf("Axpy/Scale: %v", y)
	}
}

func TestExpShift(t *testing.T) {
	src := make([]float32, 0, 20000)
	for x := float32(-95); x <= 0; x += 0.00493 {
		src = append(src, x)
	}
	src = append(src, 0)
	dst := make([]float32, len(src))
	sum := expShift(dst, src, 0)
	var ref float64
	for j, x := range src {
		want := math.Exp(float64(x))
		if x < -87 {
			want = 0
		}
		ref += want
		if math.Abs(float64(dst[j])-want) > 4e-7*want {
			t.Fatalf("exp(%v) = %v, want %v", x, dst[j], want)
		}
	}
	if math.Abs(float64(sum)-ref) > 1e-5*ref {
		t.Fatalf("sum %v, want %v", sum, ref)
	}
	if s2 := expShift(nil, src, 0); s2 != sum {
		t.Fatal("sum without dst differs")
	}
}
