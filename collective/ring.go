package collective

// ringGroup is how many slices of each step a ring handles before moving
// to the next step (see ring). It bounds the messages in flight on each
// link, which the send queue and the slot pools must hold.
const ringGroup = 16

type ringSpec struct {
	acc        []byte // work buffer of dtype elements
	src        []byte // with rs: this rank's input, laid out as acc, when it is not in acc (out of place); nil: acc holds it
	chunks     []int  // N+1 element offsets: chunk j = [chunks[j], chunks[j+1])
	rs, ag     bool   // phases: reduce-scatter, allgather
	nch        int    // rings (one per channel)
	sliceBytes int
	dtype      DType
	wire       DType
	op         Op
	roundOwn   bool // allreduce with wire != dtype: the owner's result goes through the wire format too
	noFinish   bool // reduce-scatter leaves partial results (no Average division)
	div        int  // Average divides by this (0: the ring's size)
}

// ring runs reduce-scatter and/or allgather around the ring
// prev -> rank -> next on each of nch channels in parallel; channel c moves
// part c of every chunk.
//
// Steps t = 0..T-1. Reduce-scatter step t sends chunk (r-t-1) and receives
// chunk (r-t-2), which it reduces into acc; after N-1 steps rank r owns the
// full reduction of chunk r. Allgather step t sends chunk (r-t) and
// receives chunk (r-t-1). Every send at step t+1 forwards the chunk
// received at step t. Each chunk part is cut into slices; slices are
// handled in groups of ringGroup: all steps of a group in order, and within
// a step, receiving slice k+1 overlaps reducing slice k and sending slice
// k-1. Every rank follows the same schedule, so the order of messages on a
// link is the same on both ends.
//
// Out of place (src set), reduce-scatter reads this rank's input from src
// and writes only reduced slices to acc, so src is never copied whole:
// every chunk of acc is written by a receive before it is read, and the
// allgather that follows (or the caller's) fills the rest. A ring of one
// reads no src: its callers copy instead.
func (r *run) ring(sp ringSpec) {
	n, me := r.t.Size(), r.t.Rank()
	if n == 1 {
		return
	}
	for c := 0; c < sp.nch; c++ {
		r.ringChannel(sp, c, n, me)
	}
}

// segment is one channel's part [lo, hi) of a chunk, cut into ns slices
// that start at lo+b[k] (b[ns] = hi-lo).
type segment struct {
	lo, hi, ns int
	b          []int
}

func (r *run) ringChannel(sp ringSpec, c, n, me int) {
	next, prev := (me+1)%n, (me+n-1)%n
	es, ws := sp.dtype.Size(), sp.wire.Size()
	mod := func(x int) int { return ((x % n) + n) % n }
	// part c of every chunk, and its slices
	segs := make([]segment, n)
	maxS := 0
	for j := 0; j < n; j++ {
		cl := sp.chunks[j+1] - sp.chunks[j]
		cs := split(cl, sp.nch)
		lo, hi := sp.chunks[j]+cs[c], sp.chunks[j]+cs[c+1]
		ns := slices(hi-lo, ws, sp.sliceBytes)
		segs[j] = segment{lo, hi, ns, split(hi-lo, ns)}
		maxS = max(maxS, ns)
	}
	sliceOf := func(j, k int) (int, int) {
		s := segs[j]
		return s.lo + s.b[k], s.lo + s.b[k+1]
	}
	nRS := 0
	if sp.rs {
		nRS = n - 1
	}
	T := nRS
	if sp.ag {
		T += n - 1
	}
	sendChunk := func(t int) int {
		if t < nRS {
			return mod(me - t - 1)
		}
		return mod(me - (t - nRS))
	}
	recvChunk := func(t int) int {
		if t < nRS {
			return mod(me - t - 2)
		}
		return mod(me - (t - nRS) - 1)
	}
	// The schedule: the order of sends on the link to next (identical, up
	// to chunk numbering, to the order of receives on the link from prev).
	type msg struct{ t, k int }
	var sends, recvs []msg
	sendIdx := map[msg]int{}
	for g := 0; g < maxS; g += ringGroup {
		ke := min(maxS, g+ringGroup)
		for k := g; k < ke; k++ {
			if k < segs[sendChunk(0)].ns {
				sendIdx[msg{0, k}] = len(sends)
				sends = append(sends, msg{0, k})
			}
		}
		for t := 0; t < T; t++ {
			j := recvChunk(t)
			for k := g; k < ke; k++ {
				if k < segs[j].ns {
					recvs = append(recvs, msg{t, k})
					if t+1 < T {
						sendIdx[msg{t + 1, k}] = len(sends)
						sends = append(sends, msg{t + 1, k})
					}
				}
			}
		}
	}
	direct := sp.ag && sp.wire == sp.dtype // allgather receives land in acc
	// Out of place, reduce-scatter receives land in acc too, and src is
	// combined into them: acc of a chunk is untouched until its one
	// reduce-scatter receive (the first send reads src), and saving the
	// copy of src into acc saves a pass over memory.
	rsDirect := sp.rs && sp.src != nil && sp.wire == sp.dtype
	intoAcc := func(t int) bool { // step t's receives land in acc
		if t < nRS {
			return rsDirect
		}
		return direct
	}
	depth := ringGroup + 2
	snd := r.newSender(next, c, 2*ringGroup+8)
	pool := r.newBufPool(depth)
	rv := r.newReceiver(prev, c, recvPlan{
		count: len(recvs),
		size: func(m int) int {
			lo, hi := sliceOf(recvChunk(recvs[m].t), recvs[m].k)
			return (hi - lo) * ws
		},
		dst: func(m int) []byte {
			if !intoAcc(recvs[m].t) {
				return nil
			}
			lo, hi := sliceOf(recvChunk(recvs[m].t), recvs[m].k)
			return sp.acc[lo*es : hi*es : hi*es]
		},
		before: func(m int) error {
			if !direct || !sp.rs || recvs[m].t < nRS {
				return nil
			}
			// acc of this slice was sent at reduce-scatter step t-nRS
			return snd.waitSent(sendIdx[msg{recvs[m].t - nRS, recvs[m].k}] + 1)
		},
		slotBytes: min(sp.sliceBytes, (sp.chunks[n]-sp.chunks[0])*ws+1),
		depth:     depth,
	})
	div := sp.div
	if div == 0 {
		div = n
	}
	red := r.newReducer(sp.dtype, sp.wire, sp.op, div)
	r.goFn(func() error {
		defer snd.close()
		in := sp.acc // this rank's input
		if sp.src != nil {
			in = sp.src
		}
		// send pushes buf[lo:hi] (elements) in wire format.
		send := func(buf []byte, lo, hi int) bool {
			b := buf[lo*es : hi*es]
			if sp.wire == sp.dtype {
				return snd.push(b, nil)
			}
			w, ok := pool.get(r.ctx, (hi-lo)*ws)
			if !ok {
				return false
			}
			red.toWire(w, b)
			return snd.push(w, func() { pool.put(w) })
		}
		m := 0
		for g := 0; g < maxS; g += ringGroup {
			ke := min(maxS, g+ringGroup)
			j0 := sendChunk(0)
			for k := g; k < ke && k < segs[j0].ns; k++ {
				lo, hi := sliceOf(j0, k)
				if !send(in, lo, hi) {
					return nil
				}
			}
			for t := 0; t < T; t++ {
				j := recvChunk(t)
				for k := g; k < ke && k < segs[j].ns; k++ {
					it, ok := rv.next()
					if !ok {
						return nil
					}
					m++
					lo, hi := sliceOf(j, k)
					a := sp.acc[lo*es : hi*es]
					fwd := t+1 < T
					if t < nRS {
						if !it.slot { // received into acc: combine this rank's input
							red.combine(a, sp.src[lo*es:hi*es])
						} else {
							if sp.src != nil {
								copy(a, sp.src[lo*es:hi*es])
							}
							red.combine(a, it.buf)
							rv.release(it)
						}
						if t == nRS-1 && !sp.noFinish { // this rank's own chunk is complete
							red.finish(a)
							if sp.roundOwn && sp.ag {
								w, ok := pool.get(r.ctx, (hi-lo)*ws)
								if !ok {
									return nil
								}
								red.toWire(w, a)
								red.fromWire(a, w)
								if !snd.push(w, func() { pool.put(w) }) {
									return nil
								}
								continue
							}
						}
						if fwd && !send(sp.acc, lo, hi) {
							return nil
						}
						continue
					}
					// allgather
					if !it.slot { // already in acc
						if fwd && !snd.push(a, nil) {
							return nil
						}
						continue
					}
					red.fromWire(a, it.buf)
					if !fwd {
						rv.release(it)
					} else if !snd.push(it.buf, func() { rv.release(it) }) {
						return nil
					}
				}
			}
		}
		return nil
	})
}
