package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/kernels"
)

// Orthonormalize's values are checked by the kerneltest table; here: its
// result must not depend on the number of threads (PowerSGD's workers
// orthonormalize the same all-reduced P and must agree to the bit),
// whether one matrix's rows are split (131072 x 8: up to 4 goroutines) or
// the matrices of a batch (40 x 4096 x 4: 2; 3 x 32768 x 8: 3).
func TestOrthonormalizeThreadIndependent(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, sh := range [][3]int{{1, 131072, 8}, {3, 32768, 8}, {1, 5000, 3}, {40, 4096, 4}, {5, 7, 8}} {
		n, rows, cols := sh[0], sh[1], sh[2]
		in := randn(r, n*rows*cols, 1)
		var want []float32
		for _, th := range []int{1, 2, 3, 7, 16} {
			be := New()
			be.Threads = th
			x := slices.Clone(in)
			be.Orthonormalize(kernels.FromF32(x, n, rows, cols), 1e-8)
			if want == nil {
				want = x
				continue
			}
			for i := range x {
				if math.Float32bits(x[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%v threads=%d: element %d is %g, %g with 1 thread", sh, th, i, x[i], want[i])
				}
			}
		}
	}
}

// BenchmarkOrthonormalize: the shapes PowerSGD orthonormalizes in
// Transformer-base, [rows, rank]: rows 512 (Q, and P of the d x d
// projections), 2048 (the feed-forward layers' P or Q), 32768 (the
// embedding's P). The matrix is orthonormal after the first call; the
// cost does not depend on the values.
func BenchmarkOrthonormalize(b *testing.B) {
	for _, rows := range []int{512, 2048, 32768} {
		for _, cols := range []int{1, 2, 4, 8} {
			b.Run(fmt.Sprintf("rows=%d/cols=%d", rows, cols), func(b *testing.B) {
				r := rand.New(rand.NewPCG(1, 2))
				x := kernels.FromF32(randn(r, rows*cols, 1), rows, cols)
				be := New()
				b.SetBytes(int64(4 * rows * cols))
				for range b.N {
					be.Orthonormalize(x, 1e-8)
				}
			})
		}
	}
}

// Orthonormalize takes F32 matrices only.
func TestOrthonormalizeRefuses(t *testing.T) {
	be := New()
	for what, p := range map[string]kernels.Tensor{
		"F16":   be.Alloc(dtype.Float16, 4, 2),
		"I32":   be.Alloc(dtype.Int32, 4, 2),
		"1-D":   be.Alloc(dtype.Float32, 8),
		"empty": {},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: Orthonormalize(%v) did not panic", what, p)
				}
			}()
			be.Orthonormalize(p, 1e-8)
		}()
	}
}
