package collective

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/rank"
	"github.com/gorun/gorun/rank/ranktest"
)

// names reports whether err blames rank r: a mismatch with r, an abort
// started by or blaming r, or a transport error about r.
func names(err error, r int) bool {
	var me *MismatchError
	var ab *AbortError
	var pe *rank.PeerError
	switch {
	case errors.As(err, &me):
		return me.Rank == r || me.Peer == r
	case errors.As(err, &ab):
		return ab.Origin == r || ab.Culprit == r
	case errors.As(err, &pe):
		return pe.Peer == r
	}
	return false
}

// timed runs f on every rank of ts and fails the test if it takes longer
// than limit (a hang shows as a failure, not a stuck test).
func timed(t *testing.T, ts []rank.Transport, cfg Config, limit time.Duration, f func(c *Communicator) error) []error {
	t.Helper()
	done := make(chan []error, 1)
	go func() { done <- group(ts, cfg, f) }()
	select {
	case errs := <-done:
		return errs
	case <-time.After(limit):
		t.Fatalf("ranks still blocked after %v", limit)
		return nil
	}
}

// timedCfgs is timed with a Config per rank.
func timedCfgs(t *testing.T, ts []rank.Transport, cfgs []Config, limit time.Duration, f func(c *Communicator) error) []error {
	t.Helper()
	done := make(chan []error, 1)
	go func() {
		errs := make([]error, len(ts))
		var wg sync.WaitGroup
		for r := range ts {
			wg.Add(1)
			go func(r int) {
				defer wg.Done()
				c, err := New(ts[r], cfgs[r])
				if err != nil {
					errs[r] = err
					return
				}
				defer c.Close()
				errs[r] = f(c)
			}(r)
		}
		wg.Wait()
		done <- errs
	}()
	select {
	case errs := <-done:
		return errs
	case <-time.After(limit):
		t.Fatalf("ranks still blocked after %v", limit)
		return nil
	}
}

// TestMismatch: rank 2 of 4 makes a different call; every rank gets an
// error that names rank 2 and what differs, at once (no timeout involved),
// and later calls fail too.
func TestMismatch(t *testing.T) {
	f32 := func(n int) []byte { return make([]byte, 4*n) }
	cases := []struct {
		name string
		what string
		call func(c *Communicator, odd bool) error
	}{
		{"length", "length", func(c *Communicator, odd bool) error {
			n := 1000
			if odd {
				n = 1001
			}
			return c.Allreduce(testCtx(t), nil, f32(n), dtype.Float32, Sum)
		}},
		{"dtype", "data type", func(c *Communicator, odd bool) error {
			if odd {
				return c.Allreduce(testCtx(t), nil, make([]byte, 2000), dtype.Float16, Sum)
			}
			return c.Allreduce(testCtx(t), nil, f32(1000), dtype.Float32, Sum)
		}},
		{"op", "reduction", func(c *Communicator, odd bool) error {
			op := Sum
			if odd {
				op = Max
			}
			return c.Allreduce(testCtx(t), nil, f32(1000), dtype.Float32, op)
		}},
		{"wire", "wire format", func(c *Communicator, odd bool) error {
			var o []CallOption
			if odd {
				o = append(o, WithWire(dtype.Float16))
			}
			return c.Allreduce(testCtx(t), nil, f32(1000), dtype.Float32, Sum, o...)
		}},
		{"algorithm", "algorithm", func(c *Communicator, odd bool) error {
			a := algo.Ring
			if odd {
				a = algo.Tree
			}
			return c.Allreduce(testCtx(t), nil, f32(1000), dtype.Float32, Sum, WithAlgorithm(a))
		}},
		{"algorithm-direct", "algorithm", func(c *Communicator, odd bool) error {
			a := algo.Direct
			if odd {
				a = algo.Ring
			}
			return c.Allreduce(testCtx(t), nil, f32(1000), dtype.Float32, Sum, WithAlgorithm(a))
		}},
		{"ring-vs-direct", "algorithm", func(c *Communicator, odd bool) error {
			a := algo.Ring
			if odd {
				a = algo.Direct
			}
			return c.Allreduce(testCtx(t), nil, f32(1000), dtype.Float32, Sum, WithAlgorithm(a))
		}},
		{"ring-vs-hd", "algorithm", func(c *Communicator, odd bool) error {
			a := algo.Ring
			if odd {
				a = algo.HalvingDoubling
			}
			return c.Allreduce(testCtx(t), nil, f32(1000), dtype.Float32, Sum, WithAlgorithm(a))
		}},
		{"rd-vs-hd", "algorithm", func(c *Communicator, odd bool) error {
			a := algo.RecursiveDoubling
			if odd {
				a = algo.HalvingDoubling
			}
			return c.Allreduce(testCtx(t), nil, f32(1000), dtype.Float32, Sum, WithAlgorithm(a))
		}},
		{"hd-vs-direct", "algorithm", func(c *Communicator, odd bool) error {
			a := algo.HalvingDoubling
			if odd {
				a = algo.Direct
			}
			return c.Allreduce(testCtx(t), nil, f32(1000), dtype.Float32, Sum, WithAlgorithm(a))
		}},
		{"direct-vs-barrier", "collective", func(c *Communicator, odd bool) error {
			if odd {
				return c.Barrier(testCtx(t))
			}
			return c.Allreduce(testCtx(t), nil, f32(10), dtype.Float32, Sum, WithAlgorithm(algo.Direct))
		}},
		{"root", "root", func(c *Communicator, odd bool) error {
			root := 0
			if odd {
				root = 1
			}
			return c.Broadcast(testCtx(t), make([]byte, 100), root)
		}},
		{"collective", "collective", func(c *Communicator, odd bool) error {
			if odd {
				return c.Allgather(testCtx(t), make([]byte, 4000), make([]byte, 16000))
			}
			return c.Allreduce(testCtx(t), nil, f32(1000), dtype.Float32, Sum)
		}},
		{"sequence", "collective", func(c *Communicator, odd bool) error {
			// rank 2 skips the second allreduce and is in the barrier
			// while the others are in that allreduce
			b := f32(10)
			if err := c.Allreduce(testCtx(t), nil, b, dtype.Float32, Sum); err != nil {
				return err
			}
			if !odd {
				if err := c.Allreduce(testCtx(t), nil, b, dtype.Float32, Sum); err != nil {
					return err
				}
			}
			return c.Barrier(testCtx(t))
		}},
		{"settings", "settings", func(c *Communicator, odd bool) error {
			return c.Allreduce(testCtx(t), nil, f32(100000), dtype.Float32, Sum)
		}},
		// rank 2 sets DefaultSliceBytes, the others leave it: the same
		// slices across hosts, others within one (its calls here would
		// even match; the header tells it apart anyway)
		{"settings-local", "settings", func(c *Communicator, odd bool) error {
			return c.Allreduce(testCtx(t), nil, f32(100000), dtype.Float32, Sum)
		}},
	}
	for _, k := range cases {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			ts := ranktest.InMemory(4, 2)
			cfgs := make([]Config, 4)
			switch k.name {
			case "settings":
				cfgs[2].SliceBytes = 1 << 10
			case "settings-local":
				cfgs[2].SliceBytes = DefaultSliceBytes
			}
			errs := timedCfgs(t, ts, cfgs, 10*time.Second, func(c *Communicator) error {
				err := k.call(c, c.Rank() == 2)
				// the communicator stays failed; a rank that finished the
				// call before another found the mismatch fails its next call
				err2 := c.Barrier(testCtx(t))
				if err2 == nil {
					return fmt.Errorf("barrier after the mismatched call succeeded (error of that call: %v)", err)
				}
				if err == nil {
					return err2
				}
				return err
			})
			for r, err := range errs {
				if err == nil {
					t.Fatalf("rank %d: no error", r)
				}
				t.Logf("rank %d: %v", r, err)
				if !names(err, 2) {
					t.Errorf("rank %d: error does not blame rank 2: %v", r, err)
				}
				if !strings.Contains(err.Error(), k.what) {
					t.Errorf("rank %d: error does not say that the %s differs: %v", r, k.what, err)
				}
			}
			n := 0
			for _, err := range errs {
				if err != nil {
					n++
				}
			}
			if n < 2 {
				t.Fatalf("only %d ranks failed: %v", n, errs)
			}
		})
	}
}

// TestPeerClosed: rank 3 closes its transport instead of calling; every
// other rank fails at once, blaming rank 3 (ring and tree).
func TestPeerClosed(t *testing.T) {
	for _, a := range []algo.Algorithm{algo.Ring, algo.Tree, algo.Direct, algo.HalvingDoubling, algo.RecursiveDoubling} {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			size := 4 << 20
			if a == algo.Direct {
				size = 4000
			}
			ts := ranktest.InMemory(4, 2)
			errs := timed(t, ts, Config{}, 10*time.Second, func(c *Communicator) error {
				if c.Rank() == 3 {
					return c.Transport().Close()
				}
				return c.Allreduce(testCtx(t), nil, make([]byte, size), dtype.Float32, Sum, WithAlgorithm(a))
			})
			for r := 0; r < 3; r++ {
				if errs[r] == nil || !names(errs[r], 3) {
					t.Errorf("rank %d: want an error blaming rank 3, got %v", r, errs[r])
				}
			}
		})
	}
}

// TestDeadline: rank 2 never calls; the others return by their context's
// deadline (or the Config's Timeout, on each wait), with an error, and rank
// 0 blames rank 2 (ring: rank 0 waits on 2... every rank is blocked behind
// it; halving-doubling and recursive doubling: rank 1, which exchanges
// with 2).
func TestDeadline(t *testing.T) {
	for _, k := range []struct {
		viaCfg bool
		algo   algo.Algorithm
	}{{false, algo.Ring}, {true, algo.Ring}, {false, algo.Direct}, {true, algo.Direct}, {false, algo.HalvingDoubling}, {true, algo.HalvingDoubling}, {false, algo.RecursiveDoubling}, {true, algo.RecursiveDoubling}} {
		viaCfg := k.viaCfg
		t.Run(fmt.Sprint("config-timeout=", viaCfg, "/", k.algo), func(t *testing.T) {
			t.Parallel()
			ts := ranktest.InMemory(3, 2)
			cfg := Config{}
			if viaCfg {
				cfg.Timeout = 300 * time.Millisecond
			}
			start := time.Now()
			errs := timed(t, ts, cfg, 10*time.Second, func(c *Communicator) error {
				if c.Rank() == 2 {
					return nil
				}
				ctx := context.Background()
				if !viaCfg {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
					defer cancel()
				}
				return c.Allreduce(ctx, nil, make([]byte, 4000), dtype.Float32, Sum, WithAlgorithm(k.algo))
			})
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("took %v for a 300ms deadline", d)
			}
			for r := 0; r < 2; r++ {
				var ab *AbortError
				var pe *rank.PeerError
				timedOut := errors.As(errs[r], &pe) && pe.Waited >= 300*time.Millisecond // Config.Timeout bounds each wait
				if errs[r] == nil || !(errors.Is(errs[r], context.DeadlineExceeded) || errors.As(errs[r], &ab) || timedOut) {
					t.Errorf("rank %d: want a deadline or timeout error, got %v", r, errs[r])
				}
			}
			// rank 0 receives from rank 2 (its ring predecessor); with
			// halving-doubling on 3 ranks, rank 0 folds into rank 1 and
			// waits for rank 1 (in process, whose liveness is unknown, so it
			// may name rank 1 at the timeout), and rank 1 exchanges with 2
			w := 0
			if k.algo == algo.HalvingDoubling || k.algo == algo.RecursiveDoubling {
				w = 1
			}
			if !names(errs[w], 2) {
				t.Errorf("rank %d: error does not blame rank 2: %v", w, errs[w])
			}
		})
	}
}

// TestInvalidArguments: a rank whose call is refused locally (bad buffer)
// still takes its turn and aborts the others, who would otherwise wait for
// it until their timeout.
func TestInvalidArguments(t *testing.T) {
	ts := ranktest.InMemory(4, 2)
	errs := timed(t, ts, Config{}, 10*time.Second, func(c *Communicator) error {
		recv := make([]byte, 4000)
		send := recv
		if c.Rank() == 2 {
			send = make([]byte, 3999) // not the length of recv
		}
		return c.Allreduce(testCtx(t), send, recv, dtype.Float32, Sum)
	})
	for r, err := range errs {
		if r == 2 {
			if err == nil || !strings.Contains(err.Error(), "send has 3999 bytes") {
				t.Errorf("rank 2: want its own argument error, got %v", err)
			}
			continue
		}
		if err == nil || !names(err, 2) || !strings.Contains(err.Error(), "invalid arguments") {
			t.Errorf("rank %d: want an error blaming rank 2's arguments, got %v", r, err)
		}
	}
}

// TestInvalidArgumentsEveryCollective: every collective refuses the
// arguments it cannot run with, on every rank, with an error that says
// which, instead of running something else (a root out of range taken
// modulo the world size, the first n blocks of a longer buffer, a 16-bit
// wire for 16-bit data of the other kind) or waiting.
func TestInvalidArgumentsEveryCollective(t *testing.T) {
	const n = 3
	for _, k := range []struct {
		name, want string
		call       func(c *Communicator) error
	}{
		{"broadcast root n", "root 3 out of range", func(c *Communicator) error {
			return c.Broadcast(testCtx(t), make([]byte, 100), n)
		}},
		{"broadcast root -1", "root -1 out of range", func(c *Communicator) error {
			return c.Broadcast(testCtx(t), make([]byte, 100), -1)
		}},
		{"allgather recv too long", "recv has 1204 bytes, want 3 x 400", func(c *Communicator) error {
			return c.Allgather(testCtx(t), make([]byte, 400), make([]byte, n*400+4))
		}},
		{"allgather recv too short", "recv has 1196 bytes, want 3 x 400", func(c *Communicator) error {
			return c.Allgather(testCtx(t), make([]byte, 400), make([]byte, n*400-4))
		}},
		{"reduce-scatter send too long", "send has 1204 bytes, want 3 x 400", func(c *Communicator) error {
			return c.ReduceScatter(testCtx(t), make([]byte, n*400+4), make([]byte, 400), dtype.Float32, Sum)
		}},
		{"reduce-scatter partial element", "not a whole number of float32 elements", func(c *Communicator) error {
			return c.ReduceScatter(testCtx(t), make([]byte, n*6), make([]byte, 6), dtype.Float32, Sum)
		}},
		{"reduce-scatter bad op", "bad data type", func(c *Communicator) error {
			return c.ReduceScatter(testCtx(t), make([]byte, n*8), make([]byte, 8), dtype.Float32, Op(9))
		}},
		{"reduce-scatter wire for float16 data", "only float32 data", func(c *Communicator) error {
			return c.ReduceScatter(testCtx(t), make([]byte, n*8), make([]byte, 8), dtype.Float16, Sum, WithWire(dtype.BFloat16))
		}},
		{"allreduce wire for bfloat16 data", "only float32 data", func(c *Communicator) error {
			return c.Allreduce(testCtx(t), nil, make([]byte, 800), dtype.BFloat16, Sum, WithWire(dtype.Float16))
		}},
		{"allreduce partial element", "not a whole number of float32 elements", func(c *Communicator) error {
			return c.Allreduce(testCtx(t), nil, make([]byte, 802), dtype.Float32, Sum)
		}},
		{"allreduce bad op", "bad data type", func(c *Communicator) error {
			return c.Allreduce(testCtx(t), nil, make([]byte, 800), dtype.Float32, Op(0))
		}},
	} {
		t.Run(k.name, func(t *testing.T) {
			errs := timed(t, ranktest.InMemory(n, 2), Config{}, 10*time.Second, k.call)
			for r, err := range errs {
				if err == nil || !strings.Contains(err.Error(), k.want) {
					t.Errorf("rank %d: want an error saying %q, got %v", r, k.want, err)
				}
			}
		})
	}
}

// TestErrorTexts: what the errors say, from the fields every rank fills
// in alike: a mismatch names this rank's call first and the peer's
// second; an abort frame carries origin and culprit (and what differs)
// to every rank, whose error names the rank that sent it the frame, the
// call's number, the origin and the culprit each in its place; a call's
// tag carries its length (above 16 bits too), type, reduction, wire,
// algorithm and, for a broadcast, its root.
func TestErrorTexts(t *testing.T) {
	me := &MismatchError{Rank: 1, Peer: 2, Mine: "allreduce #4 of 10 x float32, sum, ring", Peers: "allreduce #4 of 11 x float32, sum, ring", What: "length"}
	if got, want := me.Error(), "collective mismatch: rank 1 called allreduce #4 of 10 x float32, sum, ring but rank 2 called allreduce #4 of 11 x float32, sum, ring (length differs)"; got != want {
		t.Errorf("MismatchError:\n got %s\nwant %s", got, want)
	}
	cl := call{seq: 7, kind: kAllreduce, count: 1000, dtype: dtype.Float32, op: Sum, wire: dtype.Float32, algo: algo.Tree}
	for _, k := range []struct {
		reason abortReason
		diff   uint16
		want   string
	}{
		{reasonMismatch, dCount | dOp, "ranks 1 and 3 called different collectives (length, reduction differs)"},
		{reasonPeer, 0, "rank 1 lost rank 3 (it failed, exited or closed its connection)"},
		{reasonTimeout, 0, "rank 1 timed out waiting for rank 3"},
		{reasonCancel, 0, "rank 1's call was cancelled"},
		{reasonInvalid, 0, "rank 1 called it with invalid arguments"},
		{reasonOther, 0, "rank 1 failed"},
	} {
		ab := fromAbort(0, 2, cl, abortTag(5, 1, 3, k.reason, k.diff))
		if ab.Rank != 0 || ab.From != 2 || ab.Seq != 5 || ab.Origin != 1 || ab.Culprit != 3 || ab.reason != k.reason || ab.diff != k.diff {
			t.Errorf("abort frame (origin 1, culprit 3, reason %d, diff %#x, call #5) from rank 2 read back on rank 0 as origin %d, culprit %d, reason %d, diff %#x, call #%d, from rank %d, on rank %d",
				k.reason, k.diff, ab.Origin, ab.Culprit, ab.reason, ab.diff, ab.Seq, ab.From, ab.Rank)
		}
		want := "rank 0: allreduce #7 of 1000 x float32, sum, tree failed: rank 2 aborted collective #5: " + k.want
		if got := ab.Error(); got != want {
			t.Errorf("AbortError:\n got %s\nwant %s", got, want)
		}
	}
	for _, c := range []call{
		{seq: 9, kind: kAllreduce, count: 1<<20 + 3, dtype: dtype.Float32, op: Average, wire: dtype.BFloat16, algo: algo.RecursiveDoubling},
		{seq: 1<<32 - 1, kind: kReduceScatter, count: 70000, dtype: dtype.Float16, op: Min, wire: dtype.Float16, algo: algo.Ring},
		{seq: 3, kind: kBroadcast, count: 123456, root: 5},
	} {
		if got := fromTag(c.tag(2)); got != c {
			t.Errorf("tag round trip of %+v gave %+v", c, got)
		}
	}
}
