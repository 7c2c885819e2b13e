//go:build ignore

// sgemm_asmgen writes sgemm_amd64.s, the register-blocked SGEMM
// micro-kernels. Run from this directory:
//
//	go run sgemm_asmgen.go > sgemm_amd64.s
//
// Each kernel computes one MR x NR tile of C from a packed A micro-panel
// (kc steps of MR floats, the broadcast operand) and a packed B micro-panel
// (kc steps of NR floats, the vector operand):
//
//	acc = sum_p A[p*MR+i] * B[p*NR+j]
//	C[i*ldc+j] = acc               if overwrite != 0
//	C[i*ldc+j] = acc + beta*C[...] otherwise
package main

import (
	"fmt"
	"os"
	"strings"
)

type kern struct {
	name    string
	mr      int    // rows of the tile (broadcast operand)
	vecs    int    // vector registers per row of the tile
	lanes   int    // floats per vector register
	reg     string // register prefix: "Z" or "Y"
	zero    string // instruction that zeroes a register
	unroll  int    // k steps per loop iteration
	pfA     int    // software prefetch distance for A, bytes
	pfB     int    // software prefetch distance for B, bytes
	feature string
}

var b strings.Builder

func p(format string, args ...any) { fmt.Fprintf(&b, "\t"+format+"\n", args...) }

func gen(k kern) {
	nr := k.vecs * k.lanes
	vbytes := k.lanes * 4
	nacc := k.mr * k.vecs
	bReg0 := nacc          // first B register
	cast0 := nacc + k.vecs // first broadcast register
	ncast := 32 - cast0    // AVX-512 has 32 registers
	if k.reg == "Y" {
		ncast = 16 - cast0
	}
	if ncast < 1 {
		panic("not enough registers")
	}
	acc := func(i, v int) string { return fmt.Sprintf("%s%d", k.reg, i*k.vecs+v) }
	breg := func(v int) string { return fmt.Sprintf("%s%d", k.reg, bReg0+v) }
	creg := func(i int) string { return fmt.Sprintf("%s%d", k.reg, cast0+i%ncast) }
	aStep := k.mr * 4
	bStep := nr * 4

	fmt.Fprintf(&b, "// func %s(kc int, a, b, c *float32, ldc int, beta float32, overwrite int)\n", k.name)
	fmt.Fprintf(&b, "// %d x %d tile, %s.\n", k.mr, nr, k.feature)
	fmt.Fprintf(&b, "TEXT ·%s(SB), NOSPLIT, $0-56\n", k.name)
	p("MOVQ kc+0(FP), SI")
	p("MOVQ a+8(FP), AX")
	p("MOVQ b+16(FP), BX")
	p("MOVQ c+24(FP), CX")
	p("MOVQ ldc+32(FP), DX")
	p("SHLQ $2, DX")
	for i := 0; i < k.mr; i++ {
		for v := 0; v < k.vecs; v++ {
			r := acc(i, v)
			p("%s %s, %s, %s", k.zero, r, r, r)
		}
	}
	// Prefetch the C tile: it is touched only at the end.
	p("MOVQ CX, R8")
	for i := 0; i < k.mr; i++ {
		for off := 0; off < nr*4; off += 64 {
			p("PREFETCHT0 %d(R8)", off)
		}
		if nr*4%64 == 0 {
			p("PREFETCHT0 %d(R8)", nr*4-4) // an unaligned row spans one more line
		}
		p("ADDQ DX, R8")
	}
	step := func(s int) {
		for v := 0; v < k.vecs; v++ {
			p("VMOVUPS %d(BX), %s", s*bStep+v*vbytes, breg(v))
		}
		for i := 0; i < k.mr; i++ {
			p("VBROADCASTSS %d(AX), %s", s*aStep+4*i, creg(i))
			for v := 0; v < k.vecs; v++ {
				p("VFMADD231PS %s, %s, %s", breg(v), creg(i), acc(i, v))
			}
		}
	}
	p("MOVQ SI, DI")
	p("SHRQ $%d, DI", log2(k.unroll))
	p("JZ %s_tail", k.name)
	fmt.Fprintf(&b, "%s_loop:\n", k.name)
	for s := 0; s < k.unroll; s++ {
		step(s)
	}
	for off := 0; off < k.unroll*aStep; off += 64 {
		p("PREFETCHT0 %d(AX)", k.pfA+off)
	}
	if k.pfB > 0 {
		for off := 0; off < k.unroll*bStep; off += 64 {
			p("PREFETCHT0 %d(BX)", k.pfB+off)
		}
	}
	p("ADDQ $%d, AX", k.unroll*aStep)
	p("ADDQ $%d, BX", k.unroll*bStep)
	p("DECQ DI")
	p("JNZ %s_loop", k.name)
	fmt.Fprintf(&b, "%s_tail:\n", k.name)
	p("ANDQ $%d, SI", k.unroll-1)
	p("JZ %s_store", k.name)
	fmt.Fprintf(&b, "%s_one:\n", k.name)
	step(0)
	p("ADDQ $%d, AX", aStep)
	p("ADDQ $%d, BX", bStep)
	p("DECQ SI")
	p("JNZ %s_one", k.name)
	fmt.Fprintf(&b, "%s_store:\n", k.name)
	p("MOVQ overwrite+48(FP), R9")
	p("TESTQ R9, R9")
	p("JNZ %s_overwrite", k.name)
	beta := creg(0)
	p("VBROADCASTSS beta+40(FP), %s", beta)
	for i := 0; i < k.mr; i++ {
		for v := 0; v < k.vecs; v++ {
			p("VFMADD231PS %d(CX), %s, %s", v*vbytes, beta, acc(i, v))
			p("VMOVUPS %s, %d(CX)", acc(i, v), v*vbytes)
		}
		if i < k.mr-1 {
			p("ADDQ DX, CX")
		}
	}
	p("VZEROUPPER")
	p("RET")
	fmt.Fprintf(&b, "%s_overwrite:\n", k.name)
	for i := 0; i < k.mr; i++ {
		for v := 0; v < k.vecs; v++ {
			p("VMOVUPS %s, %d(CX)", acc(i, v), v*vbytes)
		}
		if i < k.mr-1 {
			p("ADDQ DX, CX")
		}
	}
	p("VZEROUPPER")
	p("RET")
	b.WriteString("\n")
}

// genPackTrans writes packTransAVX512, which transposes up to 16 rows of
// the stored matrix into a panel, 16 columns at a time through a 16 x 16
// in-register transpose (unpack ps, unpack pd, two rounds of 128-bit lane
// shuffles).
func genPackTrans() {
	b.WriteString(`// func packTransAVX512(dst, src *float32, offs *[16]int, kc, w int, alpha float32, rowMask, storeMask int)
// dst[p*w+i] = alpha*src[offs[i]/4+p] for i < 16 lanes in rowMask (other lanes
// of storeMask get zero), p < kc. offs[i] is row i's byte offset.
TEXT ·packTransAVX512(SB), NOSPLIT, $0-64
`)
	p("MOVQ dst+0(FP), DI")
	p("MOVQ src+8(FP), SI")
	p("MOVQ offs+16(FP), R9")
	p("MOVQ kc+24(FP), CX")
	p("MOVQ w+32(FP), DX")
	p("SHLQ $2, DX")
	p("MOVQ DX, R12")
	p("SHLQ $4, R12")
	p("MOVQ rowMask+48(FP), AX")
	p("KMOVW AX, K2")
	p("MOVQ storeMask+56(FP), AX")
	p("KMOVW AX, K3")
	b.WriteString("packt_loop:\n")
	p("MOVQ $0xffff, AX")
	p("CMPQ CX, $16")
	p("JGE packt_full")
	p("MOVQ $1, AX")
	p("SHLQ CX, AX")
	p("DECQ AX")
	b.WriteString("packt_full:\n")
	p("KMOVW AX, K1")
	z := func(i int) string { return fmt.Sprintf("Z%d", i) }
	for r := 0; r < 16; r++ {
		p("MOVQ %d(R9), R10", 8*r)
		p("VMOVUPS.Z (SI)(R10*1), K1, %s", z(r))
	}
	// Stage 1: t[2k], t[2k+1] = unpack lo/hi ps of rows 2k, 2k+1.
	for k := 0; k < 8; k++ {
		p("VUNPCKLPS %s, %s, %s", z(2*k+1), z(2*k), z(16+2*k))
		p("VUNPCKHPS %s, %s, %s", z(2*k+1), z(2*k), z(16+2*k+1))
	}
	// Stage 2: u[4k+c] holds rows 4k..4k+3 at column 4L+c of lane L.
	for k := 0; k < 4; k++ {
		t := 16 + 4*k
		p("VUNPCKLPD %s, %s, %s", z(t+2), z(t), z(4*k))
		p("VUNPCKHPD %s, %s, %s", z(t+2), z(t), z(4*k+1))
		p("VUNPCKLPD %s, %s, %s", z(t+3), z(t+1), z(4*k+2))
		p("VUNPCKHPD %s, %s, %s", z(t+3), z(t+1), z(4*k+3))
	}
	// Stage 3 and 4: 4 x 4 transpose of 128-bit lanes of u[c], u[4+c],
	// u[8+c], u[12+c]; column j = 4L+c ends in Z(j).
	for c := 0; c < 4; c++ {
		v := 16 + 4*c
		p("VSHUFF32X4 $0x44, %s, %s, %s", z(4+c), z(c), z(v))
		p("VSHUFF32X4 $0xEE, %s, %s, %s", z(4+c), z(c), z(v+1))
		p("VSHUFF32X4 $0x44, %s, %s, %s", z(12+c), z(8+c), z(v+2))
		p("VSHUFF32X4 $0xEE, %s, %s, %s", z(12+c), z(8+c), z(v+3))
	}
	for c := 0; c < 4; c++ {
		v := 16 + 4*c
		p("VSHUFF32X4 $0x88, %s, %s, %s", z(v+2), z(v), z(c))
		p("VSHUFF32X4 $0xDD, %s, %s, %s", z(v+2), z(v), z(4+c))
		p("VSHUFF32X4 $0x88, %s, %s, %s", z(v+3), z(v+1), z(8+c))
		p("VSHUFF32X4 $0xDD, %s, %s, %s", z(v+3), z(v+1), z(12+c))
	}
	p("VBROADCASTSS alpha+40(FP), Z16")
	p("MOVQ DI, R11")
	for j := 0; j < 16; j++ {
		if j > 0 {
			p("CMPQ CX, $%d", j)
			p("JLE packt_next")
		}
		p("VMULPS.Z Z16, %s, K2, %s", z(j), z(j))
		p("VMOVUPS %s, K3, (R11)", z(j))
		p("ADDQ DX, R11")
	}
	b.WriteString("packt_next:\n")
	p("ADDQ $64, SI")
	p("ADDQ R12, DI")
	p("SUBQ $16, CX")
	p("JGT packt_loop")
	p("VZEROUPPER")
	p("RET")
	b.WriteString("\n")
}

func log2(n int) int {
	l := 0
	for 1<<l < n {
		l++
	}
	if 1<<l != n {
		panic("unroll must be a power of two")
	}
	return l
}

func main() {
	b.WriteString("// Code generated by sgemm_asmgen.go; DO NOT EDIT.\n\n")
	b.WriteString("//go:build amd64 && !purego\n\n")
	b.WriteString("#include \"textflag.h\"\n\n")
	gen(kern{name: "sgemmKernelAVX512", mr: 12, vecs: 2, lanes: 16, reg: "Z", zero: "VPXORD", unroll: 4, pfA: 768, pfB: 0, feature: "AVX-512F"})
	gen(kern{name: "sgemmKernelAVX2", mr: 6, vecs: 2, lanes: 8, reg: "Y", zero: "VXORPS", unroll: 4, pfA: 384, pfB: 0, feature: "AVX2 and FMA"})
	genPackTrans()
	os.Stdout.WriteString(b.String())
}
