package bench

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/rank"
	"github.com/gorun/gorun/rank/ranktest"
)

// BenchmarkP2PShm is BenchmarkP2P over the shared-memory lanes that ranks on
// one host use (docs/shm.md), through the ring (the default) and with the
// single-copy path for large messages (shm-cma): one-way throughput of 1-64
// MiB messages striped over the channels, and the round-trip time of an
// 8-byte message. Unlike BenchmarkP2P it fills the source buffer, so that the
// copies read real pages rather than the kernel's shared zero page. Run it
// beside BenchmarkP2P (go test -bench 'P2P' ./bench/) to compare with QUIC
// and TCP on loopback in one sitting.
func BenchmarkP2PShm(b *testing.B) {
	for _, c := range []struct {
		nch int
		cma bool // Options.SingleCopy (GORUN_SHM_CMA=1): process_vm_readv from 64 KiB
	}{{1, false}, {2, false}, {1, true}} {
		nch := c.nch
		name := fmt.Sprintf("shm-ch%d", nch)
		if c.cma {
			name = fmt.Sprintf("shm-cma-ch%d", nch)
		}
		g := pair(b, rank.Options{SharedMemory: "on", Channels: nch, SingleCopy: c.cma})
		if tr := g[0].(*rank.Mesh).PeerTransport(1); tr != "shm" {
			b.Fatalf("rank 0 reaches rank 1 over %s, not shared memory", tr)
		}
		benchPair(b, name, g, true) // real pages, not the shared zero page
		ranktest.CloseAll(g)
	}
}

// BenchmarkShmRing4 is the pattern of one ring-allreduce step with 4 ranks on
// one host: every rank sends a message to the next rank while it receives
// one from the previous, all at once (4 ranks on 2 cores here). It compares
// the single-copy path (process_vm_readv) with the two-copy ring, and with
// QUIC and TCP on loopback; GB/s is per rank.
func BenchmarkShmRing4(b *testing.B) {
	const n = 4
	for _, c := range []struct {
		name string
		opt  rank.Options
	}{
		{"shm", rank.Options{SharedMemory: "on", Channels: 1}},
		{"shm-cma", rank.Options{SharedMemory: "on", Channels: 1, SingleCopy: true}},
		{"quic", rank.Options{Transport: "quic", ConnsPerPeer: 1, Channels: 1}},
		{"tcp", rank.Options{Transport: "tcp", Channels: 1}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c.opt.Timeout = 60 * time.Second
		g, err := loopback(ctx, n, c.opt)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		for _, size := range []int{1 << 20, 16 << 20} {
			b.Run(fmt.Sprintf("%s/%dMiB", c.name, size>>20), func(b *testing.B) {
				src := make([][]byte, n)
				dst := make([][]byte, n)
				for r := range src {
					src[r], dst[r] = make([]byte, size), make([]byte, size)
					for i := range src[r] {
						src[r][i] = byte(i + r)
					}
				}
				b.SetBytes(int64(size))
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					var wg sync.WaitGroup
					for r := 0; r < n; r++ {
						tag := rank.Tag{Seq: uint64(i)}
						wg.Add(2)
						go func() {
							defer wg.Done()
							if err := g[r].Send(context.Background(), (r+1)%n, 0, tag, src[r]); err != nil {
								b.Error(err)
							}
						}()
						go func() {
							defer wg.Done()
							if err := g[r].Recv(context.Background(), (r+n-1)%n, 0, tag, dst[r]); err != nil {
								b.Error(err)
							}
						}()
					}
					wg.Wait()
				}
				b.ReportMetric(float64(size)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
			})
		}
		ranktest.CloseAll(g)
	}
}
