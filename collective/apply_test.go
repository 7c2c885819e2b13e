package collective

import (
	"math"
	"math/rand/v2"
	"testing"
)

// apply's Sum is x[i]+y[i] rounded once for every element and length, with
// specials (it runs on a SIMD kernel: a fused or reordered operation would
// show here).
func TestApplySumIsElementwiseAdd(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	specials := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)), 1e-45, 3.4e38, -3.4e38, 1, 0.1}
	for _, n := range []int{0, 1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1023, 4099} {
		x, y, want := make([]float32, n), make([]float32, n), make([]float32, n)
		for i := range x {
			if i < len(specials) {
				x[i], y[i] = specials[i], specials[(i*5+3)%len(specials)]
			} else {
				x[i] = math.Float32frombits(r.Uint32()&^(0xff<<23) | uint32(100+r.IntN(60))<<23)
				y[i] = float32(r.NormFloat64()) * x[i]
			}
			want[i] = x[i] + y[i]
		}
		apply(x, y, Sum)
		for i := range x {
			if math.Float32bits(x[i]) != math.Float32bits(want[i]) && !(x[i] != x[i] && want[i] != want[i]) {
				t.Fatalf("n=%d: element %d: %g, want %g", n, i, x[i], want[i])
			}
		}
	}
}
