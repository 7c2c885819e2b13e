package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gorun/gorun/kernels"
)

func TestCastF16Known(t *testing.T) {
	for _, c := range []struct {
		f float32
		h uint16
	}{
		{0, 0}, {1, 0x3c00}, {-2, 0xc000}, {65504, 0x7bff}, {65520, 0x7c00}, {1e6, 0x7c00},
		{6.103515625e-05, 0x0400}, {5.960464477539063e-08, 0x0001}, {2.980232238769531e-08, 0}, // tie to even: 0
		{1.0009765625, 0x3c01}, {1.00048828125, 0x3c00}, // halfway between 0x3c00 and 0x3c01: even
		{1.00146484375, 0x3c02}, // halfway between 0x3c01 and 0x3c02: even
		{float32(math.Inf(-1)), 0xfc00},
	} {
		if got := f32ToF16(c.f); got != c.h {
			t.Errorf("f32ToF16(%v) = %#04x, want %#04x", c.f, got, c.h)
		}
	}
	if v := f16ToF32(f32ToF16(float32(math.NaN()))); v == v {
		t.Error("NaN does not survive f16")
	}
	// every finite f16 round-trips through f32
	for h := 0; h < 0x10000; h++ {
		if h&0x7c00 == 0x7c00 {
			continue
		}
		if back := f32ToF16(f16ToF32(uint16(h))); back != uint16(h) && !(h == 0x8000 && back == 0x8000) {
			t.Fatalf("f16 %#04x -> %v -> %#04x", h, f16ToF32(uint16(h)), back)
		}
	}
}

func TestCastBF16AndTensors(t *testing.T) {
	be := New()
	r := rand.New(rand.NewPCG(1, 1))
	n := 50000
	x := randn(r, n, 10)
	for _, dt := range []kernels.DType{kernels.F16, kernels.BF16} {
		h := be.Alloc(dt, n)
		y := be.Alloc(kernels.F32, n)
		be.Cast(h, kernels.FromF32(x, n))
		be.Cast(y, h)
		rel := 1.0 / 1024 // f16: ulp = 2^-10 of the binade
		if dt == kernels.BF16 {
			rel = 1.0 / 128
		}
		for i := range x {
			if d := math.Abs(float64(y.F32[i] - x[i])); d > rel*math.Abs(float64(x[i]))/2*1.0001+1e-7 /* half an ulp */ {
				t.Fatalf("%v: %v -> %v", dt, x[i], y.F32[i])
			}
		}
	}
	if f32ToBF16(1.00390625) != 0x3f80 || f32ToBF16(1.01171875) != 0x3f82 { // ties to even
		t.Fatal("bf16 rounding is not to nearest even")
	}
}

// Cast (package half's vectorized converter) equals the scalar references
// bit for bit, specials included, on every length the vector loops split.
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
		for _, dt := range []kernels.DType{kernels.F16, kernels.BF16} {
			h := be.Alloc(dt, max(n, 1)).Slice(0, n)
			be.Cast(h, kernels.FromF32(x, n))
			back := be.Alloc(kernels.F32, max(n, 1)).Slice(0, n)
			be.Cast(back, h)
			for i, v := range x {
				want, wantBack := f32ToF16(v), f16ToF32(h.U16[i])
				if dt == kernels.BF16 {
					want, wantBack = f32ToBF16(v), bf16ToF32(h.U16[i])
				}
				isNaN := v != v
				if (!isNaN && h.U16[i] != want) || (isNaN && (h.U16[i]&0x7fff) <= map[kernels.DType]uint16{kernels.F16: 0x7c00, kernels.BF16: 0x7f80}[dt]) {
					t.Fatalf("%v n=%d: Cast(%g %#x) = %#x, scalar %#x", dt, n, v, math.Float32bits(v), h.U16[i], want)
				}
				if math.Float32bits(back.F32[i]) != math.Float32bits(wantBack) && !(back.F32[i] != back.F32[i] && wantBack != wantBack) {
					t.Fatalf("%v n=%d: Cast back of %#x = %g, scalar %g", dt, n, h.U16[i], back.F32[i], wantBack)
				}
			}
		}
	}
}

// Scalar conversions written out bit by bit: the references the tests check
// Cast (package half's vectorized converter) against.

func f32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: keep it a quiet NaN
		return uint16(b>>16) | 0x40
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

func bf16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

func f32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	man := b & 0x7fffff
	switch {
	case exp == 0xff: // Inf, NaN
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case exp-127 > 15: // overflow
		return sign | 0x7c00
	case exp-127 >= -14: // normal
		e := uint32(exp - 127 + 15)
		v := e<<10 | man>>13
		rest := man & 0x1fff
		if rest > 0x1000 || rest == 0x1000 && v&1 == 1 {
			v++ // may carry into the exponent, up to Inf: correct
		}
		return sign | uint16(v)
	case exp-127 >= -25: // subnormal
		m := man | 0x800000
		shift := uint(-14 - (exp - 127) + 13)
		v := m >> shift
		rest := m & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rest > half || rest == half && v&1 == 1 {
			v++
		}
		return sign | uint16(v)
	}
	return sign
}

func f16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := int(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp == 0:
		if man == 0 {
			return math.Float32frombits(sign)
		}
		f := float32(man) / (1 << 24)
		if sign != 0 {
			f = -f
		}
		return f
	}
	return math.Float32frombits(sign | uint32(exp-15+127)<<23 | man<<13)
}
