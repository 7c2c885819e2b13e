package main

import (
	"context"
	"sync"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/rank"
)

// sendrecvKind marks -C sendrecv's messages (Tag.Kind), apart from every
// collective's.
const sendrecvKind = 0xfffe

// sendrecvSeq numbers the exchanges of one run; every rank counts the same.
var sendrecvSeq uint64

// smallExchange is the largest buffer that exchange sends as one message
// before it receives, in the calling goroutine: every transport buffers that
// much (QUIC's stream window and TCP's socket buffers are MiBs), and small
// messages cost less without goroutines, as the Direct allreduce sends them.
const smallExchange = 64 << 10

// exchange sends send to rank+1 while it receives recv from rank-1, each
// buffer striped over the mesh's channels (one message per channel), or
// for small buffers one message on channel 0, sent and then received.
func exchange(ctx context.Context, t rank.Transport, send, recv []byte) error {
	n, me := t.Size(), t.Rank()
	if n == 1 {
		copy(recv, send) // a rank that is its own neighbour
		return nil
	}
	sendrecvSeq++
	next, prev := (me+1)%n, (me+n-1)%n
	if len(send) <= smallExchange {
		tag := rank.Tag{Seq: sendrecvSeq, Kind: sendrecvKind}
		if err := t.Send(ctx, next, 0, tag, send); err != nil {
			return err
		}
		return t.Recv(ctx, prev, 0, tag, recv)
	}
	nch := t.Channels()
	part := (len(send) + nch - 1) / nch
	errs := make([]error, 2*nch)
	var wg sync.WaitGroup
	for ch := 0; ch < nch; ch++ {
		lo, hi := min(ch*part, len(send)), min((ch+1)*part, len(send))
		tag := rank.Tag{Seq: sendrecvSeq, Kind: sendrecvKind, Chunk: uint32(ch)}
		wg.Add(2)
		go func() {
			defer wg.Done()
			errs[2*ch] = t.Send(ctx, next, ch, tag, send[lo:hi])
		}()
		go func() {
			defer wg.Done()
			errs[2*ch+1] = t.Recv(ctx, prev, ch, tag, recv[lo:hi])
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// sendRecv times -C sendrecv for one size: the warm-up and timed exchanges,
// the time of one, and with -c 1 the elements (over all ranks) that differ
// from what the previous rank filled in.
func sendRecv(ctx context.Context, c *collective.Communicator, t rank.Transport, send, recv []byte, o options) (timing, int, error) {
	n, me := c.Size(), c.Rank()
	fill(send, me, o.dtype)
	clear(recv)
	for i := 0; i < o.warmup; i++ {
		if err := exchange(ctx, t, send, recv); err != nil {
			return timing{}, 0, err
		}
	}
	tm, err := timeSamples(ctx, c, o, func(k int) error {
		for i := 0; i < k; i++ {
			if err := exchange(ctx, t, send, recv); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil || !o.check {
		return tm, 0, err
	}
	w, err := sumCounts(ctx, t, &countSeq, wrongFrom(recv, (me+n-1)%n, o.dtype))
	return tm, w, err
}

// wrongFrom counts the elements of recv that differ from what rank prev
// filled its send buffer with.
func wrongFrom(recv []byte, prev int, dt dtype.DType) int {
	wrong := 0
	count := len(recv) / dt.Size()
	for i := 0; i < count; i++ {
		if elem(recv, i, dt) != round(dt, value(prev, i)) {
			wrong++
		}
	}
	return wrong
}
