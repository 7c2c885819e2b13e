package collective

import "golang.org/x/sys/cpu"

// addVector sets dst = a + b with AVX2 as far as whole steps of 32
// elements go, where the CPU has it, and returns how many elements it
// did.
func addVector(dst, a, b []float32) int {
	n := len(dst) &^ 31
	if n == 0 || !cpu.X86.HasAVX2 {
		return 0
	}
	addAVX2(&dst[0], &a[0], &b[0], n)
	return n
}

// addAVX2 sets dst[i] = a[i] + b[i] for i < n; n is a multiple of 32
// (add_amd64.s).
//
//go:noescape
func addAVX2(dst, a, b *float32, n int)
