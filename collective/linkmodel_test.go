package collective

import (
	"math"
	"strings"
	"testing"

	"github.com/gorun/gorun/rank/ranktest"
)

// TreeLoad counted by hand from inorderTree and doubleTree:
// n = 2: rank 0 is the root of one tree and the child of the other, so
// it sends its half once in each: 1 buffer. n = 4: the in-order tree has
// root 1 (children 0, 2) and 2 has child 3; the shifted tree has root 2
// (children 1, 3) and 3 has child 0; rank 2 has a parent and a child in
// the first and two children in the second: 4 halves = 2 buffers.
// From 8 ranks on some rank is interior in one tree and has a parent and
// a child in the other: 2.5 (at most 3: interior in both).
func TestTreeLoad(t *testing.T) {
	for n, want := range map[int]float64{1: 0, 2: 1, 3: 1.5, 4: 2, 7: 2, 8: 2.5, 64: 2.5, 512: 2.5} {
		if got := TreeLoad(n); got != want {
			t.Errorf("TreeLoad(%d) = %v, want %v", n, got, want)
		}
	}
	for n := 5; n <= 512; n++ {
		if got := TreeLoad(n); got < 2 || got > 3 {
			t.Errorf("TreeLoad(%d) = %v, want 2..3", n, got)
		}
	}
}

func TestLinkModel(t *testing.T) {
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	// 1 Gbit/s = 0.125 GB/s, below a 0.5 GB/s transport: the link limits.
	l := Link{Gbps: 1, StepUs: 50, CapGBs: 0.5}
	near("GBs", l.GBs(), 0.125)
	// 10 MB on 2 ranks: 2 steps + 10e6 B / 125 B/µs
	m := LinkModel(l, 2)
	near("ring np 2", m.Predict(Ring, 10e6, 2), 2*50+10e6/125)
	// a 100 Gbit/s link behind the same transport: the transport limits
	l.Gbps = 100
	near("capped GBs", l.GBs(), 0.5)
	near("capped ring np 2", LinkModel(l, 2).Predict(Ring, 10e6, 2), 2*50+10e6/500)
	// no cap: the link
	near("uncapped", Link{Gbps: 8}.GBs(), 1)
	// 4 ranks: the ring moves 1.5 buffers, the tree 2 (TreeLoad(4)), so
	// big buffers go around the ring; depth 3 at n = 4: 4 hops against 6
	// ring steps, so tiny ones take the tree
	l = Link{Gbps: 1, StepUs: 100}
	m = LinkModel(l, 4)
	near("tree np 4", m.Predict(Tree, 1e6, 4), 4*100+2*1e6/125)
	near("ring np 4", m.Predict(Ring, 1e6, 4), 6*100+1.5*1e6/125)
	if a := m.Choose(64<<20, 4); a != Ring {
		t.Errorf("64 MiB on 4 ranks: %v, want ring", a)
	}
	// 45,000 B: past Direct's 128 KiB sent (3 x 45,000), and the tree's
	// 4 hops + 720 µs beat the ring's 6 steps + 540 µs
	if a := m.Choose(45000, 4); a != Tree {
		t.Errorf("45,000 B on 4 ranks: %v, want tree", a)
	}
	if a := m.Choose(DirectLimit, 4); a != Ring {
		t.Errorf("64 KiB on 4 ranks: %v, want ring (tree 400 + 1049 µs, ring 600 + 786 µs)", a)
	}
	if a := m.Choose(1024, 4); a != Direct {
		t.Errorf("1 KiB on 4 ranks: %v, want direct (DefaultModel's limits)", a)
	}
	// at 512 ranks the ring's 1022 steps lose to the tree's 18 hops up
	// to the size where its 2x bytes cost more: 1022 x 100 µs = 102 ms
	m = LinkModel(l, 512)
	if a := m.Choose(16<<20, 512); a != Tree {
		t.Errorf("16 MiB on 512 ranks: %v, want tree", a)
	}
	if a := m.Choose(1<<30, 512); a != Ring {
		t.Errorf("1 GiB on 512 ranks: %v, want ring", a)
	}
}

// Config.Across makes Auto choose for ranks on different hosts with the
// link's model: on 4 hosts at 10 Gbit/s, 100 µs a step, the tree for small calls and the
// ring for large ones, where DefaultModel (fitted on one host's cores)
// takes the tree at every size; the hierarchical phase across 3 hosts
// chooses on each of a host's 2 ranks' half of the link; ranks on one host
// keep Model; a malformed link is refused.
func TestAutoAcrossHosts(t *testing.T) {
	l := Link{Gbps: 10, StepUs: 100} // the tree below 500 kB, the ring above
	comm := func(hosts []string, across Link) *Communicator {
		t.Helper()
		c, err := New(hostsTransport{ranktest.InMemory(len(hosts), 2)[0], hosts}, Config{Across: across})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	flat := comm([]string{"a", "b", "c", "d"}, l)
	old := comm([]string{"a", "b", "c", "d"}, Link{})
	local := comm([]string{"a", "a", "a", "a"}, l)
	if a := flat.AlgorithmFor(Auto, 25<<20); a != Ring {
		t.Errorf("4 hosts, 10 Gbit/s, 25 MiB: Auto chose %v, want the ring (the tree sends 2 buffers through its busiest rank's link, the ring 1.5)", a)
	}
	if a := flat.AlgorithmFor(Auto, 128<<10); a != Tree {
		t.Errorf("4 hosts, 10 Gbit/s, 128 KiB: Auto chose %v, want the tree (4 hops against 6 steps)", a)
	}
	for _, b := range []int{128 << 10, 1 << 20, 25 << 20} {
		if a := old.AlgorithmFor(Auto, b); a != DefaultModel.Choose(b, 4) {
			t.Errorf("no link, %d bytes: Auto chose %v, want DefaultModel's %v", b, a, DefaultModel.Choose(b, 4))
		}
		if a := local.AlgorithmFor(Auto, b); a != DefaultModel.Choose(b, 4) {
			t.Errorf("one host, %d bytes: Auto chose %v, want DefaultModel's %v", b, a, DefaultModel.Choose(b, 4))
		}
	}
	// 3 hosts x 2: each phase across the hosts has half the link; find a
	// share of the buffer that the whole link gives to the ring and the
	// half link to the tree
	hier := comm([]string{"a", "a", "b", "b", "c", "c"}, l)
	half, whole := l, l
	half.Gbps /= 2
	mh, mw := DefaultModel.OnLink(half, 3), DefaultModel.OnLink(whole, 3)
	mh.DirectMaxBytes, mw.DirectMaxBytes = 0, 0
	found := false
	for part := 4 << 10; part <= 64<<20; part += part / 8 {
		if got, want := hier.AlgorithmFor(Auto, 2*part), mh.Choose(part, 3); got != want {
			t.Fatalf("3 hosts x 2, %d bytes a share: Auto chose %v, want %v (the model on half the link)", part, got, want)
		}
		found = found || mh.Choose(part, 3) != mw.Choose(part, 3)
	}
	if !found {
		t.Error("no size where half the link and the whole link choose apart: the test cannot tell whether the link is shared")
	}
	// the logs' account of it
	for _, k := range []struct {
		c    *Communicator
		want string
	}{
		{flat, "the cost model of the link across hosts: 1.250 GB/s each way, 100 µs a step"},
		{hier, "for the phase across them: 0.625 GB/s each way, 100 µs a step (each of a host's 2 ranks)"},
		{old, "DefaultModel"},
		{local, "DefaultModel"},
	} {
		if got := k.c.AutoBasis(); !strings.Contains(got, k.want) {
			t.Errorf("AutoBasis %q, want it to say %q", got, k.want)
		}
	}
	ring, err := New(hostsTransport{ranktest.InMemory(3, 2)[0], []string{"a", "b", "c"}}, Config{Algorithm: Ring, Across: l})
	if err != nil {
		t.Fatal(err)
	}
	defer ring.Close()
	if got := ring.AutoBasis(); !strings.Contains(got, "ring asked for") {
		t.Errorf("Algorithm Ring: AutoBasis %q", got)
	}
	for _, bad := range []Link{{Gbps: -1, StepUs: 1}, {StepUs: 100}, {Gbps: 1, CapGBs: -1}} {
		if _, err := New(hostsTransport{ranktest.InMemory(2, 2)[0], []string{"a", "b"}}, Config{Across: bad}); err == nil {
			t.Errorf("link %+v: New accepted it", bad)
		}
	}
}
