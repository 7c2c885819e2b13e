package kerneltest

import (
	"fmt"
	"math"

	"github.com/gorun/gorun/kernels"
)

// dropBits are the 16 random bits of element i: splitmix64's finalizer of
// seed + (i>>2)*0x9E3779B97F4A7C15, shifted right by 16*(i&3).
func dropBits(seed uint64, i int) uint16 {
	z := seed + uint64(i>>2)*0x9E3779B97F4A7C15
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	z ^= z >> 31
	return uint16(z >> (16 * uint(i&3)))
}

// kept is the dropout mask's definition: element i is kept iff its 16
// random bits are >= round(p*65536).
func kept(seed uint64, i int, p float32) bool {
	return uint32(dropBits(seed, i)) >= uint32(math.Round(float64(p)*65536))
}

// dropout64 is base + x*keep/(1-p) (base nil: zeros).
func dropout64(base, x []float32, p float32, seed uint64) []float64 {
	want := make([]float64, len(x))
	for i, v := range x {
		if base != nil {
			want[i] = float64(base[i])
		}
		if p <= 0 || kept(seed, i, p) {
			want[i] += float64(v) / (1 - float64(p))
		}
	}
	return want
}

// checkDrop checks a dropout output got = base + x*keep/(1-p): the dropped
// elements must equal base exactly; where base is nil the kept ones must
// be non-zero (x has no zeros), so the kept set is checked exactly.
func (e *env) checkDrop(what string, got, base, x []float32, p float32, seed uint64) {
	e.t.Helper()
	bad := 0
	for i := range got {
		k := p <= 0 || kept(seed, i, p)
		b := float32(0)
		if base != nil {
			b = base[i]
		}
		if (!k && math.Float32bits(got[i]) != math.Float32bits(b)) || (k && base == nil && got[i] == 0) {
			if bad++; bad <= 5 {
				e.errorf("%s[%d] = %.8g: element should be %s (its random bits %#04x, threshold %d)", what, i, got[i],
					map[bool]string{true: "kept", false: "dropped"}[k], dropBits(seed, i), uint32(math.Round(float64(p)*65536)))
			}
		}
	}
	if bad > 5 {
		e.errorf("%s: %d of %d elements in the wrong kept set", what, bad, len(got))
	}
	e.near(what, got, dropout64(base, x, p, seed), e.tol.F32)
}

// nonzero draws n values of varied magnitude, none zero.
func (e *env) nonzero(n int) []float32 {
	x := e.varied(n, 1)
	for i := range x {
		if x[i] == 0 {
			x[i] = 1
		}
	}
	return x
}

type dropCase struct {
	name  string
	n     int
	p     float32
	seed  uint64
	alias bool // y (dx, out) is x (dy, res)
	view  bool // both are views at odd offsets of bigger tensors
}

func dropCases() []dropCase {
	var cs []dropCase
	for i, n := range []int{1, 7, 33, 100, 513, 4097, 100003} {
		for j, p := range []float32{0.1, 0.3, 0.5, 0.9} {
			cs = append(cs, dropCase{n: n, p: p, seed: uint64(42 + i*4 + j), alias: (i+j)%2 == 1})
		}
	}
	// The threshold: element 5's bits r, and p just at, above, below r.
	const seed = 1234
	r := float64(dropBits(seed, 5))
	for _, c := range []struct {
		name string
		p    float64
	}{
		{"p*65536 = r: kept", r}, {"p*65536 = r+1: dropped", r + 1},
		{"p*65536 = r+0.4 rounds to r: kept", r + 0.4}, {"p*65536 = r+0.6 rounds to r+1: dropped", r + 0.6},
	} {
		cs = append(cs, dropCase{name: c.name, n: 33, p: float32(c.p / 65536), seed: seed})
	}
	return append(cs,
		dropCase{n: 100, p: 0, seed: 1},
		dropCase{n: 513, p: 0.2, seed: 0xFFFFFFFFFFFFFFF0}, // seed + g*golden wraps
		dropCase{n: 4097, p: 0.25, seed: 99, view: true},
		dropCase{n: 6, p: 0.5, seed: 3, view: true, alias: true},
	)
}

func (c dropCase) String() string {
	s := fmt.Sprintf("n=%d p=%g seed=%#x alias=%v view=%v", c.n, c.p, c.seed, c.alias, c.view)
	if c.name != "" {
		s = c.name + " " + s
	}
	return s
}

// pair uploads x and returns it with the output tensor (x itself when
// aliased; views at offsets 1 and 3 of bigger tensors when c.view).
func (c dropCase) pair(e *env, x []float32) (out, in kernels.Tensor) {
	if c.view {
		big := e.up(append(append(e.randn(1, 1), x...), e.randn(4, 1)...), c.n+5)
		in = big.Slice(1, c.n)
		if c.alias {
			return in, in
		}
		return e.up(e.randn(c.n+7, 1), c.n+7).Slice(3, c.n), in
	}
	in = e.up(x, c.n)
	if c.alias {
		return in, in
	}
	return e.up(e.randn(c.n, 1), c.n), in
}

func testDropout(e *env) {
	for _, c := range dropCases() {
		e.run(c.String(), func() {
			x := e.nonzero(c.n)
			y, xt := c.pair(e, x)
			e.be.Dropout(y, xt, c.p, c.seed)
			e.checkDrop("y", e.down(y), nil, x, c.p, c.seed)
		})
	}
	e.run("rate", func() {
		// A property of the hash (so of the test's reference too): about a
		// fraction p is dropped, and another seed drops other elements.
		n, p := 100003, float32(0.1)
		var drop, diff int
		for i := range n {
			if !kept(42, i, p) {
				drop++
			}
			if kept(42, i, p) != kept(43, i, p) {
				diff++
			}
		}
		if sd := math.Sqrt(float64(n) * 0.1 * 0.9); math.Abs(float64(drop)-0.1*float64(n)) > 5*sd || diff < n/10 {
			e.errorf("the dropout hash drops %d of %d at p=0.1 (%d differ with the next seed)", drop, n, diff)
		}
	})
}

func testDropoutBackward(e *env) {
	for _, c := range dropCases() {
		if c.n > 4097 && c.p > 0.3 {
			continue
		}
		e.run(c.String(), func() {
			dy := e.nonzero(c.n)
			dx, dyt := c.pair(e, dy)
			e.be.DropoutBackward(dx, dyt, c.p, c.seed)
			e.checkDrop("dx", e.down(dx), nil, dy, c.p, c.seed)
		})
	}
	e.run("same mask as the forward", func() {
		n := 4097
		x := e.nonzero(n)
		y, dx := e.alloc(f32, n), e.alloc(f32, n)
		e.be.Dropout(y, e.up(x, n), 0.3, 7)
		e.be.DropoutBackward(dx, e.up(x, n), 0.3, 7)
		e.exact("DropoutBackward(x) against Dropout(x)", e.down(dx), e.down(y))
	})
}

func testResidualDropout(e *env) {
	for _, c := range dropCases() {
		if c.p > 0.5 {
			continue
		}
		e.run(c.String(), func() {
			res, y := e.varied(c.n, 1), e.nonzero(c.n)
			out, rest := c.pair(e, res) // alias: out is res
			e.be.ResidualDropout(out, rest, e.up(y, c.n), c.p, c.seed)
			e.checkDrop("out", e.down(out), res, y, c.p, c.seed)
		})
	}
}
