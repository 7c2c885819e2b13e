package algo

import "testing"

// TestTreeShapes: every tree is one binary tree over all n ranks: one
// root (HeapTree's at root), every other rank the child of its parent,
// and every rank reached from the root.
func TestTreeShapes(t *testing.T) {
	check := func(name string, s []TreeNode, n, root int) {
		t.Helper()
		if len(s) != n {
			t.Fatalf("%s: %d nodes, want %d", name, len(s), n)
		}
		top := -1
		for r, nd := range s {
			if len(nd.Children) > 2 {
				t.Errorf("%s: rank %d has %d children", name, r, len(nd.Children))
			}
			if nd.Parent < 0 {
				if top >= 0 {
					t.Fatalf("%s: roots %d and %d", name, top, r)
				}
				top = r
				continue
			}
			found := 0
			for _, c := range s[nd.Parent].Children {
				if c == r {
					found++
				}
			}
			if found != 1 {
				t.Errorf("%s: rank %d is %d times a child of its parent %d", name, r, found, nd.Parent)
			}
		}
		if root >= 0 && top != root {
			t.Errorf("%s: root %d, want %d", name, top, root)
		}
		seen, stack := 0, []int{top}
		for len(stack) > 0 {
			r := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			seen++
			stack = append(stack, s[r].Children...)
		}
		if seen != n {
			t.Errorf("%s: %d ranks reached from the root, want %d", name, seen, n)
		}
	}
	for n := 1; n <= 64; n++ {
		check("InorderTree", InorderTree(n), n, (n-1)/2)
		d := DoubleTree(n)
		check("DoubleTree[0]", d[0], n, -1)
		check("DoubleTree[1]", d[1], n, -1)
		for _, root := range []int{0, n / 2, n - 1} {
			check("HeapTree", HeapTree(n, root), n, root)
		}
	}
}
