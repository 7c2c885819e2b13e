package kerneltest

import (
	"fmt"
	"math"

	"github.com/gorun/gorun/kernels"
)

// lse64 is log(sum(exp(row))).
func lse64(row []float64) float64 {
	mx := math.Inf(-1)
	for _, v := range row {
		mx = math.Max(mx, v)
	}
	var s float64
	for _, v := range row {
		s += math.Exp(v - mx)
	}
	return mx + math.Log(s)
}

// ce64 is the label-smoothed cross entropy of logits z [N, V]: the loss
// summed over rows whose target is not pad, their number, the scale of
// the loss's rounding error (sum of |lse| + sum_j q_j |z_j|) and gs times
// the gradient.
func ce64(z []float64, tg []int32, V int, ls float64, pad int32, gs float64) (sum float64, count int, scale float64, grad []float64) {
	grad = make([]float64, len(z))
	for r, y := range tg {
		if y == pad {
			continue
		}
		row := z[r*V : r*V+V]
		l := lse64(row)
		for j, v := range row {
			q := ls / float64(V-1)
			if j == int(y) {
				q = 1 - ls
			}
			sum -= q * (v - l)
			scale += q * math.Abs(v)
			grad[r*V+j] = gs * (math.Exp(v-l) - q)
		}
		scale += math.Abs(l)
		count++
	}
	return sum, count, scale, grad
}

type ceCase struct {
	n, v    int
	ls      float32
	pad     int32
	gs      float32
	sd, off float64
	tg      []int32 // nil: random, about one in four pad
}

func (c ceCase) String() string {
	return fmt.Sprintf("N=%d V=%d ls=%g pad=%d gradScale=%g sd=%g offset=%g", c.n, c.v, c.ls, c.pad, c.gs, c.sd, c.off)
}

func testCrossEntropy(e *env) {
	for _, c := range []ceCase{
		{n: 6, v: 11, ls: 0.1, pad: 0, gs: 1, sd: 2, tg: []int32{3, 0, 10, 1, 0, 7}},
		{n: 5, v: 17, ls: 0.1, pad: 0, gs: 1, sd: 3, tg: []int32{4, 0, 16, 1, 9}},
		{n: 1, v: 7, ls: 0, pad: -1, gs: 1, sd: 1},
		{n: 40, v: 2, ls: 0.1, pad: -1, gs: 1, sd: 1},
		{n: 12, v: 33, ls: 0.2, pad: 5, gs: 0.5, sd: 1},
		{n: 7, v: 100, ls: 0.1, pad: 0, gs: 1.0 / 7, sd: 2},
		{n: 3, v: 513, ls: 0.1, pad: 0, gs: 1, sd: 1},
		{n: 4, v: 1000, ls: 0, pad: 0, gs: 1, sd: 30, off: 200},
		{n: 2, v: 4097, ls: 0.1, pad: 0, gs: 1, sd: 5},
		{n: 3, v: 9, ls: 0.1, pad: 2, gs: 1, sd: 1, tg: []int32{2, 2, 2}}, // nothing counts
	} {
		e.run(c.String(), func() {
			z := e.randn(c.n*c.v, c.sd)
			for i := range z {
				z[i] += float32(c.off)
			}
			e.act(z)
			tg := c.tg
			if tg == nil {
				tg = make([]int32, c.n)
				for i := range tg {
					tg[i] = int32(e.rng.IntN(c.v))
					if c.pad >= 0 && e.rng.IntN(4) == 0 {
						tg[i] = c.pad
					}
				}
			}
			z64 := to64(z)
			ws, wc, sc, wg := ce64(z64, tg, c.v, float64(c.ls), c.pad, float64(c.gs))
			tgt := e.upI(tg, c.n)
			logits := e.up(z, c.n, c.v)
			tol := e.tol.Softmax
			check := func(how string, s float64, n int) {
				if n != wc {
					e.errorf("%s: %d rows counted, want %d", how, n, wc)
				}
				e.scalar("loss "+how, s, ws, sc, tol)
			}
			s, n := e.be.CrossEntropy(kernels.Tensor{}, logits, tgt, c.ls, c.pad, c.gs)
			check("without dlogits", s, n)
			dl := e.up(e.randn(len(z), 1), c.n, c.v) // stale: pad rows must be cleared
			s, n = e.be.CrossEntropy(dl, logits, tgt, c.ls, c.pad, c.gs)
			check("with dlogits", s, n)
			e.exact("logits after CrossEntropy (untouched)", e.down(logits), z)
			got := e.down(dl)
			var f func([]float64) float64
			if len(z) <= fdLimit {
				f = func(x []float64) float64 {
					s, _, _, _ := ce64(x, tg, c.v, float64(c.ls), c.pad, float64(c.gs))
					return s * float64(c.gs)
				}
			}
			e.gradCheck("dlogits", got, nil, wg, f, z64, tol)
			for r, y := range tg {
				if y == c.pad {
					e.exact(fmt.Sprintf("dlogits row %d (pad)", r), got[r*c.v:(r+1)*c.v], zeros(c.v))
				}
			}
			// in place: dlogits is logits
			s, n = e.be.CrossEntropy(logits, logits, tgt, c.ls, c.pad, c.gs)
			check("in place", s, n)
			e.exact("dlogits in place against dlogits apart", e.down(logits), got)
		})
	}
}

func testLogSoftmax(e *env) {
	for _, c := range []struct {
		n, v    int
		sd, off float64
	}{
		{1, 1, 1, 0}, {3, 7, 1, 0}, {5, 33, 2, 0}, {3, 1000, 5, 0}, {2, 4097, 3, 0}, {40, 100, 1, 0}, {4, 513, 10, 200},
	} {
		for _, alias := range []bool{false, true} {
			e.run(fmt.Sprintf("N=%d V=%d sd=%g offset=%g alias=%v", c.n, c.v, c.sd, c.off, alias), func() {
				x := e.randn(c.n*c.v, c.sd)
				for j := range x {
					x[j] += float32(c.off)
				}
				e.act(x)
				xt := e.up(x, c.n, c.v)
				out := xt
				if !alias {
					out = e.up(e.randn(len(x), 1), c.n, c.v)
				}
				e.be.LogSoftmax(out, xt)
				want := make([]float64, len(x))
				for r := range c.n {
					row := to64(x[r*c.v : (r+1)*c.v])
					l := lse64(row)
					for j, v := range row {
						want[r*c.v+j] = v - l
					}
				}
				e.near("out", e.down(out), want, e.tol.Softmax)
				if !alias {
					e.exact("x (untouched)", e.down(xt), x)
				}
			})
		}
	}
}
