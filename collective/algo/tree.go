package algo

// TreeNode is one rank's place in a tree: its parent (-1 at the root) and
// its children, in the fixed order in which their contributions are
// reduced.
type TreeNode struct {
	Parent   int
	Children []int
}

// InorderTree places positions 0..n-1 in a balanced binary tree in which an
// in-order walk visits 0, 1, ..., n-1 (the root is the middle position).
// About half the positions are leaves.
func InorderTree(n int) []TreeNode {
	s := make([]TreeNode, n)
	var build func(lo, hi, parent int) int
	build = func(lo, hi, parent int) int {
		if lo > hi {
			return -1
		}
		mid := (lo + hi) / 2
		s[mid].Parent = parent
		if l := build(lo, mid-1, mid); l >= 0 {
			s[mid].Children = append(s[mid].Children, l)
		}
		if r := build(mid+1, hi, mid); r >= 0 {
			s[mid].Children = append(s[mid].Children, r)
		}
		return mid
	}
	build(0, n-1, -1)
	return s
}

// relabel maps a tree over positions to a tree over ranks, rank = f(position).
func relabel(pos []TreeNode, f func(int) int) []TreeNode {
	out := make([]TreeNode, len(pos))
	for p, sh := range pos {
		r := f(p)
		out[r].Parent = -1
		if sh.Parent >= 0 {
			out[r].Parent = f(sh.Parent)
		}
		for _, c := range sh.Children {
			out[r].Children = append(out[r].Children, f(c))
		}
	}
	return out
}

// DoubleTree returns two complementary trees over n ranks (NCCL's double
// binary tree): the second is the first mirrored or shifted by one,
// whichever leaves fewer ranks interior in both, so that most ranks are a
// leaf in one tree and each tree carries half of the data.
func DoubleTree(n int) [2][]TreeNode {
	a := InorderTree(n)
	mirror := relabel(a, func(p int) int { return n - 1 - p })
	shift := relabel(a, func(p int) int { return (p + 1) % n })
	both := func(b []TreeNode) int {
		c := 0
		for r := range a {
			if len(a[r].Children) > 0 && len(b[r].Children) > 0 {
				c++
			}
		}
		return c
	}
	if both(shift) < both(mirror) {
		return [2][]TreeNode{a, shift}
	}
	return [2][]TreeNode{a, mirror}
}

// HeapTree is a binary tree rooted at root: position p = (rank-root) mod n
// has children 2p+1 and 2p+2 (for collective's Broadcast).
func HeapTree(n, root int) []TreeNode {
	pos := make([]TreeNode, n)
	for p := range pos {
		pos[p].Parent = -1
		if p > 0 {
			pos[p].Parent = (p - 1) / 2
		}
		for _, c := range []int{2*p + 1, 2*p + 2} {
			if c < n {
				pos[p].Children = append(pos[p].Children, c)
			}
		}
	}
	return relabel(pos, func(p int) int { return (p + root) % n })
}
