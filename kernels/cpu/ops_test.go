package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gorun/gorun/kernels/kerneltest"
)

// The ops are checked by the backend-independent table in package
// kerneltest (float64 references, finite differences, exact masks); this
// file keeps what is particular to the CPU backend.

// TestOps runs the table with GOMAXPROCS workers, then with 1 and 3 so
// that both the single-worker loops and uneven splits of rows, columns and
// elements (the table's big cases exceed every op's grain) are covered.
func TestOps(t *testing.T) {
	for _, threads := range []int{0, 1, 3} {
		be := New()
		if threads > 0 {
			be.Threads = threads
		}
		t.Run(fmt.Sprintf("threads=%d", be.Threads), func(t *testing.T) {
			kerneltest.Run(t, be, kerneltest.FP32())
		})
	}
}

func randn(r *rand.Rand, n int, sd float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * sd)
	}
	return x
}

func TestExpShift(t *testing.T) {
	src := make([]float32, 0, 20000)
	for x := float32(-95); x <= 0; x += 0.00493 {
		src = append(src, x)
	}
	src = append(src, 0)
	dst := make([]float32, len(src))
	sum := expShift(dst, src, 0)
	var ref float64
	for j, x := range src {
		want := math.Exp(float64(x))
		if x < -87 {
			want = 0
		}
		ref += want
		if math.Abs(float64(dst[j])-want) > 4e-7*want {
			t.Fatalf("exp(%v) = %v, want %v", x, dst[j], want)
		}
	}
	if math.Abs(float64(sum)-ref) > 1e-5*ref {
		t.Fatalf("sum %v, want %v", sum, ref)
	}
	if s2 := expShift(nil, src, 0); s2 != sum {
		t.Fatal("sum without dst differs")
	}
}
