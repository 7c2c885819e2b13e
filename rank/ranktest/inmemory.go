// Package ranktest holds transports for tests and benchmarks: ranks of one
// process that exchange messages through memory (InMemory) or over real
// sockets on 127.0.0.1 (Loopback), and CloseAll. The product never uses
// them.
package ranktest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorun/gorun/rank"
	"github.com/gorun/gorun/rank/internal/waitctx"
)

// localDepth is how many messages a lane of an in-memory group buffers before
// Send blocks (real transports block on flow control in the same way).
const localDepth = 16

type localMsg struct {
	tag rank.Tag
	buf []byte
}

type localGroup struct {
	n, channels int
	// lanes[src][dst][ch]
	lanes  [][][]chan localMsg
	closed []chan struct{}
	once   []sync.Once
	sent   [][]atomic.Uint64 // [src][dst]
	recv   [][]atomic.Uint64 // [dst][src]
}

// localTransport is one rank of an in-memory group.
type localTransport struct {
	g    *localGroup
	rank int
}

// InMemory returns n transports that exchange messages through memory
// inside this process, for algorithm tests: the same contract as a
// rank.Mesh (tag and length checked on every Recv, ctx honoured, Close of
// one rank makes its peers' blocked and later calls fail with a
// *rank.PeerError) without sockets. Waits have no timeout but the one
// rank.WithTimeout gives, and they end at it (the liveness of a peer in
// the same process is not known). A message is copied on Send, so the
// sender may reuse its buffer at once.
func InMemory(n, channels int) []rank.Transport {
	if n < 1 || channels < 1 {
		panic(fmt.Sprintf("ranktest: InMemory(%d, %d)", n, channels))
	}
	g := &localGroup{n: n, channels: channels, closed: make([]chan struct{}, n), once: make([]sync.Once, n)}
	g.lanes = make([][][]chan localMsg, n)
	g.sent = make([][]atomic.Uint64, n)
	g.recv = make([][]atomic.Uint64, n)
	for s := range g.lanes {
		g.closed[s] = make(chan struct{})
		g.sent[s] = make([]atomic.Uint64, n)
		g.recv[s] = make([]atomic.Uint64, n)
		g.lanes[s] = make([][]chan localMsg, n)
		for d := range g.lanes[s] {
			if d == s {
				continue
			}
			g.lanes[s][d] = make([]chan localMsg, channels)
			for c := range g.lanes[s][d] {
				g.lanes[s][d][c] = make(chan localMsg, localDepth)
			}
		}
	}
	ts := make([]rank.Transport, n)
	for r := range ts {
		ts[r] = &localTransport{g: g, rank: r}
	}
	return ts
}

var (
	errPeerClosed = errors.New("peer closed its transport")
	errClosed     = errors.New("mesh closed") // as a closed rank.Mesh says
)

func (t *localTransport) Rank() int     { return t.rank }
func (t *localTransport) Size() int     { return t.g.n }
func (t *localTransport) Channels() int { return t.g.channels }

func (t *localTransport) check(peer, ch int, op string) error {
	if peer < 0 || peer >= t.g.n || peer == t.rank {
		return fmt.Errorf("rank %d: %s: invalid peer %d (job size %d)", t.rank, op, peer, t.g.n)
	}
	if ch < 0 || ch >= t.g.channels {
		return fmt.Errorf("rank %d: %s: invalid channel %d (have %d)", t.rank, op, ch, t.g.channels)
	}
	select {
	case <-t.g.closed[t.rank]:
		return &rank.PeerError{Self: t.rank, Peer: peer, Op: op, Err: errClosed}
	default:
	}
	return nil
}

func (t *localTransport) fail(ctx context.Context, op string, peer, ch int, tag rank.Tag, err error) error {
	pe := &rank.PeerError{Self: t.rank, Peer: peer, Op: op}
	var se *stallError
	if ctx.Err() != nil {
		err = ctx.Err()
	} else if errors.As(err, &se) {
		pe.Waited = se.waited
	}
	pe.Err = fmt.Errorf("%w (channel %d, %v)", err, ch, tag)
	return pe
}

// stallError is a wait that reached its timeout, worded as a rank.Mesh
// words one whose peer's liveness it does not know.
type stallError struct{ waited time.Duration }

func (e *stallError) Error() string {
	return fmt.Sprintf("waited %s (timeout %s) with no progress", e.waited.Round(100*time.Millisecond), e.waited)
}

// waitTimer returns a channel that fires at the wait timeout ctx carries (nil:
// never) and the func that stops it.
func waitTimer(ctx context.Context) (<-chan time.Time, time.Duration, func() bool) {
	d := waitctx.From(ctx, 0)
	if d <= 0 {
		return nil, 0, func() bool { return false }
	}
	tm := time.NewTimer(d)
	return tm.C, d, tm.Stop
}

// Send implements Transport.
func (t *localTransport) Send(ctx context.Context, peer, ch int, tag rank.Tag, payload []byte) error {
	if err := t.check(peer, ch, "send"); err != nil {
		return err
	}
	m := localMsg{tag: tag, buf: append([]byte(nil), payload...)}
	select {
	case <-t.g.closed[peer]:
		return t.fail(ctx, "send", peer, ch, tag, errPeerClosed)
	default:
	}
	timeout, d, stop := waitTimer(ctx)
	defer stop()
	select {
	case t.g.lanes[t.rank][peer][ch] <- m:
		t.g.sent[t.rank][peer].Add(uint64(len(payload)))
		return nil
	case <-timeout:
		return t.fail(ctx, "send", peer, ch, tag, &stallError{waited: d})
	case <-ctx.Done():
		return t.fail(ctx, "send", peer, ch, tag, ctx.Err())
	case <-t.g.closed[t.rank]:
		return t.fail(ctx, "send", peer, ch, tag, errClosed)
	case <-t.g.closed[peer]:
		return t.fail(ctx, "send", peer, ch, tag, errPeerClosed)
	}
}

// Recv implements Transport.
func (t *localTransport) Recv(ctx context.Context, peer, ch int, want rank.Tag, dst []byte) error {
	if err := t.check(peer, ch, "recv"); err != nil {
		return err
	}
	q := t.g.lanes[peer][t.rank][ch]
	var m localMsg
	select {
	case m = <-q:
	default:
		timeout, d, stop := waitTimer(ctx)
		defer stop()
		select {
		case m = <-q:
		case <-timeout:
			return t.fail(ctx, "recv", peer, ch, want, &stallError{waited: d})
		case <-ctx.Done():
			return t.fail(ctx, "recv", peer, ch, want, ctx.Err())
		case <-t.g.closed[t.rank]:
			return t.fail(ctx, "recv", peer, ch, want, errClosed)
		case <-t.g.closed[peer]:
			// Deliver what the peer sent before it closed.
			select {
			case m = <-q:
			default:
				return t.fail(ctx, "recv", peer, ch, want, errPeerClosed)
			}
		}
	}
	t.g.recv[t.rank][peer].Add(uint64(len(m.buf)))
	if m.tag != want || len(m.buf) != len(dst) {
		return &rank.MismatchError{Self: t.rank, Peer: peer, Channel: ch, Want: want, Got: m.tag, WantLen: len(dst), GotLen: len(m.buf)}
	}
	copy(dst, m.buf)
	return nil
}

// Stats implements Transport (payload bytes only: there is no framing).
func (t *localTransport) Stats() []rank.PeerStats {
	s := make([]rank.PeerStats, t.g.n)
	for p := range s {
		s[p] = rank.PeerStats{BytesSent: t.g.sent[t.rank][p].Load(), BytesRecv: t.g.recv[t.rank][p].Load()}
	}
	return s
}

// Close implements Transport: this rank's blocked calls and its peers' calls
// with it fail with a *rank.PeerError.
func (t *localTransport) Close() error {
	t.g.once[t.rank].Do(func() { close(t.g.closed[t.rank]) })
	return nil
}
