package collective

// CostModel predicts the time of an allreduce of B bytes on N ranks:
//
//	ring: 2(N-1) * RingStepUs  +  2(N-1)/N * B / RingGBs
//	tree: 2*ceil(log2(N+1))-ish depth * TreeHopUs + B / TreeGBs
//
// (times in microseconds, bandwidths in GB/s = 1e3 bytes per microsecond),
// and Choose picks the cheaper. The constants come from allreduce-perf runs
// (docs/collectives.md has the measurements).
type CostModel struct {
	RingStepUs, TreeHopUs float64
	RingGBs, TreeGBs      float64
}

// DefaultModel was fitted to allreduce-perf over loopback QUIC on the
// 2-core development box (see docs/collectives.md).
var DefaultModel = CostModel{RingStepUs: 60, TreeHopUs: 60, RingGBs: 0.5, TreeGBs: 0.35}

func treeDepth(n int) int {
	d := 0
	for (1 << d) <= n {
		d++
	}
	return d
}

// Predict returns the modelled time in microseconds.
func (m CostModel) Predict(a Algorithm, bytes, n int) float64 {
	if n <= 1 {
		return 0
	}
	b := float64(bytes)
	switch a {
	case Tree:
		return 2*float64(treeDepth(n)-1)*m.TreeHopUs + b/(m.TreeGBs*1e3)
	default:
		return 2*float64(n-1)*m.RingStepUs + 2*float64(n-1)/float64(n)*b/(m.RingGBs*1e3)
	}
}

// Choose returns Ring or Tree for an allreduce of bytes (on the wire) over n ranks.
func (m CostModel) Choose(bytes, n int) Algorithm {
	if n <= 2 {
		return Ring
	}
	if m.Predict(Tree, bytes, n) < m.Predict(Ring, bytes, n) {
		return Tree
	}
	return Ring
}
