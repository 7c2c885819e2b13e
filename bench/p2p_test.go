// Package bench holds the project's go test -bench suites. Benchmarks print
// numbers; tests elsewhere assert correctness.
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

func pair(b *testing.B, opt rank.Options) []rank.Transport {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opt.Timeout = 60 * time.Second
	g, err := loopback(ctx, 2, opt)
	if err != nil {
		b.Fatal(err)
	}
	return g
}

// BenchmarkP2P measures one-way throughput between two ranks on loopback
// (each message striped over every channel, hence over every connection),
// the throughput of both directions at once (exchange: the traffic of a
// 2-rank ring allreduce) and the round-trip time of an 8-byte message.
func BenchmarkP2P(b *testing.B) {
	type cfg struct {
		name string
		opt  rank.Options
	}
	cfgs := []cfg{
		{"quic-conns1", rank.Options{Transport: "quic", ConnsPerPeer: 1, Channels: 1}},
		{"quic-conns2", rank.Options{Transport: "quic", ConnsPerPeer: 2, Channels: 2}},
		{"quic-conns4", rank.Options{Transport: "quic", ConnsPerPeer: 4, Channels: 4}},
		{"tcp", rank.Options{Transport: "tcp", Channels: 1}},
		{"tcp-ch2", rank.Options{Transport: "tcp", Channels: 2}},
	}
	for _, c := range cfgs {
		g := pair(b, c.opt)
		benchPair(b, c.name, g, false)
		ranktest.CloseAll(g)
	}
}

// benchPair runs the throughput (1, 16, 64 MiB, striped over the channels;
// one way, then both ways at once) and 8-byte round-trip sub-benchmarks
// between the two ranks of g; fill
// writes the source buffer first, so copies read real pages rather than the
// kernel's shared zero page.
func benchPair(b *testing.B, name string, g []rank.Transport, fill bool) {
	ctx := context.Background()
	nch := g[0].Channels()
	// One way (rank 0 to rank 1), then both directions at once: what each
	// rank of a 2-rank ring allreduce asks of the transport (it sends to its
	// peer while it receives from it). GB/s is per direction; the one-way
	// rate is what a single direction gets when it has the whole machine.
	for _, both := range []bool{false, true} {
		senders, kind := 1, ""
		if both {
			senders, kind = 2, "exchange-"
		}
		for _, size := range []int{1 << 20, 16 << 20, 64 << 20} {
			b.Run(fmt.Sprintf("%s/%s%dMiB", name, kind, size>>20), func(b *testing.B) {
				var src, dst [2][]byte
				for s := 0; s < senders; s++ {
					src[s], dst[s] = make([]byte, size), make([]byte, size)
					if fill {
						for i := range src[s] {
							src[s][i] = byte(i + s)
						}
					}
				}
				part := (size + nch - 1) / nch
				b.SetBytes(int64(size))
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					var wg sync.WaitGroup
					for ch := 0; ch < nch; ch++ {
						lo, hi := min(ch*part, size), min((ch+1)*part, size)
						tag := rank.Tag{Seq: uint64(i), Chunk: uint32(ch)}
						for s := 0; s < senders; s++ { // s sends to 1-s
							wg.Add(2)
							go func() {
								defer wg.Done()
								if err := g[s].Send(ctx, 1-s, ch, tag, src[s][lo:hi]); err != nil {
									b.Error(err)
								}
							}()
							go func() {
								defer wg.Done()
								if err := g[1-s].Recv(ctx, s, ch, tag, dst[s][lo:hi]); err != nil {
									b.Error(err)
								}
							}()
						}
					}
					wg.Wait()
				}
				b.ReportMetric(float64(size)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
			})
		}
	}
	b.Run(name+"/rtt-8B", func(b *testing.B) {
		buf0, buf1 := make([]byte, 8), make([]byte, 8)
		done := make(chan error, 1)
		go func() {
			for i := 0; i < b.N; i++ {
				t := rank.Tag{Seq: uint64(i)}
				if err := g[1].Recv(ctx, 0, 0, t, buf1); err != nil {
					done <- err
					return
				}
				if err := g[1].Send(ctx, 0, 0, t, buf1); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			t := rank.Tag{Seq: uint64(i)}
			if err := g[0].Send(ctx, 1, 0, t, buf0); err != nil {
				b.Fatal(err)
			}
			if err := g[0].Recv(ctx, 1, 0, t, buf0); err != nil {
				b.Fatal(err)
			}
		}
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/1e3/float64(b.N), "us/rtt")
	})
}
