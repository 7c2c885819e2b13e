package kerneltest

import (
	"fmt"
	"math"

	"github.com/gorun/gorun/kernels"
)

// orthoRef orthonormalizes the [rows, cols] matrix x in place in float64,
// as kernels.Backend.Orthonormalize documents: modified Gram-Schmidt, left
// to right, each column's projection (on its unnormalized direction)
// subtracted from the later ones before it is divided by its norm plus
// eps; a column left with at most OrthoDropTol of its input norm is
// zeroed. It returns which columns were kept and, for each, the
// amplification of float32 rounding error that column's output suffers:
// a column left with a fraction f of its input norm comes out of the
// cancellation with its rounding errors (relative 2^-24 of its input,
// and those of the earlier columns' outputs, through the subtracted
// projections) multiplied by 1/f; amp[k] is 1/f of the worst kept column
// j <= k, times the number of kept columns up to k (the errors add up).
func orthoRef(x []float64, rows, cols int, eps float64) (kept []bool, amp []float64) {
	col := func(k int) func(r int) *float64 { return func(r int) *float64 { return &x[r*cols+k] } }
	norm := func(k int) float64 {
		var s float64
		c := col(k)
		for r := 0; r < rows; r++ {
			s += *c(r) * *c(r)
		}
		return math.Sqrt(s)
	}
	in := make([]float64, cols)
	for k := range in {
		in[k] = norm(k)
	}
	kept, amp = make([]bool, cols), make([]float64, cols)
	worst, nkept := 1.0, 0
	for j := 0; j < cols; j++ {
		nrm := norm(j)
		cj := col(j)
		if nrm <= kernels.OrthoDropTol*in[j] {
			for r := 0; r < rows; r++ {
				*cj(r) = 0
			}
			amp[j] = worst * float64(max(nkept, 1))
			continue
		}
		kept[j] = true
		nkept++
		worst = max(worst, in[j]/nrm)
		amp[j] = worst * float64(nkept)
		for k := j + 1; k < cols; k++ {
			ck := col(k)
			var d float64
			for r := 0; r < rows; r++ {
				d += *cj(r) * *ck(r)
			}
			d /= nrm * nrm
			for r := 0; r < rows; r++ {
				*ck(r) -= d * *cj(r)
			}
		}
		for r := 0; r < rows; r++ {
			*cj(r) /= nrm + eps
		}
	}
	return kept, amp
}

// gram returns the [cols, cols] matrix x^T x of one [rows, cols] matrix.
func gram(x []float64, rows, cols int) []float64 {
	g := make([]float64, cols*cols)
	for r := 0; r < rows; r++ {
		row := x[r*cols : r*cols+cols]
		for j, a := range row {
			for k, b := range row {
				g[j*cols+k] += a * b
			}
		}
	}
	return g
}

type orthoCase struct {
	name          string
	n, rows, cols int
	eps           float32
	// gen fills matrix b of the batch (row-major [rows, cols]); nil:
	// standard normal values.
	gen func(e *env, b int, m []float32)
	// zeroCols lists the columns that must come out zero in every matrix
	// (besides those the reference zeroes, which are checked anyway).
	zeroCols []int
}

// dependent makes column dup[i][0] a copy of the earlier column
// dup[i][1] (in order, so a copy of a copy is one too), column lin[i][0]
// the combination 3*c[lin[i][1]] - 0.5*c[lin[i][2]] of earlier ones, and
// the columns listed in zero zero.
func dependent(cols int, dup [][2]int, lin [][3]int, zero []int) func(*env, int, []float32) {
	return func(e *env, _ int, m []float32) {
		copy(m, e.randn(len(m), 1))
		rows := len(m) / cols
		for r := 0; r < rows; r++ {
			row := m[r*cols : r*cols+cols]
			for _, d := range dup {
				row[d[0]] = row[d[1]]
			}
			for _, l := range lin {
				row[l[0]] = 3*row[l[1]] - 0.5*row[l[2]]
			}
			for _, k := range zero {
				row[k] = 0
			}
		}
	}
}

func orthoCases() []orthoCase {
	var cs []orthoCase
	// The shapes: rows 1 and 7 have fewer rows than columns for some cols
	// (the columns beyond the rank must come out zero), 32768 is a
	// Transformer-base embedding's P (vocabulary rows) and needs many
	// blocks and loop iterations.
	for _, rows := range []int{1, 7, 1000, 32768} {
		for _, cols := range []int{1, 2, 4, 8} {
			cs = append(cs, orthoCase{name: "normal", n: 1, rows: rows, cols: cols, eps: 1e-8})
		}
	}
	rankDef := dependent(8, [][2]int{{2, 0}, {6, 2}}, [][3]int{{5, 1, 3}}, []int{7})
	cs = append(cs,
		orthoCase{name: "batch", n: 3, rows: 7, cols: 4, eps: 1e-8},
		orthoCase{name: "batch", n: 3, rows: 1000, cols: 8, eps: 1e-8},
		// A column equal to an earlier one (2 = 0, 6 = 2), a linear
		// combination (5 = 3*c1 - 0.5*c3), a zero column (7).
		orthoCase{name: "rank-deficient", n: 1, rows: 1000, cols: 8, eps: 1e-8, gen: rankDef, zeroCols: []int{2, 5, 6, 7}},
		orthoCase{name: "rank-deficient", n: 1, rows: 32768, cols: 8, eps: 1e-8, gen: rankDef, zeroCols: []int{2, 5, 6, 7}},
		orthoCase{name: "duplicate first column", n: 1, rows: 513, cols: 2, eps: 1e-8, gen: dependent(2, [][2]int{{1, 0}}, nil, nil), zeroCols: []int{1}},
		orthoCase{name: "all zero", n: 1, rows: 1000, cols: 4, eps: 1e-8, gen: func(*env, int, []float32) {}, zeroCols: []int{0, 1, 2, 3}},
		orthoCase{name: "all zero", n: 1, rows: 1, cols: 1, eps: 1e-8, gen: func(*env, int, []float32) {}, zeroCols: []int{0}},
		// The matrices of a batch are independent: a rank-deficient one, an
		// all-zero one and a normal one, 2048 rows each.
		orthoCase{name: "mixed batch", n: 3, rows: 2048, cols: 8, eps: 1e-8, gen: func(e *env, b int, m []float32) {
			switch b {
			case 0:
				rankDef(e, b, m)
			case 2:
				copy(m, e.randn(len(m), 1))
			}
		}},
		// Column norms spread over six decades: the drop rule is relative,
		// and so is the accuracy.
		orthoCase{name: "column scales 1e-3..1e3", n: 1, rows: 2048, cols: 8, eps: 1e-8, gen: func(e *env, _ int, m []float32) {
			cols := 8
			s := make([]float64, cols)
			for k := range s {
				s[k] = math.Pow(10, 6*e.rng.Float64()-3)
			}
			for i := range m {
				m[i] = float32(e.rng.NormFloat64() * s[i%cols])
			}
		}},
		// Nearly dependent but kept: column 1 is column 0 plus 1e-2 of
		// noise, column 3 column 2 plus 1e-3: the cancellation multiplies
		// rounding errors by about 100 and 1000.
		orthoCase{name: "nearly dependent", n: 1, rows: 1000, cols: 4, eps: 1e-8, gen: func(e *env, _ int, m []float32) {
			copy(m, e.randn(len(m), 1))
			for r := 0; r < len(m)/4; r++ {
				m[r*4+1] = m[r*4] + float32(1e-2*e.rng.NormFloat64())
				m[r*4+3] = m[r*4+2] + float32(1e-3*e.rng.NormFloat64())
			}
		}},
		// eps comparable to the norms: columns come out shorter than 1.
		orthoCase{name: "large eps", n: 1, rows: 7, cols: 2, eps: 1e-3, gen: func(e *env, _ int, m []float32) { copy(m, e.randn(len(m), 1e-3)) }},
		orthoCase{name: "large eps", n: 2, rows: 1000, cols: 4, eps: 1, gen: func(e *env, _ int, m []float32) { copy(m, e.randn(len(m), 0.01)) }},
	)
	return cs
}

// testOrthonormalize checks Orthonormalize against orthoRef on each
// matrix. Output column k of a matrix is allowed tol.Ortho * amp[k] (see
// orthoRef) of |want| + the column's root mean square: the float32 result
// differs from the float64 one by the rounding of float32 storage,
// amplified by the cancellation in the subtracted projections (amp is
// 1..8 for the random full-rank cases, up to about 2000 for "nearly
// dependent"). The CPU backend's worst error is 4.4e-8 of that scale
// (about one unit in the last place of the output), whatever the case;
// FP32's 1e-6 leaves 20x for other float64 summation orders, while sums
// in float32 (off by about sqrt(rows)*2^-24, 1e-5 for 32768 rows) fail
// it. Columns the reference zeroes must be exactly zero (the drop rule
// sets them to 0, no rounding involved), and no output may be NaN or
// infinite. Then the Gram matrix P^T P of the output must be that of the
// reference (the identity, but for zeroed columns and (n/(n+eps))^2 on the
// diagonal) within tol.Ortho times twice the larger amp of the two
// columns.
func testOrthonormalize(e *env) {
	for _, c := range orthoCases() {
		e.run(fmt.Sprintf("%s n=%d rows=%d cols=%d eps=%g", c.name, c.n, c.rows, c.cols, c.eps), func() {
			m := c.rows * c.cols
			x := make([]float32, c.n*m)
			for b := 0; b < c.n; b++ {
				if c.gen == nil {
					copy(x[b*m:], e.randn(m, 1))
				} else {
					c.gen(e, b, x[b*m:(b+1)*m])
				}
			}
			dims := []int{c.rows, c.cols}
			if c.n > 1 {
				dims = []int{c.n, c.rows, c.cols}
			}
			p := e.up(x, dims...)
			e.be.Orthonormalize(p, c.eps)
			got := e.down(p)
			for b := 0; b < c.n; b++ {
				what := "p"
				if c.n > 1 {
					what = fmt.Sprintf("p[%d]", b)
				}
				e.checkOrtho(what, got[b*m:(b+1)*m], x[b*m:(b+1)*m], c)
			}
		})
	}
}

func (e *env) checkOrtho(what string, got, in []float32, c orthoCase) {
	e.t.Helper()
	rows, cols := c.rows, c.cols
	for i, v := range got {
		if v != v || math.IsInf(float64(v), 0) {
			e.errorf("%s[%d, %d] = %g", what, i/cols, i%cols, v)
			return
		}
	}
	want := to64(in)
	kept, amp := orthoRef(want, rows, cols, float64(c.eps))
	for _, k := range c.zeroCols {
		if kept[k] {
			panic(fmt.Sprintf("kerneltest: the reference keeps column %d of %s, which the case makes dependent", k, c.name))
		}
	}
	// The reference itself: orthogonal to float64 rounding.
	gw := gram(want, rows, cols)
	for j := 0; j < cols; j++ {
		for k := 0; k < cols; k++ {
			if j != k && math.Abs(gw[j*cols+k]) > 1e-9 {
				panic(fmt.Sprintf("kerneltest: reference columns %d and %d of %s have dot product %g", j, k, c.name, gw[j*cols+k]))
			}
		}
	}
	tol := e.tol.Ortho
	scale := make([]float64, len(want))
	colRMS := make([]float64, cols)
	for i, w := range want {
		colRMS[i%cols] += w * w
	}
	for k := range colRMS {
		colRMS[k] = math.Sqrt(colRMS[k] / float64(rows))
	}
	for i, w := range want {
		k := i % cols
		if kept[k] {
			scale[i] = amp[k] * (math.Abs(w) + colRMS[k])
		}
	}
	e.nearScale(what, got, want, scale, tol)
	gg := gram(to64(got), rows, cols)
	gs := make([]float64, len(gg))
	for j := 0; j < cols; j++ {
		for k := 0; k < cols; k++ {
			gs[j*cols+k] = 2 * max(amp[j], amp[k])
		}
	}
	g32 := make([]float32, len(gg))
	for i, v := range gg {
		g32[i] = float32(v)
	}
	e.nearScale(what+"^T "+what, g32, gw, gs, tol)
}
