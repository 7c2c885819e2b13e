//go:build amd64 && !purego

#include "textflag.h"

// Packing loop for CPUs with AVX-512F (the transposing one,
// packTransAVX512, is generated into sgemm_amd64.s). It writes kc rows of
// a panel: dst row p gets alpha times 1 or 2 vectors of 16 lanes; lanes
// outside the load masks are zero, lanes outside the store masks are left
// alone (a panel row of 12 floats uses a store mask of 12 lanes).

// func packCopyAVX512(dst, src *float32, kc, ld int, alpha float32, lm1, lm2, sm1, sm2 int)
// dst[p*w+j] = alpha*src[p*ld+j]: contiguous runs (op(X) rows stored as rows).
TEXT ·packCopyAVX512(SB), NOSPLIT, $0-72
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ kc+16(FP), CX
	MOVQ ld+24(FP), DX
	SHLQ $2, DX
	VBROADCASTSS alpha+32(FP), Z0
	MOVQ lm1+40(FP), AX
	KMOVW AX, K1
	MOVQ lm2+48(FP), AX
	KMOVW AX, K2
	MOVQ sm1+56(FP), AX
	KMOVW AX, K3
	POPCNTQ AX, R8
	MOVQ sm2+64(FP), BX
	KMOVW BX, K4
	POPCNTQ BX, R9
	ADDQ R9, R8
	SHLQ $2, R8 // panel row width in bytes
	TESTQ BX, BX
	JZ copy1
copy2:
	VMOVUPS.Z (SI), K1, Z1
	VMOVUPS.Z 64(SI), K2, Z2
	VMULPS Z0, Z1, Z1
	VMULPS Z0, Z2, Z2
	VMOVUPS Z1, K3, (DI)
	VMOVUPS Z2, K4, 64(DI)
	ADDQ DX, SI
	ADDQ R8, DI
	DECQ CX
	JNZ copy2
	VZEROUPPER
	RET
copy1:
	VMOVUPS.Z (SI), K1, Z1
	VMULPS Z0, Z1, Z1
	VMOVUPS Z1, K3, (DI)
	ADDQ DX, SI
	ADDQ R8, DI
	DECQ CX
	JNZ copy1
	VZEROUPPER
	RET
