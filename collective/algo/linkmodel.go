package algo

import "fmt"

// Link is what an allreduce among ranks on different hosts runs over, as
// LinkModel sees it: the rate of each rank's share of its host's link, the
// cost of one message exchange apart from its bytes, and the rate one
// connection reaches when the CPU, not the link, limits.
type Link struct {
	// Gbps is the rate each rank has to and from the other hosts, Gbit/s
	// each way (a host's link shared by the ranks that use it at once).
	Gbps float64
	// StepUs is the time of one ring step or tree hop apart from moving
	// the bytes (µs): the link's one-way latency plus the transport's cost
	// per message on both sides.
	StepUs float64
	// CapGBs is the rate one connection carries each way, both directions
	// busy, when the CPU is the limit (GB/s; 0: no cap).
	CapGBs float64
}

func (l Link) String() string {
	s := fmt.Sprintf("%.3f GB/s each way, %.0f µs a step", l.GBs(), l.StepUs)
	if l.Gbps <= 0 {
		s += " (the transport's cap; the link's rate unknown)"
	}
	return s
}

// GBs is the rate a rank moves bytes at each way: the link or the
// transport's cap, whichever is lower.
func (l Link) GBs() float64 {
	r := l.Gbps / 8
	if l.CapGBs > 0 && (r <= 0 || l.CapGBs < r) {
		r = l.CapGBs
	}
	return r
}

// LinkModel is the cost model of an allreduce among n ranks that each
// reach the others over their own Link l: DefaultModel on that link
// (DefaultModel.OnLink).
func LinkModel(l Link, n int) CostModel { return DefaultModel.OnLink(l, n) }

// OnLink is m with its steps and rates those of n ranks that each reach
// the others over their own Link l, its limits for Direct and recursive
// doubling kept. The ring moves 2(n-1)/n of the buffer through every
// rank's link, RingGBs = l.GBs(); gorun's double binary tree (DoubleTree:
// each tree carries half the buffer on its own channel, reduce up and
// broadcast down at once) moves TreeLoad(n) buffers through its busiest
// rank's link, which CostModel's B / TreeGBs cannot say for every n, so
// TreeGBs = l.GBs() / TreeLoad(n) for this n. Every step or hop costs
// l.StepUs. So the tree wins small calls (fewer steps) and the ring large
// ones, the crossover growing with n, as NCCL chooses.
func (m CostModel) OnLink(l Link, n int) CostModel {
	r := l.GBs()
	tree := r
	if load := TreeLoad(n); load > 0 {
		tree = r / load
	}
	m.RingStepUs, m.TreeHopUs, m.RingGBs, m.TreeGBs = l.StepUs, l.StepUs, r, tree
	return m
}

// TreeLoad is the number of buffers the busiest rank of gorun's double
// binary tree on n ranks sends (and receives) in one allreduce: in each of
// the two trees, which carry half of the buffer each, a rank sends its
// half up to its parent and down to each child. 1 at n = 2, 2 at n = 4
// and for large n (a rank interior in one tree, with two children, has a
// parent there too); 0 for one rank.
func TreeLoad(n int) float64 {
	if n < 2 {
		return 0
	}
	trees := DoubleTree(n)
	load := 0.0
	for r := 0; r < n; r++ {
		edges := 0
		for _, tr := range trees {
			edges += len(tr[r].Children)
			if tr[r].Parent >= 0 {
				edges++
			}
		}
		load = max(load, float64(edges)/2)
	}
	return load
}
