package collective

import (
	"strings"
	"testing"

	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/rank/ranktest"
)

// Config.Across makes Auto choose for ranks on different hosts with the
// link's model: on 4 hosts at 10 Gbit/s, 100 µs a step, the tree for small calls and the
// ring for large ones, where DefaultModel (fitted on one host's cores)
// takes the tree at every size; the hierarchical phase across 3 hosts
// chooses on each of a host's 2 ranks' half of the link; ranks on one host
// keep Model; a malformed link is refused.
func TestAutoAcrossHosts(t *testing.T) {
	l := algo.Link{Gbps: 10, StepUs: 100} // the tree below 500 kB, the ring above
	comm := func(hosts []string, across algo.Link) *Communicator {
		t.Helper()
		c, err := New(hostsTransport{ranktest.InMemory(len(hosts), 2)[0], hosts}, Config{Across: across})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	flat := comm([]string{"a", "b", "c", "d"}, l)
	old := comm([]string{"a", "b", "c", "d"}, algo.Link{})
	local := comm([]string{"a", "a", "a", "a"}, l)
	if a := flat.AlgorithmFor(algo.Auto, 25<<20); a != algo.Ring {
		t.Errorf("4 hosts, 10 Gbit/s, 25 MiB: Auto chose %v, want the ring (the tree sends 2 buffers through its busiest rank's link, the ring 1.5)", a)
	}
	if a := flat.AlgorithmFor(algo.Auto, 128<<10); a != algo.Tree {
		t.Errorf("4 hosts, 10 Gbit/s, 128 KiB: Auto chose %v, want the tree (4 hops against 6 steps)", a)
	}
	for _, b := range []int{128 << 10, 1 << 20, 25 << 20} {
		if a := old.AlgorithmFor(algo.Auto, b); a != algo.DefaultModel.Choose(b, 4) {
			t.Errorf("no link, %d bytes: Auto chose %v, want DefaultModel's %v", b, a, algo.DefaultModel.Choose(b, 4))
		}
		if a := local.AlgorithmFor(algo.Auto, b); a != algo.DefaultModel.Choose(b, 4) {
			t.Errorf("one host, %d bytes: Auto chose %v, want DefaultModel's %v", b, a, algo.DefaultModel.Choose(b, 4))
		}
	}
	// 3 hosts x 2: each phase across the hosts has half the link; find a
	// share of the buffer that the whole link gives to the ring and the
	// half link to the tree
	hier := comm([]string{"a", "a", "b", "b", "c", "c"}, l)
	half, whole := l, l
	half.Gbps /= 2
	mh, mw := algo.DefaultModel.OnLink(half, 3), algo.DefaultModel.OnLink(whole, 3)
	mh.DirectMaxBytes, mw.DirectMaxBytes = 0, 0
	found := false
	for part := 4 << 10; part <= 64<<20; part += part / 8 {
		if got, want := hier.AlgorithmFor(algo.Auto, 2*part), mh.Choose(part, 3); got != want {
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
	ring, err := New(hostsTransport{ranktest.InMemory(3, 2)[0], []string{"a", "b", "c"}}, Config{Algorithm: algo.Ring, Across: l})
	if err != nil {
		t.Fatal(err)
	}
	defer ring.Close()
	if got := ring.AutoBasis(); !strings.Contains(got, "ring asked for") {
		t.Errorf("Algorithm Ring: AutoBasis %q", got)
	}
	for _, bad := range []algo.Link{{Gbps: -1, StepUs: 1}, {StepUs: 100}, {Gbps: 1, CapGBs: -1}} {
		if _, err := New(hostsTransport{ranktest.InMemory(2, 2)[0], []string{"a", "b"}}, Config{Across: bad}); err == nil {
			t.Errorf("link %+v: New accepted it", bad)
		}
	}
}
