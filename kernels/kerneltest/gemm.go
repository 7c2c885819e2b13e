package kerneltest

import (
	"fmt"
	"math"

	"github.com/gorun/gorun/kernels"
)

// gemm64 is C = alpha*op(A)*op(B) + beta*C for one m x n product in
// float64, with bound[i] = sum_k |alpha*a*b| + |beta*c| (the scale of its
// rounding error). A is stored m x k (k x m if ta), B k x n (n x k if tb),
// both row-major. beta == 0 does not read C (BLAS).
func gemm64(ta, tb bool, m, n, k int, alpha float64, a, b []float32, beta float64, c []float32, want, bound []float64) {
	for i := range m {
		for j := range n {
			var s, sa float64
			for p := range k {
				av := a[i*k+p]
				if ta {
					av = a[p*m+i]
				}
				bv := b[p*n+j]
				if tb {
					bv = b[j*k+p]
				}
				s += float64(av) * float64(bv)
				sa += math.Abs(float64(av) * float64(bv))
			}
			w, bd := alpha*s, math.Abs(alpha)*sa
			if beta != 0 {
				w += beta * float64(c[i*n+j])
				bd += math.Abs(beta * float64(c[i*n+j]))
			}
			want[i*n+j], bound[i*n+j] = w, bd
		}
	}
}

type gemmCase struct {
	name        string
	ta, tb      bool
	batch       []int // leading dimensions (none: 2-D)
	m, n, k     int
	alpha, beta float32
	nanC        bool // C starts as NaN (with beta == 0 it must not be read)
	view        string
	bcast       byte // 'A' or 'B': that operand one matrix (2-D) for the whole batch
}

func testGemm(e *env) {
	var cases []gemmCase
	for _, tr := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
		tn := fmt.Sprintf("transA=%v transB=%v", tr[0], tr[1])
		cases = append(cases,
			gemmCase{name: tn + " 7x33x100", ta: tr[0], tb: tr[1], m: 7, n: 33, k: 100, alpha: 2, beta: 0.5},
			gemmCase{name: tn + " 3x4x5", ta: tr[0], tb: tr[1], m: 3, n: 4, k: 5, alpha: 2, beta: 0.5},
			gemmCase{name: tn + " 1x1x1", ta: tr[0], tb: tr[1], m: 1, n: 1, k: 1, alpha: 1, beta: 1},
			gemmCase{name: tn + " 2x513x33 beta=0 NaN C", ta: tr[0], tb: tr[1], m: 2, n: 513, k: 33, alpha: -1.5, nanC: true},
			gemmCase{name: tn + " batched 3x7x9x33", ta: tr[0], tb: tr[1], batch: []int{3}, m: 7, n: 9, k: 33, alpha: 1, beta: 0.25},
			gemmCase{name: tn + " batched 2x3x5x17x8", ta: tr[0], tb: tr[1], batch: []int{2, 3}, m: 5, n: 17, k: 8, alpha: 0.7, beta: 0},
			// one input, several weight matrices (Q, K, V), and their
			// gradients accumulated
			gemmCase{name: tn + " one A for a batch of 3 7x9x33", ta: tr[0], tb: tr[1], batch: []int{3}, m: 7, n: 9, k: 33, alpha: 1, beta: 0, bcast: 'A'},
			gemmCase{name: tn + " one B for a batch of 2 5x17x8", ta: tr[0], tb: tr[1], batch: []int{2}, m: 5, n: 17, k: 8, alpha: 1, beta: 1, bcast: 'B'},
			gemmCase{name: tn + " one A for a batch of 2x3 4x6x10", ta: tr[0], tb: tr[1], batch: []int{2, 3}, m: 4, n: 6, k: 10, alpha: 0.5, beta: 1, bcast: 'A'},
		)
	}
	cases = append(cases,
		gemmCase{name: "100x100x100", m: 100, n: 100, k: 100, alpha: 1, beta: 1},
		gemmCase{name: "1x4097x7", m: 1, n: 4097, k: 7, alpha: 1, beta: 0},
		gemmCase{name: "33x1x4097", tb: true, m: 33, n: 1, k: 4097, alpha: 1, beta: -1},
		gemmCase{name: "k=0 beta=0.5", ta: true, m: 4, n: 7, k: 0, alpha: 1, beta: 0.5},
		gemmCase{name: "k=0 beta=0 NaN C", ta: true, m: 4, n: 7, k: 0, alpha: 1, beta: 0, nanC: true},
		gemmCase{name: "A rank 3 read as 2-D", m: 6, n: 9, k: 13, alpha: 1, beta: 0.5, view: "rank3"},
		gemmCase{name: "A and C row slices", m: 5, n: 33, k: 7, alpha: 1, beta: 1, view: "slice"},
		gemmCase{name: "transB A and C row slices", tb: true, m: 5, n: 33, k: 7, alpha: 1, beta: 1, view: "slice"},
	)
	for _, c := range cases {
		e.run(c.name, func() { gemmRun(e, c) })
	}
}

func gemmRun(e *env, c gemmCase) {
	batch := 1
	for _, d := range c.batch {
		batch *= d
	}
	m, n, k := c.m, c.n, c.k
	aDims, bDims := []int{m, k}, []int{k, n}
	if c.ta {
		aDims = []int{k, m}
	}
	if c.tb {
		bDims = []int{n, k}
	}
	with := func(d []int) []int { return append(append([]int(nil), c.batch...), d...) }
	na, nb := batch, batch // matrices of A and B
	aAt, bAt := m*k, k*n   // their strides in the reference
	switch c.bcast {
	case 'A':
		na, aAt = 1, 0
	case 'B':
		nb, bAt = 1, 0
	}
	av, bv := e.varied(na*m*k, 1), e.randn(nb*k*n, 1)
	cv := e.randn(batch*m*n, 1)
	if c.nanC {
		for i := range cv {
			cv[i] = float32(math.NaN())
		}
	}
	var at, bt, ct, cbig kernels.Tensor
	var cbase []float32
	if c.bcast == 'B' {
		bt = e.up(bv, bDims...)
	} else {
		bt = e.up(bv, with(bDims)...)
	}
	switch c.view {
	case "rank3": // A [2, m/2, k] read as m x k
		at = e.up(av, 2, m/2, k)
		ct = e.up(cv, m, n)
	case "slice": // A rows 3..3+m of a bigger tensor, C rows 2..2+m
		big := append(e.randn(3*k, 1), av...)
		big = append(big, e.randn(2*k, 1)...)
		at = e.up(big, m+5, k).RowSlice(3, 3+m)
		cbase = append(e.randn(2*n, 1), cv...)
		cbase = append(cbase, e.randn(4*n, 1)...)
		cbig = e.up(cbase, m+6, n)
		ct = cbig.RowSlice(2, 2+m)
	default:
		if c.bcast == 'A' {
			at = e.up(av, aDims...)
		} else {
			at = e.up(av, with(aDims)...)
		}
		ct = e.up(cv, with([]int{m, n})...)
	}
	e.be.Gemm(c.ta, c.tb, c.alpha, at, bt, c.beta, ct)
	want, bound := make([]float64, batch*m*n), make([]float64, batch*m*n)
	for i := range batch {
		gemm64(c.ta, c.tb, m, n, k, float64(c.alpha), av[i*aAt:], bv[i*bAt:], float64(c.beta), cv[i*m*n:], want[i*m*n:], bound[i*m*n:])
	}
	e.nearScale("C", e.down(ct), want, bound, e.tol.Gemm)
	if c.view == "slice" {
		got := e.down(cbig)
		e.exact("C rows before the slice", got[:2*n], cbase[:2*n])
		e.exact("C rows after the slice", got[(2+m)*n:], cbase[(2+m)*n:])
	}
}
