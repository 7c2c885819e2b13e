package kerneltest

import (
	"fmt"
	"math"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/kernels"
)

// rowShapes are the [rows, d] shapes of the row-wise ops: odd widths, one
// with rows enough for a CPU backend to split them over 3 workers, and long
// rows for a GPU's block loops.
var rowShapes = [][2]int{{1, 1}, {3, 7}, {5, 33}, {4, 100}, {2, 513}, {200, 33}, {7, 1000}, {3, 4097}}

func shapeName(s [2]int) string { return fmt.Sprintf("%dx%d", s[0], s[1]) }

func testAddBias(e *env) {
	for _, s := range rowShapes {
		e.run(shapeName(s), func() {
			rows, d := s[0], s[1]
			x, b := e.varied(rows*d, 1), e.randn(d, 1)
			xt := e.up(x, rows, d)
			if rows%2 == 0 { // also as a 3-D tensor
				xt = xt.Reshape(2, rows/2, d)
			}
			e.be.AddBias(xt, e.up(b, d))
			want := make([]float64, rows*d)
			for i := range want {
				want[i] = float64(x[i]) + float64(b[i%d])
			}
			e.near("x", e.down(xt), want, e.tol.F32)
		})
	}
}

// biasGrad64 is dbias0 + the column sums of dy.
func biasGrad64(db0, dy []float32, d int) []float64 {
	want := to64(db0)
	for i, v := range dy {
		want[i%d] += float64(v)
	}
	return want
}

func testBiasGrad(e *env) {
	shapes := append(clone(rowShapes), [2]int{1000, 33}, [2]int{4097, 3}, [2]int{64, 200})
	for _, s := range shapes {
		e.run(shapeName(s), func() {
			rows, d := s[0], s[1]
			db0, dy := e.randn(d, 1), e.varied(rows*d, 1)
			dbt := e.up(db0, d)
			e.be.BiasGrad(dbt, e.up(dy, rows, d))
			e.near("dbias (accumulated)", e.down(dbt), biasGrad64(db0, dy, d), e.tol.F32)
		})
	}
}

func relu64(x []float64, b []float64) []float64 {
	y := make([]float64, len(x))
	d := len(b)
	for i, v := range x {
		y[i] = math.Max(0, v+b[i%d])
	}
	return y
}

func testBiasReLU(e *env) {
	for _, s := range rowShapes {
		e.run(shapeName(s), func() {
			rows, d := s[0], s[1]
			x, b := e.varied(rows*d, 1), e.randn(d, 1)
			xt := e.up(x, rows, d)
			e.be.BiasReLU(xt, e.up(b, d))
			// x+b is exact in float64 and its float32 rounding keeps the
			// sign, so the zeros are exact.
			e.near("x", e.down(xt), relu64(to64(x), to64(b)), e.tol.F32)
		})
	}
	// The whole chain of a ReLU layer's bias: y = max(0, x+b), loss =
	// sum(w*y), dx = ReLUBackward(w, y), dbias = BiasGrad(dx); checked
	// against finite differences of the float64 forward, inputs kept away
	// from the kink.
	e.run("gradient chain 6x5", func() {
		rows, d := 6, 5
		x, b, w := e.randn(rows*d, 1), e.randn(d, 0.1), e.randn(rows*d, 1)
		for i := range x {
			if math.Abs(float64(x[i])) < 0.3 {
				x[i] += 0.6
			}
		}
		yt := e.up(x, rows, d)
		e.be.BiasReLU(yt, e.up(b, d))
		dxt := e.up(w, rows, d)
		e.be.ReLUBackward(dxt, yt)
		dbt := e.alloc(dtype.Float32, d)
		e.be.BiasGrad(dbt, dxt)
		x64, b64 := to64(x), to64(b)
		y := relu64(x64, b64)
		dx, db := make([]float64, len(x)), make([]float64, d)
		for i := range dx {
			if y[i] > 0 {
				dx[i] = float64(w[i])
				db[i%d] += dx[i]
			}
		}
		e.gradCheck("dx", e.down(dxt), nil, dx, func(v []float64) float64 { return dot64(w, relu64(v, b64)) }, x64, e.tol.F32)
		e.gradCheck("dbias", e.down(dbt), nil, db, func(v []float64) float64 { return dot64(w, relu64(x64, v)) }, b64, e.tol.F32)
	})
}

// BiasReLUDropout is BiasReLU then Dropout: x against the float64 ReLU, y
// against the float64 dropout of x as stored (the dropped elements exactly
// zero), and both bit for bit against BiasReLU and Dropout run one after
// the other on the same backend. Views at odd offsets (not 4-byte aligned
// in 16 bits); y aliasing x (x then ends as y).
func testBiasReLUDropout(e *env) {
	type brdCase struct {
		rows, d int
		p       float32
		seed    uint64
		view    bool // x and y views at offsets 1 and 3 of bigger tensors
		alias   bool // y is x
	}
	var cs []brdCase
	for i, s := range rowShapes {
		cs = append(cs, brdCase{rows: s[0], d: s[1], p: []float32{0.1, 0.3, 0}[i%3], seed: uint64(100 + i)})
	}
	cs = append(cs,
		brdCase{rows: 6, d: 100, p: 0.2, seed: 7, view: true},
		brdCase{rows: 3, d: 7, p: 0.5, seed: 8, view: true},
		brdCase{rows: 40, d: 64, p: 0.1, seed: 0xFFFFFFFFFFFFFFF0}, // seed + g*golden wraps
		brdCase{rows: 5, d: 100, p: 0.2, seed: 11, alias: true},
		brdCase{rows: 3, d: 7, p: 0, seed: 0, alias: true, view: true}, // BiasReLU
	)
	for _, c := range cs {
		e.run(fmt.Sprintf("%dx%d p=%g seed=%#x view=%v alias=%v", c.rows, c.d, c.p, c.seed, c.view, c.alias), func() {
			n := c.rows * c.d
			x, b := e.varied(n, 1), e.randn(c.d, 1)
			place := func(v []float32, off int) kernels.Tensor {
				if !c.view {
					return e.up(v, c.rows, c.d)
				}
				big := e.up(append(append(e.randn(off, 1), v...), e.randn(2, 1)...), off+n+2)
				return big.Slice(off, c.rows, c.d)
			}
			xt, yt, bt := place(x, 1), place(e.randn(n, 1), 3), e.up(b, c.d)
			if c.alias {
				yt = xt
			}
			e.be.BiasReLUDropout(yt, xt, bt, c.p, c.seed)
			x2, y2 := e.up(x, c.rows, c.d), e.alloc(f32, c.rows, c.d)
			e.be.BiasReLU(x2, bt)
			e.be.Dropout(y2, x2, c.p, c.seed)
			gx, gy, rx := e.down(xt), e.down(yt), e.down(x2)
			e.near("relu", rx, relu64(to64(x), to64(b)), e.tol.F32)
			e.near("y", gy, dropout64(nil, rx, c.p, c.seed), e.tol.F32)
			for i, v := range gy {
				if c.p > 0 && !kept(c.seed, i, c.p) && v != 0 {
					e.errorf("y[%d] = %g: a dropped element (its random bits %#04x) must be 0", i, v, dropBits(c.seed, i))
					break
				}
			}
			if !c.alias {
				e.exact("x against BiasReLU", gx, rx)
			}
			e.exact("y against BiasReLU then Dropout", gy, e.down(y2))
		})
	}
}

func testReLUBackward(e *env) {
	for _, n := range []int{1, 7, 33, 4097, 100003} {
		e.run(fmt.Sprint(n), func() {
			y, dx := make([]float32, n), e.varied(n, 1)
			for i := range y {
				switch e.rng.IntN(3) {
				case 0: // y == 0: the unit was off
				case 1:
					y[i] = float32(e.rng.Float64() * 3)
				default:
					y[i] = float32(math.Pow(10, -30*e.rng.Float64())) // tiny but on
				}
			}
			y[0] = 0
			if n > 1 {
				y[n-1] = 1.1754944e-38 // the smallest normal float32
			}
			e.act(y)
			dxt := e.up(dx, n)
			e.be.ReLUBackward(dxt, e.up(y, n))
			want := clone(dx)
			for i := range want {
				if y[i] == 0 {
					want[i] = 0
				}
			}
			e.exact("dx", e.down(dxt), want)
		})
	}
}

func testAddPositional(e *env) {
	for _, c := range []struct {
		b, t, d, t0, maxT int
		rank2             bool
	}{
		{2, 3, 7, 0, 5, false},
		{2, 3, 33, 2, 6, false},
		{4, 1, 100, 9, 10, false}, // one decoding step at position 9
		{3, 40, 513, 1, 50, false},
		{1, 2, 4097, 3, 5, false},
		{1, 5, 7, 2, 8, true}, // x [T, D]
	} {
		e.run(fmt.Sprintf("B=%d T=%d D=%d t0=%d rank2=%v", c.b, c.t, c.d, c.t0, c.rank2), func() {
			n := c.b * c.t * c.d
			x, pe := e.varied(n, 1), e.randn(c.maxT*c.d, 1)
			xt := e.up(x, c.b, c.t, c.d)
			if c.rank2 {
				xt = xt.Reshape(c.t, c.d)
			}
			e.be.AddPositional(xt, e.up(pe, c.maxT, c.d), c.t0)
			want := make([]float64, n)
			for i := range want {
				pos := (i/c.d)%c.t + c.t0
				want[i] = float64(x[i]) + float64(pe[pos*c.d+i%c.d])
			}
			e.near("x", e.down(xt), want, e.tol.F32)
		})
	}
}
