package collective

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/rank"
	"github.com/gorun/gorun/rank/ranktest"
)

// loopback returns n meshes over transport: "quic", "tcp", or "shm"
// (shared memory between the ranks, QUIC for the rest).
func loopback(t *testing.T, n int, transport string) []rank.Transport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opt := rank.Options{Transport: transport, Timeout: 10 * time.Second}
	if transport == "shm" {
		opt.Transport, opt.SharedMemory = "quic", "on"
	}
	ts, err := ranktest.Loopback(ctx, n, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ranktest.CloseAll(ts) })
	return ts
}

// TestLoopback: a smaller set of the property tests over real QUIC and
// TLS/TCP meshes on 127.0.0.1, and over shared memory.
func TestLoopback(t *testing.T) {
	for _, k := range []struct {
		transport string
		n         int
	}{{"quic", 2}, {"quic", 3}, {"tcp", 3}, {"shm", 4}} {
		t.Run(fmt.Sprintf("%s-N%d", k.transport, k.n), func(t *testing.T) {
			ts := loopback(t, k.n, k.transport)
			var cases []arCase
			i := 0
			for _, l := range []int{0, 1, k.n + 1, 1031, 100_003} {
				for _, op := range ops {
					for _, v := range []variant{{dtype.Float32, dtype.Float32}, {dtype.Float32, dtype.Float16}, {dtype.BFloat16, dtype.BFloat16}} {
						for _, a := range []algo.Algorithm{algo.Ring, algo.Tree, algo.Direct, algo.HalvingDoubling, algo.RecursiveDoubling} {
							if a == algo.Direct { // small lengths only (larger ones run the ring or tree)
								if l <= 2000 {
									cases = append(cases, arCase{count: l, op: op, v: v, algo: a, inPlace: (i+int(op))%2 == 0})
								}
								continue
							}
							i++
							if l > 2000 && (op == Min || i%3 != 0) {
								continue // keep the large ones few
							}
							cases = append(cases, arCase{count: l, op: op, v: v, algo: a, inPlace: i%2 == 0})
						}
					}
				}
			}
			checkAllreduceInts(t, ts, Config{SliceBytes: 4096}, cases)
			errs := group(ts, Config{}, func(c *Communicator) error {
				for root := 0; root < k.n; root++ {
					buf := make([]byte, 70001)
					if c.Rank() == root {
						buf = pattern(root, len(buf))
					}
					if err := c.Broadcast(testCtx(t), buf, root); err != nil {
						return err
					}
					if !bytes.Equal(buf, pattern(root, len(buf))) {
						return fmt.Errorf("broadcast from %d: wrong bytes", root)
					}
				}
				recv := make([]byte, k.n*5003)
				if err := c.Allgather(testCtx(t), pattern(c.Rank(), 5003), recv); err != nil {
					return err
				}
				for r := 0; r < k.n; r++ {
					if !bytes.Equal(recv[r*5003:(r+1)*5003], pattern(r, 5003)) {
						return fmt.Errorf("allgather: block %d wrong", r)
					}
				}
				send := make([]float32, k.n*1000)
				for i := range send {
					send[i] = float32(i + c.Rank())
				}
				out := make([]float32, 1000)
				if err := c.ReduceScatter(testCtx(t), Float32Bytes(send), Float32Bytes(out), dtype.Float32, Sum); err != nil {
					return err
				}
				for i, x := range out {
					j := c.Rank()*1000 + i
					if want := float32(k.n*j + k.n*(k.n-1)/2); x != want {
						return fmt.Errorf("reduce-scatter: element %d = %v, want %v", i, x, want)
					}
				}
				return c.Barrier(testCtx(t))
			})
			if err := firstErr(errs); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestLoopbackPeerDies: over QUIC, rank 2 closes its mesh (as a process
// that exits does) while the others are in an allreduce; they fail
// within the timeout, blaming rank 2.
func TestLoopbackPeerDies(t *testing.T) {
	ts := loopback(t, 3, "quic")
	start := time.Now()
	errs := timed(t, ts, Config{Timeout: 5 * time.Second}, 15*time.Second, func(c *Communicator) error {
		buf := make([]byte, 8<<20)
		if err := c.Allreduce(testCtx(t), nil, buf, dtype.Float32, Sum); err != nil {
			return fmt.Errorf("first allreduce: %w", err)
		}
		if c.Rank() == 2 {
			go c.Transport().Close()
			return nil
		}
		return c.Allreduce(testCtx(t), nil, buf, dtype.Float32, Sum)
	})
	for r := 0; r < 2; r++ {
		if errs[r] == nil || !names(errs[r], 2) {
			t.Errorf("rank %d: want an error blaming rank 2, got %v", r, errs[r])
		} else {
			t.Logf("rank %d after %v: %v", r, time.Since(start).Round(time.Millisecond), errs[r])
		}
	}
}
