package collective

// addF32 sets x[i] += y[i] for every element of x (y is at least as
// long). Every element is one IEEE single-precision addition of x[i] and
// y[i], rounded once, with x[i] first (a NaN in x wins over one in y), on
// every CPU, vector or not: ranks on different machines reduce to the same
// bits. Where the CPU has AVX2 the bulk goes 32 elements a step
// (add_amd64.s, about three times the SSE axpy this replaced on slices
// in cache; docs/performance.md).
func addF32(x, y []float32) {
	y = y[:len(x)]
	for i := addVector(x, y); i < len(x); i++ {
		x[i] += y[i]
	}
}
