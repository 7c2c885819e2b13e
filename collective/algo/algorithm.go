// Package algo holds gorun's allreduce algorithms as pure functions of
// (rank, world size, sizes), with no I/O: their names (Algorithm,
// ParseAlgorithm), the shapes of the trees the tree allreduce, Broadcast
// and Barrier run over (DoubleTree, InorderTree, HeapTree), the fold of
// halving-doubling and recursive doubling (Pow2Below), and the cost model
// that predicts their times and chooses among them (CostModel,
// DefaultModel, Link, LinkModel, TreeLoad, DoublingLoad).
//
// As etcd-io/raft keeps its state machine apart from the network, the
// plan here is pure and package collective's executor moves the bytes:
// it imports algo, and so does package plan, the step-time model, which
// depends on no transport code.
package algo

import "fmt"

// Algorithm selects how collective's Allreduce moves data.
type Algorithm uint8

const (
	Auto Algorithm = 0 // by size and world size (see CostModel)
	Ring Algorithm = 1 // reduce-scatter + allgather around rings
	Tree Algorithm = 2 // reduce up / broadcast down a double binary tree
	// Direct: every rank sends its buffer to every peer and reduces all of
	// them itself in rank order (small calls; see collective/direct.go). A call of
	// more than DirectLimit bytes on the wire that asks for Direct runs
	// the ring or tree instead.
	Direct Algorithm = 3
	// Shared: the shared-memory allreduce (collective/shared.go), for communicators
	// whose ranks all run on one host and share its group segment. Auto
	// picks it there for every size; asked for elsewhere, Auto's choice runs.
	Shared Algorithm = 4
	// HalvingDoubling: reduce-scatter by recursive halving, allgather by
	// recursive doubling (Rabenseifner; collective/halving.go): 2*log2(N) steps
	// where the ring takes 2(N-1), the same bytes per rank; world sizes
	// that are not a power of two fold the extra ranks into partners
	// first.
	HalvingDoubling Algorithm = 5
	// RecursiveDoubling: log2(N) exchanges of the whole buffer with the
	// peer at distance 1, 2, 4, ... (collective/halving.go's rdSteps): at two ranks
	// one exchange where the ring and halving-doubling take two, the same
	// bytes; world sizes that are not a power of two fold as
	// HalvingDoubling does.
	RecursiveDoubling Algorithm = 6
)

func (a Algorithm) String() string {
	switch a {
	case Auto:
		return "auto"
	case Ring:
		return "ring"
	case Tree:
		return "tree"
	case Direct:
		return "direct"
	case Shared:
		return "shm"
	case HalvingDoubling:
		return "hd"
	case RecursiveDoubling:
		return "rd"
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// ParseAlgorithm accepts auto, ring, tree, direct, shm, hd (or
// halving-doubling), rd (or recursive-doubling).
func ParseAlgorithm(s string) (Algorithm, error) {
	switch s {
	case "auto", "":
		return Auto, nil
	case "ring":
		return Ring, nil
	case "tree":
		return Tree, nil
	case "direct":
		return Direct, nil
	case "shm":
		return Shared, nil
	case "hd", "halving-doubling":
		return HalvingDoubling, nil
	case "rd", "recursive-doubling":
		return RecursiveDoubling, nil
	}
	return 0, fmt.Errorf("unknown allreduce algorithm %q (want auto, ring, tree, direct, shm, hd or rd)", s)
}
