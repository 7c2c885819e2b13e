package half

import "golang.org/x/sys/cpu"

var (
	useF16C = cpu.X86.HasF16C && cpu.X86.HasAVX
	useAVX2 = cpu.X86.HasAVX2
)

// Assembly kernels (half_amd64.s); n is a multiple of 8 (16 for f32ToBF16AVX2).

//go:noescape
func f32ToF16F16C(dst *uint16, src *float32, n int)

//go:noescape
func f16ToF32F16C(dst *float32, src *uint16, n int)

//go:noescape
func f32ToBF16AVX2(dst *uint16, src *float32, n int)

//go:noescape
func bf16ToF32AVX2(dst *float32, src *uint16, n int)
