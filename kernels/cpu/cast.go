package cpu

import (
	"fmt"
	"math"

	"github.com/gorun/gorun/half"
	"github.com/gorun/gorun/kernels"
)

// Scalar conversions: the references the tests check Cast (package half's
// vectorized converter) against.

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

// Cast implements kernels.Backend.
func (be *Backend) Cast(dt, st kernels.Tensor) {
	sameLen(dt, st, "Cast")
	n := dt.Len()
	switch {
	case dt.DType == st.DType:
		be.Copy(dt, st)
	case st.DType == kernels.F32 && dt.DType == kernels.F16:
		be.par(n, 1<<14, func(_, lo, hi int) {
			half.Float32ToFloat16(dt.U16[lo:hi], st.F32[lo:hi])
		})
	case st.DType == kernels.F32 && dt.DType == kernels.BF16:
		be.par(n, 1<<14, func(_, lo, hi int) {
			half.Float32ToBFloat16(dt.U16[lo:hi], st.F32[lo:hi])
		})
	case st.DType == kernels.F16 && dt.DType == kernels.F32:
		be.par(n, 1<<14, func(_, lo, hi int) {
			half.Float16ToFloat32(dt.F32[lo:hi], st.U16[lo:hi])
		})
	case st.DType == kernels.BF16 && dt.DType == kernels.F32:
		be.par(n, 1<<14, func(_, lo, hi int) {
			half.BFloat16ToFloat32(dt.F32[lo:hi], st.U16[lo:hi])
		})
	default:
		panic(fmt.Sprintf("cpu: Cast %v to %v is not supported", st.DType, dt.DType))
	}
}
