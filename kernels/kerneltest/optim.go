package kerneltest

import (
	"fmt"
	"math"

	"github.com/gorun/gorun/kernels"
)

// adamLR is the step size of step t (from 1) with the bias correction
// folded in, as kernels.AdamArgs documents: lr*sqrt(1-b2^t)/(1-b1^t).
func adamLR(lr, b1, b2 float64, t int) float32 {
	return float32(lr * math.Sqrt(1-math.Pow(b2, float64(t))) / (1 - math.Pow(b1, float64(t))))
}

// adam64 is one Adam step in float64 on p, m, v (updated in place).
func adam64(p, g, m, v []float64, a kernels.AdamArgs) {
	b1, b2 := float64(a.Beta1), float64(a.Beta2)
	for i := range p {
		m[i] = b1*m[i] + (1-b1)*g[i]
		v[i] = b2*v[i] + (1-b2)*g[i]*g[i]
		p[i] -= float64(a.LR) * m[i] / (math.Sqrt(v[i]) + float64(a.Eps))
	}
}

// checkAdam checks the state after one step against adam64 applied to the
// state before it (p0, m0, v0: what the backend held). p is judged by its
// change, which is what the step computes: |got - want| <= tol*(|dp| +
// rms(dp)) plus one unit in the last place of p (2^-23 |p|), the
// rounding of p itself.
func (e *env) checkAdam(step string, gotP, gotM, gotV, p0, m0, v0, g []float32, a kernels.AdamArgs) {
	e.t.Helper()
	p, m, v := to64(p0), to64(m0), to64(v0)
	adam64(p, to64(g), m, v, a)
	tol := e.tol.F32
	e.near("m "+step, gotM, m, tol)
	e.near("v "+step, gotV, v, tol)
	dp := make([]float64, len(p))
	for i := range p {
		dp[i] = p[i] - float64(p0[i])
	}
	r := rms(dp)
	scale := make([]float64, len(p))
	for i := range p {
		scale[i] = math.Abs(dp[i]) + r + 0x1p-23*math.Abs(p[i])/tol
	}
	e.nearScale("p "+step, gotP, p, scale, tol)
}

type adamCase struct {
	n              int
	lr, b1, b2, ep float64
	fresh          bool // m and v start at zero (step 1 is the first)
	zeroG          bool // some gradients are exactly zero
}

func testAdam(e *env) {
	for _, c := range []adamCase{
		{n: 1, lr: 1e-3, b1: 0.9, b2: 0.98, ep: 1e-9, fresh: true},
		{n: 7, lr: 0.01, b1: 0.9, b2: 0.997, ep: 1e-9},
		{n: 513, lr: 0.5, b1: 0.9, b2: 0.98, ep: 1e-8, fresh: true, zeroG: true},
		{n: 4097, lr: 2e-3, b1: 0.8, b2: 0.999, ep: 1e-6},
		{n: 100003, lr: 1e-3, b1: 0.9, b2: 0.98, ep: 1e-9, fresh: true},
	} {
		e.run(fmt.Sprintf("n=%d lr=%g b1=%g b2=%g eps=%g fresh=%v", c.n, c.lr, c.b1, c.b2, c.ep, c.fresh), func() {
			p := e.varied(c.n, 0.1)
			m, v := zeros(c.n), zeros(c.n)
			t0 := 0
			if !c.fresh {
				t0 = 10
				m = e.randn(c.n, 0.1)
				for i := range v {
					v[i] = float32(e.rng.Float64() * 0.1)
				}
			}
			pt, mt, vt, gt := e.up(p, c.n), e.up(m, c.n), e.up(v, c.n), e.alloc(f32, c.n)
			for s := 1; s <= 3; s++ {
				g := e.varied(c.n, 0.1)
				if c.zeroG {
					for i := 0; i < c.n; i += 5 {
						g[i] = 0
					}
				}
				e.be.Upload(gt, g)
				a := kernels.AdamArgs{LR: adamLR(c.lr, c.b1, c.b2, t0+s), Beta1: float32(c.b1), Beta2: float32(c.b2), Eps: float32(c.ep)}
				e.be.Adam(pt, gt, mt, vt, a)
				np, nm, nv := e.down(pt), e.down(mt), e.down(vt)
				e.checkAdam(fmt.Sprintf("after step %d", t0+s), np, nm, nv, p, m, v, g, a)
				p, m, v = np, nm, nv
			}
		})
	}
}

func testAdamRows(e *env) {
	for _, c := range []struct {
		rows, cols int
		sets       [][]int32 // the rows of each step (nil: k random distinct rows)
		k          int
	}{
		{rows: 5, cols: 3, sets: [][]int32{{1, 4}, {0, 1}}},
		{rows: 3, cols: 1, sets: [][]int32{{2}, {0, 2}}},
		{rows: 40, cols: 33, k: 30},
		{rows: 100, cols: 7, k: 50},
		{rows: 6, cols: 4097, sets: [][]int32{{0, 5}, {3}}},
	} {
		e.run(fmt.Sprintf("%dx%d", c.rows, c.cols), func() {
			n := c.rows * c.cols
			p, m := e.varied(n, 0.1), e.randn(n, 0.1)
			v := make([]float32, n)
			for i := range v {
				v[i] = float32(e.rng.Float64())
			}
			pt, mt, vt, gt := e.up(p, c.rows, c.cols), e.up(m, c.rows, c.cols), e.up(v, c.rows, c.cols), e.alloc(f32, c.rows, c.cols)
			for s := range 2 {
				var set []int32
				if c.sets != nil {
					set = c.sets[s]
				} else {
					for _, r := range e.rng.Perm(c.rows)[:c.k] {
						set = append(set, int32(r))
					}
				}
				g := e.varied(n, 0.1)
				e.be.Upload(gt, g)
				a := kernels.AdamArgs{LR: adamLR(0.01, 0.9, 0.997, s+1), Beta1: 0.9, Beta2: 0.997, Eps: 1e-9}
				e.be.AdamRows(pt, gt, mt, vt, e.upI(set, len(set)), a)
				np, nm, nv := e.down(pt), e.down(mt), e.down(vt)
				on := make([]bool, c.rows)
				for _, r := range set {
					on[r] = true
				}
				step := fmt.Sprintf("after step %d, rows %v", s+1, set)
				if len(set) > 8 {
					step = fmt.Sprintf("after step %d", s+1)
				}
				for r := range c.rows {
					lo, hi := r*c.cols, (r+1)*c.cols
					if on[r] {
						e.checkAdam(fmt.Sprintf("row %d %s", r, step), np[lo:hi], nm[lo:hi], nv[lo:hi], p[lo:hi], m[lo:hi], v[lo:hi], g[lo:hi], a)
						continue
					}
					for _, x := range []struct {
						name      string
						got, want []float32
					}{{"p", np, p}, {"m", nm, m}, {"v", nv, v}} {
						e.exact(fmt.Sprintf("%s row %d (not listed) %s", x.name, r, step), x.got[lo:hi], x.want[lo:hi])
					}
				}
				p, m, v = np, nm, nv
			}
		})
	}
}

func testGatherRows(e *env) {
	for _, c := range []struct {
		src, dst []int
		cols     int
		idx      []int32 // nil: one random row per dst row
	}{
		{src: []int{4, 6}, dst: []int{5, 6}, cols: 6, idx: []int32{3, 0, 3, 1}},
		{src: []int{3, 5, 7}, dst: []int{3, 40}, cols: 20, idx: []int32{2, 2, 0}},
		{src: []int{8, 1000}, dst: []int{12, 1100}, cols: 999},
		{src: []int{2, 3, 4097}, dst: []int{2, 3, 4097}, cols: 3 * 4097, idx: []int32{1, 0}},
		{src: []int{7, 1}, dst: []int{7, 1}, cols: 1, idx: []int32{6, 5, 4, 3, 2, 1, 0}},
	} {
		e.run(fmt.Sprintf("src %v dst %v cols %d", c.src, c.dst, c.cols), func() {
			sl, dl := 1, 1
			for _, d := range c.src[1:] {
				sl *= d
			}
			for _, d := range c.dst[1:] {
				dl *= d
			}
			idx := c.idx
			if idx == nil {
				for range c.dst[0] {
					idx = append(idx, int32(e.rng.IntN(c.src[0])))
				}
			}
			src, dst := e.randn(c.src[0]*sl, 1), e.randn(c.dst[0]*dl, 1)
			dt := e.up(dst, c.dst...)
			e.be.GatherRows(dt, e.up(src, c.src...), e.upI(idx, len(idx)), c.cols)
			want := clone(dst)
			for i, r := range idx {
				copy(want[i*dl:i*dl+c.cols], src[int(r)*sl:int(r)*sl+c.cols])
			}
			e.exact("dst", e.down(dt), want)
		})
	}
}

func testWriteStep(e *env) {
	for _, c := range [][4]int{{2, 3, 7, 0}, {3, 5, 33, 4}, {4, 10, 513, 7}, {1, 2, 4097, 1}, {5, 1, 1, 0}} {
		r, tc, d, t := c[0], c[1], c[2], c[3]
		e.run(fmt.Sprintf("R=%d Tcap=%d D=%d t=%d", r, tc, d, t), func() {
			cache, x := e.randn(r*tc*d, 1), e.randn(r*d, 1)
			ct := e.up(cache, r, tc, d)
			e.be.WriteStep(ct, e.up(x, r, d), t)
			want := clone(cache)
			for i := range r {
				copy(want[(i*tc+t)*d:(i*tc+t+1)*d], x[i*d:(i+1)*d])
			}
			e.exact("cache", e.down(ct), want)
		})
	}
}
