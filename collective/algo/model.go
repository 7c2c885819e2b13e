package algo

// CostModel predicts the time of an allreduce of B bytes on N ranks:
//
//	ring: 2(N-1) * RingStepUs  +  2(N-1)/N * B / RingGBs
//	tree: 2*ceil(log2(N+1))-ish depth * TreeHopUs + B / TreeGBs
//	hd:   2*log2(p) * RingStepUs  +  2(p-1)/p * B / RingGBs  on p = 2^k ranks;
//	      N > p: 2 more steps and 2B more bytes (the fold)
//	rd:   log2(p) * RingStepUs  +  log2(p) * B / RingGBs, the same fold
//
// (times in microseconds, bandwidths in GB/s = 1e3 bytes per microsecond),
// and Choose picks the cheaper. The constants come from allreduce-perf runs
// (docs/collective.md has the measurements and the fit).
type CostModel struct {
	RingStepUs, TreeHopUs float64
	RingGBs, TreeGBs      float64
	// DirectMaxBytes: calls of at most this many bytes on the wire use
	// Direct (one message from every rank to every other, reduced locally;
	// see collective/direct.go); 0 never picks it. It must stay small enough that two
	// messages fit in every transport's buffers (direct.go says why).
	DirectMaxBytes int
	// DirectMaxSent bounds what Direct sends from each rank, (N-1) * B:
	// over QUIC, 8 ranks on 2 cores, Direct lost to the tree from 16 KiB
	// per message (docs/collective.md); 0: no bound.
	DirectMaxSent int
	// DoublingMaxBytes: on two ranks, calls above DirectMaxBytes and of
	// at most this many bytes on the wire use RecursiveDoubling (one
	// exchange of the whole buffer, where the ring takes two of halves);
	// 0 never picks it. Above it the ring wins: the exchange combines the
	// whole buffer where the ring combines half (docs/collective.md).
	DoublingMaxBytes int
}

// DefaultModel was fitted (weighted least squares on relative error) to
// allreduce-perf over QUIC between 4 processes on the 2-core development
// box, 4 KiB to 64 MiB, ring and tree (bench/peers/allreduce_peers.sh,
// docs/collective.md). On that box the two algorithms were within 10 % of
// each other at 4 ranks from 1 MiB up, and the tree 10-15 % faster below,
// so Auto picks the tree at 3 ranks and more (the two per-byte terms are
// within 2 %: the choice at large sizes is a coin toss the data cannot
// settle); two ranks use the ring, apart from recursive doubling's range
// (DoublingMaxBytes, measured between two test hosts over TLS/TCP and QUIC).
var DefaultModel = CostModel{RingStepUs: 216, TreeHopUs: 277, RingGBs: 0.0552, TreeGBs: 0.0374,
	DirectMaxBytes: DirectLimit, DirectMaxSent: 128 << 10, DoublingMaxBytes: 256 << 10}

// DirectLimit is the largest DirectMaxBytes collective.New accepts (see
// collective/direct.go for why direct messages must stay small).
const DirectLimit = 64 << 10

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
	case HalvingDoubling:
		steps, moved := hdCost(n)
		return float64(steps)*m.RingStepUs + moved*b/(m.RingGBs*1e3)
	case RecursiveDoubling:
		steps, moved := rdCost(n)
		return float64(steps)*m.RingStepUs + moved*b/(m.RingGBs*1e3)
	default:
		return 2*float64(n-1)*m.RingStepUs + 2*float64(n-1)/float64(n)*b/(m.RingGBs*1e3)
	}
}

// hdCost is the halving-doubling allreduce's critical path on n ranks:
// its steps, each one exchange with one peer like a ring step, and the
// bytes through the busiest rank's link as a multiple of the buffer:
// 2(p-1)/p on p = 2^k ranks; with extra ranks, 2 more steps and 2 more
// buffers (the fold into a partner and the result sent back).
func hdCost(n int) (steps int, moved float64) {
	p, k := Pow2Below(n)
	steps, moved = 2*k, 2*float64(p-1)/float64(p)
	if n > p {
		steps, moved = steps+2, moved+2
	}
	return steps, moved
}

// Pow2Below returns p = 2^k, the largest power of two <= n (1 for n < 2),
// and k: the ranks halving-doubling and recursive doubling run on after
// the fold, and their number of steps each way.
func Pow2Below(n int) (p, k int) {
	p = 1
	for p*2 <= n {
		p, k = p*2, k+1
	}
	return p, k
}

// rdCost is recursive doubling's critical path on n ranks, as hdCost's:
// log2(p) steps of the whole buffer each, and the fold's 2 steps and 2
// buffers when n is not a power of two.
func rdCost(n int) (steps int, moved float64) {
	p, k := Pow2Below(n)
	steps, moved = k, float64(k)
	if n > p {
		steps, moved = steps+2, moved+2
	}
	return steps, moved
}

// DoublingLoad is the number of buffers recursive doubling on n ranks
// sends through its busiest rank's link (as TreeLoad): log2(p) on p = 2^k
// ranks, and 2 more on a folded pair; 0 for one rank.
func DoublingLoad(n int) float64 {
	_, moved := rdCost(n)
	return moved
}

// Choose returns Direct, RecursiveDoubling, Ring or Tree for an allreduce
// of bytes (on the wire) over n ranks: RecursiveDoubling only on two
// ranks, up to DoublingMaxBytes. It never returns HalvingDoubling: measured on the
// development box it lost to the tree at 16-256 KiB, where its Predict
// (the ring's step cost) says it wins, and won from 1 MiB, where Predict
// gives it to the tree (docs/collective.md).
func (m CostModel) Choose(bytes, n int) Algorithm {
	if n > 1 && bytes <= m.DirectMaxBytes && (m.DirectMaxSent == 0 || (n-1)*bytes <= m.DirectMaxSent) {
		return Direct
	}
	if n == 2 && bytes <= m.DoublingMaxBytes {
		return RecursiveDoubling
	}
	if n <= 2 {
		return Ring
	}
	if m.Predict(Tree, bytes, n) < m.Predict(Ring, bytes, n) {
		return Tree
	}
	return Ring
}
