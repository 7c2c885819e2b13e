package bench

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/rank"
	"github.com/gorun/gorun/rank/ranktest"
)

// arGroup is np ranks (goroutines with their own endpoints on loopback)
// and a Communicator per rank.
type arGroup struct {
	ts    []rank.Transport
	comms []*collective.Communicator
}

func newARGroup(b *testing.B, np int, opt rank.Options) *arGroup {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opt.Timeout = 120 * time.Second
	ts, err := loopback(ctx, np, opt)
	if err != nil {
		b.Fatal(err)
	}
	g := &arGroup{ts: ts}
	for _, t := range ts {
		c, err := collective.New(t, collective.Config{})
		if err != nil {
			b.Fatal(err)
		}
		g.comms = append(g.comms, c)
	}
	return g
}

func (g *arGroup) close() {
	for _, c := range g.comms {
		c.Close()
	}
	ranktest.CloseAll(g.ts)
}

// run does iters allreduces of bytes (float32 data, sum) on every rank.
func (g *arGroup) run(b *testing.B, bufs [][]byte, iters int, opts []collective.CallOption) {
	var wg sync.WaitGroup
	for r, c := range g.comms {
		wg.Add(1)
		go func(r int, c *collective.Communicator) {
			defer wg.Done()
			for i := 0; i < iters; i++ {
				if err := c.Allreduce(context.Background(), nil, bufs[r], dtype.Float32, collective.Sum, opts...); err != nil {
					b.Error(err)
					return
				}
			}
		}(r, c)
	}
	wg.Wait()
}

// BenchmarkAllreduce reports the bus bandwidth (nccl-tests' busbw =
// size/time * 2(n-1)/n, GB = 1e9 bytes) and the time of float32 sum
// allreduces over real loopback meshes: QUIC, TLS/TCP and shared memory,
// np 2 and 4, ring and tree (and over shared memory the group-segment
// allreduce, "shm"), float32 or float16 on the wire, 1 KiB to
// 64 MiB. Select with -bench, e.g.
//
//	go test -bench 'Allreduce/quic/np4/ring/fp32' ./bench/
func BenchmarkAllreduce(b *testing.B) {
	transports := []struct {
		name string
		opt  rank.Options
	}{
		{"quic", rank.Options{Transport: "quic"}},
		{"tcp", rank.Options{Transport: "tcp"}},
		{"shm", rank.Options{Transport: "quic", SharedMemory: "on"}},
	}
	sizes := []int{1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20}
	for _, tr := range transports {
		for _, np := range []int{2, 4} {
			var g *arGroup
			algos := []algo.Algorithm{algo.Ring, algo.Tree}
			if tr.name == "shm" {
				algos = append(algos, algo.Shared) // the group-segment allreduce (auto on one host)
			}
			for _, a := range algos {
				for _, wire := range []dtype.DType{dtype.Float32, dtype.Float16} {
					wname := map[dtype.DType]string{dtype.Float32: "fp32", dtype.Float16: "fp16"}[wire]
					for _, size := range sizes {
						name := fmt.Sprintf("%s/np%d/%s/%s/%s", tr.name, np, a, wname, sizeName(size))
						b.Run(name, func(b *testing.B) {
							if g == nil {
								g = newARGroup(b, np, tr.opt)
							}
							opts := []collective.CallOption{collective.WithAlgorithm(a)}
							if wire != dtype.Float32 {
								opts = append(opts, collective.WithWire(wire))
							}
							bufs := make([][]byte, np)
							for r := range bufs {
								bufs[r] = make([]byte, size)
							}
							g.run(b, bufs, 2, opts) // warm-up
							b.SetBytes(int64(size))
							b.ResetTimer()
							g.run(b, bufs, b.N, opts)
							sec := b.Elapsed().Seconds() / float64(b.N)
							algbw := float64(size) / sec / 1e9
							b.ReportMetric(algbw*2*float64(np-1)/float64(np), "busbw_GB/s")
							b.ReportMetric(sec*1e6, "us/op")
						})
					}
				}
			}
			if g != nil {
				g.close()
			}
		}
	}
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
