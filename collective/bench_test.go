package collective

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/gorun/gorun/rank"
)

// BenchmarkLocalAllreduce measures the collective's own cost (scheduling,
// reduction, conversion) over the in-process transport.
func BenchmarkLocalAllreduce(b *testing.B) {
	for _, np := range []int{2, 4} {
		for _, size := range []int{4 << 10, 1 << 20, 16 << 20} {
			for _, a := range []Algorithm{Ring, Tree} {
				b.Run(fmt.Sprintf("np%d/%s/%dKiB", np, a, size>>10), func(b *testing.B) {
					ts := rank.NewLocalGroup(np, 2)
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
								if err := comms[r].Allreduce(context.Background(), nil, bufs[r], Float32, Sum, WithAlgorithm(a)); err != nil {
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
