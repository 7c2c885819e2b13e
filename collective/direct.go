package collective

import (
	"context"

	"github.com/gorun/gorun/dtype"
)

// Direct allreduce, for small calls: every rank sends its whole buffer
// (in the wire format) to every peer on channel 0, receives every peer's,
// and reduces the n contributions itself in rank order 0, 1, ..., n-1,
// accumulating in float32 and rounding once at the end, so every rank
// computes the same result bit for bit. It runs in the queue goroutine:
// no sender, receiver or reducer goroutines and no channel hand-offs, so
// a call costs one message latency plus the reduction.
//
// Guarantees kept: each message carries the call's tag (sequence number,
// count, dtype, op, wire, algorithm), so a rank that makes a different
// call gets a tag mismatch on its first receive from a disagreeing peer
// (a rank running a ring or tree call receives its ring predecessor's
// header first, a direct rank its peers' data: in any mix some ring
// neighbours disagree and one of them sees it); errors go through the
// Communicator's abort, and the context (Config.Timeout) bounds every
// Send and Recv.
//
// Why every rank may send before it receives without deadlocking: rank A
// sends its message of call k to q only once it has finished call k-1,
// which needs q's message of k-1, which q sent only after finishing k-2,
// which needed A's message of k-2. So at most two direct messages (k-1
// and k) from A are unread on a link, and Send blocks only when the link
// cannot buffer them: ranktest.InMemory buffers 16 messages per lane, the
// shared-memory ring 1 MiB per channel and direction, TCP lanes ask for
// 4 MiB socket buffers (the kernel grants twice the smaller of that and
// net.core.wmem_max, 416 KiB by default, and as much again at the
// receiver), and QUIC streams open with a 4 MiB receive window.
// DirectMaxBytes (64 KiB by default) keeps two messages plus headers well
// inside all of them. Messages of an
// earlier ring or tree call are drained by that call's receiver
// goroutines, which never wait on this call.

// DirectAlgorithm's scratch lives in the Communicator: calls run one at a
// time in the queue goroutine.
func (c *Communicator) directScratch(nbytes int) []byte {
	if cap(c.dscratch) < nbytes {
		c.dscratch = make([]byte, nbytes)
	}
	return c.dscratch[:nbytes]
}

func (c *Communicator) directAllreduce(ctx context.Context, buf []byte, count int, cl call) error {
	n, me := c.t.Size(), c.t.Rank()
	ws := cl.wire.Size()
	wb := count * ws
	tag := cl.tag(0)
	// scratch: n wire buffers (this rank's own converted one when wire !=
	// dtype), a float32 accumulator and a float32 decode buffer, each
	// rounded up to 8 bytes so the float32 views stay aligned.
	wpad := (wb + 7) &^ 7
	fpad := (count*4 + 7) &^ 7
	s := c.directScratch(n*wpad + 2*fpad)
	contrib := func(r int) []byte { return s[r*wpad : r*wpad+wb : r*wpad+wb] }
	acc := Float32s(s[n*wpad : n*wpad+count*4])
	tmp := Float32s(s[n*wpad+fpad : n*wpad+fpad+count*4])

	own := buf
	if cl.wire != cl.dtype {
		own = contrib(me)
		encode(own, Float32s(buf), cl.wire)
	}
	for i := 1; i < n; i++ {
		p := (me + i) % n
		if err := c.t.Send(ctx, p, 0, tag, own); err != nil {
			return explainMismatch(err)
		}
	}
	// receive in the order the peers send to this rank: rank me-1 sends
	// to me first, me-2 second, ...
	for i := 1; i < n; i++ {
		p := (me - i + n) % n
		if err := c.t.Recv(ctx, p, 0, tag, contrib(p)); err != nil {
			return explainMismatch(err)
		}
	}
	if count == 0 {
		return nil
	}
	get := func(r int) []byte {
		if r == me {
			return own
		}
		return contrib(r)
	}
	decode(acc, get(0), cl.wire)
	for r := 1; r < n; r++ {
		y := tmp
		if cl.wire == dtype.Float32 {
			y = Float32s(get(r))
		} else {
			decode(tmp, get(r), cl.wire)
		}
		apply(acc, acc, y, cl.op)
	}
	if cl.op == Average {
		d := float32(n)
		for i := range acc {
			acc[i] /= d
		}
	}
	if cl.wire != cl.dtype {
		// float32 data on a 16-bit wire: the result is rounded to the wire
		// format as the ring's and tree's are (the owner's slice too).
		w := contrib(me)
		encode(w, acc, cl.wire)
		decode(Float32s(buf), w, cl.wire)
		return nil
	}
	encode(buf, acc, cl.dtype)
	return nil
}
