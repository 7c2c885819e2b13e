package collective

import "github.com/gorun/gorun/dtype"

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
	dtype      dtype.DType
	wire       dtype.DType
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

// ringMsg is a message of a ring's schedule: slice k of step t.
type ringMsg struct{ t, k int }

// ringPlan is one channel's ring schedule on one rank: its part of every
// chunk cut into slices, the chunk each step sends and receives, and the
// order of the messages it sends to next and receives from prev (the
// same order on both ends of a link, up to chunk numbering). It is a pure
// function of the ring's shape (ringPlanFor); ringChannel executes it.
type ringPlan struct {
	segs       []segment
	maxS       int // the most slices of any segment
	nRS, T     int // reduce-scatter steps, and all steps
	sendChunks []int
	recvChunks []int // the chunk step t sends and receives
	sends      []ringMsg
	recvs      []ringMsg
	sendIdx    map[ringMsg]int // a send's place in sends
}

// ringPlanFor returns rank me's plan for channel c of nch on a ring of n
// (chunks: N+1 element offsets; ws: the wire's element size; rs, ag: the
// phases). Reduce-scatter step t sends chunk me-t-1 and receives me-t-2;
// allgather step t sends chunk me-t and receives me-t-1. Slices go in
// groups of ringGroup: all steps of a group in order.
func ringPlanFor(chunks []int, nch, c, n, me, ws, sliceBytes int, rs, ag bool) ringPlan {
	mod := func(x int) int { return ((x % n) + n) % n }
	p := ringPlan{segs: make([]segment, n)}
	for j := 0; j < n; j++ {
		cs := split(chunks[j+1]-chunks[j], nch)
		lo, hi := chunks[j]+cs[c], chunks[j]+cs[c+1]
		ns := slices(hi-lo, ws, sliceBytes)
		p.segs[j] = segment{lo, hi, ns, split(hi-lo, ns)}
		p.maxS = max(p.maxS, ns)
	}
	if rs {
		p.nRS = n - 1
	}
	p.T = p.nRS
	if ag {
		p.T += n - 1
	}
	for t := 0; t < p.T; t++ {
		if t < p.nRS {
			p.sendChunks = append(p.sendChunks, mod(me-t-1))
			p.recvChunks = append(p.recvChunks, mod(me-t-2))
		} else {
			p.sendChunks = append(p.sendChunks, mod(me-(t-p.nRS)))
			p.recvChunks = append(p.recvChunks, mod(me-(t-p.nRS)-1))
		}
	}
	p.sendIdx = map[ringMsg]int{}
	for g := 0; g < p.maxS; g += ringGroup {
		ke := min(p.maxS, g+ringGroup)
		for k := g; k < ke && p.T > 0 && k < p.segs[p.sendChunks[0]].ns; k++ {
			p.sendIdx[ringMsg{0, k}] = len(p.sends)
			p.sends = append(p.sends, ringMsg{0, k})
		}
		for t := 0; t < p.T; t++ {
			for k := g; k < ke && k < p.segs[p.recvChunks[t]].ns; k++ {
				p.recvs = append(p.recvs, ringMsg{t, k})
				if t+1 < p.T { // every send after the first step forwards a receive
					p.sendIdx[ringMsg{t + 1, k}] = len(p.sends)
					p.sends = append(p.sends, ringMsg{t + 1, k})
				}
			}
		}
	}
	return p
}

// slice returns the elements [lo, hi) of slice k of chunk j's segment.
func (p *ringPlan) slice(j, k int) (int, int) {
	s := p.segs[j]
	return s.lo + s.b[k], s.lo + s.b[k+1]
}

// ringChannel runs the plan of channel c: a receiver reading ahead from
// prev, a sender to next, and the drive (ringDrive) between them.
func (r *run) ringChannel(sp ringSpec, c, n, me int) {
	next, prev := (me+1)%n, (me+n-1)%n
	es, ws := sp.dtype.Size(), sp.wire.Size()
	p := ringPlanFor(sp.chunks, sp.nch, c, n, me, ws, sp.sliceBytes, sp.rs, sp.ag)
	direct := sp.ag && sp.wire == sp.dtype // allgather receives land in acc
	// Out of place, reduce-scatter receives land in acc too, and src is
	// combined into them: acc of a chunk is untouched until its one
	// reduce-scatter receive (the first send reads src), and saving the
	// copy of src into acc saves a pass over memory.
	rsDirect := sp.rs && sp.src != nil && sp.wire == sp.dtype
	intoAcc := func(t int) bool { // step t's receives land in acc
		if t < p.nRS {
			return rsDirect
		}
		return direct
	}
	depth := ringGroup + 2
	snd := r.newSender(next, c, 2*ringGroup+8)
	rv := r.newReceiver(prev, c, recvPlan{
		count: len(p.recvs),
		size: func(m int) int {
			lo, hi := p.slice(p.recvChunks[p.recvs[m].t], p.recvs[m].k)
			return (hi - lo) * ws
		},
		dst: func(m int) []byte {
			if !intoAcc(p.recvs[m].t) {
				return nil
			}
			lo, hi := p.slice(p.recvChunks[p.recvs[m].t], p.recvs[m].k)
			return sp.acc[lo*es : hi*es : hi*es]
		},
		before: func(m int) error {
			if !direct || !sp.rs || p.recvs[m].t < p.nRS {
				return nil
			}
			// acc of this slice was sent at reduce-scatter step t-nRS
			return snd.waitSent(p.sendIdx[ringMsg{p.recvs[m].t - p.nRS, p.recvs[m].k}] + 1)
		},
		slotBytes: min(sp.sliceBytes, (sp.chunks[n]-sp.chunks[0])*ws+1),
		depth:     depth,
	})
	div := sp.div
	if div == 0 {
		div = n
	}
	io := ringIO{snd: snd, rv: rv, red: r.newReducer(sp.dtype, sp.wire, sp.op, div), pool: r.newBufPool(depth)}
	r.goFn(func() error {
		defer snd.close()
		return r.ringDrive(sp, &p, io)
	})
}

// ringIO is what ringDrive works with: the channel's sender and receiver,
// the reducer and the send buffers.
type ringIO struct {
	snd  *sender
	rv   *receiver
	red  *reducer
	pool *bufPool
}

// ringDrive walks the plan's receives in order: a reduce-scatter slice is
// combined with this rank's input and forwarded (or, at the last step,
// finished: this rank owns the chunk), an allgather slice is stored and
// forwarded. It returns nil when the run fails (the failure is the run's
// error).
func (r *run) ringDrive(sp ringSpec, p *ringPlan, io ringIO) error {
	if p.T == 0 {
		return nil
	}
	es, ws := sp.dtype.Size(), sp.wire.Size()
	snd, rv, red, pool := io.snd, io.rv, io.red, io.pool
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
	for g := 0; g < p.maxS; g += ringGroup {
		ke := min(p.maxS, g+ringGroup)
		j0 := p.sendChunks[0]
		for k := g; k < ke && k < p.segs[j0].ns; k++ {
			lo, hi := p.slice(j0, k)
			if !send(in, lo, hi) {
				return nil
			}
		}
		for t := 0; t < p.T; t++ {
			j := p.recvChunks[t]
			for k := g; k < ke && k < p.segs[j].ns; k++ {
				it, ok := rv.next()
				if !ok {
					return nil
				}
				lo, hi := p.slice(j, k)
				a := sp.acc[lo*es : hi*es]
				fwd := t+1 < p.T
				if t < p.nRS {
					if !it.slot { // received into acc: combine this rank's input
						red.combine(a, sp.src[lo*es:hi*es])
					} else {
						if sp.src != nil {
							copy(a, sp.src[lo*es:hi*es])
						}
						red.combine(a, it.buf)
						rv.release(it)
					}
					if t == p.nRS-1 && !sp.noFinish { // this rank's own chunk is complete
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
}
