package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// gemmCase is one Sgemm call; the stored matrices get extra columns when the
// leading dimensions exceed the logical widths.
type gemmCase struct {
	transA, transB bool
	m, n, k        int
	alpha, beta    float32
	padA, padB     int // lda - stored columns, ldb - stored columns
	padC           int
}

func (tc gemmCase) String() string {
	t := func(b bool) string {
		if b {
			return "T"
		}
		return "N"
	}
	return fmt.Sprintf("%s%s_m%d_n%d_k%d_a%g_b%g_pad%d.%d.%d", t(tc.transA), t(tc.transB), tc.m, tc.n, tc.k, tc.alpha, tc.beta, tc.padA, tc.padB, tc.padC)
}

func randSlice(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = r.Float32()*2 - 1
	}
	return s
}

// stored returns rows, cols and the leading dimension of a matrix whose op()
// is r x c.
func stored(trans bool, r, c, pad int) (int, int, int) {
	if trans {
		r, c = c, r
	}
	return r, c, max(c+pad, 1)
}

func size(rows, cols, ld int) int {
	if rows == 0 {
		return 0
	}
	return (rows-1)*ld + cols
}

func gonumTrans(t bool) blas.Transpose {
	if t {
		return blas.Trans
	}
	return blas.NoTrans
}

// errBound is, for each element of C, sum_p |alpha*opA[i][p]*opB[p][j]| +
// |beta*C[i][j]|: floating-point error of any summation order is at most
// about k*eps times it.
func errBound(tc gemmCase, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) []float64 {
	bound := make([]float64, tc.m*tc.n)
	for i := 0; i < tc.m; i++ {
		for j := 0; j < tc.n; j++ {
			var s float64
			for p := 0; p < tc.k; p++ {
				var av, bv float32
				if tc.transA {
					av = a[p*lda+i]
				} else {
					av = a[i*lda+p]
				}
				if tc.transB {
					bv = b[j*ldb+p]
				} else {
					bv = b[p*ldb+j]
				}
				s += math.Abs(float64(av) * float64(bv))
			}
			s *= math.Abs(float64(tc.alpha))
			if tc.beta != 0 {
				s += math.Abs(float64(tc.beta) * float64(c[i*ldc+j]))
			}
			bound[i*tc.n+j] = s
		}
	}
	return bound
}

// checkCase runs tc through Sgemm and gonum's Sgemm and compares all of C,
// including the elements between rows that must stay untouched.
func checkCase(t *testing.T, r *rand.Rand, tc gemmCase, nanC bool) {
	t.Helper()
	ar, ac, lda := stored(tc.transA, tc.m, tc.k, tc.padA)
	br, bc, ldb := stored(tc.transB, tc.k, tc.n, tc.padB)
	ldc := max(tc.n+tc.padC, 1)
	a := randSlice(r, size(ar, ac, lda))
	b := randSlice(r, size(br, bc, ldb))
	c := randSlice(r, tc.m*ldc)
	if nanC {
		for i := range c {
			c[i] = float32(math.NaN())
		}
	}
	// Elements outside the m x n view are sentinels that must survive.
	const sentinel = 12345.5
	for i := 0; i < tc.m; i++ {
		for j := tc.n; j < ldc; j++ {
			c[i*ldc+j] = sentinel
		}
	}
	want := append([]float32(nil), c...)
	bound := errBound(tc, a, lda, b, ldb, c, ldc)
	gonum.Implementation{}.Sgemm(gonumTrans(tc.transA), gonumTrans(tc.transB), tc.m, tc.n, tc.k, tc.alpha, a, max(lda, 1), b, max(ldb, 1), tc.beta, want, max(ldc, 1))
	Sgemm(tc.transA, tc.transB, tc.m, tc.n, tc.k, tc.alpha, a, lda, b, ldb, tc.beta, c, ldc)

	eps := float64(math.Nextafter32(1, 2) - 1)
	bad := 0
	for i := 0; i < tc.m; i++ {
		for j := 0; j < ldc; j++ {
			got, w := c[i*ldc+j], want[i*ldc+j]
			if j >= tc.n {
				if got != sentinel {
					t.Errorf("%v: C[%d][%d] outside the matrix changed to %v", tc, i, j, got)
					return
				}
				continue
			}
			tol := 2*float64(tc.k+2)*eps*bound[i*tc.n+j] + 1e-30
			if math.IsNaN(float64(got)) || math.Abs(float64(got)-float64(w)) > tol {
				if bad < 3 {
					t.Errorf("%v: C[%d][%d] = %v, gonum %v (tol %.3g)", tc, i, j, got, w, tol)
				}
				bad++
			}
		}
	}
	if bad > 0 {
		t.Errorf("%v: %d of %d elements differ", tc, bad, tc.m*tc.n)
	}
}

// withKernel runs f with each available micro-kernel selected in turn.
func withKernel(t *testing.T, f func(t *testing.T)) {
	for _, name := range SgemmKernels() {
		t.Run(name, func(t *testing.T) {
			prev, err := SetSgemmKernel(name)
			if err != nil {
				t.Fatal(err)
			}
			defer SetSgemmKernel(prev)
			if got := SgemmKernel(); got != name {
				t.Fatalf("SgemmKernel() = %q after selecting %q", got, name)
			}
			f(t)
		})
	}
}

var transposes = [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}}

func TestSgemmSmallShapes(t *testing.T) {
	dims := []int{1, 7, 63, 65}
	withKernel(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(1, 2))
		for _, tr := range transposes {
			for _, m := range dims {
				for _, n := range dims {
					for _, k := range dims {
						tc := gemmCase{transA: tr[0], transB: tr[1], m: m, n: n, k: k, alpha: 1, beta: 0}
						// Vary alpha, beta and the strides across shapes.
						switch (m + 2*n + 3*k) % 4 {
						case 1:
							tc.alpha, tc.beta, tc.padA, tc.padC = -1.5, 0.25, 3, 1
						case 2:
							tc.alpha, tc.beta, tc.padB = 0.5, 1, 5
						case 3:
							tc.beta, tc.padA, tc.padB, tc.padC = 2, 1, 2, 17
						}
						checkCase(t, r, tc, false)
					}
				}
			}
		}
	})
}

func TestSgemm513(t *testing.T) {
	// 513 in each dimension in turn; the full cross product would be slow.
	shapes := [][3]int{{513, 7, 65}, {65, 513, 7}, {7, 65, 513}, {513, 65, 63}, {63, 513, 65}, {65, 63, 513}}
	if !testing.Short() {
		shapes = append(shapes, [3]int{513, 513, 513})
	}
	withKernel(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(3, 4))
		for i, s := range shapes {
			for _, tr := range transposes {
				tc := gemmCase{transA: tr[0], transB: tr[1], m: s[0], n: s[1], k: s[2], alpha: 0.75, beta: 0.5, padA: i, padB: 2 * i, padC: 3}
				checkCase(t, r, tc, false)
			}
		}
	})
}

func TestSgemmBetaZeroOverwritesNaN(t *testing.T) {
	withKernel(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(5, 6))
		for _, tr := range transposes {
			for _, s := range [][3]int{{1, 1, 1}, {7, 63, 65}, {65, 65, 7}, {130, 70, 600}} {
				tc := gemmCase{transA: tr[0], transB: tr[1], m: s[0], n: s[1], k: s[2], alpha: 1.25, beta: 0, padC: 2}
				checkCase(t, r, tc, true)
			}
		}
	})
}

func TestSgemmAlphaZeroAndEmpty(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	// alpha == 0 and k == 0 reduce to C = beta*C.
	for _, tc := range []gemmCase{
		{m: 7, n: 9, k: 5, alpha: 0, beta: 0.5},
		{m: 7, n: 9, k: 5, alpha: 0, beta: 0},
		{m: 7, n: 9, k: 0, alpha: 1, beta: 3},
		{m: 7, n: 9, k: 0, alpha: 1, beta: 1},
	} {
		checkCase(t, r, tc, false)
	}
	// beta == 0 with alpha == 0 must clear NaN too.
	c := []float32{float32(math.NaN()), float32(math.Inf(1))}
	Sgemm(false, false, 1, 2, 3, 0, make([]float32, 3), 3, make([]float32, 6), 2, 0, c, 2)
	if c[0] != 0 || c[1] != 0 {
		t.Errorf("alpha=0 beta=0: C = %v, want zeros", c)
	}
	// Empty shapes touch nothing.
	Sgemm(false, false, 0, 5, 5, 1, nil, 5, make([]float32, 25), 5, 0, nil, 5)
	Sgemm(false, false, 5, 0, 5, 1, make([]float32, 25), 5, nil, 1, 0, nil, 1)
}

func TestSgemmThreads(t *testing.T) {
	// Odd thread counts and shapes where rows, columns or both are split.
	defer SetThreads(SetThreads(0))
	r := rand.New(rand.NewPCG(9, 10))
	for _, nt := range []int{1, 2, 3, 4} {
		SetThreads(nt)
		if got := Threads(); got != nt {
			t.Fatalf("Threads() = %d after SetThreads(%d)", got, nt)
		}
		for _, s := range [][3]int{{300, 70, 130}, {20, 700, 100}, {97, 97, 97}, {1, 2000, 64}, {2000, 1, 64}} {
			for _, tr := range transposes {
				checkCase(t, r, gemmCase{transA: tr[0], transB: tr[1], m: s[0], n: s[1], k: s[2], alpha: 1, beta: 0.5, padA: 1, padC: 2}, false)
			}
		}
	}
}

func TestSgemmStrided(t *testing.T) {
	defer SetThreads(SetThreads(0))
	withKernel(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(11, 12))
		for _, nt := range []int{1, 3} {
			SetThreads(nt)
			for _, s := range []struct {
				batch, m, n, k int
				transA, transB bool
			}{
				{8, 32, 32, 64, false, true},  // scores = Q K^T per head
				{8, 32, 64, 32, false, false}, // context = P V per head
				{5, 7, 65, 63, true, false},
				{3, 1, 1, 1, true, true},
				{2, 200, 160, 200, false, false}, // large enough to split each matrix
			} {
				ar, ac, lda := stored(s.transA, s.m, s.k, 1)
				br, bc, ldb := stored(s.transB, s.k, s.n, 0)
				ldc := s.n + 2
				sa, sb, sc := size(ar, ac, lda)+3, size(br, bc, ldb), s.m*ldc+1
				a := randSlice(r, s.batch*sa)
				b := randSlice(r, s.batch*sb)
				c := randSlice(r, s.batch*sc)
				want := append([]float32(nil), c...)
				for i := 0; i < s.batch; i++ {
					gonum.Implementation{}.Sgemm(gonumTrans(s.transA), gonumTrans(s.transB), s.m, s.n, s.k, 0.5, a[i*sa:], lda, b[i*sb:], ldb, 2, want[i*sc:], ldc)
				}
				SgemmStrided(s.batch, s.transA, s.transB, s.m, s.n, s.k, 0.5, a, lda, sa, b, ldb, sb, 2, c, ldc, sc)
				tol := float64(s.k+2) * 1e-6 * 4
				for i := range c {
					if math.Abs(float64(c[i]-want[i])) > tol {
						t.Fatalf("batch %+v threads %d: c[%d] = %v, gonum %v", s, nt, i, c[i], want[i])
					}
				}
			}
		}
	})
}

// TestSgemmKernelsAgree compares each assembly micro-kernel with the pure Go
// one directly, tile by tile, including the beta and overwrite paths.
func TestSgemmKernelsAgree(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for _, im := range sgemmImpls {
		for _, kc := range []int{1, 3, 4, 5, 64, 257} {
			a := randSlice(r, kc*im.mr)
			b := randSlice(r, kc*im.nr)
			ldc := im.nr + 3
			c0 := randSlice(r, im.mr*ldc)
			for _, ow := range []int{0, 1} {
				got := append([]float32(nil), c0...)
				im.fn(kc, &a[0], &b[0], &got[0], ldc, -0.5, ow)
				for i := 0; i < im.mr; i++ {
					for j := 0; j < ldc; j++ {
						if j >= im.nr {
							if got[i*ldc+j] != c0[i*ldc+j] {
								t.Fatalf("%s kc=%d: wrote outside the tile at %d,%d", im.name, kc, i, j)
							}
							continue
						}
						var s float64
						for p := 0; p < kc; p++ {
							s += float64(a[p*im.mr+i]) * float64(b[p*im.nr+j])
						}
						if ow == 0 {
							s += -0.5 * float64(c0[i*ldc+j])
						}
						if d := math.Abs(s - float64(got[i*ldc+j])); d > float64(kc+2)*1e-6 {
							t.Fatalf("%s kc=%d overwrite=%d: C[%d][%d] = %v, want %v", im.name, kc, ow, i, j, got[i*ldc+j], s)
						}
					}
				}
			}
		}
	}
}

func TestSgemmSelectKernel(t *testing.T) {
	names := SgemmKernels()
	if names[len(names)-1] != "go" {
		t.Fatalf("SgemmKernels() = %v, want the pure Go kernel last", names)
	}
	prev, err := SetSgemmKernel("go")
	if err != nil {
		t.Fatal(err)
	}
	defer SetSgemmKernel(prev)
	if _, err := SetSgemmKernel("no-such-kernel"); err == nil || !strings.Contains(err.Error(), "no-such-kernel") {
		t.Errorf("SetSgemmKernel(bogus) error = %v", err)
	}
	if SgemmKernel() != "go" {
		t.Errorf("a failed SetSgemmKernel changed the kernel to %q", SgemmKernel())
	}
	if _, err := SetSgemmKernel("auto"); err != nil || SgemmKernel() != names[0] {
		t.Errorf("auto selected %q (err %v), want %q", SgemmKernel(), err, names[0])
	}
}

func TestSgemmBadArgumentsPanic(t *testing.T) {
	for _, tc := range []struct {
		name string
		call func()
		want string
	}{
		{"short a", func() {
			Sgemm(false, false, 4, 4, 4, 1, make([]float32, 15), 4, make([]float32, 16), 4, 0, make([]float32, 16), 4)
		}, "a has 15 elements"},
		{"small ldb", func() {
			Sgemm(false, true, 4, 4, 4, 1, make([]float32, 16), 4, make([]float32, 16), 3, 0, make([]float32, 16), 4)
		}, "ldb=3"},
		{"short c", func() {
			Sgemm(false, false, 4, 4, 4, 1, make([]float32, 16), 4, make([]float32, 16), 4, 0, make([]float32, 10), 4)
		}, "c has 10"},
		{"negative", func() { Sgemm(false, false, -1, 4, 4, 1, nil, 4, nil, 4, 0, nil, 4) }, "negative dimension"},
		{"strided short", func() {
			SgemmStrided(3, false, false, 2, 2, 2, 1, make([]float32, 12), 2, 4, make([]float32, 12), 2, 4, 0, make([]float32, 11), 2, 4)
		}, "c has"},
	} {
		func() {
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(fmt.Sprint(r), tc.want) {
					t.Errorf("%s: panic %v, want one containing %q", tc.name, r, tc.want)
				}
			}()
			tc.call()
		}()
	}
}

func TestSgemmNoAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts are checked in the full run")
	}
	r := rand.New(rand.NewPCG(15, 16))
	m, n, k := 256, 256, 256
	a, b, c := randSlice(r, m*k), randSlice(r, k*n), make([]float32, m*n)
	for _, nt := range []int{1, 2} {
		prev := SetThreads(nt)
		allocs := testing.AllocsPerRun(20, func() {
			Sgemm(false, false, m, n, k, 1, a, k, b, n, 0, c, n)
			SgemmStrided(4, false, true, 64, 64, 64, 1, a, k, 64*k, b, k, 64*k, 0, c, n, 64*n)
		})
		SetThreads(prev)
		if allocs != 0 {
			t.Errorf("threads %d: %v allocations per call, want 0", nt, allocs)
		}
	}
}

// TestSgemmPackers compares the AVX-512 packing loops with the Go ones for
// the panel widths of every kernel, partial panels and both layouts. The
// results must be identical: both round alpha*x once.
func TestSgemmPackers(t *testing.T) {
	if !hasPackAVX512 {
		t.Skip("CPU without AVX-512F: only the Go packers exist")
	}
	r := rand.New(rand.NewPCG(17, 18))
	for _, w := range []int{4, 6, 12, 16, 32} {
		for _, trans := range []bool{false, true} {
			for _, s := range [][2]int{{1, 1}, {w, 16}, {2*w + 3, 17}, {w - 1, 33}, {3*w + 1, 5}} {
				rows, kc := max(s[0], 1), s[1]
				ld := rows + kc + 3
				src := randSlice(r, (rows+kc+3)*ld)
				panels := (rows + w - 1) / w
				// dst has room for the panels plus a guard zone.
				want := randSlice(r, panels*w*kc+8)
				got := append([]float32(nil), want...)
				packA(want, w, trans, src, ld, 1, rows, 2, kc, -0.75)
				packAAsm(got, w, trans, src, ld, 1, rows, 2, kc, -0.75)
				for i := range want {
					if got[i] != want[i] {
						t.Fatalf("packA w=%d trans=%v rows=%d kc=%d: [%d] = %v, Go packer %v", w, trans, rows, kc, i, got[i], want[i])
					}
				}
				packB(want, w, trans, src, ld, 2, kc, 1, rows)
				packBAsm(got, w, trans, src, ld, 2, kc, 1, rows)
				for i := range want {
					if got[i] != want[i] {
						t.Fatalf("packB w=%d trans=%v cols=%d kc=%d: [%d] = %v, Go packer %v", w, trans, rows, kc, i, got[i], want[i])
					}
				}
			}
		}
	}
}
