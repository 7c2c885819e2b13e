package algo

import (
	"math"
	"testing"
)

// TreeLoad counted by hand from InorderTree and DoubleTree:
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
