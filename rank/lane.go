package rank

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/gorun/gorun/rank/internal/waitctx"
)

// Socket lanes: one ordered duplex byte stream per peer and channel (a
// QUIC stream, or a TLS/TCP connection whose records sealed.go seals),
// messages framed with a 24-byte header, and the deadlines of each Send
// or Recv on one (laneWait; stall.go judges a wait without progress).

// frame header: magic, seq, kind, aux, chunk, length.
const (
	frameMagic  = 0x4752554e // "GRUN"
	headerBytes = 24
	helloMagic  = 0x47524c4f // "GRLO"
	maxFrame    = 1 << 31
)

// link carries the messages to one peer: the socket lanes of the
// transport that carries the data (sockets), or the shared-memory segment
// shared with it (*shmPeer, shm.go). Mesh.Send and Recv look up the
// peer's link and call it.
type link interface {
	// send writes one framed message on channel ch; with more, a lane
	// that gathers writes (sealedConn) may hold it for the next.
	send(ctx context.Context, ch int, tag Tag, payload []byte, more bool) error
	// recv reads the next message on channel ch into dst.
	recv(ctx context.Context, ch int, want Tag, dst []byte) error
}

// sockets is a peer's link over socket lanes: those of the transport that
// carries the data (Mesh.lanes, which auto's choice sets).
type sockets struct {
	m    *Mesh
	peer int
}

func (s sockets) send(ctx context.Context, ch int, tag Tag, payload []byte, more bool) error {
	return s.m.sendOn(ctx, s.m.lanes[s.peer][ch], s.peer, ch, tag, payload, more)
}

func (s sockets) recv(ctx context.Context, ch int, want Tag, dst []byte) error {
	return s.m.recvOn(ctx, s.m.lanes[s.peer][ch], s.peer, ch, want, dst)
}

// laneConn is one ordered duplex byte stream to a peer (a QUIC stream or a
// TLS-over-TCP connection).
type laneConn interface {
	io.Reader
	io.Writer
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
	Close() error
}

type lane struct {
	c    laneConn
	rmu  sync.Mutex
	wmu  sync.Mutex
	dmu  sync.Mutex   // orders deadline changes: a wait's extension, a cancelled context's and Close's cut
	rw   laneWait     // the Recv in progress (under rmu)
	ww   laneWait     // the Send in progress (under wmu)
	cut  [2]laneCut   // [write]: the cut armed on the latest wait's context (under dmu)
	dl   [2]time.Time // [write]: the deadline last set (under dmu)
	rh   [headerBytes]byte
	wh   [headerBytes]byte
	wbuf []byte // header and a small payload, written at once
}

// laneCut cuts one direction's wait short when its context is done. It
// is armed once per context (context.AfterFunc), not once per wait: a
// collective's call sends and receives all its messages under one, and
// arming and disarming for each message was 2-3 % of a rank's CPU at 1
// MiB, np 2 (docs/performance.md). It stays armed after the wait, until
// a wait under another context replaces it; when its context ends
// between waits it cuts nothing.
type laneCut struct {
	done <-chan struct{} // the context's Done: contexts that share it end together
	stop func() bool
	busy bool // a wait under it is in progress
}

// coalesceBytes is the largest payload that Send copies behind its header
// into one write: one QUIC packet or TLS record, and one wake-up of the
// connection's sender, instead of two for the header and the payload.
// Larger payloads are written from the caller's buffer, where a separate
// 24-byte header costs nothing measurable.
const coalesceBytes = 16 << 10

// laneWait runs the deadlines of one Send or Recv on a socket lane: while
// bytes move the deadline moves with them; when none have moved for the
// timeout, judge (stall.go) decides whether the wait goes on.
type laneWait struct {
	m       *Mesh
	l       *lane
	ctx     context.Context
	peer    int
	write   bool
	timeout time.Duration
	last    time.Time // the last progress (or the start)
	cut     *laneCut
}

// startWait begins a Send's or Recv's wait on l; w.end ends it.
func (m *Mesh) startWait(ctx context.Context, l *lane, peer int, write bool) *laneWait {
	w, c := &l.rw, &l.cut[side(write)]
	if write {
		w = &l.ww
	}
	*w = laneWait{m: m, l: l, ctx: ctx, peer: peer, write: write, timeout: waitctx.From(ctx, m.opt.Timeout), last: time.Now(), cut: c}
	done := ctx.Done()
	l.dmu.Lock()
	if c.done != done {
		if c.stop != nil {
			c.stop()
		}
		*c = laneCut{done: done}
		if done != nil {
			c.stop = context.AfterFunc(ctx, func() {
				l.dmu.Lock()
				if c.done == done && c.busy { // a wait under this context, not another's
					setDeadline(l, write, time.Unix(1, 0))
				}
				l.dmu.Unlock()
			})
		}
	}
	c.busy = true
	l.dmu.Unlock()
	w.extend(w.last.Add(w.timeout), true)
	return w
}

// end ends the wait: a cut for its context no longer touches the lane.
func (w *laneWait) end() {
	w.l.dmu.Lock()
	w.cut.busy = false
	w.l.dmu.Unlock()
}

// side indexes a lane's per-direction state: 0 receiving, 1 sending.
func side(write bool) int {
	if write {
		return 1
	}
	return 0
}

// setDeadline sets a direction's deadline; the caller holds l.dmu.
func setDeadline(l *lane, write bool, t time.Time) {
	l.dl[side(write)] = t
	if write {
		l.c.SetWriteDeadline(t)
	} else {
		l.c.SetReadDeadline(t)
	}
}

// extend sets the deadline to t, unless the context is done or the mesh
// closed (whose cut it must not undo); it reports whether it did. With
// keep (a wait's start), a deadline an earlier wait set at most a
// sixteenth of the timeout before t stays: when it passes, expired
// extends it (without keep). Setting it for every message cost about 1 %
// of a rank's CPU at 1 MiB.
func (w *laneWait) extend(t time.Time, keep bool) bool {
	w.l.dmu.Lock()
	defer w.l.dmu.Unlock()
	ok := w.ctx.Err() == nil
	select {
	case <-w.m.closed:
		ok = false
	default:
	}
	if !ok {
		t = time.Unix(1, 0)
	}
	d := w.l.dl[side(w.write)]
	if keep && ok && !d.After(t) && t.Sub(d) < w.timeout/16 {
		return true
	}
	setDeadline(w.l, w.write, t)
	return ok
}

// expired handles err from a Read or Write: nil if the wait goes on.
func (w *laneWait) expired(err error) error {
	if !errors.Is(err, os.ErrDeadlineExceeded) || w.ctx.Err() != nil {
		return err
	}
	idle := time.Since(w.last)
	next, serr := w.m.judge(w.peer, idle, w.timeout)
	if serr != nil {
		return serr
	}
	if !w.extend(time.Now().Add(next), false) {
		return err
	}
	return nil
}

func (w *laneWait) readFull(b []byte) error { return w.whole(b, w.l.c.Read) }

func (w *laneWait) writeAll(b []byte) error { return w.whole(b, w.l.c.Write) }

// whole reads or writes all of b, each byte moved extending the wait.
func (w *laneWait) whole(b []byte, move func([]byte) (int, error)) error {
	for len(b) > 0 {
		n, err := move(b)
		if n > 0 {
			b = b[n:]
			w.last = time.Now()
		}
		if err != nil && len(b) > 0 {
			if err = w.expired(err); err != nil {
				return err
			}
		}
	}
	return nil
}

// flusher is a lane connection that gathers writes until Flush
// (sealedConn).
type flusher interface {
	Flush() (bool, error)
}

// flush is writeAll for what a gathering lane holds.
func (w *laneWait) flush(f flusher) error {
	for {
		moved, err := f.Flush()
		if moved {
			w.last = time.Now()
		}
		if err == nil {
			return nil
		}
		if err = w.expired(err); err != nil {
			return err
		}
	}
}

// discard reads and drops n bytes.
func (w *laneWait) discard(n int) error {
	buf := make([]byte, min(n, 64<<10))
	for n > 0 {
		k := min(n, len(buf))
		if err := w.readFull(buf[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

func (m *Mesh) ioError(ctx context.Context, op string, peer, ch int, tag Tag, err error, w *laneWait) error {
	pe := &PeerError{Self: m.id.Rank, Peer: peer, Host: m.names[peer], Op: op}
	closed := false
	select {
	case <-m.closed:
		closed = true
	default:
	}
	var se *stallError
	var it *quic.IdleTimeoutError
	switch {
	case ctx.Err() != nil:
		err = ctx.Err()
	case errors.As(err, &se):
		pe.Waited = se.waited
		err = fmt.Errorf("%w (channel %d, %v)", se, ch, tag)
	case closed:
		err = errClosed
	case errors.As(err, &it):
		// The connection itself gave up: nothing came from the peer, not
		// even an answer to a keep-alive, for the QUIC idle timeout.
		pe.Waited = time.Since(w.last)
		err = &stallError{waited: pe.Waited, msg: fmt.Sprintf("waited %s (timeout %s): rank %d sent nothing for %s, not even keep-alives, and the QUIC connection timed out (stopped, dead or cut off; channel %d, %v)",
			round(pe.Waited), w.timeout, peer, quicIdleTimeout(m.opt.Timeout), ch, tag)}
	case errors.Is(err, os.ErrDeadlineExceeded):
		pe.Waited = time.Since(w.last)
		err = fmt.Errorf("%w (channel %d, %v)", unknownStall(pe.Waited, w.timeout), ch, tag)
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		err = fmt.Errorf("rank %d closed the connection (channel %d, %v)", peer, ch, tag)
	default:
		// Not wrapped: a socket's own timeout (ETIMEDOUT, "connection timed
		// out") is a lost peer, not a stall, and collective's blame would
		// read a wrapped net.Error with Timeout() as a stall.
		err = fmt.Errorf("%v (channel %d, %v)", err, ch, tag)
	}
	pe.Err = err
	return pe
}

// sendOn writes one framed message on the socket lane l to peer; with
// more, what the lane gathers (sealedConn) is left for the next.
func (m *Mesh) sendOn(ctx context.Context, l *lane, peer, ch int, tag Tag, payload []byte, more bool) (err error) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	putHeader(l.wh[:], tag, len(payload))
	w := m.startWait(ctx, l, peer, true)
	defer w.end()
	if len(payload) <= coalesceBytes {
		l.wbuf = append(append(l.wbuf[:0], l.wh[:]...), payload...)
		err = w.writeAll(l.wbuf)
	} else if err = w.writeAll(l.wh[:]); err == nil {
		err = w.writeAll(payload)
	}
	if f, ok := l.c.(flusher); ok && err == nil && !more {
		err = w.flush(f)
	}
	if err != nil {
		return m.ioError(ctx, "send", peer, ch, tag, err, w)
	}
	m.count[peer].sent.Add(uint64(headerBytes + len(payload)))
	return nil
}

// recvOn reads one framed message from the socket lane l of peer.
func (m *Mesh) recvOn(ctx context.Context, l *lane, peer, ch int, want Tag, dst []byte) error {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	w := m.startWait(ctx, l, peer, false)
	defer w.end()
	if err := w.readFull(l.rh[:]); err != nil {
		return m.ioError(ctx, "recv", peer, ch, want, err, w)
	}
	magic := binary.LittleEndian.Uint32(l.rh[0:])
	if magic != frameMagic {
		return &PeerError{Self: m.id.Rank, Peer: peer, Host: m.names[peer], Op: "recv",
			Err: fmt.Errorf("garbage on channel %d (bad frame header %08x): the stream is out of step", ch, magic)}
	}
	got, n := parseHeader(l.rh[:])
	if got != want || n != len(dst) {
		// Consume the payload so the lane stays framed, then report.
		if err := w.discard(n); err != nil {
			return m.ioError(ctx, "recv", peer, ch, want, err, w)
		}
		m.count[peer].recv.Add(uint64(headerBytes + n))
		return &MismatchError{Self: m.id.Rank, Peer: peer, Channel: ch, Want: want, Got: got, WantLen: len(dst), GotLen: n}
	}
	if n > 0 {
		if err := w.readFull(dst); err != nil {
			return m.ioError(ctx, "recv", peer, ch, want, err, w)
		}
	}
	m.count[peer].recv.Add(uint64(headerBytes + n))
	return nil
}

func putHeader(b []byte, t Tag, n int) {
	binary.LittleEndian.PutUint32(b[0:], frameMagic)
	binary.LittleEndian.PutUint64(b[4:], t.Seq)
	binary.LittleEndian.PutUint16(b[12:], t.Kind)
	binary.LittleEndian.PutUint16(b[14:], t.Aux)
	binary.LittleEndian.PutUint32(b[16:], t.Chunk)
	binary.LittleEndian.PutUint32(b[20:], uint32(n))
}

func parseHeader(b []byte) (Tag, int) {
	return Tag{
		Seq:   binary.LittleEndian.Uint64(b[4:]),
		Kind:  binary.LittleEndian.Uint16(b[12:]),
		Aux:   binary.LittleEndian.Uint16(b[14:]),
		Chunk: binary.LittleEndian.Uint32(b[16:]),
	}, int(binary.LittleEndian.Uint32(b[20:]))
}
