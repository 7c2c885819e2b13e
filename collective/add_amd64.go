package collective

import "golang.org/x/sys/cpu"

var addAVX2OK = cpu.X86.HasAVX2

// addAVX2 sets x[i] += y[i] for i < n; n is a multiple of 32
// (add_amd64.s).
//
//go:noescape
func addAVX2(x, y *float32, n int)
