package collective

// treeShape is one rank's place in a tree: its parent (-1 at the root) and
// its children, in the fixed order in which their contributions are
// reduced.
type treeShape struct {
	parent   int
	children []int
}

// inorderTree places positions 0..n-1 in a balanced binary tree in which an
// in-order walk visits 0, 1, ..., n-1 (the root is the middle position).
// About half the positions are leaves.
func inorderTree(n int) []treeShape {
	s := make([]treeShape, n)
	var build func(lo, hi, parent int) int
	build = func(lo, hi, parent int) int {
		if lo > hi {
			return -1
		}
		mid := (lo + hi) / 2
		s[mid].parent = parent
		if l := build(lo, mid-1, mid); l >= 0 {
			s[mid].children = append(s[mid].children, l)
		}
		if r := build(mid+1, hi, mid); r >= 0 {
			s[mid].children = append(s[mid].children, r)
		}
		return mid
	}
	build(0, n-1, -1)
	return s
}

// relabel maps a tree over positions to a tree over ranks, rank = f(position).
func relabel(pos []treeShape, f func(int) int) []treeShape {
	out := make([]treeShape, len(pos))
	for p, sh := range pos {
		r := f(p)
		out[r].parent = -1
		if sh.parent >= 0 {
			out[r].parent = f(sh.parent)
		}
		for _, c := range sh.children {
			out[r].children = append(out[r].children, f(c))
		}
	}
	return out
}

// doubleTree returns two complementary trees over n ranks (NCCL's double
// binary tree): the second is the first mirrored or shifted by one,
// whichever leaves fewer ranks interior in both, so that most ranks are a
// leaf in one tree and each tree carries half of the data.
func doubleTree(n int) [2][]treeShape {
	a := inorderTree(n)
	mirror := relabel(a, func(p int) int { return n - 1 - p })
	shift := relabel(a, func(p int) int { return (p + 1) % n })
	both := func(b []treeShape) int {
		c := 0
		for r := range a {
			if len(a[r].children) > 0 && len(b[r].children) > 0 {
				c++
			}
		}
		return c
	}
	if both(shift) < both(mirror) {
		return [2][]treeShape{a, shift}
	}
	return [2][]treeShape{a, mirror}
}

// heapTree is a binary tree rooted at root: position p = (rank-root) mod n
// has children 2p+1 and 2p+2 (for Broadcast).
func heapTree(n, root int) []treeShape {
	pos := make([]treeShape, n)
	for p := range pos {
		pos[p].parent = -1
		if p > 0 {
			pos[p].parent = (p - 1) / 2
		}
		for _, c := range []int{2*p + 1, 2*p + 2} {
			if c < n {
				pos[p].children = append(pos[p].children, c)
			}
		}
	}
	return relabel(pos, func(p int) int { return (p + root) % n })
}

type treeSpec struct {
	acc        []byte
	lo, hi     int // elements of acc this tree moves
	ch         int
	shape      treeShape
	up         bool // reduce toward the root (else the root's data is broadcast as is)
	sliceBytes int
	dtype      DType
	wire       DType
	op         Op
	div        int // Average divides by this (0: the transport's size)
}

// tree runs a pipelined reduce-up / broadcast-down over one tree on one
// channel. Up: for each slice, the contributions of the children are
// reduced into this rank's, in the order of shape.children, and the sum
// goes to the parent. The root finishes the slice (Average) and sends it
// down; every rank forwards what it receives from its parent to its
// children. Slices flow up and down at the same time.
func (r *run) tree(sp treeSpec) {
	es, ws := sp.dtype.Size(), sp.wire.Size()
	ns := slices(sp.hi-sp.lo, ws, sp.sliceBytes)
	bounds := split(sp.hi-sp.lo, ns)
	sl := func(k int) []byte {
		return sp.acc[(sp.lo+bounds[k])*es : (sp.lo+bounds[k+1])*es : (sp.lo+bounds[k+1])*es]
	}
	wlen := func(k int) int { return (bounds[k+1] - bounds[k]) * ws }
	depth := ringGroup + 2
	slotBytes := min(sp.sliceBytes, (sp.hi-sp.lo)*ws+1)
	div := sp.div
	if div == 0 {
		div = r.t.Size()
	}
	red := r.newReducer(sp.dtype, sp.wire, sp.op, div)
	sh := sp.shape
	root := sh.parent < 0
	kids := make([]*sender, len(sh.children))
	for i, c := range sh.children {
		kids[i] = r.newSender(c, sp.ch, depth+8)
	}
	pool := r.newBufPool(depth)
	// down sends acc slice k (or, if wire, the wire bytes w, released by
	// done once every child's sender is done with them) to the children.
	down := func(k int, wire bool, w []byte, done func()) bool {
		if len(kids) == 0 {
			if done != nil {
				done()
			}
			return true
		}
		b := sl(k)
		if wire {
			b = w
			done = refDone(len(kids), done)
		}
		for _, s := range kids {
			if !s.push(b, done) {
				return false
			}
		}
		return true
	}
	closeKids := func() {
		for _, s := range kids {
			s.close()
		}
	}
	// up: reduce the children's slices, then send to the parent (or, at the
	// root, finish and send down).
	var upSnd *sender
	if !root && sp.up {
		upSnd = r.newSender(sh.parent, sp.ch, depth+8)
	}
	if sp.up {
		rvs := make([]*receiver, len(sh.children))
		for i, c := range sh.children {
			rvs[i] = r.newReceiver(c, sp.ch, recvPlan{count: ns, size: wlen, slotBytes: slotBytes, depth: depth})
		}
		r.goFn(func() error {
			if upSnd != nil {
				defer upSnd.close()
			} else {
				defer closeKids()
			}
			for k := 0; k < ns; k++ {
				a := sl(k)
				for _, rv := range rvs {
					it, ok := rv.next()
					if !ok {
						return nil
					}
					red.combine(a, it.buf)
					rv.release(it)
				}
				if root {
					red.finish(a)
					if sp.wire != sp.dtype {
						w, ok := pool.get(r.ctx, wlen(k))
						if !ok {
							return nil
						}
						red.toWire(w, a)
						red.fromWire(a, w)
						if !down(k, true, w, func() { pool.put(w) }) {
							return nil
						}
					} else if !down(k, false, nil, nil) {
						return nil
					}
					continue
				}
				if sp.wire == sp.dtype {
					if !upSnd.push(a, nil) {
						return nil
					}
					continue
				}
				w, ok := pool.get(r.ctx, wlen(k))
				if !ok {
					return nil
				}
				red.toWire(w, a)
				if !upSnd.push(w, func() { pool.put(w) }) {
					return nil
				}
			}
			return nil
		})
	} else if root {
		r.goFn(func() error {
			defer closeKids()
			for k := 0; k < ns; k++ {
				if !down(k, false, nil, nil) {
					return nil
				}
			}
			return nil
		})
	}
	if root {
		return
	}
	// down: receive from the parent, forward to the children.
	direct := sp.wire == sp.dtype
	prv := r.newReceiver(sh.parent, sp.ch, recvPlan{
		count: ns, size: wlen, slotBytes: slotBytes, depth: depth,
		dst: func(k int) []byte {
			if direct {
				return sl(k)
			}
			return nil
		},
		before: func(k int) error {
			if direct && upSnd != nil {
				return upSnd.waitSent(k + 1) // our slice k has left for the parent
			}
			return nil
		},
	})
	r.goFn(func() error {
		defer closeKids()
		for k := 0; k < ns; k++ {
			it, ok := prv.next()
			if !ok {
				return nil
			}
			if !it.slot {
				if !down(k, false, nil, nil) {
					return nil
				}
				continue
			}
			if upSnd != nil {
				// Our slice k went up before the parent's result for it
				// could come down, so this hardly ever waits; it makes that
				// order visible to the race detector, which cannot see it
				// through a shared-memory transport.
				if upSnd.waitSent(k+1) != nil {
					return nil
				}
			}
			red.fromWire(sl(k), it.buf)
			if !down(k, true, it.buf, func() { prv.release(it) }) {
				return nil
			}
		}
		return nil
	})
}
