//go:build !amd64

package collective

// addVector adds nothing where there is no vector loop: addF32's scalar
// loop does it all.
func addVector(x, y []float32) int { return 0 }
