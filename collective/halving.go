package collective

import (
	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/dtype"
)

// Halving-doubling allreduce (Rabenseifner's algorithm; gloo's
// allreduce_halving_doubling, MPICH's reduce_scatter + allgather for long
// vectors): a reduce-scatter by recursive vector halving and distance
// doubling, then an allgather by recursive vector doubling and distance
// halving. On P = 2^k ranks that is 2k steps where the ring takes
// 2(P-1), each rank sending and receiving the same 2(P-1)/P of the
// buffer as on the ring.
//
// World sizes that are not a power of two: with p = 2^k the largest power
// of two <= P and r = P-p extra ranks, the first 2r ranks pair up: each
// even rank 2i sends its whole buffer to rank 2i+1, which reduces it into
// its own (the fold), and gets the whole result back from 2i+1 at the end
// (the unfold). Ranks 2i+1 (i < r) and 2r..P-1 run the power-of-two
// algorithm as virtual ranks 0..p-1. That is MPICH's choice: 2 extra steps
// and 2 extra buffers through the pair's link, and the even rank idle in
// between (gloo splits the folded rank's work differently; not worth the
// complexity at the world sizes gorun runs).
//
// The algorithm is a pure plan (hdPlanFor: for one rank, the list of
// steps, each an exchange with one peer of element ranges) and an executor
// (run.halvingDoubling) that moves the bytes with the ring's machinery:
// senders, receivers reading ahead into slots, the reducer, the wire
// format. Every element's final value is computed once, by the rank whose
// range it falls in after the reduce-scatter, which then copies it to the
// others; with a 16-bit wire that rank rounds its own final values through
// the wire format too (as the ring's owner does), so every rank holds the
// same bits.

// span is the elements [lo, hi) of a buffer.
type span struct{ lo, hi int }

func (s span) len() int { return s.hi - s.lo }

// hdStep is one step of a rank's plan: one exchange with one peer. The
// rank sends its elements send (if sends) and receives the peer's
// elements recv (if recvs), which it combines into its own (reduce) or
// which replace its own (the allgather and the unfold). The peer's step
// is the mirror image: its send is this rank's recv and the reverse.
type hdStep struct {
	peer         int
	send, recv   span
	sends, recvs bool
	reduce       bool
	// exchange: send and recv are the same range (recursive doubling):
	// each slice has left before the peer's is combined into it, and the
	// lower rank's value is the first operand on both ends.
	exchange bool
}

// hdPlan is one rank's halving-doubling allreduce of count elements.
type hdPlan struct {
	steps []hdStep
	// rs: steps[:rs] reduce; after them the elements own hold their full
	// reduction, which this rank finishes (Average, wire rounding).
	rs  int
	own span // empty on a rank that folded its data into a partner
}

// hdPlanFor returns rank's plan for an allreduce of count elements over
// world ranks. It is a pure function: every rank computes every peer's
// plan alike, so the two ends of each step agree on the ranges.
func hdPlanFor(rank, world, count int) hdPlan {
	return foldedPlan(rank, world, count, halvingDoublingSteps)
}

// rdPlanFor returns rank's plan for the recursive-doubling allreduce of
// count elements over world ranks (see rdSteps); pure, as hdPlanFor.
func rdPlanFor(rank, world, count int) hdPlan {
	return foldedPlan(rank, world, count, rdSteps)
}

// foldedPlan is the plan of an algorithm for a power of two of ranks
// (steps: the plan of virtual rank v of pof2, whose peers real names)
// on any world size: with extra ranks, the first 2*extra fold into
// partners first and get the result back last.
func foldedPlan(rank, world, count int, steps func(p *hdPlan, v, pof2 int, all span, real func(int) int)) hdPlan {
	all := span{0, count}
	if world <= 1 {
		return hdPlan{own: all}
	}
	pof2, _ := algo.Pow2Below(world)
	extra := world - pof2
	var p hdPlan
	v := rank - extra // virtual rank among the pof2
	if rank < 2*extra {
		if rank%2 == 0 { // folds into rank+1 and waits for the result
			p.steps = []hdStep{{peer: rank + 1, send: all, sends: true, reduce: true},
				{peer: rank + 1, recv: all, recvs: true}}
			p.rs = 1
			return p
		}
		v = rank / 2
		p.steps = append(p.steps, hdStep{peer: rank - 1, recv: all, recvs: true, reduce: true})
	}
	real := func(v int) int {
		if v < extra {
			return 2*v + 1
		}
		return v + extra
	}
	steps(&p, v, pof2, all, real)
	if rank < 2*extra {
		p.steps = append(p.steps, hdStep{peer: rank - 1, send: all, sends: true})
	}
	return p
}

// halvingDoublingSteps appends the halving-doubling steps of virtual rank
// v among pof2 to p and sets p.rs and p.own.
func halvingDoublingSteps(p *hdPlan, v, pof2 int, all span, real func(int) int) {
	// reduce-scatter: at distance mask, keep the lower half of the current
	// range if bit mask of v is clear, else the upper; give the other half.
	// The peer v^mask has the same current range (they differ only in bits
	// not yet used), so the two ends agree on the halves.
	cur := all
	first := len(p.steps)
	for mask := 1; mask < pof2; mask <<= 1 {
		mid := cur.lo + cur.len()/2
		keep, give := span{cur.lo, mid}, span{mid, cur.hi}
		if v&mask != 0 {
			keep, give = give, keep
		}
		p.steps = append(p.steps, hdStep{peer: real(v ^ mask), send: give, recv: keep, sends: true, recvs: true, reduce: true})
		cur = keep
	}
	p.rs, p.own = len(p.steps), cur
	// allgather: the same peers in reverse order; send everything owned so
	// far, receive what was given to that peer (which the peer now owns).
	for i := p.rs - 1; i >= first; i-- {
		got := p.steps[i].send
		p.steps = append(p.steps, hdStep{peer: p.steps[i].peer, send: cur, recv: got, sends: true, recvs: true})
		cur = span{min(cur.lo, got.lo), max(cur.hi, got.hi)}
	}
}

// rdSteps appends the recursive-doubling steps of virtual rank v among
// pof2 to p: at distance 1, 2, 4, ... it exchanges its whole buffer with
// peer v^mask and combines the peer's into it, the lower rank's value the
// first operand on both ends, so the two compute the same bits. log2(p)
// steps where halving-doubling takes 2 log2(p), each moving the whole
// buffer where halving-doubling moves halves, quarters, ...: at p = 2 the
// same bytes in one exchange instead of two.
func rdSteps(p *hdPlan, v, pof2 int, all span, real func(int) int) {
	for mask := 1; mask < pof2; mask <<= 1 {
		p.steps = append(p.steps, hdStep{peer: real(v ^ mask), send: all, recv: all, sends: true, recvs: true, reduce: true, exchange: true})
	}
	p.rs, p.own = len(p.steps), all
}

// exchanges reports whether the plan is recursive doubling's.
func (p hdPlan) exchanges() bool {
	for _, st := range p.steps {
		if st.exchange {
			return true
		}
	}
	return false
}

type hdSpec struct {
	acc        []byte
	lo, hi     int // elements of acc to reduce
	nch        int // channels: channel c runs the algorithm on part c of [lo, hi)
	sliceBytes int
	dtype      dtype.DType
	wire       dtype.DType
	op         Op
	div        int // Average divides by this (0: the transport's size)
	// plan is the algorithm: hdPlanFor or rdPlanFor.
	plan func(rank, world, count int) hdPlan
}

// halvingDoubling runs sp.plan's allreduce (halving-doubling or recursive
// doubling) of acc[lo:hi] on nch channels in parallel, each on its part
// of the elements.
func (r *run) halvingDoubling(sp hdSpec) {
	n, me := r.t.Size(), r.t.Rank()
	if n == 1 {
		return
	}
	if sp.div == 0 {
		sp.div = n
	}
	parts := split(sp.hi-sp.lo, sp.nch)
	for c := 0; c < sp.nch; c++ {
		r.hdChannel(sp, c, sp.lo+parts[c], sp.plan(me, n, parts[c+1]-parts[c]))
	}
}

// hdMsg is a message of a plan: slice k of step t.
type hdMsg struct{ t, k int }

// hdSlices cuts a step's ranges into pipeline slices; both ends of a step
// cut a range alike.
func hdSlices(s span, ws, sliceBytes int) []int {
	b := split(s.len(), slices(s.len(), ws, sliceBytes))
	for i := range b {
		b[i] += s.lo
	}
	return b
}

// hdChannel executes plan p on channel c; the plan's element i is element
// base+i of acc.
//
// One sender and one receiver per peer. Within a step the rank alternates
// sending slice k and taking received slice k, so that two peers never
// both wait for room to send while neither consumes (each end's sends are
// bounded by the other's slots only when the other is behind). A
// received slice is reduced from a slot, or (allgather, wire = data
// type) lands in acc directly once every earlier send to that peer (the
// reduce-scatter's send of that same range) has left.
func (r *run) hdChannel(sp hdSpec, c, base int, p hdPlan) {
	es, ws := sp.dtype.Size(), sp.wire.Size()
	sendB := make([][]int, len(p.steps))
	recvB := make([][]int, len(p.steps))
	snd := map[int]*sender{}
	rmsgs := map[int][]hdMsg{} // per peer, its messages to this rank in order
	sentBefore := make([]int, len(p.steps))
	pushed := map[int]int{}
	maxRecv := 0
	for t, st := range p.steps {
		sentBefore[t] = pushed[st.peer]
		if st.sends {
			sendB[t] = hdSlices(st.send, ws, sp.sliceBytes)
			pushed[st.peer] += len(sendB[t]) - 1
			if snd[st.peer] == nil {
				snd[st.peer] = r.newSender(st.peer, c, 2*ringGroup+8)
			}
		}
		if st.recvs {
			recvB[t] = hdSlices(st.recv, ws, sp.sliceBytes)
			maxRecv = max(maxRecv, st.recv.len())
			for k := 0; k+1 < len(recvB[t]); k++ {
				rmsgs[st.peer] = append(rmsgs[st.peer], hdMsg{t, k})
			}
		}
	}
	direct := sp.wire == sp.dtype
	accOf := func(lo, hi int) []byte { return sp.acc[(base+lo)*es : (base+hi)*es : (base+hi)*es] }
	depth := ringGroup + 2
	slots := depth
	if p.exchanges() {
		slots = 4 // what an exchange combines is still in cache (rdExchange)
	}
	rcv := map[int]*receiver{}
	for peer, msgs := range rmsgs {
		s := snd[peer]
		rcv[peer] = r.newReceiver(peer, c, recvPlan{
			count: len(msgs),
			size: func(m int) int {
				b := recvB[msgs[m].t]
				return (b[msgs[m].k+1] - b[msgs[m].k]) * ws
			},
			dst: func(m int) []byte {
				if !direct || p.steps[msgs[m].t].reduce {
					return nil
				}
				b := recvB[msgs[m].t]
				return accOf(b[msgs[m].k], b[msgs[m].k+1])
			},
			before: func(m int) error {
				t := msgs[m].t
				if !direct || p.steps[t].reduce || msgs[m].k > 0 || s == nil || sentBefore[t] == 0 {
					return nil
				}
				return s.waitSent(sentBefore[t]) // what this range held has left
			},
			slotBytes: min(sp.sliceBytes, maxRecv*ws+1),
			depth:     slots,
		})
	}
	red := r.newReducer(sp.dtype, sp.wire, sp.op, sp.div)
	pool := r.newBufPool(depth)
	r.goFn(func() error {
		defer func() {
			for _, s := range snd {
				s.close()
			}
		}()
		return r.hdDrive(sp, p, hdIO{snd: snd, rcv: rcv, sendB: sendB, recvB: recvB, sentBefore: sentBefore, red: red, pool: pool, acc: accOf})
	})
}

// hdIO is what hdDrive works with: the channel's senders and receivers by
// peer, each step's slice bounds and the messages sent to its peer before
// it, the reducer and the send buffers.
type hdIO struct {
	snd          map[int]*sender
	rcv          map[int]*receiver
	sendB, recvB [][]int
	sentBefore   []int
	red          *reducer
	pool         *bufPool
	acc          func(lo, hi int) []byte
}

// hdDrive runs the steps in order: for each, alternately sends a slice
// and takes a received one; after the reduce steps it finishes the
// rank's own range. It returns nil when the run fails (the failure is the
// run's error).
func (r *run) hdDrive(sp hdSpec, p hdPlan, io hdIO) error {
	ws := sp.wire.Size()
	// send pushes elements [lo, hi) of acc in the wire format.
	send := func(s *sender, lo, hi int) bool {
		a := io.acc(lo, hi)
		if sp.wire == sp.dtype {
			return s.push(a, nil)
		}
		w, ok := io.pool.get(r.ctx, (hi-lo)*ws)
		if !ok {
			return false
		}
		io.red.toWire(w, a)
		return s.push(w, func() { io.pool.put(w) })
	}
	for t, st := range p.steps {
		if t == p.rs && !r.hdFinish(sp, p.own, io) {
			return nil
		}
		if st.exchange {
			if !r.rdExchange(sp, t, st, io, send) {
				return nil
			}
			continue
		}
		sb, rb := io.sendB[t], io.recvB[t]
		for k := 0; k+1 < max(len(sb), len(rb)); k++ {
			if k+1 < len(sb) && !send(io.snd[st.peer], sb[k], sb[k+1]) {
				return nil
			}
			if k+1 >= len(rb) {
				continue
			}
			it, ok := io.rcv[st.peer].next()
			if !ok {
				return nil
			}
			a := io.acc(rb[k], rb[k+1])
			switch {
			case st.reduce:
				io.red.combine(a, it.buf)
			case it.slot:
				io.red.get(a, it.buf)
			}
			io.rcv[st.peer].release(it)
		}
	}
	if p.rs == len(p.steps) { // recursive doubling: no allgather after
		r.hdFinish(sp, p.own, io)
	}
	return nil
}

// rdExchange runs exchange step t: it sends every slice of the range
// while combining the peer's slices into it as they come, at most
// ringGroup slices ahead. On a 16-bit wire a slice is rounded through the
// wire format in acc as it goes out, so that both ends combine the same
// two values, the lower rank's first; it is pushed only once ringGroup
// earlier ones have left, so that a wire buffer is always free
// (ringGroup+2 of them) and this rank never waits for one while the peer
// waits for it to take what came: it waits only for slices up to the one
// it is about to combine, which the peer, combining its own in the same
// order, takes. With wire = data type a slice goes out from acc itself
// and is combined once it has left.
func (r *run) rdExchange(sp hdSpec, t int, st hdStep, io hdIO, send func(*sender, int, int) bool) bool {
	b := io.sendB[t]
	n := len(b) - 1
	s, rv := io.snd[st.peer], io.rcv[st.peer]
	peerFirst := st.peer < r.t.Rank()
	narrow := sp.wire != sp.dtype
	pushed := 0
	for k := 0; k < n; k++ {
		for ; pushed < n && pushed <= k+ringGroup; pushed++ {
			lo, hi := b[pushed], b[pushed+1]
			if !narrow {
				if !send(s, lo, hi) {
					return false
				}
				continue
			}
			if pushed >= ringGroup && s.waitSent(io.sentBefore[t]+pushed+1-ringGroup) != nil {
				return false
			}
			w, ok := r.roundThroughWire(sp, io, lo, hi)
			if !ok || !s.push(w, func() { io.pool.put(w) }) {
				return false
			}
		}
		it, ok := rv.next()
		if !ok {
			return false
		}
		if !narrow && s.waitSent(io.sentBefore[t]+k+1) != nil {
			return false
		}
		io.red.combineOrdered(io.acc(b[k], b[k+1]), it.buf, peerFirst)
		rv.release(it)
	}
	return true
}

// hdFinish applies the last step to the rank's own fully reduced range
// (Average's division) and, for float32 data on a 16-bit wire, rounds it
// through the wire format, as the other ranks will receive it.
func (r *run) hdFinish(sp hdSpec, own span, io hdIO) bool {
	b := hdSlices(own, sp.wire.Size(), sp.sliceBytes)
	for k := 0; k+1 < len(b); k++ {
		a := io.acc(b[k], b[k+1])
		io.red.finish(a)
		if sp.wire == sp.dtype {
			continue
		}
		w, ok := r.roundThroughWire(sp, io, b[k], b[k+1])
		if !ok {
			return false
		}
		io.pool.put(w)
	}
	return true
}

// roundThroughWire rounds elements [lo, hi) of acc (float32) through the
// 16-bit wire format in place, by way of a send buffer from the pool,
// which it returns holding them in the wire format (the caller sends it or
// puts it back).
func (r *run) roundThroughWire(sp hdSpec, io hdIO, lo, hi int) ([]byte, bool) {
	w, ok := io.pool.get(r.ctx, (hi-lo)*sp.wire.Size())
	if !ok {
		return nil, false
	}
	a := io.acc(lo, hi)
	io.red.toWire(w, a)
	io.red.fromWire(a, w)
	return w, true
}
