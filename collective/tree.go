package collective

import (
	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/dtype"
)

type treeSpec struct {
	acc        []byte
	lo, hi     int // elements of acc this tree moves
	ch         int
	shape      algo.TreeNode
	up         bool // reduce toward the root (else the root's data is broadcast as is)
	sliceBytes int
	dtype      dtype.DType
	wire       dtype.DType
	op         Op
	div        int // Average divides by this (0: the transport's size)
}

// tree runs a pipelined reduce-up / broadcast-down over one tree on one
// channel. Up: for each slice, the contributions of the children are
// reduced into this rank's, in the order of shape.Children, and the sum
// goes to the parent. The root finishes the slice (Average) and sends it
// down; every rank forwards what it receives from its parent to its
// children. Slices flow up and down at the same time: treeUp and treeDown
// run as goroutines of their own, over the senders and receivers this
// wires.
func (r *run) tree(sp treeSpec) {
	es, ws := sp.dtype.Size(), sp.wire.Size()
	ns := slices(sp.hi-sp.lo, ws, sp.sliceBytes)
	bounds := split(sp.hi-sp.lo, ns)
	div := sp.div
	if div == 0 {
		div = r.t.Size()
	}
	depth := ringGroup + 2
	sh := sp.shape
	io := &treeIO{
		ns:   ns,
		root: sh.Parent < 0,
		sl: func(k int) []byte {
			return sp.acc[(sp.lo+bounds[k])*es : (sp.lo+bounds[k+1])*es : (sp.lo+bounds[k+1])*es]
		},
		wlen: func(k int) int { return (bounds[k+1] - bounds[k]) * ws },
		red:  r.newReducer(sp.dtype, sp.wire, sp.op, div),
		pool: r.newBufPool(depth),
	}
	slotBytes := min(sp.sliceBytes, (sp.hi-sp.lo)*ws+1)
	for _, c := range sh.Children {
		io.kids = append(io.kids, r.newSender(c, sp.ch, depth+8))
	}
	if !io.root && sp.up {
		io.upSnd = r.newSender(sh.Parent, sp.ch, depth+8)
	}
	if sp.up {
		rvs := make([]*receiver, len(sh.Children))
		for i, c := range sh.Children {
			rvs[i] = r.newReceiver(c, sp.ch, recvPlan{count: ns, size: io.wlen, slotBytes: slotBytes, depth: depth})
		}
		r.goFn(func() error { return r.treeUp(sp, io, rvs) })
	} else if io.root {
		r.goFn(func() error {
			defer io.closeKids()
			for k := 0; k < ns; k++ {
				if !io.down(k, false, nil, nil) {
					return nil
				}
			}
			return nil
		})
	}
	if io.root {
		return
	}
	// down: receive from the parent, forward to the children.
	direct := sp.wire == sp.dtype
	prv := r.newReceiver(sh.Parent, sp.ch, recvPlan{
		count: ns, size: io.wlen, slotBytes: slotBytes, depth: depth,
		dst: func(k int) []byte {
			if direct {
				return io.sl(k)
			}
			return nil
		},
		before: func(k int) error {
			if direct && io.upSnd != nil {
				return io.upSnd.waitSent(k + 1) // our slice k has left for the parent
			}
			return nil
		},
	})
	r.goFn(func() error { return r.treeDown(io, prv) })
}

// treeIO is one tree's slices and the ends of its links: the senders to
// the children (kids) and to the parent (upSnd; nil at the root or when
// only broadcasting), the reducer and the wire buffers.
type treeIO struct {
	ns    int
	root  bool
	sl    func(k int) []byte // acc's slice k
	wlen  func(k int) int    // slice k's bytes on the wire
	red   *reducer
	pool  *bufPool
	kids  []*sender
	upSnd *sender
}

// down sends acc slice k (or, if wire, the wire bytes w, released by done
// once every child's sender is done with them) to the children.
func (io *treeIO) down(k int, wire bool, w []byte, done func()) bool {
	if len(io.kids) == 0 {
		if done != nil {
			done()
		}
		return true
	}
	b := io.sl(k)
	if wire {
		b = w
		done = refDone(len(io.kids), done)
	}
	for _, s := range io.kids {
		if !s.push(b, done) {
			return false
		}
	}
	return true
}

func (io *treeIO) closeKids() {
	for _, s := range io.kids {
		s.close()
	}
}

// treeUp reduces the children's slices (from rvs, in the shape's order)
// into this rank's and sends each to the parent, or, at the root,
// finishes it and sends it down. It returns nil when the run fails (the
// failure is the run's error).
func (r *run) treeUp(sp treeSpec, io *treeIO, rvs []*receiver) error {
	if io.upSnd != nil {
		defer io.upSnd.close()
	} else {
		defer io.closeKids()
	}
	for k := 0; k < io.ns; k++ {
		a := io.sl(k)
		for _, rv := range rvs {
			it, ok := rv.next()
			if !ok {
				return nil
			}
			io.red.combine(a, it.buf)
			rv.release(it)
		}
		if io.root {
			io.red.finish(a)
			if sp.wire != sp.dtype {
				w, ok := io.pool.get(r.ctx, io.wlen(k))
				if !ok {
					return nil
				}
				io.red.toWire(w, a)
				io.red.fromWire(a, w)
				if !io.down(k, true, w, func() { io.pool.put(w) }) {
					return nil
				}
			} else if !io.down(k, false, nil, nil) {
				return nil
			}
			continue
		}
		if sp.wire == sp.dtype {
			if !io.upSnd.push(a, nil) {
				return nil
			}
			continue
		}
		w, ok := io.pool.get(r.ctx, io.wlen(k))
		if !ok {
			return nil
		}
		io.red.toWire(w, a)
		if !io.upSnd.push(w, func() { io.pool.put(w) }) {
			return nil
		}
	}
	return nil
}

// treeDown takes each slice from the parent (prv: landed in acc, or in a
// slot on a 16-bit wire) and forwards it to the children. It returns nil
// when the run fails.
func (r *run) treeDown(io *treeIO, prv *receiver) error {
	defer io.closeKids()
	for k := 0; k < io.ns; k++ {
		it, ok := prv.next()
		if !ok {
			return nil
		}
		if !it.slot {
			if !io.down(k, false, nil, nil) {
				return nil
			}
			continue
		}
		if io.upSnd != nil {
			// Our slice k went up before the parent's result for it
			// could come down, so this hardly ever waits; it makes that
			// order visible to the race detector, which cannot see it
			// through a shared-memory transport.
			if io.upSnd.waitSent(k+1) != nil {
				return nil
			}
		}
		io.red.fromWire(io.sl(k), it.buf)
		if !io.down(k, true, it.buf, func() { prv.release(it) }) {
			return nil
		}
	}
	return nil
}
