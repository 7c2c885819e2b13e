package cpu

import "unsafe"

// sgemmKernelGo is the pure Go micro-kernel: a 4 x 4 tile held in 16 local
// variables. It is the fallback on CPUs and architectures without an
// assembly kernel and the reference the assembly kernels are tested against.
func sgemmKernelGo(kc int, a, b, c *float32, ldc int, beta float32, overwrite int) {
	const mr, nr = 4, 4
	ap := unsafe.Slice(a, kc*mr)
	bp := unsafe.Slice(b, kc*nr)
	var c00, c01, c02, c03 float32
	var c10, c11, c12, c13 float32
	var c20, c21, c22, c23 float32
	var c30, c31, c32, c33 float32
	for p := 0; p < kc; p++ {
		av := ap[p*mr : p*mr+mr : p*mr+mr]
		bv := bp[p*nr : p*nr+nr : p*nr+nr]
		a0, a1, a2, a3 := av[0], av[1], av[2], av[3]
		b0, b1, b2, b3 := bv[0], bv[1], bv[2], bv[3]
		c00 += a0 * b0
		c01 += a0 * b1
		c02 += a0 * b2
		c03 += a0 * b3
		c10 += a1 * b0
		c11 += a1 * b1
		c12 += a1 * b2
		c13 += a1 * b3
		c20 += a2 * b0
		c21 += a2 * b1
		c22 += a2 * b2
		c23 += a2 * b3
		c30 += a3 * b0
		c31 += a3 * b1
		c32 += a3 * b2
		c33 += a3 * b3
	}
	cs := unsafe.Slice(c, 3*ldc+nr)
	rows := [mr][nr]float32{
		{c00, c01, c02, c03},
		{c10, c11, c12, c13},
		{c20, c21, c22, c23},
		{c30, c31, c32, c33},
	}
	for i := 0; i < mr; i++ {
		row := cs[i*ldc : i*ldc+nr : i*ldc+nr]
		if overwrite != 0 {
			copy(row, rows[i][:])
			continue
		}
		for j := range row {
			row[j] = rows[i][j] + beta*row[j]
		}
	}
}
