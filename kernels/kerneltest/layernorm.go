package kerneltest

import (
	"fmt"
	"math"

	"github.com/gorun/gorun/kernels"
)

// ln64 is LayerNorm over rows of d in float64: y, mean and rstd.
func ln64(x, g, b []float64, d int, eps float64) (y, mean, rstd []float64) {
	rows := len(x) / d
	y, mean, rstd = make([]float64, len(x)), make([]float64, rows), make([]float64, rows)
	for r := range rows {
		row := x[r*d : r*d+d]
		var m, v float64
		for _, a := range row {
			m += a
		}
		m /= float64(d)
		for _, a := range row {
			v += (a - m) * (a - m)
		}
		v /= float64(d)
		rs := 1 / math.Sqrt(v+eps)
		mean[r], rstd[r] = m, rs
		for j, a := range row {
			y[r*d+j] = (a-m)*rs*g[j] + b[j]
		}
	}
	return y, mean, rstd
}

// lnBwd64 is LayerNorm's backward in float64 at the saved mean and rstd:
// the gradients of sum(dy*y) with respect to x, gamma and beta.
func lnBwd64(dy, x, mean, rstd, g []float64, d int) (dx, dg, db []float64) {
	dx, dg, db = make([]float64, len(x)), make([]float64, d), make([]float64, d)
	for r := range len(x) / d {
		var a, c float64 // mean of dy*g, mean of dy*g*n
		for j := range d {
			n := (x[r*d+j] - mean[r]) * rstd[r]
			a += dy[r*d+j] * g[j]
			c += dy[r*d+j] * g[j] * n
			dg[j] += dy[r*d+j] * n
			db[j] += dy[r*d+j]
		}
		a /= float64(d)
		c /= float64(d)
		for j := range d {
			n := (x[r*d+j] - mean[r]) * rstd[r]
			dx[r*d+j] = rstd[r] * (dy[r*d+j]*g[j] - a - n*c)
		}
	}
	return dx, dg, db
}

type lnCase struct {
	rows, d int
	offset  float64 // added to x: the variance must not cancel
	mixed   bool    // magnitudes spread within each row too
	eps     float32
}

func lnCases() []lnCase {
	var cs []lnCase
	for i, s := range rowShapes {
		cs = append(cs, lnCase{rows: s[0], d: s[1], eps: []float32{1e-6, 1e-5}[i%2]})
	}
	return append(cs,
		lnCase{rows: 5, d: 7, eps: 1e-6},
		lnCase{rows: 4, d: 9, eps: 1e-6},
		lnCase{rows: 50, d: 33, offset: 3, eps: 1e-6},
		lnCase{rows: 4, d: 100, offset: 30, eps: 1e-6}, // a one-pass variance fails here
		lnCase{rows: 3, d: 4097, offset: 3, eps: 1e-6},
		lnCase{rows: 6, d: 513, mixed: true, eps: 1e-6},
		// enough rows that a GPU's parameter gradients run in splits of
		// the rows (kernels/cuda's column reductions), some columns past
		// the last full block of 32
		lnCase{rows: 1500, d: 40, eps: 1e-6},
	)
}

func (c lnCase) String() string {
	return fmt.Sprintf("%dx%d offset=%g mixed=%v eps=%g", c.rows, c.d, c.offset, c.mixed, c.eps)
}

// input draws x: each row at its own scale (10^-2 to 10^2).
func (c lnCase) input(e *env) []float32 {
	x := make([]float32, c.rows*c.d)
	for r := range c.rows {
		sc := math.Pow(10, 4*e.rng.Float64()-2)
		var row []float32
		if c.mixed {
			row = e.varied(c.d, sc)
		} else {
			row = e.randn(c.d, sc)
		}
		for j, v := range row {
			x[r*c.d+j] = float32(float64(v) + c.offset*sc)
		}
	}
	return e.act(x)
}

func testLayerNorm(e *env) {
	for _, c := range lnCases() {
		e.run(c.String(), func() {
			x, g, b := c.input(e), e.randn(c.d, 1), e.randn(c.d, 1)
			y, mean, rstd := e.alloc(f32, c.rows, c.d), e.up(e.randn(c.rows, 1), c.rows), e.up(e.randn(c.rows, 1), c.rows)
			e.be.LayerNorm(y, mean, rstd, e.up(x, c.rows, c.d), e.up(g, c.d), e.up(b, c.d), c.eps)
			e.checkLayerNorm(c, x, g, b, y, mean, rstd)
		})
	}
}

// checkLayerNorm checks y, mean and rstd, a LayerNorm of x with gamma g and
// beta b, against the float64 reference.
func (e *env) checkLayerNorm(c lnCase, x, g, b []float32, y, mean, rstd kernels.Tensor) {
	e.t.Helper()
	wy, wm, wr := ln64(to64(x), to64(g), to64(b), c.d, float64(c.eps))
	// y against the size of the terms of (x-mean)*rstd*g + b: x-mean
	// cancels when the mean is large, and the rounding of x and
	// mean then shows in y.
	scale := make([]float64, len(x))
	ys := make([]float64, len(x))
	for i, v := range x {
		r, j := i/c.d, i%c.d
		ys[i] = (math.Abs(float64(v))+math.Abs(wm[r]))*wr[r]*math.Abs(float64(g[j])) + math.Abs(float64(b[j]))
	}
	floor := rms(ys)
	for i := range scale {
		scale[i] = ys[i] + floor
	}
	e.nearScale("y", e.down(y), wy, scale, e.tol.F32)
	// mean: against the spread of its row
	scale = make([]float64, c.rows)
	for r := range scale {
		scale[r] = math.Abs(wm[r]) + math.Sqrt(max(1/(wr[r]*wr[r])-float64(c.eps), 0))
	}
	e.nearScale("mean", e.down(mean), wm, scale, e.tol.F32)
	for r := range scale {
		scale[r] = wr[r]
	}
	e.nearScale("rstd", e.down(rstd), wr, scale, e.tol.F32)
}

// ResidualDropoutLayerNorm is ResidualDropout (or Dropout, without a
// residual) then LayerNorm: out against the float64 dropout (the dropped
// elements exactly the residual), y, mean and rstd against the float64
// layer norm of out as stored, and all four bit for bit against the two
// ops run one after the other on the same backend. out aliases the
// residual, or x, or neither; views at odd offsets (not 4-byte aligned in
// 16 bits).
func testResidualDropoutLayerNorm(e *env) {
	type rdlCase struct {
		lnCase
		p     float32
		seed  uint64
		res   bool   // with a residual
		alias string // "res": out is res; "x": out is x
		view  bool   // res, x, out views at offsets 1, 3, 5 of bigger tensors
	}
	var cs []rdlCase
	for i, c := range lnCases() {
		cs = append(cs, rdlCase{lnCase: c, p: []float32{0.1, 0, 0.3}[i%3], seed: uint64(200 + i), res: i%4 != 3,
			alias: []string{"", "res", "x"}[i%3], view: i%5 == 2})
	}
	cs = append(cs,
		rdlCase{lnCase: lnCase{rows: 8, d: 64, eps: 1e-6}, p: 0.1, seed: 0xFFFFFFFFFFFFFFF0, res: true},
		rdlCase{lnCase: lnCase{rows: 5, d: 33, eps: 1e-6}, p: 0.2, seed: 9, res: false, alias: "x", view: true},
	)
	for _, c := range cs {
		e.run(fmt.Sprintf("%v p=%g seed=%#x res=%v alias=%q view=%v", c.lnCase, c.p, c.seed, c.res, c.alias, c.view), func() {
			n := c.rows * c.d
			res, x, g, b := c.input(e), e.nonzero(n), e.randn(c.d, 1), e.randn(c.d, 1)
			place := func(v []float32, off int) kernels.Tensor {
				if !c.view {
					return e.up(v, c.rows, c.d)
				}
				big := e.up(append(append(e.randn(off, 1), v...), e.randn(2, 1)...), off+n+2)
				return big.Slice(off, c.rows, c.d)
			}
			var rest kernels.Tensor
			var base []float32
			if c.res {
				rest, base = place(res, 1), res
			}
			xt := place(x, 3)
			out := place(e.randn(n, 1), 5)
			switch {
			case c.alias == "res" && c.res:
				out = rest
			case c.alias == "x":
				out = xt
			}
			y, mean, rstd := e.alloc(f32, c.rows, c.d), e.alloc(f32, c.rows), e.alloc(f32, c.rows)
			gt, bt := e.up(g, c.d), e.up(b, c.d)
			e.be.ResidualDropoutLayerNorm(out, y, mean, rstd, rest, xt, gt, bt, c.p, c.seed, c.eps)
			gout := e.down(out)
			e.checkDrop("out", gout, base, x, c.p, c.seed)
			e.checkLayerNorm(c.lnCase, gout, g, b, y, mean, rstd)
			// the two ops one after the other
			out2, y2, mean2, rstd2 := e.alloc(f32, c.rows, c.d), e.alloc(f32, c.rows, c.d), e.alloc(f32, c.rows), e.alloc(f32, c.rows)
			if c.res {
				e.be.ResidualDropout(out2, e.up(res, c.rows, c.d), e.up(x, c.rows, c.d), c.p, c.seed)
			} else {
				e.be.Dropout(out2, e.up(x, c.rows, c.d), c.p, c.seed)
			}
			e.be.LayerNorm(y2, mean2, rstd2, out2, gt, bt, c.eps)
			e.exact("out against ResidualDropout", gout, e.down(out2))
			e.exact("y against ResidualDropout then LayerNorm", e.down(y), e.down(y2))
			e.bits("mean against LayerNorm", e.down(mean), e.down(mean2))
			e.bits("rstd against LayerNorm", e.down(rstd), e.down(rstd2))
		})
	}
}

func testLayerNormBackward(e *env) {
	for _, c := range lnCases() {
		e.run(c.String(), func() {
			x, g, b := c.input(e), e.randn(c.d, 1), e.randn(c.d, 1)
			x64, g64, b64 := to64(x), to64(g), to64(b)
			_, m64, r64 := ln64(x64, g64, b64, c.d, float64(c.eps))
			// the saved statistics as the forward stores them (float32)
			mean, rstd := f32s(m64), f32s(r64)
			dy := e.varied(c.rows*c.d, 1)
			// Accumulation: dx, dgamma and dbeta start from values of the
			// gradients' size.
			wdx, wdg, wdb := lnBwd64(to64(dy), x64, to64(mean), to64(rstd), g64, c.d)
			dx0, dg0, db0 := e.randn(len(x), rms(wdx)), e.randn(c.d, rms(wdg)), e.randn(c.d, rms(wdb))
			dx, dg, db := e.up(dx0, c.rows, c.d), e.up(dg0, c.d), e.up(db0, c.d)
			e.be.LayerNormBackward(dx, dg, db, e.up(dy, c.rows, c.d), e.up(x, c.rows, c.d), e.up(mean, c.rows), e.up(rstd, c.rows), e.up(g, c.d))
			loss := func(x, g, b []float64) float64 {
				y, _, _ := ln64(x, g, b, c.d, float64(c.eps))
				return dot64(dy, y)
			}
			var fx, fg, fb func([]float64) float64
			if c.rows*c.d <= 40 {
				fx = func(v []float64) float64 { return loss(v, g64, b64) }
				fg = func(v []float64) float64 { return loss(x64, v, b64) }
				fb = func(v []float64) float64 { return loss(x64, g64, v) }
			}
			e.gradCheck("dx", e.down(dx), dx0, wdx, fx, x64, e.tol.F32)
			e.gradCheck("dgamma", e.down(dg), dg0, wdg, fg, g64, e.tol.F32)
			e.gradCheck("dbeta", e.down(db), db0, wdb, fb, b64, e.tol.F32)
		})
	}
}
