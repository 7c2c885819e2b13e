package collective

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/gorun/gorun/rank"
)

// When a call fails on one rank (a mismatch, a dead peer, a deadline), the
// other ranks may be blocked waiting for it, and a rank blocked on a rank
// that is itself blocked would only notice at the transport's timeout. So
// the failing rank aborts: it sends an abort frame on every channel to
// every peer, and keeps reading (and dropping) what its peers still send
// it until they have aborted too. A rank that receives an abort frame
// fails its call with an *AbortError and aborts in turn, so the failure
// reaches every rank at once, carrying the rank that first failed, the
// rank it blamed and why.

// kAbort is the Kind of an abort frame. Its Tag carries Seq =
// origin<<32 | culprit, Aux = reason | differences<<3, Chunk = the
// aborted call's sequence number. It has no payload.
const kAbort kind = 6

type abortReason uint16

const (
	reasonOther    abortReason = 0 // a local error on the origin rank
	reasonMismatch abortReason = 1 // origin and culprit made different calls
	reasonPeer     abortReason = 2 // culprit failed, vanished or closed its transport
	reasonTimeout  abortReason = 3 // origin gave up waiting for culprit (deadline, timeout)
	reasonCancel   abortReason = 4 // origin's context was cancelled
	reasonInvalid  abortReason = 5 // origin called with invalid arguments
)

// diff bits: what differs between two calls.
const (
	dSeq uint16 = 1 << iota
	dKind
	dCount
	dDtype
	dOp
	dWire
	dAlgo
	dRoot
	dSize
)

func diffBits(a, b call) uint16 {
	var d uint16
	if a.seq != b.seq {
		d |= dSeq
	}
	if a.kind != b.kind {
		d |= dKind
	}
	if a.count != b.count {
		d |= dCount
	}
	if a.dtype != b.dtype {
		d |= dDtype
	}
	if a.op != b.op {
		d |= dOp
	}
	if a.wire != b.wire {
		d |= dWire
	}
	if a.algo != b.algo {
		d |= dAlgo
	}
	if a.root != b.root {
		d |= dRoot
	}
	if d == 0 {
		d = dSize
	}
	return d
}

func diffText(d uint16) string {
	names := []string{
		"sequence number (a rank skipped or added a collective)", "collective", "length", "data type",
		"reduction", "wire format", "algorithm (set GORUN_ALLREDUCE the same on every rank)", "root",
		"message size (slice settings differ between ranks)",
	}
	var s []string
	for i, n := range names {
		if d&(1<<i) != 0 {
			s = append(s, n)
		}
	}
	return strings.Join(s, ", ")
}

// AbortError is what a rank gets when another rank failed the same call
// and aborted it: Origin is the rank that failed first, Culprit the rank it
// blamed (the peer it disagreed with, or the one that died or was late).
type AbortError struct {
	Rank    int    // this rank
	From    int    // the peer whose abort frame this rank received
	Call    string // this rank's call
	Seq     int    // the sequence number of the aborted call (this call or an earlier one)
	Origin  int
	Culprit int
	Reason  string
	reason  abortReason
	diff    uint16
}

func (e *AbortError) Error() string {
	return fmt.Sprintf("rank %d: %s failed: rank %d aborted collective #%d: %s", e.Rank, e.Call, e.From, e.Seq, e.Reason)
}

func reasonText(reason abortReason, origin, culprit int, diff uint16) string {
	switch reason {
	case reasonMismatch:
		return fmt.Sprintf("ranks %d and %d called different collectives (%s differs)", origin, culprit, diffText(diff))
	case reasonPeer:
		return fmt.Sprintf("rank %d lost rank %d (it failed, exited or closed its connection)", origin, culprit)
	case reasonTimeout:
		return fmt.Sprintf("rank %d timed out waiting for rank %d", origin, culprit)
	case reasonCancel:
		return fmt.Sprintf("rank %d's call was cancelled", origin)
	case reasonInvalid:
		return fmt.Sprintf("rank %d called it with invalid arguments", origin)
	}
	return fmt.Sprintf("rank %d failed", origin)
}

func abortTag(seq uint32, origin, culprit int, reason abortReason, diff uint16) rank.Tag {
	return rank.Tag{Seq: uint64(uint32(origin))<<32 | uint64(uint32(culprit)), Kind: uint16(kAbort),
		Aux: uint16(reason) | diff<<3, Chunk: seq}
}

// fromAbort turns a received abort frame into an *AbortError.
func fromAbort(self, from int, mine call, t rank.Tag) *AbortError {
	origin, culprit := int(uint32(t.Seq>>32)), int(uint32(t.Seq))
	reason, diff := abortReason(t.Aux&7), t.Aux>>3
	return &AbortError{Rank: self, From: from, Call: mine.String(), Seq: int(t.Chunk), Origin: origin, Culprit: culprit,
		Reason: reasonText(reason, origin, culprit, diff), reason: reason, diff: diff}
}

// blame works out what to tell the peers about err, this rank's failure of
// call cl.
func blame(self int, ctx context.Context, cl call, err error) (origin, culprit int, reason abortReason, diff uint16) {
	if cl.bad {
		return self, self, reasonInvalid, 0
	}
	var ab *AbortError
	if errors.As(err, &ab) {
		return ab.Origin, ab.Culprit, ab.reason, ab.diff
	}
	var me *MismatchError
	if errors.As(err, &me) {
		return self, me.Peer, reasonMismatch, me.bits
	}
	var pe *rank.PeerError
	if errors.As(err, &pe) {
		if ctx.Err() == context.Canceled {
			return self, self, reasonCancel, 0
		}
		var te interface{ Timeout() bool }
		if ctx.Err() != nil || pe.Waited > 0 || errors.As(pe.Err, &te) && te.Timeout() || strings.Contains(pe.Err.Error(), "timeout") {
			return self, pe.Peer, reasonTimeout, 0
		}
		return self, pe.Peer, reasonPeer, 0
	}
	if errors.Is(err, context.Canceled) {
		return self, self, reasonCancel, 0
	}
	return self, self, reasonOther, 0
}

// abortLinger bounds how long an aborting rank keeps telling and draining
// its peers (in the background) when the Communicator has no Timeout.
const abortLinger = 30 * time.Second

// abort tells every peer on every channel that call cl failed here, and
// drains what the peers still send until each has aborted too (or the
// linger time is over). It returns once the abort frames are sent and
// every peer but the culprit has answered with its own abort (or failed),
// or after abortSendWait; the draining goes on in the background.
func (c *Communicator) abort(cl call, ctx context.Context, err error) {
	t := c.t
	n, me := t.Size(), t.Rank()
	if n == 1 {
		return
	}
	origin, culprit, reason, diff := blame(me, ctx, cl, err)
	tag := abortTag(cl.seq, origin, culprit, reason, diff)
	if g := c.group(); g != nil {
		g.postAbort(cl.seq, tag)
	}
	linger := abortLinger
	if c.cfg.Timeout > 0 {
		linger = c.cfg.Timeout
	}
	actx, cancel := context.WithTimeout(context.Background(), linger)
	// A peer has answered once one of its lanes brings its abort (or
	// fails); the culprit may never answer (stopped, dead), and the peer
	// whose abort this call received has answered already.
	from := -1
	var ab *AbortError
	if errors.As(err, &ab) {
		from = ab.From
	}
	var wg, told sync.WaitGroup
	for p := 0; p < n; p++ {
		if p == me {
			continue
		}
		told.Add(1)
		answered := sync.OnceFunc(told.Done)
		if p == culprit || p == from {
			answered()
		}
		for ch := 0; ch < t.Channels(); ch++ {
			wg.Add(2)
			told.Add(1)
			go func(p, ch int) {
				defer wg.Done()
				defer told.Done()
				t.Send(actx, p, ch, tag, nil)
			}(p, ch)
			go func(p, ch int) {
				defer wg.Done()
				defer answered()
				for {
					err := t.Recv(actx, p, ch, tag, nil)
					var rm *rank.MismatchError
					if err == nil || !errors.As(err, &rm) || kind(rm.Got.Kind) == kAbort {
						return // the peer aborted (or is gone): nothing more will come
					}
				}
			}(p, ch)
		}
	}
	go func() { wg.Wait(); cancel() }()
	// Wait (briefly) until the abort frames are out and the peers have
	// answered, so that a process that exits on this error has told its
	// peers first: a frame handed to QUIC is sent later, from a buffer
	// that dies with the process, and a peer that finds this rank dead
	// may not look for a frame it left in shared memory.
	sent := make(chan struct{})
	go func() { told.Wait(); close(sent) }()
	select {
	case <-sent:
	case <-time.After(min(linger, abortSendWait)):
	}
}

// abortSendWait bounds how long a failing call waits for its abort frames
// to be handed to the transport.
const abortSendWait = 2 * time.Second
