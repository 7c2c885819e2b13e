//go:build !amd64

package collective

// addVector does nothing where there is no vector loop: addF32's scalar
// loop does it all.
func addVector(dst, a, b []float32) int { return 0 }
