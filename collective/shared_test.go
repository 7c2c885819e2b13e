package collective

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/rank"
)

// sharedOnly checks that every communicator over ts picks the shared-memory
// allreduce by itself.
func sharedOnly(t *testing.T, ts []rank.Transport) {
	t.Helper()
	errs := group(ts, Config{}, func(c *Communicator) error {
		for _, b := range []int{0, 4, 4096, 64 << 20} {
			if a := c.AlgorithmFor(algo.Auto, b); a != algo.Shared {
				return fmt.Errorf("auto picks %s for %d bytes on one host, want shm", a, b)
			}
		}
		return nil
	})
	if err := firstErr(errs); err != nil {
		t.Fatal(err)
	}
}

// TestSharedAllreduce: the shared-memory allreduce over real group
// segments (ranks as meshes of one process, with real QUIC sockets beside
// the shared memory), for world sizes 2..8, awkward lengths (one element,
// fewer elements than ranks, several rounds), every op and dtype, in place
// and not, against the float64 reference and bit-identical on every rank;
// and no byte of it crosses the sockets.
func TestSharedAllreduce(t *testing.T) {
	for _, n := range []int{2, 3, 5, 8} {
		t.Run(fmt.Sprint("N", n), func(t *testing.T) {
			ts := loopback(t, n, "shm")
			sharedOnly(t, ts)
			lengths := []int{0, 1, n - 1, n, n + 1, 7919, DefaultSharedRoundBytes/4 + 3}
			if n == 3 {
				lengths = append(lengths, 1_000_003) // 16 rounds of float32
			}
			var cases []arCase
			i := 0
			for _, l := range lengths {
				for _, op := range ops {
					for _, v := range []variant{{dtype.Float32, dtype.Float32}, {dtype.Float16, dtype.Float16}, {dtype.BFloat16, dtype.BFloat16}, {dtype.Float32, dtype.Float16}} {
						i++
						if l > 10000 && i%4 != 0 {
							continue // keep the large ones few
						}
						cases = append(cases, arCase{count: l, op: op, v: v, algo: algo.Auto, inPlace: i%2 == 0})
					}
				}
			}
			before := make([]rank.PeerStats, n)
			for r, tr := range ts {
				for _, s := range tr.Stats() {
					before[r].BytesSent += s.BytesSent
				}
			}
			checkAllreduceInts(t, ts, Config{}, cases)
			for r, tr := range ts {
				var sent uint64
				for _, s := range tr.Stats() {
					sent += s.BytesSent
				}
				if d := sent - before[r].BytesSent; d > 0 {
					t.Errorf("rank %d sent %d bytes through the transport during shared-memory allreduces", r, d)
				}
			}
		})
	}
}

// TestSharedCommunicatorsInTurn: communicators created one after another
// on the same meshes (each a new epoch of the group's control words), with
// odd and even numbers of rounds between them, stay correct; so do the
// other collectives between shared-memory allreduces.
func TestSharedCommunicatorsInTurn(t *testing.T) {
	ts := loopback(t, 3, "shm")
	for k, count := range []int{5, 3 * DefaultSharedRoundBytes / 4, 1, 2*DefaultSharedRoundBytes/4 + 1, 0, 77} {
		errs := group(ts, Config{}, func(c *Communicator) error {
			buf := make([]float32, count)
			for i := range buf {
				buf[i] = float32(c.Rank()*1000 + i%1000)
			}
			if err := c.Allreduce(testCtx(t), nil, Float32Bytes(buf), dtype.Float32, Sum); err != nil {
				return err
			}
			for i, x := range buf {
				if want := float32(3000 + 3*(i%1000)); x != want {
					return fmt.Errorf("communicator %d, count %d: element %d = %v, want %v", k, count, i, x, want)
				}
			}
			b := []byte{byte(k), 0, 0}
			if err := c.Broadcast(testCtx(t), b, k%3); err != nil {
				return err
			}
			if b[0] != byte(k) {
				return fmt.Errorf("broadcast: %v", b)
			}
			return c.Barrier(testCtx(t))
		})
		if err := firstErr(errs); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSharedMismatch: on one host, and on two hosts whose phases within a
// host use the group segment, a rank that makes another call than the
// others (another length, algorithm, collective, or a skipped call) makes
// every rank fail at once with an error naming it; so does a rank that
// closes its mesh, or that never comes (at the deadline).
func TestSharedMismatch(t *testing.T) {
	const bad = 2
	for _, k := range []struct {
		name string
		f    func(c *Communicator, buf []byte) error
		want string
	}{
		{"length", func(c *Communicator, buf []byte) error {
			if c.Rank() == bad {
				buf = buf[:len(buf)-4]
			}
			return c.Allreduce(testCtx(t), nil, buf, dtype.Float32, Sum)
		}, "length"},
		{"algorithm", func(c *Communicator, buf []byte) error {
			var o []CallOption
			if c.Rank() == bad { // an algorithm other than Auto's
				a := algo.Ring
				if c.AlgorithmFor(algo.Auto, len(buf)) == algo.Ring {
					a = algo.Tree
				}
				o = append(o, WithAlgorithm(a))
			}
			return c.Allreduce(testCtx(t), nil, buf, dtype.Float32, Sum, o...)
		}, "algorithm"},
		{"collective", func(c *Communicator, buf []byte) error {
			if c.Rank() == bad {
				return c.Broadcast(testCtx(t), buf, 0)
			}
			return c.Allreduce(testCtx(t), nil, buf, dtype.Float32, Sum)
		}, "collective"},
		{"skipped", func(c *Communicator, buf []byte) error {
			if c.Rank() != bad {
				if err := c.Allreduce(testCtx(t), nil, buf, dtype.Float32, Max); err != nil {
					return err
				}
			}
			return c.Allreduce(testCtx(t), nil, buf, dtype.Float32, Sum)
		}, "reduction"}, // a skipped call shows as a different call under the same number
		{"invalid", func(c *Communicator, buf []byte) error {
			dt := dtype.Float32
			if c.Rank() == bad {
				dt = dtype.DType(9)
			}
			return c.Allreduce(testCtx(t), nil, buf, dt, Sum)
		}, "invalid arguments"},
		{"closed", func(c *Communicator, buf []byte) error {
			if c.Rank() == bad {
				return c.Transport().Close()
			}
			return c.Allreduce(testCtx(t), nil, buf, dtype.Float32, Sum)
		}, "rank 2"},
		{"deadline", func(c *Communicator, buf []byte) error {
			if c.Rank() == bad {
				time.Sleep(1500 * time.Millisecond)
				return nil
			}
			ctx, cancel := context.WithTimeout(testCtx(t), 300*time.Millisecond)
			defer cancel()
			return c.Allreduce(ctx, nil, buf, dtype.Float32, Sum)
		}, "deadline"},
	} {
		for _, layout := range []string{"one-host", "2x2"} {
			t.Run(layout+"/"+k.name, func(t *testing.T) {
				sharedMismatchCase(t, layout, bad, k.name, k.want, k.f)
			})
		}
	}
}

// sharedMismatchCase runs one case of TestSharedMismatch: on one host
// (the shm allreduce), or on 2 fake hosts of 2 (the hierarchical
// allreduce, its phases within a host in the group segment). Rank bad
// runs f's odd call; the others must fail at once, naming it.
func sharedMismatchCase(t *testing.T, layout string, bad int, name, want string, f func(c *Communicator, buf []byte) error) {
	var ts []rank.Transport
	if layout == "2x2" {
		ts = realHosts(t, "a", "a", "b", "b")
	} else {
		ts = loopback(t, 4, "shm")
	}
	start := time.Now()
	errs := timed(t, ts, Config{Timeout: 8 * time.Second}, 20*time.Second, func(c *Communicator) error {
		buf := make([]byte, 600_000)
		if err := c.Allreduce(testCtx(t), nil, buf, dtype.Float32, Sum); err != nil {
			return fmt.Errorf("first allreduce: %w", err)
		}
		return f(c, buf)
	})
	took := time.Since(start)
	for r, err := range errs {
		if r == bad && (name == "closed" || name == "deadline" || name == "invalid") {
			continue // it did not take part, or failed on its own arguments
		}
		if err == nil {
			t.Errorf("rank %d: no error", r)
			continue
		}
		if !names(err, bad) && name != "deadline" {
			t.Errorf("rank %d: error does not name rank %d: %v", r, bad, err)
		}
		if !strings.Contains(err.Error(), want) && !(name == "deadline" && strings.Contains(err.Error(), fmt.Sprintf("timed out waiting for rank %d", bad))) {
			t.Errorf("rank %d: error does not say %q: %v", r, want, err)
		}
		if strings.Contains(err.Error(), "first allreduce") {
			t.Errorf("rank %d: the first (matching) call failed: %v", r, err)
		}
	}
	if name != "deadline" && took > 5*time.Second {
		t.Errorf("took %v: the ranks waited for a timeout instead of telling each other", took)
	}
	t.Logf("after %v: rank 0: %v", took.Round(time.Millisecond), errs[0])
}

// TestSharedAllreduceCounted: the shared-memory allreduce counts what it
// moves through the group segment with each peer (rank.PeerStats'
// GroupSent and GroupRecv): each way, per round, the peer's part of the
// contributions and this rank's part of the results, in the wire type;
// what rank r counts as sent to p, p counts as received from r; and none
// of it is counted as messages.
func TestSharedAllreduceCounted(t *testing.T) {
	const n = 3
	ts := loopback(t, n, "shm")
	for _, v := range []variant{{dtype.Float32, dtype.Float32}, {dtype.Float32, dtype.Float16}} {
		ws := v.wire.Size()
		per := min(DefaultSharedRoundBytes, rank.GroupSlotBytes/2) / ws
		count := 2*per + 5 // three rounds
		// want[r][p]: the bytes between r and p, each way
		var want [n][n]int
		for lo := 0; lo < count; lo += per {
			parts := split(min(count, lo+per)-lo, n)
			for r := 0; r < n; r++ {
				for p := 0; p < n; p++ {
					if p != r {
						want[r][p] += (parts[p+1] - parts[p] + parts[r+1] - parts[r]) * ws
					}
				}
			}
		}
		got := make([][]rank.PeerStats, n)
		errs := group(ts, Config{}, func(c *Communicator) error {
			before := c.Transport().Stats()
			buf := make([]float32, count)
			if err := c.Allreduce(testCtx(t), nil, Float32Bytes(buf), dtype.Float32, Sum, WithWire(v.wire)); err != nil {
				return err
			}
			after := c.Transport().Stats()
			for p := range after {
				after[p] = rank.PeerStats{BytesSent: after[p].BytesSent - before[p].BytesSent, BytesRecv: after[p].BytesRecv - before[p].BytesRecv,
					GroupSent: after[p].GroupSent - before[p].GroupSent, GroupRecv: after[p].GroupRecv - before[p].GroupRecv}
			}
			got[c.Rank()] = after
			return nil
		})
		if err := firstErr(errs); err != nil {
			t.Fatal(err)
		}
		for r := 0; r < n; r++ {
			for p := 0; p < n; p++ {
				s := got[r][p]
				if s.GroupSent != uint64(want[r][p]) || s.GroupRecv != uint64(want[r][p]) || s.BytesSent != 0 || s.BytesRecv != 0 {
					t.Errorf("%v wire: rank %d with rank %d: %+v, want %d group bytes each way and no messages", v.wire, r, p, s, want[r][p])
				}
				if s.GroupSent != got[p][r].GroupRecv {
					t.Errorf("%v wire: rank %d counts %d bytes sent to rank %d, which counts %d received", v.wire, r, s.GroupSent, p, got[p][r].GroupRecv)
				}
			}
		}
	}
}

// TestSharedMismatchFailsTheCall: in the shm allreduce a host-mate's
// different call is caught in the call's first round, on every rank,
// whatever the order in which the ranks arrive: the call itself fails
// everywhere (not only the next one), so that no rank goes on with a
// result reduced from buffers of different lengths. Rank 0 comes late,
// so rank 1 has long arrived and stopped looking at what rank 0 posts;
// only the first round's comparison of the posted calls sees it then.
func TestSharedMismatchFailsTheCall(t *testing.T) {
	ts := loopback(t, 2, "shm")
	errs := timed(t, ts, Config{Timeout: 8 * time.Second}, 20*time.Second, func(c *Communicator) error {
		if err := c.Allreduce(testCtx(t), nil, make([]byte, 4000), dtype.Float32, Sum); err != nil {
			return fmt.Errorf("first allreduce: %w", err)
		}
		n := 1000
		if c.Rank() == 0 {
			time.Sleep(100 * time.Millisecond)
		} else {
			n = 999
		}
		err := c.Allreduce(testCtx(t), nil, make([]byte, 4*n), dtype.Float32, Sum)
		if err == nil {
			return errors.New("the mismatched allreduce (1000 elements on rank 0, 999 on rank 1) succeeded")
		}
		return err
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "length") || !names(err, 1-r) {
			t.Errorf("rank %d: want the mismatched call to fail with an error about the length, got %v", r, err)
		}
	}
}
