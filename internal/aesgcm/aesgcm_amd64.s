#include "textflag.h"

// AES-128-GCM with VAES and VPCLMULQDQ on 512-bit registers: four blocks
// per instruction, sixteen blocks (256 bytes) per loop turn. The layout of
// values, and why the hash key is stored multiplied by y, is explained in
// aesgcm_amd64.go; in short:
//
//   - a GHASH block is byte-reversed on load (VPSHUFB with bswapMask), so
//     that a lane holds the block as one 128-bit big-endian integer: bit
//     127-i is the coefficient of x^i;
//   - products are four 64x64 carry-less multiplications (lo, hi and the
//     two cross terms), summed unreduced over sixteen blocks, then reduced
//     once, modulo y^128 + y^127 + y^126 + y^121 + 1 with a factor y^-128
//     (two folds of 64 bits with gfPoly's 0xc2 << 56);
//   - a counter block is kept byte-reversed as well, so that GCM's 32-bit
//     big-endian counter is dword 0 of its lane and VPADDD is inc32.
//
// Register use in the bulk loops:
//   Z0-Z3   counter blocks, then keystream, then ciphertext (seal) or
//           plaintext (open)
//   Z4-Z7   input blocks, then the byte-reversed ciphertext to hash
//   Z8-Z11  hash key powers (tab): lanes of Z8 = H^16..H^13, ..., Z11 = H^4..H^1
//   Z12     the GHASH state in lane 0 between turns; lo products within one
//   Z13     cross products; Z14 hi products; Z15, Z16 scratch
//   X17     gfPoly; Z18 the counter step (4 per lane); Z19 the next counters
//   Z20-Z30 the 11 round keys, each broadcast to the four lanes
//   Z31     bswapMask in every lane

DATA bswapMask<>+0(SB)/8, $0x08090a0b0c0d0e0f
DATA bswapMask<>+8(SB)/8, $0x0001020304050607
GLOBL bswapMask<>(SB), RODATA|NOPTR, $16

DATA gfPoly<>+0(SB)/8, $0xc200000000000000
DATA gfPoly<>+8(SB)/8, $0
GLOBL gfPoly<>(SB), RODATA|NOPTR, $16

// ctrLanes: 0, 1, 2, 3 added to dword 0 of lanes 0-3.
DATA ctrLanes<>+0(SB)/8, $0
DATA ctrLanes<>+8(SB)/8, $0
DATA ctrLanes<>+16(SB)/8, $1
DATA ctrLanes<>+24(SB)/8, $0
DATA ctrLanes<>+32(SB)/8, $2
DATA ctrLanes<>+40(SB)/8, $0
DATA ctrLanes<>+48(SB)/8, $3
DATA ctrLanes<>+56(SB)/8, $0
GLOBL ctrLanes<>(SB), RODATA|NOPTR, $64

DATA ctrStep4<>+0(SB)/8, $4
DATA ctrStep4<>+8(SB)/8, $0
GLOBL ctrStep4<>(SB), RODATA|NOPTR, $16

DATA ctrStep1<>+0(SB)/8, $1
DATA ctrStep1<>+8(SB)/8, $0
GLOBL ctrStep1<>(SB), RODATA|NOPTR, $16

// REDUCE: X12 (lo) and X14 (hi) of an unreduced product -> X12 = (hi:lo)
// * y^-128 mod the field polynomial, lanes 1-3 of Z12 cleared. X15 scratch.
#define REDUCE \
	VPCLMULQDQ $0x00, X17, X12, X15 \
	VPSHUFD    $0x4e, X12, X12 \
	VPXORQ     X15, X12, X12 \
	VPCLMULQDQ $0x00, X17, X12, X15 \
	VPSHUFD    $0x4e, X12, X12 \
	VPTERNLOGD $0x96, X15, X14, X12

// MULACC: the products of the four lanes of data register D with key
// powers K added to Z12 (lo), Z13 (cross) and Z14 (hi).
#define MULACC(K, D) \
	VPCLMULQDQ $0x00, K, D, Z15 \
	VPCLMULQDQ $0x11, K, D, Z16 \
	VPXORQ     Z15, Z12, Z12 \
	VPXORQ     Z16, Z14, Z14 \
	VPCLMULQDQ $0x01, K, D, Z15 \
	VPCLMULQDQ $0x10, K, D, Z16 \
	VPTERNLOGD $0x96, Z15, Z16, Z13

// GHASH16: the GHASH state in X12 (lanes 1-3 of Z12 clear) advanced over
// the sixteen byte-reversed blocks in Z4-Z7; the result in X12, lanes 1-3
// clear.
#define GHASH16 \
	VPXORQ     Z12, Z4, Z4 \
	VPCLMULQDQ $0x00, Z8, Z4, Z12 \
	VPCLMULQDQ $0x11, Z8, Z4, Z14 \
	VPCLMULQDQ $0x01, Z8, Z4, Z13 \
	VPCLMULQDQ $0x10, Z8, Z4, Z15 \
	VPXORQ     Z15, Z13, Z13 \
	MULACC(Z9, Z5) \
	MULACC(Z10, Z6) \
	MULACC(Z11, Z7) \
	VPSLLDQ       $8, Z13, Z15 \
	VPSRLDQ       $8, Z13, Z13 \
	VPXORQ        Z15, Z12, Z12 \
	VPXORQ        Z13, Z14, Z14 \
	VEXTRACTI64X4 $1, Z12, Y15 \
	VEXTRACTI64X4 $1, Z14, Y16 \
	VPXORQ        Y15, Y12, Y12 \
	VPXORQ        Y16, Y14, Y14 \
	VEXTRACTI32X4 $1, Y12, X15 \
	VEXTRACTI32X4 $1, Y14, X16 \
	VPXORQ        X15, X12, X12 \
	VPXORQ        X16, X14, X14 \
	REDUCE

// GHASH1: the GHASH state in X12 advanced over the byte-reversed block in
// X4, with H (times y) in X18.
#define GHASH1 \
	VPXORQ     X12, X4, X4 \
	VPCLMULQDQ $0x00, X18, X4, X12 \
	VPCLMULQDQ $0x11, X18, X4, X14 \
	VPCLMULQDQ $0x01, X18, X4, X13 \
	VPCLMULQDQ $0x10, X18, X4, X15 \
	VPXORQ     X15, X13, X13 \
	VPSLLDQ    $8, X13, X15 \
	VPSRLDQ    $8, X13, X13 \
	VPXORQ     X15, X12, X12 \
	VPXORQ     X13, X14, X14 \
	REDUCE

#define ROUND4(K) \
	VAESENC K, Z0, Z0 \
	VAESENC K, Z1, Z1 \
	VAESENC K, Z2, Z2 \
	VAESENC K, Z3, Z3

// KEYSTREAM16: sixteen counter blocks from Z19 encrypted into Z0-Z3; Z19
// advanced by 16.
#define KEYSTREAM16 \
	VPSHUFB     Z31, Z19, Z0 \
	VPADDD      Z18, Z19, Z19 \
	VPSHUFB     Z31, Z19, Z1 \
	VPADDD      Z18, Z19, Z19 \
	VPSHUFB     Z31, Z19, Z2 \
	VPADDD      Z18, Z19, Z19 \
	VPSHUFB     Z31, Z19, Z3 \
	VPADDD      Z18, Z19, Z19 \
	VPXORQ      Z20, Z0, Z0 \
	VPXORQ      Z20, Z1, Z1 \
	VPXORQ      Z20, Z2, Z2 \
	VPXORQ      Z20, Z3, Z3 \
	ROUND4(Z21) \
	ROUND4(Z22) \
	ROUND4(Z23) \
	ROUND4(Z24) \
	ROUND4(Z25) \
	ROUND4(Z26) \
	ROUND4(Z27) \
	ROUND4(Z28) \
	ROUND4(Z29) \
	VAESENCLAST Z30, Z0, Z0 \
	VAESENCLAST Z30, Z1, Z1 \
	VAESENCLAST Z30, Z2, Z2 \
	VAESENCLAST Z30, Z3, Z3

// SETUP: round keys from AX, key powers from BX, the GHASH state from
// R8, the counter block from R9, and the constants.
#define SETUP \
	VBROADCASTI32X4 bswapMask<>(SB), Z31 \
	VMOVDQU64       gfPoly<>(SB), X17 \
	VBROADCASTI32X4 ctrStep4<>(SB), Z18 \
	VBROADCASTI32X4 (R9), Z19 \
	VPSHUFB         Z31, Z19, Z19 \
	VPADDD          ctrLanes<>(SB), Z19, Z19 \
	VMOVDQU64       (R8), X12 \
	VMOVDQU64       0(BX), Z8 \
	VMOVDQU64       64(BX), Z9 \
	VMOVDQU64       128(BX), Z10 \
	VMOVDQU64       192(BX), Z11 \
	VBROADCASTI32X4 0(AX), Z20 \
	VBROADCASTI32X4 16(AX), Z21 \
	VBROADCASTI32X4 32(AX), Z22 \
	VBROADCASTI32X4 48(AX), Z23 \
	VBROADCASTI32X4 64(AX), Z24 \
	VBROADCASTI32X4 80(AX), Z25 \
	VBROADCASTI32X4 96(AX), Z26 \
	VBROADCASTI32X4 112(AX), Z27 \
	VBROADCASTI32X4 128(AX), Z28 \
	VBROADCASTI32X4 144(AX), Z29 \
	VBROADCASTI32X4 160(AX), Z30

// FINISH: the GHASH state back to R8 and the next counter block (lane 0
// of Z19, byte order restored) to R9.
#define FINISH \
	VMOVDQU64 X12, (R8) \
	VPSHUFB   X31, X19, X0 \
	VMOVDQU64 X0, (R9) \
	VZEROUPPER

// LOAD16: sixteen blocks at SI into Z4-Z7.
#define LOAD16 \
	VMOVDQU64 0(SI), Z4 \
	VMOVDQU64 64(SI), Z5 \
	VMOVDQU64 128(SI), Z6 \
	VMOVDQU64 192(SI), Z7

// REVERSE16: the bytes of each block in Z4-Z7 reversed, for the hash.
#define REVERSE16 \
	VPSHUFB Z31, Z4, Z4 \
	VPSHUFB Z31, Z5, Z5 \
	VPSHUFB Z31, Z6, Z6 \
	VPSHUFB Z31, Z7, Z7

// BULKARGS: sealBlocks' and openBlocks' arguments: rk in AX, tab in BX, y
// in R8, ctr in R9, dst in DI, src in SI, and in CX the 256-byte turns.
#define BULKARGS \
	MOVQ rk+0(FP), AX \
	MOVQ tab+8(FP), BX \
	MOVQ y+16(FP), R8 \
	MOVQ ctr+24(FP), R9 \
	MOVQ dst_base+32(FP), DI \
	MOVQ src_base+56(FP), SI \
	MOVQ src_len+64(FP), CX \
	SHRQ $8, CX

// SEALOUT: the keystream in Z0-Z3 xored with sixteen blocks at SI into
// ciphertext at DI, which is kept byte-reversed in Z4-Z7 for the hash; SI
// and DI advanced.
#define SEALOUT \
	VPXORQ    0(SI), Z0, Z0 \
	VPXORQ    64(SI), Z1, Z1 \
	VPXORQ    128(SI), Z2, Z2 \
	VPXORQ    192(SI), Z3, Z3 \
	VMOVDQU64 Z0, 0(DI) \
	VMOVDQU64 Z1, 64(DI) \
	VMOVDQU64 Z2, 128(DI) \
	VMOVDQU64 Z3, 192(DI) \
	VPSHUFB   Z31, Z0, Z4 \
	VPSHUFB   Z31, Z1, Z5 \
	VPSHUFB   Z31, Z2, Z6 \
	VPSHUFB   Z31, Z3, Z7 \
	ADDQ      $256, SI \
	ADDQ      $256, DI

// func sealBlocks(rk *[176]byte, tab *[256]byte, y, ctr *[16]byte, dst, src []byte)
// len(src) is a multiple of 256 and len(dst) >= len(src). Software
// pipelined: each turn hashes the previous turn's ciphertext (Z4-Z7)
// while it encrypts the next sixteen blocks, so that the hash does not
// wait for the cipher's rounds.
TEXT ·sealBlocks(SB), NOSPLIT, $0-80
	BULKARGS
	JZ   sealDone
	SETUP
	KEYSTREAM16
	SEALOUT
	DECQ CX
	JZ   sealLast

sealLoop:
	KEYSTREAM16
	GHASH16
	SEALOUT
	DECQ CX
	JNZ  sealLoop

sealLast:
	GHASH16
	FINISH

sealDone:
	RET

// func openBlocks(rk *[176]byte, tab *[256]byte, y, ctr *[16]byte, dst, src []byte)
// As sealBlocks, hashing src (the ciphertext) instead of dst.
TEXT ·openBlocks(SB), NOSPLIT, $0-80
	BULKARGS
	JZ   openDone
	SETUP

openLoop:
	LOAD16
	KEYSTREAM16
	VPXORQ    Z4, Z0, Z0
	VPXORQ    Z5, Z1, Z1
	VPXORQ    Z6, Z2, Z2
	VPXORQ    Z7, Z3, Z3
	VMOVDQU64 Z0, 0(DI)
	VMOVDQU64 Z1, 64(DI)
	VMOVDQU64 Z2, 128(DI)
	VMOVDQU64 Z3, 192(DI)
	REVERSE16
	GHASH16
	ADDQ      $256, SI
	ADDQ      $256, DI
	DECQ      CX
	JNZ       openLoop
	FINISH

openDone:
	RET

// func ghashBlocks(tab *[256]byte, y *[16]byte, src []byte)
// The GHASH state y advanced over src, whose length is a multiple of 16.
TEXT ·ghashBlocks(SB), NOSPLIT, $0-40
	MOVQ tab+0(FP), BX
	MOVQ y+8(FP), R8
	MOVQ src_base+16(FP), SI
	MOVQ src_len+24(FP), CX
	SHRQ $4, CX
	JZ   ghashDone
	VBROADCASTI32X4 bswapMask<>(SB), Z31
	VMOVDQU64       gfPoly<>(SB), X17
	VMOVDQU64       (R8), X12
	VMOVDQU64       240(BX), X18
	CMPQ CX, $16
	JB   ghashTail
	VMOVDQU64 0(BX), Z8
	VMOVDQU64 64(BX), Z9
	VMOVDQU64 128(BX), Z10
	VMOVDQU64 192(BX), Z11

ghashLoop16:
	LOAD16
	REVERSE16
	GHASH16
	ADDQ    $256, SI
	SUBQ    $16, CX
	CMPQ    CX, $16
	JAE     ghashLoop16
	TESTQ   CX, CX
	JZ      ghashStore

ghashTail:
	VMOVDQU64 0(SI), X4
	VPSHUFB   X31, X4, X4
	GHASH1
	ADDQ    $16, SI
	DECQ    CX
	JNZ     ghashTail

ghashStore:
	VMOVDQU64 X12, (R8)
	VZEROUPPER

ghashDone:
	RET

// ENCRYPT1: X0 encrypted with the round keys at AX.
#define ENCRYPT1 \
	VPXOR       0(AX), X0, X0 \
	VAESENC     16(AX), X0, X0 \
	VAESENC     32(AX), X0, X0 \
	VAESENC     48(AX), X0, X0 \
	VAESENC     64(AX), X0, X0 \
	VAESENC     80(AX), X0, X0 \
	VAESENC     96(AX), X0, X0 \
	VAESENC     112(AX), X0, X0 \
	VAESENC     128(AX), X0, X0 \
	VAESENC     144(AX), X0, X0 \
	VAESENCLAST 160(AX), X0, X0

// func ctrBlocks(rk *[176]byte, ctr *[16]byte, dst []byte)
// len(dst)/16 blocks of keystream from the counter block ctr, which is
// advanced past them.
TEXT ·ctrBlocks(SB), NOSPLIT, $0-40
	MOVQ rk+0(FP), AX
	MOVQ ctr+8(FP), R9
	MOVQ dst_base+16(FP), DI
	MOVQ dst_len+24(FP), CX
	SHRQ $4, CX
	JZ   ctrDone
	VMOVDQU64 bswapMask<>(SB), X31
	VMOVDQU64 ctrStep1<>(SB), X18
	VMOVDQU64 (R9), X19
	VPSHUFB   X31, X19, X19

ctrLoop:
	VPSHUFB     X31, X19, X0
	VPADDD      X18, X19, X19
	ENCRYPT1
	VMOVDQU64   X0, (DI)
	ADDQ        $16, DI
	DECQ        CX
	JNZ         ctrLoop
	VPSHUFB     X31, X19, X0
	VMOVDQU64   X0, (R9)
	VZEROUPPER

ctrDone:
	RET

// func encryptBlock(rk *[176]byte, dst, src *[16]byte)
TEXT ·encryptBlock(SB), NOSPLIT, $0-24
	MOVQ        rk+0(FP), AX
	MOVQ        dst+8(FP), DI
	MOVQ        src+16(FP), SI
	VMOVDQU     (SI), X0
	ENCRYPT1
	VMOVDQU     X0, (DI)
	VZEROUPPER
	RET

// EXPAND: round key X1 -> the next, written at off(DX); RCON is the round
// constant. X2, X3 scratch.
#define EXPAND(RCON, off) \
	VAESKEYGENASSIST $RCON, X1, X2 \
	VPSHUFD          $0xff, X2, X2 \
	VPSLLDQ          $4, X1, X3 \
	VPXOR            X3, X1, X1 \
	VPSLLDQ          $4, X3, X3 \
	VPXOR            X3, X1, X1 \
	VPSLLDQ          $4, X3, X3 \
	VPXOR            X3, X1, X1 \
	VPXOR            X2, X1, X1 \
	VMOVDQU          X1, off(DX)

// func expandKey(key *[16]byte, rk *[176]byte)
// The AES-128 key schedule (FIPS 197 section 5.2): 11 round keys.
TEXT ·expandKey(SB), NOSPLIT, $0-16
	MOVQ    key+0(FP), AX
	MOVQ    rk+8(FP), DX
	VMOVDQU (AX), X1
	VMOVDQU X1, 0(DX)
	EXPAND(0x01, 16)
	EXPAND(0x02, 32)
	EXPAND(0x04, 48)
	EXPAND(0x08, 64)
	EXPAND(0x10, 80)
	EXPAND(0x20, 96)
	EXPAND(0x40, 112)
	EXPAND(0x80, 128)
	EXPAND(0x1b, 144)
	EXPAND(0x36, 160)
	VZEROUPPER
	RET
