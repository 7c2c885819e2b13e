//go:build !amd64

package half

const (
	useF16C = false
	useAVX2 = false
)

func f32ToF16F16C(dst *uint16, src *float32, n int)  { panic("unreachable") }
func f16ToF32F16C(dst *float32, src *uint16, n int)  { panic("unreachable") }
func f32ToBF16AVX2(dst *uint16, src *float32, n int) { panic("unreachable") }
func bf16ToF32AVX2(dst *float32, src *uint16, n int) { panic("unreachable") }
