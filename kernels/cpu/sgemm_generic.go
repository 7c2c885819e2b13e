package cpu

import "unsafe"

// sgemmKernelGo is the pure Go micro-kernel for a 4 x 4 tile. It is the
// fallback on CPUs and architectures without an assembly kernel (and what
// SetSgemmKernel("go") selects). It makes two passes over k, rows 0-1 and
// rows 2-3, so that the 8 accumulators and 6 operands of a pass fit in the
// 16 floating-point registers of amd64 and arm64 without spilling.
func sgemmKernelGo(kc int, a, b, c *float32, ldc int, beta float32, overwrite int) {
	const mr, nr = 4, 4
	ap := unsafe.Slice(a, kc*mr)
	bp := unsafe.Slice(b, kc*nr)
	cs := unsafe.Slice(c, 3*ldc+nr)
	for half := 0; half < mr; half += 2 {
		var c00, c01, c02, c03 float32
		var c10, c11, c12, c13 float32
		for p := 0; p < kc; p++ {
			av := ap[p*mr+half : p*mr+half+2 : p*mr+half+2]
			bv := bp[p*nr : p*nr+nr : p*nr+nr]
			a0, a1 := av[0], av[1]
			b0, b1, b2, b3 := bv[0], bv[1], bv[2], bv[3]
			c00 += a0 * b0
			c01 += a0 * b1
			c02 += a0 * b2
			c03 += a0 * b3
			c10 += a1 * b0
			c11 += a1 * b1
			c12 += a1 * b2
			c13 += a1 * b3
		}
		storeRowGo(cs[half*ldc:half*ldc+nr:half*ldc+nr], c00, c01, c02, c03, beta, overwrite)
		storeRowGo(cs[(half+1)*ldc:(half+1)*ldc+nr:(half+1)*ldc+nr], c10, c11, c12, c13, beta, overwrite)
	}
}

func storeRowGo(row []float32, v0, v1, v2, v3, beta float32, overwrite int) {
	if overwrite != 0 {
		row[0], row[1], row[2], row[3] = v0, v1, v2, v3
		return
	}
	row[0] = v0 + beta*row[0]
	row[1] = v1 + beta*row[1]
	row[2] = v2 + beta*row[2]
	row[3] = v3 + beta*row[3]
}
