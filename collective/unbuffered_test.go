package collective

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/rank"
	"github.com/gorun/gorun/rank/ranktest"
)

// syncLinks wraps an in-process group so that a Send returns only once
// the peer has received the message: links that buffer nothing, the
// tightest flow control a transport can have (a TCP lane whose socket
// buffers are full). An algorithm that lets both ends of a link wait for
// room to send while neither receives deadlocks on it.
type syncLinks struct {
	mu          sync.Mutex
	cond        *sync.Cond
	sent, recvd map[[3]int]int // by (from, to, channel)
}

type syncTransport struct {
	rank.Transport
	l *syncLinks
}

func syncGroup(n, channels int) []rank.Transport {
	l := &syncLinks{sent: map[[3]int]int{}, recvd: map[[3]int]int{}}
	l.cond = sync.NewCond(&l.mu)
	var ts []rank.Transport
	for _, t := range ranktest.InMemory(n, channels) {
		ts = append(ts, &syncTransport{t, l})
	}
	return ts
}

func (l *syncLinks) wake() {
	l.mu.Lock()
	l.cond.Broadcast()
	l.mu.Unlock()
}

func (s *syncTransport) Send(ctx context.Context, peer, ch int, tag rank.Tag, payload []byte) error {
	if err := s.Transport.Send(ctx, peer, ch, tag, payload); err != nil {
		return err
	}
	k := [3]int{s.Rank(), peer, ch}
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	s.l.sent[k]++
	for idx := s.l.sent[k]; s.l.recvd[k] < idx && ctx.Err() == nil; {
		s.l.cond.Wait()
	}
	return ctx.Err()
}

func (s *syncTransport) Recv(ctx context.Context, peer, ch int, want rank.Tag, dst []byte) error {
	err := s.Transport.Recv(ctx, peer, ch, want, dst)
	s.l.mu.Lock()
	s.l.recvd[[3]int{peer, s.Rank(), ch}]++
	s.l.cond.Broadcast()
	s.l.mu.Unlock()
	return err
}

// TestUnbufferedLinks: the pipelined algorithms (ring, tree,
// halving-doubling, recursive doubling; Direct needs links that hold two
// messages, direct.go) with hundreds of slices per step, both wire widths,
// 2-4 ranks on 2 channels, over links that buffer nothing: each completes
// with the right sums. None may let both ends of a link wait for room to
// send while neither takes what came (recursive doubling's first version
// did, on a 16-bit wire).
func TestUnbufferedLinks(t *testing.T) {
	const count = 1 << 14
	for _, a := range []algo.Algorithm{algo.Ring, algo.Tree, algo.HalvingDoubling, algo.RecursiveDoubling} {
		for _, n := range []int{2, 3, 4} {
			for _, v := range []variant{{dtype.Float32, dtype.Float32}, {dtype.Float32, dtype.Float16}} {
				ts := syncGroup(n, 2)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				// waiters on the links wake up at the deadline too
				go func() { <-ctx.Done(); ts[0].(*syncTransport).l.wake() }()
				out := make([][]byte, n)
				errs := group(ts, Config{SliceBytes: 64, Channels: 2}, func(c *Communicator) error {
					vals := make([]float64, count)
					for i := range vals {
						vals[i] = intValue(c.Rank(), i)
					}
					buf := makeBuf(v.dt, vals)
					o := []CallOption{WithAlgorithm(a)}
					if v.wire != v.dt {
						o = append(o, WithWire(v.wire))
					}
					err := c.Allreduce(ctx, nil, buf, v.dt, Sum, o...)
					out[c.Rank()] = buf
					return err
				})
				cancel()
				if err := firstErr(errs); err != nil {
					t.Fatalf("%v n=%d %v: %v", a, n, v, err)
				}
				ranktest.CloseAll(ts)
				if !intSumsMatch(out[0], v.dt, n, func(int) bool { return false }) {
					t.Errorf("%v n=%d %v: wrong sums", a, n, v)
				}
			}
		}
	}
}
