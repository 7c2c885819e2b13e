#include "textflag.h"

// func addAVX2(dst, a, b *float32, n int)
// dst[i] = a[i] + b[i] for i < n, n a multiple of 32: four 8-lane VADDPS
// a step, a the first operand of each (its NaN wins, as in the scalar
// loop). dst may be a or b.
TEXT ·addAVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $5, CX
	JZ   done
loop:
	VMOVUPS 0(SI), Y0
	VMOVUPS 32(SI), Y1
	VMOVUPS 64(SI), Y2
	VMOVUPS 96(SI), Y3
	VADDPS  0(DX), Y0, Y0
	VADDPS  32(DX), Y1, Y1
	VADDPS  64(DX), Y2, Y2
	VADDPS  96(DX), Y3, Y3
	VMOVUPS Y0, 0(DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	ADDQ    $128, DI
	ADDQ    $128, SI
	ADDQ    $128, DX
	DECQ    CX
	JNZ     loop
	VZEROUPPER
done:
	RET
