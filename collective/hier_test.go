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

// hostsTransport gives an in-process transport a host per rank, as
// rank.Mesh.Hosts does.
type hostsTransport struct {
	rank.Transport
	hosts []string
}

func (h hostsTransport) Hosts() []string { return h.hosts }

func withHosts(ts []rank.Transport, hosts ...string) []rank.Transport {
	out := make([]rank.Transport, len(ts))
	for i, t := range ts {
		out[i] = hostsTransport{t, hosts}
	}
	return out
}

func TestNewHier(t *testing.T) {
	if h := newHier([]string{"a", "a", "b", "b"}, 3); h == nil || fmt.Sprint(h.local, h.cross, h.idx, h.hidx) != "[2 3] [1 3] 1 1" {
		t.Errorf("2x2: %+v", h)
	}
	if h := newHier([]string{"a", "b", "a", "b", "a", "b"}, 2); h == nil || fmt.Sprint(h.local, h.cross, h.idx, h.hidx) != "[0 2 4] [2 3] 1 0" {
		t.Errorf("interleaved 2x3: %+v", h)
	}
	for _, hosts := range [][]string{{"a", "a", "a", "a"}, {"a", "b", "c", "d"}, {"a", "a", "a", "b"}, {"a", "b"}} {
		if h := newHier(hosts, 0); h != nil {
			t.Errorf("%v: want flat, got %+v", hosts, h)
		}
	}
}

// TestHierarchicalAllreduce: 2 hosts x 2, 2 hosts x 3 (interleaved
// ranks), 3 hosts x 2: the same exact results as the flat property tests,
// bit-identical on every rank, and the only bytes that cross hosts flow
// between ranks with the same local index.
func TestHierarchicalAllreduce(t *testing.T) {
	for _, hosts := range [][]string{
		{"a", "a", "b", "b"},
		{"a", "b", "a", "b", "a", "b"},
		{"x", "x", "y", "y", "z", "z"},
	} {
		t.Run(fmt.Sprint(hosts), func(t *testing.T) {
			t.Parallel()
			n := len(hosts)
			var cases []arCase
			i := 0
			for _, l := range []int{0, 1, n - 1, n + 1, 31, 1031} {
				for _, op := range ops {
					for _, v := range variants {
						// Auto: never Direct across hosts (the byte check below
						// would see it: Direct sends to every rank)
						for _, a := range []algo.Algorithm{algo.Ring, algo.Tree, algo.HalvingDoubling, algo.RecursiveDoubling, algo.Auto} {
							i++
							cases = append(cases, arCase{count: l, op: op, v: v, algo: a, inPlace: i%2 == 0})
						}
					}
				}
			}
			ts := withHosts(ranktest.InMemory(n, 2), hosts...)
			checkAllreduceInts(t, ts, Config{SliceBytes: 64}, cases)
			for r, tr := range ts {
				h := newHier(hosts, r)
				if h == nil {
					t.Fatal("layout not hierarchical")
				}
				for p, st := range tr.Stats() {
					sameIdx := false
					for _, x := range h.cross {
						sameIdx = sameIdx || x == p
					}
					if hosts[p] != hosts[r] && !sameIdx && st.BytesSent > 0 {
						t.Errorf("rank %d sent %d bytes to rank %d, on another host with another local index", r, st.BytesSent, p)
					}
				}
			}
		})
	}
}

// TestHierarchicalMismatch: a rank that differs fails every rank at once,
// blamed by name, though the phases talk to host-mates and to one rank per
// other host only.
func TestHierarchicalMismatch(t *testing.T) {
	lengthMismatch(t, withHosts(ranktest.InMemory(6, 2), "a", "a", "a", "b", "b", "b"), 4)
}

// lengthMismatch: rank culprit's allreduce is one element short; every
// rank must fail, blaming the culprit's length.
func lengthMismatch(t *testing.T, ts []rank.Transport, culprit int) {
	t.Helper()
	errs := timed(t, ts, Config{}, 10*time.Second, func(c *Communicator) error {
		n := 1000
		if c.Rank() == culprit {
			n = 999
		}
		err := c.Allreduce(testCtx(t), nil, make([]byte, 4*n), dtype.Float32, Sum)
		if err2 := c.Barrier(testCtx(t)); err2 == nil {
			return fmt.Errorf("barrier after the mismatch succeeded (allreduce: %v)", err)
		} else if err == nil {
			return err2
		}
		return err
	})
	for r, err := range errs {
		if err == nil || !names(err, culprit) || !strings.Contains(err.Error(), "length") {
			t.Errorf("rank %d: want an error blaming rank %d's length, got %v", r, culprit, err)
		}
	}
}

// TestSlicesByHost: by default a call whose ranks span hosts cuts
// DefaultSliceBytes slices and one within a host LocalSliceBytes (the
// hierarchical allreduce's phases each by where they run); a set slice
// applies everywhere. The 2 x 2 allreduce with the default slices, large
// enough for several slices of both sizes, is exact on every rank.
func TestSlicesByHost(t *testing.T) {
	for _, c := range []struct {
		hosts       []string
		cfg         int
		flat, local int
	}{
		{[]string{"a", "a", "b", "b"}, 0, DefaultSliceBytes, LocalSliceBytes},
		{[]string{"a", "b"}, 0, DefaultSliceBytes, LocalSliceBytes},
		{[]string{"a", "a", "a"}, 0, LocalSliceBytes, LocalSliceBytes},
		{[]string{"a", "a", "b", "b"}, 4096, 4096, 4096},
	} {
		ts := withHosts(ranktest.InMemory(len(c.hosts), 1), c.hosts...)
		var mu sync.Mutex
		got := map[string]bool{}
		errs := group(ts, Config{SliceBytes: c.cfg}, func(cm *Communicator) error {
			mu.Lock()
			got[fmt.Sprint(cm.flatSlice, cm.localSlice)] = true
			mu.Unlock()
			return nil
		})
		want := fmt.Sprint(c.flat, c.local)
		if err := errors.Join(errs...); err != nil || len(got) != 1 || !got[want] {
			t.Errorf("%v, SliceBytes %d: slices (flat, local) %v, want %s (%v)", c.hosts, c.cfg, got, want, err)
		}
	}
	ts := withHosts(ranktest.InMemory(4, 1), "a", "a", "b", "b")
	checkAllreduceInts(t, ts, Config{}, []arCase{
		{count: 1<<20 + 3, op: Sum, v: variants[0], algo: algo.Auto},
		{count: 1<<20 + 3, op: Average, v: variants[1], algo: algo.Ring, inPlace: true},
	})
}

// groupHosts is hostsTransport for a real mesh: it also hands out the
// mesh's group segment, which then holds every fake host's ranks.
type groupHosts struct{ hostsTransport }

func (g groupHosts) LocalGroup(ctx context.Context) (*rank.LocalGroup, error) {
	return g.Transport.(interface {
		LocalGroup(context.Context) (*rank.LocalGroup, error)
	}).LocalGroup(ctx)
}

// realHosts is a mesh of real ranks with shared memory, one per host
// given, each fake host's ranks using their part of the one group segment.
func realHosts(t *testing.T, hosts ...string) []rank.Transport {
	real := loopback(t, len(hosts), "shm")
	ts := make([]rank.Transport, len(hosts))
	for r := range ts {
		ts[r] = groupHosts{hostsTransport{real[r], hosts}}
	}
	return ts
}

// TestHierarchicalGroup: the phases within a host through the host's
// group segment (real meshes with shared memory; the ranks of each fake
// host use their part of one segment): exact results, bit-identical on
// every rank, for lengths that leave parts empty, uneven, or several
// rounds long, every op and wire format, in place and out; host-mates
// exchange no message, and the group counters show what moved.
func TestHierarchicalGroup(t *testing.T) {
	for _, hosts := range [][]string{{"a", "a", "b", "b"}, {"a", "b", "a", "b", "a", "b"}} {
		t.Run(fmt.Sprint(hosts), func(t *testing.T) {
			n := len(hosts)
			ts := realHosts(t, hosts...)
			errs := group(ts, Config{}, func(c *Communicator) error {
				if !c.HierarchicalInGroup() || len(c.hg.members) != n/2 {
					return fmt.Errorf("rank %d: hierarchical phases not on the group segment (%+v)", c.Rank(), c.hg)
				}
				return nil
			})
			if err := firstErr(errs); err != nil {
				t.Fatal(err)
			}
			before := make([][]rank.PeerStats, n)
			for r, tr := range ts {
				before[r] = tr.Stats()
			}
			var cases []arCase
			i := 0
			per := DefaultSharedRoundBytes / 4 / (n / 2) // float32 elements of a part per round
			for _, l := range []int{0, 1, n/2 + 1, 1031, n/2*per + 3, 2*n*per + 1} {
				for _, op := range ops {
					for _, v := range variants {
						i++
						if l > 2000 && i%3 != 0 {
							continue // keep the large ones few
						}
						cases = append(cases, arCase{count: l, op: op, v: v, algo: algo.Ring, inPlace: i%2 == 0})
					}
				}
			}
			checkAllreduceInts(t, ts, Config{}, cases)
			for r, tr := range ts {
				for p, st := range tr.Stats() {
					if p == r || hosts[p] != hosts[r] {
						continue
					}
					if d := st.BytesSent - before[r][p].BytesSent; d > 0 {
						t.Errorf("rank %d sent %d bytes in messages to rank %d on its host", r, d, p)
					}
					if st.GroupSent == before[r][p].GroupSent || st.GroupRecv == before[r][p].GroupRecv {
						t.Errorf("rank %d: no bytes counted through the group segment with rank %d", r, p)
					}
				}
			}
		})
	}
}

// TestHierarchicalGroupMismatch: through the group segment too, a rank
// whose call differs from its host-mates' fails every rank, blamed by
// name.
func TestHierarchicalGroupMismatch(t *testing.T) {
	lengthMismatch(t, realHosts(t, "a", "a", "b", "b"), 1)
	// Ranks 0 and 2 (local index 0 on each host) agree with each other,
	// and 1 and 3 too, so the phase across the hosts sees nothing wrong:
	// only the group segment's check between host-mates can tell.
	errs := timed(t, realHosts(t, "a", "a", "b", "b"), Config{}, 10*time.Second, func(c *Communicator) error {
		n := 1000 - c.Rank()%2
		return c.Allreduce(testCtx(t), nil, make([]byte, 4*n), dtype.Float32, Sum)
	})
	for r, err := range errs {
		if mate := r ^ 1; err == nil || !names(err, mate) || !strings.Contains(err.Error(), "length") {
			t.Errorf("rank %d: want an error naming rank %d and the length, got %v", r, mate, err)
		}
	}
}
