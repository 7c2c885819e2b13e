package collective

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"gonum.org/v1/gonum/blas/blas32"

	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/rank/ranktest"
)

// BenchmarkLocalAllreduce measures the collective's own cost (scheduling,
// reduction, conversion) over the in-process transport.
func BenchmarkLocalAllreduce(b *testing.B) {
	for _, np := range []int{2, 4} {
		for _, size := range []int{4 << 10, 1 << 20, 16 << 20} {
			for _, a := range []algo.Algorithm{algo.Ring, algo.Tree, algo.HalvingDoubling} {
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
