package collective

import (
	"math"
	"math/rand/v2"
	"testing"
)

// apply's Sum is x[i]+y[i] rounded once for every element and length, with
// specials, bit for bit, NaNs included (it runs on a SIMD kernel: a fused
// or reordered operation, or operands swapped, would show here), at every
// alignment, and y is left as it was; the same into a third buffer, and
// into y with y the first operand (recursive doubling's order).
func TestApplySumIsElementwiseAdd(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	nanX, nanY := math.Float32frombits(0x7fc0_1234), math.Float32frombits(0xffc0_0042) // quiet NaNs, payloads told apart
	specials := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)), 1e-45, 3.4e38, -3.4e38, 1, 0.1, nanX, nanY, 1.5e-39}
	for _, n := range []int{0, 1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 1023, 4099, 24576} {
		off := n % 5 // slices that start off any vector alignment
		xb, yb, want := make([]float32, n+off), make([]float32, n+off+3), make([]float32, n)
		x, y := xb[off:], yb[off:]
		for i := range x {
			if i < len(specials) {
				x[i], y[i] = specials[i], specials[(i*5+3)%len(specials)]
			} else {
				x[i] = math.Float32frombits(r.Uint32()&^(0xff<<23) | uint32(100+r.IntN(60))<<23)
				y[i] = float32(r.NormFloat64()) * x[i]
			}
			want[i] = x[i] + y[i]
		}
		if n > 40 { // NaNs in both operands inside the vector part: x's wins
			x[35], y[35] = nanX, nanY
			x[36], y[36] = nanY, nanX
			want[35], want[36] = nanX, nanY
		}
		y0, x0 := append([]float32(nil), y...), append([]float32(nil), x...)
		// the other operand order into y (dst = b; y's NaN wins), then into
		// a third buffer, then x += y
		yb2 := append([]float32(nil), yb...)
		y2 := yb2[off:]
		apply(y2[:n], y2, x0, Sum)
		d := make([]float32, n)
		apply(d, x0, y0, Sum)
		for i := range d {
			if math.Float32bits(d[i]) != math.Float32bits(want[i]) {
				t.Fatalf("n=%d: into a third buffer: element %d: %#08x, want %#08x", n, i, math.Float32bits(d[i]), math.Float32bits(want[i]))
			}
			w2 := want[i]
			if n > 40 && (i == 35 || i == 36) {
				w2 = y0[i] // both NaN: the first operand's, y's here
			}
			if math.Float32bits(y2[i]) != math.Float32bits(w2) {
				t.Fatalf("n=%d: y = y + x: element %d: %#08x, want %#08x", n, i, math.Float32bits(y2[i]), math.Float32bits(w2))
			}
		}
		apply(x, x, y, Sum)
		for i := range x {
			if math.Float32bits(x[i]) != math.Float32bits(want[i]) {
				t.Fatalf("n=%d: element %d: %g (%#08x), want %g (%#08x)", n, i, x[i], math.Float32bits(x[i]), want[i], math.Float32bits(want[i]))
			}
		}
		for i := range y {
			if math.Float32bits(y[i]) != math.Float32bits(y0[i]) {
				t.Fatalf("n=%d: y[%d] changed", n, i)
			}
		}
	}
}
