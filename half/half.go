// Package half converts between float32 and the two 16-bit floating-point
// formats used on the wire and in mixed-precision storage: IEEE 754 binary16
// ("float16", "half") and bfloat16.
//
// All conversions from float32 round to nearest, ties to even. Infinities
// keep their sign; a NaN stays a NaN of the same sign, made quiet, keeping
// the top bits of its payload (what the x86 F16C instructions do, so the
// vector and scalar paths are bit-identical); float16 subnormals are
// produced and read exactly; float32 values too large for float16 become
// infinities.
//
// The slice functions use F16C (float16) and AVX2 (bfloat16) on amd64 when
// the CPU has them, chosen at run time, and a pure Go loop otherwise. The
// result is the same bit for bit on either path.
package half

import "math"

// F32ToF16 converts one float32 to float16 bits.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	man := b & 0x7fffff
	switch {
	case exp == 0xff:
		if man != 0 { // NaN: quiet, keep the top payload bits
			return sign | 0x7e00 | uint16(man>>13)
		}
		return sign | 0x7c00
	case exp > 127+15: // overflow
		return sign | 0x7c00
	case exp >= 127-14: // normal range of float16
		v := uint32(exp-127+15)<<10 | man>>13
		rest := man & 0x1fff
		if rest > 0x1000 || rest == 0x1000 && v&1 == 1 {
			v++ // a carry into the exponent is right, up to infinity
		}
		return sign | uint16(v)
	case exp >= 127-25: // float16 subnormal (or rounds up to the smallest one)
		m := man | 0x800000
		shift := uint(-14-(exp-127)) + 13
		v := m >> shift
		rest := m & (1<<shift - 1)
		h := uint32(1) << (shift - 1)
		if rest > h || rest == h && v&1 == 1 {
			v++
		}
		return sign | uint16(v)
	}
	return sign // underflow to a signed zero
}

// F16ToF32 converts float16 bits to float32 (exactly).
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		if man != 0 {
			return math.Float32frombits(sign | 0x7fc00000 | man<<13)
		}
		return math.Float32frombits(sign | 0x7f800000)
	case exp == 0:
		if man == 0 {
			return math.Float32frombits(sign)
		}
		// subnormal: normalise
		e := uint32(127 - 15 + 1)
		for man&0x400 == 0 {
			man <<= 1
			e--
		}
		return math.Float32frombits(sign | e<<23 | (man&0x3ff)<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | man<<13)
}

// F32ToBF16 converts one float32 to bfloat16 bits.
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: quiet, keep the top payload bits
		return uint16((b | 0x400000) >> 16)
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// BF16ToF32 converts bfloat16 bits to float32 (exactly).
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

func check(nd, ns int) {
	if nd < ns {
		panic("half: destination shorter than source")
	}
}

// Float32ToFloat16 converts src into dst[:len(src)]. It panics if dst is
// shorter than src.
func Float32ToFloat16(dst []uint16, src []float32) {
	check(len(dst), len(src))
	n := 0
	if useF16C && len(src) >= 8 {
		n = len(src) &^ 7
		f32ToF16F16C(&dst[0], &src[0], n)
	}
	f32ToF16Go(dst[n:], src[n:])
}

// Float16ToFloat32 converts src into dst[:len(src)].
func Float16ToFloat32(dst []float32, src []uint16) {
	check(len(dst), len(src))
	n := 0
	if useF16C && len(src) >= 8 {
		n = len(src) &^ 7
		f16ToF32F16C(&dst[0], &src[0], n)
	}
	f16ToF32Go(dst[n:], src[n:])
}

// Float32ToBFloat16 converts src into dst[:len(src)].
func Float32ToBFloat16(dst []uint16, src []float32) {
	check(len(dst), len(src))
	n := 0
	if useAVX2 && len(src) >= 16 {
		n = len(src) &^ 15
		f32ToBF16AVX2(&dst[0], &src[0], n)
	}
	f32ToBF16Go(dst[n:], src[n:])
}

// BFloat16ToFloat32 converts src into dst[:len(src)].
func BFloat16ToFloat32(dst []float32, src []uint16) {
	check(len(dst), len(src))
	n := 0
	if useAVX2 && len(src) >= 8 {
		n = len(src) &^ 7
		bf16ToF32AVX2(&dst[0], &src[0], n)
	}
	bf16ToF32Go(dst[n:], src[n:])
}

// Vectorized reports which vector paths the slice functions use on this
// machine ("f16c", "avx2"), for logs and benchmarks.
func Vectorized() []string {
	var s []string
	if useF16C {
		s = append(s, "f16c")
	}
	if useAVX2 {
		s = append(s, "avx2")
	}
	return s
}

// The pure Go loops (bit arithmetic, one element at a time).

func f32ToF16Go(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, f := range src {
		dst[i] = F32ToF16(f)
	}
}

func f16ToF32Go(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = F16ToF32(h)
	}
}

func f32ToBF16Go(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	i := 0
	for ; i+4 <= len(src); i += 4 {
		s := src[i : i+4 : i+4]
		d := dst[i : i+4 : i+4]
		d[0] = F32ToBF16(s[0])
		d[1] = F32ToBF16(s[1])
		d[2] = F32ToBF16(s[2])
		d[3] = F32ToBF16(s[3])
	}
	for ; i < len(src); i++ {
		dst[i] = F32ToBF16(src[i])
	}
}

func bf16ToF32Go(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = math.Float32frombits(uint32(h) << 16)
	}
}
