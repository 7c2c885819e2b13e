#include "textflag.h"

// The state S0..S7 lives in Z0..Z7, a 128-bit lane of AEGIS-128L in each
// quarter. AESENC's operands in Go's order are (round key, state,
// result); the draft's AESRound(x, k) is AESENC with state x and round
// key k. VPTERNLOGQ $f, c, b, a sets a to f(a, b, c): 0x96 is a xor b xor
// c, 0x78 is a xor (b and c).

#define LOADSTATE(s) \
	VMOVDQU64 0(s), Z0 \
	VMOVDQU64 64(s), Z1 \
	VMOVDQU64 128(s), Z2 \
	VMOVDQU64 192(s), Z3 \
	VMOVDQU64 256(s), Z4 \
	VMOVDQU64 320(s), Z5 \
	VMOVDQU64 384(s), Z6 \
	VMOVDQU64 448(s), Z7

#define STORESTATE(s) \
	VMOVDQU64 Z0, 0(s) \
	VMOVDQU64 Z1, 64(s) \
	VMOVDQU64 Z2, 128(s) \
	VMOVDQU64 Z3, 192(s) \
	VMOVDQU64 Z4, 256(s) \
	VMOVDQU64 Z5, 320(s) \
	VMOVDQU64 Z6, 384(s) \
	VMOVDQU64 Z7, 448(s)

// UPDATE absorbs M0 (Z8) and M1 (Z9): S'i = AESRound(S(i-1), Si) for
// i = 1..7 except S'4 = AESRound(S3, S4 xor M1), and S'0 =
// AESRound(S7, S0 xor M0). Computed from S7 down, so each Si is read
// before it is replaced; Z12 keeps the old S7.
#define UPDATE \
	VMOVDQU64 Z7, Z12 \
	VPXORQ    Z9, Z4, Z13 \
	VPXORQ    Z8, Z0, Z14 \
	VAESENC   Z7, Z6, Z7 \
	VAESENC   Z6, Z5, Z6 \
	VAESENC   Z5, Z4, Z5 \
	VAESENC   Z13, Z3, Z4 \
	VAESENC   Z3, Z2, Z3 \
	VAESENC   Z2, Z1, Z2 \
	VAESENC   Z1, Z0, Z1 \
	VAESENC   Z14, Z12, Z0

// XORZ0 sets x to x xor Z0, the first keystream half, S1 xor S6 xor (S2
// and S3); XORZ1 to x xor Z1 = x xor S2 xor S5 xor (S6 and S7).
#define XORZ0(x) \
	VPTERNLOGQ $0x96, Z6, Z1, x \
	VPTERNLOGQ $0x78, Z3, Z2, x

#define XORZ1(x) \
	VPTERNLOGQ $0x96, Z5, Z2, x \
	VPTERNLOGQ $0x78, Z7, Z6, x

// BLOCKSARGS loads encBlocks's and decBlocks's arguments (the state in
// DI and Z0..Z7, dst in DX, src in SI, the block count in CX) and sets
// the flags for a count of zero.
#define BLOCKSARGS \
	MOVQ  s+0(FP), DI \
	MOVQ  dst+8(FP), DX \
	MOVQ  src+16(FP), SI \
	MOVQ  blocks+24(FP), CX \
	LOADSTATE(DI) \
	TESTQ CX, CX

// func update(s *state, m *[128]byte)
TEXT ·update(SB), NOSPLIT, $0-16
	MOVQ s+0(FP), DI
	MOVQ m+8(FP), SI
	LOADSTATE(DI)
	VMOVDQU64 0(SI), Z8
	VMOVDQU64 64(SI), Z9
	UPDATE
	STORESTATE(DI)
	VZEROUPPER
	RET

// func keystream(s *state, z *[128]byte)
TEXT ·keystream(SB), NOSPLIT, $0-16
	MOVQ s+0(FP), DI
	MOVQ z+8(FP), SI
	LOADSTATE(DI)
	VPXORQ Z10, Z10, Z10
	VPXORQ Z11, Z11, Z11
	XORZ0(Z10)
	XORZ1(Z11)
	VMOVDQU64 Z10, 0(SI)
	VMOVDQU64 Z11, 64(SI)
	VZEROUPPER
	RET

// func encBlocks(s *state, dst, src *byte, blocks int)
TEXT ·encBlocks(SB), NOSPLIT, $0-32
	BLOCKSARGS
	JZ encdone

encloop:
	VMOVDQU64 0(SI), Z8
	VMOVDQU64 64(SI), Z9
	VMOVDQU64 0(SI), Z10
	VMOVDQU64 64(SI), Z11
	XORZ0(Z10)
	XORZ1(Z11)
	VMOVDQU64 Z10, 0(DX)
	VMOVDQU64 Z11, 64(DX)
	UPDATE
	ADDQ $128, SI
	ADDQ $128, DX
	DECQ CX
	JNZ  encloop

encdone:
	STORESTATE(DI)
	VZEROUPPER
	RET

// func decBlocks(s *state, dst, src *byte, blocks int)
TEXT ·decBlocks(SB), NOSPLIT, $0-32
	BLOCKSARGS
	JZ decdone

decloop:
	VMOVDQU64 0(SI), Z8
	VMOVDQU64 64(SI), Z9
	XORZ0(Z8)
	XORZ1(Z9)
	VMOVDQU64 Z8, 0(DX)
	VMOVDQU64 Z9, 64(DX)
	UPDATE
	ADDQ $128, SI
	ADDQ $128, DX
	DECQ CX
	JNZ  decloop

decdone:
	STORESTATE(DI)
	VZEROUPPER
	RET

// func start(s *state, m *[128]byte, ctx *[64]byte)
TEXT ·start(SB), NOSPLIT, $0-24
	MOVQ s+0(FP), DI
	MOVQ m+8(FP), SI
	MOVQ ctx+16(FP), DX
	LOADSTATE(DI)
	VMOVDQU64 0(SI), Z8
	VMOVDQU64 64(SI), Z9
	VMOVDQU64 0(DX), Z15
	MOVQ $10, CX

startloop:
	VPXORQ Z15, Z3, Z3
	VPXORQ Z15, Z7, Z7
	UPDATE
	DECQ CX
	JNZ  startloop
	STORESTATE(DI)
	VZEROUPPER
	RET

// func finish(s *state, tag, lens *[16]byte)
TEXT ·finish(SB), NOSPLIT, $0-24
	MOVQ s+0(FP), DI
	MOVQ tag+8(FP), SI
	MOVQ lens+16(FP), DX
	LOADSTATE(DI)
	VBROADCASTI32X4 0(DX), Z8
	VPXORQ          Z2, Z8, Z8
	VMOVDQU64       Z8, Z9
	MOVQ            $7, CX

finishloop:
	UPDATE
	DECQ CX
	JNZ  finishloop
	VPTERNLOGQ    $0x96, Z2, Z1, Z0
	VPTERNLOGQ    $0x96, Z5, Z4, Z3
	VPTERNLOGQ    $0x96, Z6, Z3, Z0
	VEXTRACTI64X4 $1, Z0, Y1
	VPXOR         Y1, Y0, Y0
	VEXTRACTI128  $1, Y0, X1
	VPXOR         X1, X0, X0
	VMOVDQU       X0, 0(SI)
	VZEROUPPER
	RET
