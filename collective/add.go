package collective

// addF32 sets dst[i] = a[i] + b[i] for every element of dst (a and b are
// at least as long; dst may be either of them). Every element is one IEEE
// single-precision addition, rounded once, with a[i] first (a NaN in a
// wins over one in b), on every CPU, vector or not: ranks on different
// machines reduce to the same bits. Where the CPU has AVX2 the bulk goes
// 32 elements a step (add_amd64.s, about three times the SSE axpy this
// replaced on slices in cache; docs/performance.md).
func addF32(dst, a, b []float32) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := addVector(dst, a, b); i < len(dst); i++ {
		dst[i] = a[i] + b[i]
	}
}
