package cpu

import (
	"fmt"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/half"
	"github.com/gorun/gorun/kernels"
)

// Cast implements kernels.Backend.
func (be *Backend) Cast(dt, st kernels.Tensor) {
	sameLen(dt, st, "Cast")
	n := dt.Len()
	switch {
	case dt.DType == st.DType:
		be.Copy(dt, st)
	case st.DType == dtype.Float32 && dt.DType == dtype.Float16:
		be.par(n, 1<<14, func(_, lo, hi int) {
			half.Float32ToFloat16(dt.U16[lo:hi], st.F32[lo:hi])
		})
	case st.DType == dtype.Float32 && dt.DType == dtype.BFloat16:
		be.par(n, 1<<14, func(_, lo, hi int) {
			half.Float32ToBFloat16(dt.U16[lo:hi], st.F32[lo:hi])
		})
	case st.DType == dtype.Float16 && dt.DType == dtype.Float32:
		be.par(n, 1<<14, func(_, lo, hi int) {
			half.Float16ToFloat32(dt.F32[lo:hi], st.U16[lo:hi])
		})
	case st.DType == dtype.BFloat16 && dt.DType == dtype.Float32:
		be.par(n, 1<<14, func(_, lo, hi int) {
			half.BFloat16ToFloat32(dt.F32[lo:hi], st.U16[lo:hi])
		})
	default:
		panic(fmt.Sprintf("cpu: Cast %v to %v is not supported", st.DType, dt.DType))
	}
}
