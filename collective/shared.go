package collective

import (
	"context"
	"time"

	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/rank"
)

// The shared-memory allreduce, for a communicator whose ranks all run on
// one host (rank.LocalGroup: one segment mapped by every rank). It sends
// no messages: each rank has a slot in the segment, and every round of at
// most Config.SharedRoundBytes of the buffer goes
//
//  1. each rank copies its piece of the buffer, but for its own part,
//     into its slot and publishes an arrival;
//  2. once all have arrived, rank i reduces part i of the piece: its own
//     part i (read from its buffer, not copied) with the other slots' part
//     i in rank order (each element is computed once, by one rank, so every
//     rank ends with the same bits), writes it into its buffer and into its
//     own slot, and publishes a second arrival;
//  3. once all have, each rank copies every other part from its owner's
//     slot into its buffer.
//
// Each byte is copied in once and out once and read once by the reduction,
// all through cache-sized pieces (the message-passing ring over the pair
// segments copies it into a ring, out of the ring, and then reduces).
// Slots are double-buffered: round k uses half k%2 of every slot, and a
// rank reuses a half only after every rank has arrived in the round after
// the one that read it.
//
// Errors stay errors, not hangs. Every call (of any collective) posts its
// description in the caller's control words before it starts; a rank
// waiting for another checks what that rank posted, so a rank that called
// something else (a different length, type, reduction, algorithm,
// collective, or skipped a call) is reported as a *MismatchError at once,
// and the first round compares every rank's description before reducing
// anything. A failing rank also posts its abort there (besides the abort
// frames it sends on the transport), which waiting ranks turn into an
// *AbortError. Waits end with a *rank.PeerError when a rank dies (pidfd)
// or closes its mesh, at the transport's timeout, or at the context's
// deadline.
//
// Control words of each rank (rank.LocalGroup.Word):
//
//	0  arrivals: epoch<<40 | count in this epoch
//	1  description version (odd while being written)
//	2  epoch<<32 | sequence number of the call posted
//	3  the call: kind, dtype, op, wire, algorithm, root (packCall)
//	4  the call's count
//	5  abort: epoch<<32 | sequence number of the aborted call (0: none)
//	6  abort tag's Seq (origin and culprit)
//	7  abort tag's Aux (reason and differences)
//
// The epoch tells communicators on the same mesh apart (one at a time,
// created in the same order on every rank: rank.LocalGroup.Claim).

// DefaultSharedRoundBytes is the piece of the buffer each round of the
// shared-memory allreduce handles unless Config.SharedRoundBytes says.
const DefaultSharedRoundBytes = 256 << 10

// groupState is a communicator's use of the host's group segment: of
// the slots and control words of some of its members (all of them for a
// communicator on one host; a host's ranks of a hierarchical one).
type groupState struct {
	g       *rank.LocalGroup
	members []int // the members taking part, indices into g, ascending
	ranks   []int // their global ranks
	me      int   // this rank's index in members
	epoch   uint64
	arrived uint64 // this rank's arrivals in this epoch
	entered bool   // the epoch's first barrier is done
	round   int    // bytes of the buffer a round handles (Config.SharedRoundBytes)
}

// hostGroup returns the group state over the given global ranks (this
// rank among them, at least two) when they all share t's group segment,
// else nil. Every one of them gets the same answer.
func hostGroup(t rank.Transport, timeout time.Duration, ranks []int) (*groupState, error) {
	lg, ok := t.(interface {
		LocalGroup(context.Context) (*rank.LocalGroup, error)
	})
	if !ok || len(ranks) < 2 {
		return nil, nil
	}
	if timeout <= 0 {
		timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	g, err := lg.LocalGroup(ctx)
	if err != nil || g == nil {
		return nil, err
	}
	idx := map[int]int{}
	for i, r := range g.Ranks() {
		idx[r] = i
	}
	s := &groupState{g: g, ranks: ranks, me: -1}
	for k, r := range ranks {
		i, ok := idx[r]
		if !ok {
			return nil, nil
		}
		if i == g.Index() {
			s.me = k
		}
		s.members = append(s.members, i)
	}
	if s.me < 0 {
		return nil, nil
	}
	s.epoch = uint64(g.Claim())
	return s, nil
}

// sharedGroup returns the group state when every rank of t is on this
// host and shares the group segment, else nil.
func sharedGroup(t rank.Transport, timeout time.Duration) (*groupState, error) {
	all := make([]int, t.Size())
	for r := range all {
		all[r] = r
	}
	return hostGroup(t, timeout, all)
}

func packCall(c call) uint64 {
	v := uint64(c.kind) | uint64(c.dtype)<<16 | uint64(c.op)<<20 | uint64(c.wire)<<24 | uint64(c.algo)<<28 | uint64(uint32(c.root))<<32
	return v
}

func unpackCall(seq, v, count uint64) call {
	return call{seq: uint32(seq), kind: kind(uint16(v)), dtype: dtype.DType(v >> 16 & 15), op: Op(v >> 20 & 15),
		wire: dtype.DType(v >> 24 & 15), algo: algo.Algorithm(v >> 28 & 15), root: int(uint32(v >> 32)), count: int(count)}
}

func sameCall(a, b call) bool {
	return a.seq == b.seq && a.kind == b.kind && a.count == b.count && a.dtype == b.dtype &&
		a.op == b.op && a.wire == b.wire && a.algo == b.algo && a.root == b.root
}

// post publishes the call this rank is about to run.
func (s *groupState) post(cl call) {
	g := s.g
	if g.Enter() != nil {
		return
	}
	defer g.Leave()
	me := s.members[s.me]
	v := g.Word(me, 1)
	v.Add(1)
	g.Word(me, 2).Store(s.epoch<<32 | uint64(cl.seq))
	g.Word(me, 3).Store(packCall(cl))
	g.Word(me, 4).Store(uint64(cl.count))
	v.Add(1)
}

// postAbort publishes this rank's abort of a call.
func (s *groupState) postAbort(seq uint32, t rank.Tag) {
	g := s.g
	if g.Enter() != nil {
		return
	}
	defer g.Leave()
	me := s.members[s.me]
	g.Word(me, 6).Store(t.Seq)
	g.Word(me, 7).Store(uint64(t.Aux))
	g.Word(me, 5).Store(s.epoch<<32 | uint64(seq))
}

// posted reads the call member i posted last (ok false while it is being
// rewritten).
func (s *groupState) posted(i int) (epoch uint64, c call, ok bool) {
	g := s.g
	i = s.members[i]
	v := g.Word(i, 1)
	for try := 0; try < 100; try++ {
		v1 := v.Load()
		if v1&1 != 0 {
			continue
		}
		e, p, n := g.Word(i, 2).Load(), g.Word(i, 3).Load(), g.Word(i, 4).Load()
		if v.Load() == v1 {
			return e >> 32, unpackCall(e, p, n), true
		}
	}
	return 0, call{}, false
}

// check runs while this rank waits for member i in call cl: an abort
// posted by any member in this epoch, or a different call posted by i,
// ends the wait.
func (s *groupState) check(cl call, i int) error {
	g := s.g
	for k, gk := range s.members {
		if w := g.Word(gk, 5).Load(); w>>32 == s.epoch {
			t := rank.Tag{Seq: g.Word(gk, 6).Load(), Kind: uint16(kAbort), Aux: uint16(g.Word(gk, 7).Load()), Chunk: uint32(w)}
			return fromAbort(s.ranks[s.me], s.ranks[k], cl, t)
		}
	}
	ep, pc, ok := s.posted(i)
	if ok && ep == s.epoch && (pc.seq > cl.seq || pc.seq == cl.seq && !sameCall(pc, cl)) {
		return s.mismatch(cl, i, pc)
	}
	return nil
}

func (s *groupState) mismatch(cl call, i int, pc call) error {
	return &MismatchError{Rank: s.ranks[s.me], Peer: s.ranks[i], Mine: cl.String(), Peers: pc.String(),
		What: differences(cl, pc), bits: diffBits(cl, pc)}
}

// arrive publishes this rank's next arrival and waits for every other
// rank's.
func (s *groupState) arrive(ctx context.Context, cl call) error {
	g := s.g
	s.arrived++
	target := s.epoch<<40 | s.arrived
	g.Word(s.members[s.me], 0).Store(target)
	for i, gi := range s.members {
		if i == s.me {
			continue
		}
		w := g.Word(gi, 0)
		there := func() bool { return w.Load() >= target }
		check := func() error {
			// i may have arrived and gone on to its next call since
			// there() was false: what i posts comes after its arrival.
			if err := s.check(cl, i); err != nil && !there() {
				return err
			}
			return nil
		}
		if err := g.Wait(ctx, gi, there, check); err != nil {
			return err
		}
	}
	return nil
}

// enter enters the group segment (Leave ends it) and runs the epoch's
// first barrier, once: every rank has finished the previous
// communicator's last round (and its reads of the slots) once it arrives
// there.
func (s *groupState) enter(ctx context.Context, cl call) error {
	if err := s.g.Enter(); err != nil {
		return err
	}
	if !s.entered {
		if err := s.arrive(ctx, cl); err != nil {
			s.g.Leave()
			return err
		}
		s.entered = true
	}
	return nil
}

// compare checks, in a call's first round, that every member posted this
// call.
func (s *groupState) compare(cl call) error {
	for i := range s.members {
		if i == s.me {
			continue
		}
		ep, pc, ok := s.posted(i)
		if !ok || ep != s.epoch || !sameCall(pc, cl) {
			return s.mismatch(cl, i, pc)
		}
	}
	return nil
}

// allreduce runs the shared-memory allreduce of send into recv (count
// elements each; they may be the same slice).
func (s *groupState) allreduce(ctx context.Context, send, recv []byte, count int, cl call) error {
	g := s.g
	if err := s.enter(ctx, cl); err != nil {
		return err
	}
	defer g.Leave()
	n, me := len(s.members), s.me
	// Float32 data with a 16-bit wire format goes into the slots in that
	// format, as it would go on a wire: every contribution is rounded to
	// it, the sums are float32, and the result is rounded to it once
	// (the ring's and tree's semantics, and half the bytes to copy).
	es, ws := cl.dtype.Size(), cl.wire.Size()
	halfBytes := rank.GroupSlotBytes / 2
	per := max(1, min(s.round, halfBytes)/ws)
	rounds := max(1, (count+per-1)/per)
	red := newReducer(cl.dtype, cl.wire, cl.op, n)
	conv := cl.wire != cl.dtype
	for rd := 0; rd < rounds; rd++ {
		lo, hi := rd*per, min(count, (rd+1)*per)
		in, piece := send[lo*es:hi*es], recv[lo*es:hi*es]
		b := int(s.arrived/2) % 2 // two arrivals per round
		slot := func(i int) []byte { return g.Slot(s.members[i])[b*halfBytes : b*halfBytes+(hi-lo)*ws] }
		parts := split(hi-lo, n)
		plo, phi := parts[me]*es, parts[me+1]*es
		if conv {
			red.toWire(slot(me), in)
		} else {
			// only the parts other ranks reduce: this rank reads its own
			// part straight from its buffer
			copy(slot(me)[:plo], in[:plo])
			copy(slot(me)[phi:], in[phi:])
		}
		if err := s.arrive(ctx, cl); err != nil {
			return err
		}
		if rd == 0 {
			if err := s.compare(cl); err != nil {
				return err
			}
		}
		mine := piece[plo:phi]
		wpart := func(i, j int) []byte { return slot(i)[parts[j]*ws : parts[j+1]*ws] }
		// This rank's own contribution first, then the others' in rank
		// order: each element is computed by one rank only, so every rank
		// ends with the same bits.
		if conv {
			red.fromWire(mine, wpart(me, me))
		} else if len(mine) > 0 && &in[plo] != &mine[0] {
			copy(mine, in[plo:phi])
		}
		for i := 0; i < n; i++ {
			if i != me {
				red.combine(mine, wpart(i, me))
			}
		}
		red.finish(mine)
		red.put(wpart(me, me), mine)
		if conv { // this rank keeps the rounded result, as the others get it
			red.fromWire(mine, wpart(me, me))
		}
		if err := s.arrive(ctx, cl); err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			if i == me {
				continue
			}
			red.get(piece[parts[i]*es:parts[i+1]*es], wpart(i, i))
		}
		// Between this rank and i moved, each way, part i (of the
		// contributions) and part me (of the results).
		for i := 0; i < n; i++ {
			if i != me {
				b := (parts[i+1] - parts[i] + parts[me+1] - parts[me]) * ws
				g.Count(s.members[i], b, b)
			}
		}
	}
	return nil
}

// The hierarchical allreduce's phases within a host (hier.go) over the
// group segment: member j's part of the buffer is [parts[j], parts[j+1])
// (elements). Each round moves a piece of at most per elements of every
// part through the slots, piece j at j*per in a slot, with one arrival:
// a rank writes half arrived%2 of its slot, and it has seen every member
// arrive since they read what it wrote there two rounds before.
type partRounds struct {
	parts  []int
	per    int // elements of each part per round
	rounds int
	es, ws int
}

func (s *groupState) partRounds(parts []int, cl call) partRounds {
	n := len(s.members)
	es, ws := cl.dtype.Size(), cl.wire.Size()
	per := max(1, min(s.round, rank.GroupSlotBytes/2)/ws/n)
	longest := 0
	for j := 0; j < n; j++ {
		longest = max(longest, parts[j+1]-parts[j])
	}
	return partRounds{parts: parts, per: per, rounds: max(1, (longest+per-1)/per), es: es, ws: ws}
}

// piece is part j's elements [lo, hi) in round rd.
func (p partRounds) piece(j, rd int) (lo, hi int) {
	lo = min(p.parts[j+1], p.parts[j]+rd*p.per)
	return lo, min(p.parts[j+1], lo+p.per)
}

// slotPiece is piece j (n elements) in member i's slot, in the half that
// a round begun with h arrivals uses.
func (s *groupState) slotPiece(p partRounds, h uint64, i, j, n int) []byte {
	off := int(h%2)*(rank.GroupSlotBytes/2) + j*p.per*p.ws
	return s.g.Slot(s.members[i])[off : off+n*p.ws]
}

// reduceScatter leaves in this rank's part of acc the host's partial
// result (no Average division): its own contribution (from src, or acc
// when src is nil), then every other member's in member order, which
// the others wrote into their slots (in the wire format).
func (s *groupState) reduceScatter(ctx context.Context, acc, src []byte, parts []int, cl call) error {
	g := s.g
	if err := s.enter(ctx, cl); err != nil {
		return err
	}
	defer g.Leave()
	in := acc
	if src != nil {
		in = src
	}
	p := s.partRounds(parts, cl)
	n, me, es, ws := len(s.members), s.me, p.es, p.ws
	red := newReducer(cl.dtype, cl.wire, cl.op, n)
	for rd := 0; rd < p.rounds; rd++ {
		h := s.arrived
		for j := 0; j < n; j++ {
			if j != me {
				lo, hi := p.piece(j, rd)
				red.put(s.slotPiece(p, h, me, j, hi-lo), in[lo*es:hi*es])
				g.Count(s.members[j], (hi-lo)*ws, 0)
			}
		}
		if err := s.arrive(ctx, cl); err != nil {
			return err
		}
		if rd == 0 {
			if err := s.compare(cl); err != nil {
				return err
			}
		}
		lo, hi := p.piece(me, rd)
		mine := acc[lo*es : hi*es]
		if src != nil {
			copy(mine, src[lo*es:hi*es])
		}
		for i := 0; i < n; i++ {
			if i != me {
				red.combine(mine, s.slotPiece(p, h, i, me, hi-lo))
				g.Count(s.members[i], 0, (hi-lo)*ws)
			}
		}
	}
	return nil
}

// allgather copies every other member's part of acc into this rank's
// acc through the slots. Through the wire format when it differs: the
// hierarchical allreduce leaves values of that format in the parts, so
// the trip changes none.
func (s *groupState) allgather(ctx context.Context, acc []byte, parts []int, cl call) error {
	g := s.g
	if err := s.enter(ctx, cl); err != nil {
		return err
	}
	defer g.Leave()
	p := s.partRounds(parts, cl)
	n, me, es, ws := len(s.members), s.me, p.es, p.ws
	red := newReducer(cl.dtype, cl.wire, cl.op, n)
	for rd := 0; rd < p.rounds; rd++ {
		h := s.arrived
		mlo, mhi := p.piece(me, rd)
		red.put(s.slotPiece(p, h, me, me, mhi-mlo), acc[mlo*es:mhi*es])
		if err := s.arrive(ctx, cl); err != nil {
			return err
		}
		for j := 0; j < n; j++ {
			if j != me {
				lo, hi := p.piece(j, rd)
				red.get(acc[lo*es:hi*es], s.slotPiece(p, h, j, j, hi-lo))
				g.Count(s.members[j], (mhi-mlo)*ws, (hi-lo)*ws)
			}
		}
	}
	return nil
}
