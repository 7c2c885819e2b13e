package collective

import (
	"context"
	"os"
	"strconv"
	"time"

	"github.com/gorun/gorun/rank"
)

// The shared-memory allreduce, for a communicator whose ranks all run on
// one host (rank.LocalGroup: one segment mapped by every rank). It sends
// no messages: each rank has a slot in the segment, and every round of at
// most SharedRoundBytes of the buffer goes
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

// EnvSharedRound sets SharedRoundBytes (the same on every rank).
const EnvSharedRound = "GORUN_SHM_ROUND"

// SharedRoundBytes is the piece of the buffer each round of the
// shared-memory allreduce handles (at most half a group slot).
var SharedRoundBytes = 256 << 10

func init() {
	if v, err := strconv.Atoi(os.Getenv(EnvSharedRound)); err == nil && v >= 4096 {
		SharedRoundBytes = min(v, rank.GroupSlotBytes/2)
	}
}

// groupState is a communicator's use of the host's group segment.
type groupState struct {
	g       *rank.LocalGroup
	epoch   uint64
	arrived uint64 // this rank's arrivals in this epoch
	entered bool   // the epoch's first barrier is done
}

// sharedGroup returns the group state when every rank of t is on this
// host and shares the group segment, else nil.
func sharedGroup(t rank.Transport, timeout time.Duration) (*groupState, error) {
	lg, ok := t.(interface {
		LocalGroup(context.Context) (*rank.LocalGroup, error)
	})
	if !ok || t.Size() < 2 {
		return nil, nil
	}
	if timeout <= 0 {
		timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	g, err := lg.LocalGroup(ctx)
	if err != nil || g == nil || g.Size() != t.Size() || g.Index() != t.Rank() {
		return nil, err
	}
	return &groupState{g: g, epoch: uint64(g.Claim())}, nil
}

func packCall(c call) uint64 {
	v := uint64(c.kind) | uint64(c.dtype)<<16 | uint64(c.op)<<20 | uint64(c.wire)<<24 | uint64(c.algo)<<28 | uint64(uint32(c.root))<<32
	return v
}

func unpackCall(seq, v, count uint64) call {
	return call{seq: uint32(seq), kind: kind(uint16(v)), dtype: DType(v >> 16 & 15), op: Op(v >> 20 & 15),
		wire: DType(v >> 24 & 15), algo: Algorithm(v >> 28 & 15), root: int(uint32(v >> 32)), count: int(count)}
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
	me := g.Index()
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
	me := g.Index()
	g.Word(me, 6).Store(t.Seq)
	g.Word(me, 7).Store(uint64(t.Aux))
	g.Word(me, 5).Store(s.epoch<<32 | uint64(seq))
}

// posted reads the call member i posted last (ok false while it is being
// rewritten).
func (s *groupState) posted(i int) (epoch uint64, c call, ok bool) {
	g := s.g
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
	me := g.Index()
	for k := 0; k < g.Size(); k++ {
		if w := g.Word(k, 5).Load(); w>>32 == s.epoch {
			t := rank.Tag{Seq: g.Word(k, 6).Load(), Kind: uint16(kAbort), Aux: uint16(g.Word(k, 7).Load()), Chunk: uint32(w)}
			return fromAbort(me, g.Ranks()[k], cl, t)
		}
	}
	ep, pc, ok := s.posted(i)
	if ok && ep == s.epoch && (pc.seq > cl.seq || pc.seq == cl.seq && !sameCall(pc, cl)) {
		return s.mismatch(cl, i, pc)
	}
	return nil
}

func (s *groupState) mismatch(cl call, i int, pc call) error {
	return &MismatchError{Rank: s.g.Index(), Peer: s.g.Ranks()[i], Mine: cl.String(), Peers: pc.String(),
		What: differences(cl, pc), bits: diffBits(cl, pc)}
}

// arrive publishes this rank's next arrival and waits for every other
// rank's.
func (s *groupState) arrive(ctx context.Context, cl call) error {
	g := s.g
	me := g.Index()
	s.arrived++
	target := s.epoch<<40 | s.arrived
	g.Word(me, 0).Store(target)
	for i := 0; i < g.Size(); i++ {
		if i == me {
			continue
		}
		w := g.Word(i, 0)
		there := func() bool { return w.Load() >= target }
		check := func() error {
			// i may have arrived and gone on to its next call since
			// there() was false: what i posts comes after its arrival.
			if err := s.check(cl, i); err != nil && !there() {
				return err
			}
			return nil
		}
		if err := g.Wait(ctx, i, there, check); err != nil {
			return err
		}
	}
	return nil
}

// allreduce runs the shared-memory allreduce of send into recv (count
// elements each; they may be the same slice).
func (s *groupState) allreduce(ctx context.Context, send, recv []byte, count int, cl call) error {
	g := s.g
	if err := g.Enter(); err != nil {
		return err
	}
	defer g.Leave()
	n, me := g.Size(), g.Index()
	if !s.entered {
		// A new epoch: every rank has finished the previous communicator's
		// last round (and its reads of the slots) once it arrives here.
		if err := s.arrive(ctx, cl); err != nil {
			return err
		}
		s.entered = true
	}
	// Float32 data with a 16-bit wire format goes into the slots in that
	// format, as it would go on a wire: every contribution is rounded to
	// it, the sums are float32, and the result is rounded to it once
	// (the ring's and tree's semantics, and half the bytes to copy).
	es, ws := cl.dtype.Size(), cl.wire.Size()
	halfBytes := rank.GroupSlotBytes / 2
	per := max(1, min(SharedRoundBytes, halfBytes)/ws)
	rounds := max(1, (count+per-1)/per)
	red := newReducer(cl.dtype, cl.wire, cl.op, n)
	conv := cl.wire != cl.dtype
	for rd := 0; rd < rounds; rd++ {
		lo, hi := rd*per, min(count, (rd+1)*per)
		in, piece := send[lo*es:hi*es], recv[lo*es:hi*es]
		b := int(s.arrived/2) % 2 // two arrivals per round
		slot := func(i int) []byte { return g.Slot(i)[b*halfBytes : b*halfBytes+(hi-lo)*ws] }
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
			for i := 0; i < n; i++ {
				if i == me {
					continue
				}
				ep, pc, ok := s.posted(i)
				if !ok || ep != s.epoch || !sameCall(pc, cl) {
					return s.mismatch(cl, i, pc)
				}
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
		if conv {
			red.toWire(wpart(me, me), mine)
			red.fromWire(mine, wpart(me, me))
		} else {
			copy(wpart(me, me), mine)
		}
		if err := s.arrive(ctx, cl); err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			if i == me {
				continue
			}
			dst := piece[parts[i]*es : parts[i+1]*es]
			if conv {
				red.fromWire(dst, wpart(i, i))
			} else {
				copy(dst, wpart(i, i))
			}
		}
		// Between this rank and i moved, each way, part i (of the
		// contributions) and part me (of the results).
		for i := 0; i < n; i++ {
			if i != me {
				b := (parts[i+1] - parts[i] + parts[me+1] - parts[me]) * ws
				g.Count(i, b, b)
			}
		}
	}
	return nil
}
