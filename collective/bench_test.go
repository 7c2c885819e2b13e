package collective

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"gonum.org/v1/gonum/blas/blas32"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/rank/ranktest"
)

// BenchmarkLocalAllreduce measures the collective's own cost (scheduling,
// reduction, conversion) over the in-process transport.
func BenchmarkLocalAllreduce(b *testing.B) {
	for _, np := range []int{2, 4} {
		for _, size := range []int{4 << 10, 1 << 20, 16 << 20} {
			for _, a := range []Algorithm{Ring, Tree, HalvingDoubling} {
				b.Run(fmt.Sprintf("np%d/%s/%dKiB", np, a, size>>10), func(b *testing.B) {
					ts := ranktest.InMemory(np, 2)
					comms := make([]*Communicator, np)
					for r := range comms {
						comms[r], _ = New(ts[r], Config{})
					}
					bufs := make([][]byte, np)
					for r := range bufs {
						bufs[r] = make([]byte, size)
					}
					b.SetBytes(int64(size))
					b.ResetTimer()
					var wg sync.WaitGroup
					for r := range comms {
						wg.Add(1)
						go func(r int) {
							defer wg.Done()
							for i := 0; i < b.N; i++ {
								if err := comms[r].Allreduce(context.Background(), nil, bufs[r], dtype.Float32, Sum, WithAlgorithm(a)); err != nil {
									b.Error(err)
									return
								}
							}
						}(r)
					}
					wg.Wait()
				})
			}
		}
	}
}

// TestModelChoice: Choose takes the algorithm Predict says is faster: with
// a cheap tree hop and a slow tree per byte, the tree for small calls and
// the ring for large ones, more so with more ranks; the ring at 2 ranks.
func TestModelChoice(t *testing.T) {
	m := CostModel{RingStepUs: 50, TreeHopUs: 50, RingGBs: 1, TreeGBs: 0.5}
	for _, k := range []struct {
		bytes, n int
		want     Algorithm
	}{{4 << 10, 8, Tree}, {64 << 20, 8, Ring}, {4 << 10, 2, Ring}, {1 << 10, 4, Tree}, {1 << 20, 4, Ring}} {
		if a := m.Choose(k.bytes, k.n); a != k.want {
			t.Errorf("%d bytes on %d ranks: %v (ring %.0f us, tree %.0f us)", k.bytes, k.n, a,
				m.Predict(Ring, k.bytes, k.n), m.Predict(Tree, k.bytes, k.n))
		}
	}
	// DirectMaxBytes: Direct up to it (from 2 ranks), the others above
	m.DirectMaxBytes = 8 << 10
	for _, k := range []struct {
		bytes, n int
		want     Algorithm
	}{{0, 2, Direct}, {8 << 10, 8, Direct}, {8<<10 + 1, 8, Tree}, {8<<10 + 1, 2, Ring}, {4 << 10, 1, Ring}} {
		if a := m.Choose(k.bytes, k.n); a != k.want {
			t.Errorf("DirectMaxBytes %d: %d bytes on %d ranks: %v, want %v", m.DirectMaxBytes, k.bytes, k.n, a, k.want)
		}
	}
	// DirectMaxSent: (N-1) * bytes at most
	m.DirectMaxSent = 21 << 10
	for _, k := range []struct {
		bytes, n int
		want     Algorithm
	}{{7 << 10, 4, Direct}, {7<<10 + 1, 4, Tree}, {8 << 10, 2, Direct}, {3 << 10, 8, Direct}, {4 << 10, 8, Tree}} {
		if a := m.Choose(k.bytes, k.n); a != k.want {
			t.Errorf("DirectMaxSent %d: %d bytes on %d ranks: %v, want %v", m.DirectMaxSent, k.bytes, k.n, a, k.want)
		}
	}
	if DefaultModel.RingGBs <= 0 || DefaultModel.TreeGBs <= 0 {
		t.Fatal("DefaultModel has no bandwidths")
	}
}

// BenchmarkApplySum is the reduction's sum on one pipeline slice (96 KiB of
// float32, in cache) and on 4 MiB (out of L2), beside gonum's float32 axpy
// (x += 1*y, SSE), which it replaced, and the plain Go loop.
func BenchmarkApplySum(b *testing.B) {
	for _, n := range []int{DefaultSliceBytes / 4, 1 << 20} {
		x, y := make([]float32, n), make([]float32, n)
		for _, k := range []struct {
			name string
			sum  func()
		}{
			{"gorun", func() { apply(x, x, y, Sum) }},
			{"gonum-axpy", func() {
				blas32.Axpy(1, blas32.Vector{N: n, Inc: 1, Data: y}, blas32.Vector{N: n, Inc: 1, Data: x})
			}},
			{"go-loop", func() {
				for i := range x {
					x[i] += y[i]
				}
			}},
		} {
			b.Run(fmt.Sprintf("%s/%dKiB", k.name, 4*n>>10), func(b *testing.B) {
				b.SetBytes(int64(4 * n))
				for i := 0; i < b.N; i++ {
					k.sum()
				}
			})
		}
	}
}
