package collective

import "golang.org/x/sys/cpu"

// addVector adds y into x with AVX2 as far as whole steps of 32 elements
// go, where the CPU has it, and returns how many elements it added.
func addVector(x, y []float32) int {
	n := len(x) &^ 31
	if n == 0 || !cpu.X86.HasAVX2 {
		return 0
	}
	addAVX2(&x[0], &y[0], n)
	return n
}

// addAVX2 sets x[i] += y[i] for i < n; n is a multiple of 32
// (add_amd64.s).
//
//go:noescape
func addAVX2(x, y *float32, n int)
