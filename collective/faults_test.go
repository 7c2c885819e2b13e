package collective

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/rank"
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
			return c.Allreduce(testCtx(t), nil, f32(n), Float32, Sum)
		}},
		{"dtype", "data type", func(c *Communicator, odd bool) error {
			if odd {
				return c.Allreduce(testCtx(t), nil, make([]byte, 2000), Float16, Sum)
			}
			return c.Allreduce(testCtx(t), nil, f32(1000), Float32, Sum)
		}},
		{"op", "reduction", func(c *Communicator, odd bool) error {
			op := Sum
			if odd {
				op = Max
			}
			return c.Allreduce(testCtx(t), nil, f32(1000), Float32, op)
		}},
		{"wire", "wire format", func(c *Communicator, odd bool) error {
			var o []CallOption
			if odd {
				o = append(o, WithWire(Float16))
			}
			return c.Allreduce(testCtx(t), nil, f32(1000), Float32, Sum, o...)
		}},
		{"algorithm", "algorithm", func(c *Communicator, odd bool) error {
			a := Ring
			if odd {
				a = Tree
			}
			return c.Allreduce(testCtx(t), nil, f32(1000), Float32, Sum, WithAlgorithm(a))
		}},
		{"algorithm-direct", "algorithm", func(c *Communicator, odd bool) error {
			a := Direct
			if odd {
				a = Ring
			}
			return c.Allreduce(testCtx(t), nil, f32(1000), Float32, Sum, WithAlgorithm(a))
		}},
		{"ring-vs-direct", "algorithm", func(c *Communicator, odd bool) error {
			a := Ring
			if odd {
				a = Direct
			}
			return c.Allreduce(testCtx(t), nil, f32(1000), Float32, Sum, WithAlgorithm(a))
		}},
		{"ring-vs-hd", "algorithm", func(c *Communicator, odd bool) error {
			a := Ring
			if odd {
				a = HalvingDoubling
			}
			return c.Allreduce(testCtx(t), nil, f32(1000), Float32, Sum, WithAlgorithm(a))
		}},
		{"rd-vs-hd", "algorithm", func(c *Communicator, odd bool) error {
			a := RecursiveDoubling
			if odd {
				a = HalvingDoubling
			}
			return c.Allreduce(testCtx(t), nil, f32(1000), Float32, Sum, WithAlgorithm(a))
		}},
		{"hd-vs-direct", "algorithm", func(c *Communicator, odd bool) error {
			a := HalvingDoubling
			if odd {
				a = Direct
			}
			return c.Allreduce(testCtx(t), nil, f32(1000), Float32, Sum, WithAlgorithm(a))
		}},
		{"direct-vs-barrier", "collective", func(c *Communicator, odd bool) error {
			if odd {
				return c.Barrier(testCtx(t))
			}
			return c.Allreduce(testCtx(t), nil, f32(10), Float32, Sum, WithAlgorithm(Direct))
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
			return c.Allreduce(testCtx(t), nil, f32(1000), Float32, Sum)
		}},
		{"sequence", "collective", func(c *Communicator, odd bool) error {
			// rank 2 skips the second allreduce and is in the barrier
			// while the others are in that allreduce
			b := f32(10)
			if err := c.Allreduce(testCtx(t), nil, b, Float32, Sum); err != nil {
				return err
			}
			if !odd {
				if err := c.Allreduce(testCtx(t), nil, b, Float32, Sum); err != nil {
					return err
				}
			}
			return c.Barrier(testCtx(t))
		}},
		{"settings", "settings", func(c *Communicator, odd bool) error {
			return c.Allreduce(testCtx(t), nil, f32(100000), Float32, Sum)
		}},
		// rank 2 sets DefaultSliceBytes, the others leave it: the same
		// slices across hosts, others within one (its calls here would
		// even match; the header tells it apart anyway)
		{"settings-local", "settings", func(c *Communicator, odd bool) error {
			return c.Allreduce(testCtx(t), nil, f32(100000), Float32, Sum)
		}},
	}
	for _, k := range cases {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			ts := rank.NewLocalGroup(4, 2)
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
	for _, a := range []Algorithm{Ring, Tree, Direct, HalvingDoubling, RecursiveDoubling} {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			size := 4 << 20
			if a == Direct {
				size = 4000
			}
			ts := rank.NewLocalGroup(4, 2)
			errs := timed(t, ts, Config{}, 10*time.Second, func(c *Communicator) error {
				if c.Rank() == 3 {
					return c.Transport().Close()
				}
				return c.Allreduce(testCtx(t), nil, make([]byte, size), Float32, Sum, WithAlgorithm(a))
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
		algo   Algorithm
	}{{false, Ring}, {true, Ring}, {false, Direct}, {true, Direct}, {false, HalvingDoubling}, {true, HalvingDoubling}, {false, RecursiveDoubling}, {true, RecursiveDoubling}} {
		viaCfg := k.viaCfg
		t.Run(fmt.Sprint("config-timeout=", viaCfg, "/", k.algo), func(t *testing.T) {
			t.Parallel()
			ts := rank.NewLocalGroup(3, 2)
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
				return c.Allreduce(ctx, nil, make([]byte, 4000), Float32, Sum, WithAlgorithm(k.algo))
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
			if k.algo == HalvingDoubling || k.algo == RecursiveDoubling {
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
	ts := rank.NewLocalGroup(4, 2)
	errs := timed(t, ts, Config{}, 10*time.Second, func(c *Communicator) error {
		recv := make([]byte, 4000)
		send := recv
		if c.Rank() == 2 {
			send = make([]byte, 3999) // not the length of recv
		}
		return c.Allreduce(testCtx(t), send, recv, Float32, Sum)
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
