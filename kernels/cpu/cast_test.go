package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/half"
	"github.com/gorun/gorun/kernels"
)

func TestCastBF16AndTensors(t *testing.T) {
	be := New()
	r := rand.New(rand.NewPCG(1, 1))
	n := 50000
	x := randn(r, n, 10)
	for _, dt := range []dtype.DType{dtype.Float16, dtype.BFloat16} {
		h := be.Alloc(dt, n)
		y := be.Alloc(dtype.Float32, n)
		be.Cast(h, kernels.FromF32(x, n))
		be.Cast(y, h)
		rel := 1.0 / 1024 // f16: ulp = 2^-10 of the binade
		if dt == dtype.BFloat16 {
			rel = 1.0 / 128
		}
		for i := range x {
			if d := math.Abs(float64(y.F32[i] - x[i])); d > rel*math.Abs(float64(x[i]))/2*1.0001+1e-7 /* half an ulp */ {
				t.Fatalf("%v: %v -> %v", dt, x[i], y.F32[i])
			}
		}
	}
}

// Cast equals package half's scalar conversions (which half's tests check
// against references of their own) bit for bit, specials included, on
// every length the vector loops and the threads split.
func TestCastMatchesScalar(t *testing.T) {
	be := New()
	r := rand.New(rand.NewPCG(3, 4))
	specials := []float32{0, float32(math.Copysign(0, -1)), 1, -1, 65504, 65520, 6e-8, 3e-8, 1e-45,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 3.4e38, -2.5e-5}
	for _, n := range []int{0, 1, 7, 8, 15, 16, 17, 33, 1000, 40000} {
		x := make([]float32, n)
		for i := range x {
			if i < len(specials) {
				x[i] = specials[i]
			} else {
				x[i] = math.Float32frombits(r.Uint32())
			}
		}
		for _, dt := range []dtype.DType{dtype.Float16, dtype.BFloat16} {
			h := be.Alloc(dt, max(n, 1)).Slice(0, n)
			be.Cast(h, kernels.FromF32(x, n))
			back := be.Alloc(dtype.Float32, max(n, 1)).Slice(0, n)
			be.Cast(back, h)
			for i, v := range x {
				want, wantBack := half.F32ToF16(v), half.F16ToF32(h.U16[i])
				if dt == dtype.BFloat16 {
					want, wantBack = half.F32ToBF16(v), half.BF16ToF32(h.U16[i])
				}
				isNaN := v != v
				if (!isNaN && h.U16[i] != want) || (isNaN && (h.U16[i]&0x7fff) <= map[dtype.DType]uint16{dtype.Float16: 0x7c00, dtype.BFloat16: 0x7f80}[dt]) {
					t.Fatalf("%v n=%d: Cast(%g %#x) = %#x, scalar %#x", dt, n, v, math.Float32bits(v), h.U16[i], want)
				}
				if math.Float32bits(back.F32[i]) != math.Float32bits(wantBack) && !(back.F32[i] != back.F32[i] && wantBack != wantBack) {
					t.Fatalf("%v n=%d: Cast back of %#x = %g, scalar %g", dt, n, h.U16[i], back.F32[i], wantBack)
				}
			}
		}
	}
}
