//go:build linux

package rank

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"regexp"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/rank/internal/waitctx"
)

// Shared memory between ranks of one host (see docs/shm.md).
//
// Every pair of ranks on the same host shares one segment: a file under
// /dev/shm that the lower rank creates (mode 0600, a name with 128 random
// bits that only travels over the authenticated control stream), the higher
// rank maps and unlinks at once, and the lower rank unlinks again (a no-op
// normally) when the higher rank answers. Nothing stays in /dev/shm after the
// handshake, whatever happens to the processes later: the memory lives only as
// long as a mapping of it does.
//
// The segment holds, for every channel and direction, a single-producer
// single-consumer byte ring. Messages are framed as on a socket lane (the
// 24-byte header, then the payload) and streamed through the ring, so a
// message may be larger than the ring. Head and tail are free-running byte
// counters on their own cache lines, updated with sync/atomic on the mapped
// memory; the producer copies, then publishes the tail; the consumer reads
// the tail, copies, then publishes the head.
//
// Waiting has no futex: a waiter spins on the counters a few hundred times,
// then yields (runtime.Gosched and sched_yield, so that a peer process on the
// same core can run), then sleeps with a growing nanosleep, then time.Sleep.
// The peer's liveness is checked while waiting through a pidfd (the process
// exiting, kill -9 included, makes it readable) and through the closed flag a
// peer sets in the segment when it closes its mesh. The QUIC (or TCP)
// connection to the peer stays open beside the segment as the mesh's
// control path.

const (
	shmMagic      = 0x31304d4853524700 // "\x00GRSHM01"
	shmVersion    = 1
	shmHelloMagic = 0x47525348 // "GRSH": the handshake frame on channel 0
	shmPage       = 4096
	shmCtrlBytes  = 128 // one ring's counters: tail at 0, head at 64
	// shmRingBytes is the capacity of one ring (one channel, one direction).
	shmRingBytes = 1 << 20
	// shmChunk bounds one copy before it is published, so that the consumer
	// starts copying out while the producer still copies in.
	shmChunk = 128 << 10

	shmSpins     = 300 // busy re-checks before yielding
	shmYields    = 200 // Gosched/sched_yield rounds before sleeping
	shmNapMin    = 10 * time.Microsecond
	shmNapMax    = 500 * time.Microsecond
	shmNapFor    = 20 * time.Millisecond // then time.Sleep(shmSleep)
	shmSleep     = time.Millisecond
	shmLiveCheck = 20 * time.Millisecond
	shmOffClosed = 64  // u32: lower rank closed; 128: higher rank closed
	shmOffPidLo  = 192 // u64 pids, informational
	shmOffCMA    = 256 // u32 at 256: the higher rank reads the lower's memory; 320: the reverse

	// Messages of at least shmCMAMin bytes travel in one copy when the
	// receiver may read the sender's memory (process_vm_readv, Linux cross
	// memory attach, as MPI's vader does): the ring carries only the header
	// and the payload's address, the receiver copies straight into its
	// buffer and acknowledges, and the Send returns. It is off unless
	// Options.SingleCopy (GORUN_SHM_CMA=1): on this 2-core machine the two-copy ring, whose two
	// copies run in parallel on both cores, moved more (docs/shm.md).
	shmCMAMin   = 64 << 10
	shmCMAMagic = 0x434d4147 // "GAMC": a frame header whose payload stays with the sender
)

// shmProbe is what a peer reads from this process's memory at the
// handshake to learn whether it may use process_vm_readv on us.
var shmProbe = [16]byte{'g', 'o', 'r', 'u', 'n', ' ', 'c', 'm', 'a', ' ', 'p', 'r', 'o', 'b', 'e', '!'}

var (
	errShmPeerClosed = errors.New("peer closed its mesh")
	shmNameRE        = regexp.MustCompile(`^gorun-[A-Za-z0-9]{1,32}-[0-9]+-[0-9]+-[0-9a-f]{32}$`)
)

// shmRing is one direction of one channel.
type shmRing struct {
	mu   sync.Mutex // one Send (or one Recv) at a time; guards gone
	gone bool       // the segment is unmapped
	tail *atomic.Uint64
	head *atomic.Uint64
	ack  *atomic.Uint64 // single-copy messages the consumer finished (written by it)
	ackc *atomic.Uint32 // 0: it read the sender's memory; 1: it could not, send through the ring
	// claim decides who owns a posted single-copy message: the receiver
	// (0 -> 1, before it reads) or a sender that gives up (0 -> 2).
	claim *atomic.Uint32
	buf   []byte
	mask  uint64
	hdr   [headerBytes]byte
}

// shmPeer is the segment shared with one peer.
type shmPeer struct {
	self, peer int
	host       string
	seg        []byte
	tx, rx     []*shmRing
	myClosed   *atomic.Uint32
	peerClosed *atomic.Uint32
	peerReads  *atomic.Uint32 // the peer may read this process's memory
	iReads     *atomic.Uint32 // this process may read the peer's
	closing    atomic.Bool
	pid        int
	pidfd      int // -1 without pidfd_open: kill(pid, 0) then
	dead       atomic.Bool
	timeout    time.Duration
	count      *peerCounters
	mesh       *Mesh
}

func shmLayout(channels int) (dataOff, size int) {
	rings := 2 * channels
	dataOff = (shmPage + rings*shmCtrlBytes + shmPage - 1) / shmPage * shmPage
	return dataOff, dataOff + rings*shmRingBytes
}

func u64At(seg []byte, off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&seg[off]))
}

func u32At(seg []byte, off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&seg[off]))
}

// newShmPeer builds the view of a mapped segment. lower says whether this
// rank is the pair's lower rank (it sends on direction 0).
func newShmPeer(seg []byte, self, peer, channels int, lower bool) *shmPeer {
	sp := &shmPeer{self: self, peer: peer, seg: seg, pidfd: -1}
	dataOff, _ := shmLayout(channels)
	if lower {
		sp.myClosed, sp.peerClosed = u32At(seg, shmOffClosed), u32At(seg, 2*shmOffClosed)
		sp.peerReads, sp.iReads = u32At(seg, shmOffCMA), u32At(seg, shmOffCMA+64)
	} else {
		sp.myClosed, sp.peerClosed = u32At(seg, 2*shmOffClosed), u32At(seg, shmOffClosed)
		sp.peerReads, sp.iReads = u32At(seg, shmOffCMA+64), u32At(seg, shmOffCMA)
	}
	ring := func(i int) *shmRing {
		ctrl := shmPage + i*shmCtrlBytes
		off := dataOff + i*shmRingBytes
		return &shmRing{
			tail: u64At(seg, ctrl), head: u64At(seg, ctrl+64),
			ack: u64At(seg, ctrl+72), ackc: u32At(seg, ctrl+80), claim: u32At(seg, ctrl+84),
			buf: seg[off : off+shmRingBytes : off+shmRingBytes], mask: shmRingBytes - 1,
		}
	}
	for ch := 0; ch < channels; ch++ {
		lohi, hilo := ring(2*ch), ring(2*ch+1)
		if lower {
			sp.tx, sp.rx = append(sp.tx, lohi), append(sp.rx, hilo)
		} else {
			sp.tx, sp.rx = append(sp.tx, hilo), append(sp.rx, lohi)
		}
	}
	return sp
}

func (m *Mesh) closeShm() {
	for p := range m.links {
		if sp := m.shmPeer(p); sp != nil {
			sp.close()
		}
	}
}

// close tells the peer, stops this side's waiters, and unmaps the segment.
// What this side sent stays readable by the peer: its own mapping keeps the
// memory.
func (sp *shmPeer) close() {
	if sp.closing.Swap(true) {
		return
	}
	sp.myClosed.Store(1)
	for _, rs := range [][]*shmRing{sp.tx, sp.rx} {
		for _, r := range rs {
			r.mu.Lock()
			r.gone = true
		}
	}
	unix.Munmap(sp.seg)
	for _, rs := range [][]*shmRing{sp.tx, sp.rx} {
		for _, r := range rs {
			r.mu.Unlock()
		}
	}
	if sp.pidfd >= 0 {
		unix.Close(sp.pidfd)
	}
}

// alive reports whether the peer process still runs.
func (sp *shmPeer) alive() bool {
	if sp.dead.Load() {
		return false
	}
	var gone bool
	if sp.pidfd >= 0 {
		fds := []unix.PollFd{{Fd: int32(sp.pidfd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		gone = err == nil && n > 0
	} else {
		gone = unix.Kill(sp.pid, 0) == unix.ESRCH
	}
	if gone {
		sp.dead.Store(true)
	}
	return !gone
}

// shmWait paces one Send or Recv while the ring is full or empty.
type shmWait struct {
	sp        *shmPeer
	ctx       context.Context
	n         int
	nap       time.Duration
	start     time.Time // of the wait without progress
	nextLive  time.Time
	timeout   time.Duration
	nextJudge time.Time
	stall     error // what ended the wait (errShmStall)
	gone      error // the peer closed or died: the next pause fails with it
}

// progress resets the backoff after bytes moved.
func (w *shmWait) progress() { w.n = 0 }

// pause waits a little; it fails when the wait must end.
func (w *shmWait) pause() error {
	sp := w.sp
	if sp.closing.Load() {
		return errClosed
	}
	// A peer that closed its mesh or died may have written (an abort, say)
	// just before: the caller looks at the ring once more before this
	// wait fails.
	if w.gone != nil {
		return w.gone
	}
	if sp.peerClosed.Load() != 0 {
		w.gone = errShmPeerClosed
		return nil
	}
	w.n++
	if w.n <= shmSpins {
		return nil
	}
	if w.n == shmSpins+1 {
		w.start = time.Now()
		w.nextLive = w.start.Add(shmLiveCheck)
		w.nap = shmNapMin
		if w.timeout == 0 {
			w.timeout = waitctx.From(w.ctx, sp.timeout)
		}
		w.nextJudge = w.start.Add(w.timeout)
	}
	select {
	case <-w.ctx.Done():
		return w.ctx.Err()
	default:
	}
	if w.n <= shmSpins+shmYields {
		if w.n&1 == 0 {
			runtime.Gosched()
		} else {
			unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
		}
		if w.n&31 != 0 {
			return nil
		}
	} else if waited := time.Since(w.start); waited < shmNapFor {
		ts := unix.NsecToTimespec(int64(w.nap))
		unix.Nanosleep(&ts, nil)
		w.nap = min(2*w.nap, shmNapMax)
	} else {
		time.Sleep(shmSleep)
	}
	now := time.Now()
	if now.After(w.nextLive) {
		w.nextLive = now.Add(shmLiveCheck)
		if !sp.alive() {
			w.gone = errShmPeerDied
			return nil
		}
	}
	if now.After(w.nextJudge) {
		// No progress for the timeout: a stopped peer is named now, a live
		// one gets longer (stall.go).
		next, err := sp.mesh.judge(sp.peer, now.Sub(w.start), w.timeout)
		if err != nil {
			w.stall = err
			return errShmStall
		}
		w.nextJudge = now.Add(next)
	}
	return nil
}

var (
	errShmStall    = errors.New("no progress")
	errShmPeerDied = errors.New("peer process died")
)

func (sp *shmPeer) fail(w *shmWait, op string, ch int, tag Tag, err error) error {
	var waited time.Duration
	switch {
	case w.ctx.Err() != nil:
		err = w.ctx.Err()
	case err == errClosed:
	case err == errShmStall:
		waited = w.stall.(*stallError).waited
		err = fmt.Errorf("%w (shared-memory channel %d, %v)", w.stall, ch, tag)
	case err == errShmPeerDied:
		err = fmt.Errorf("rank %d (pid %d) died (shared-memory channel %d, %v)", sp.peer, sp.pid, ch, tag)
	case err == errShmPeerClosed:
		err = fmt.Errorf("rank %d closed the connection (shared-memory channel %d, %v)", sp.peer, ch, tag)
	default:
		err = fmt.Errorf("%w (shared-memory channel %d, %v)", err, ch, tag)
	}
	return &PeerError{Self: sp.self, Peer: sp.peer, Host: sp.host, Op: op, Err: err, Waited: waited}
}

// put copies b into the ring from position *t, waiting for room; it
// publishes the tail after every chunk when publish is set, else leaves that
// to the caller.
func (r *shmRing) put(w *shmWait, t *uint64, b []byte, publish bool) error {
	size := uint64(len(r.buf))
	for len(b) > 0 {
		free := size - (*t - r.head.Load())
		if free == 0 {
			r.tail.Store(*t) // let the consumer drain what is written
			if err := w.pause(); err != nil {
				return err
			}
			continue
		}
		w.progress()
		n := min(free, uint64(len(b)), shmChunk)
		off := *t & r.mask
		k := copy(r.buf[off:], b[:n])
		copy(r.buf, b[k:n])
		*t += n
		b = b[n:]
		if publish {
			r.tail.Store(*t)
		}
	}
	return nil
}

// get copies the next len(b) bytes out of the ring (drops them if b is nil
// and skip > 0), waiting for data.
func (r *shmRing) get(w *shmWait, b []byte, skip int) error {
	h := r.head.Load()
	want := uint64(len(b))
	if b == nil {
		want = uint64(skip)
	}
	for want > 0 {
		avail := r.tail.Load() - h
		if avail == 0 {
			if err := w.pause(); err != nil {
				// A peer that closed after sending still delivers.
				if err == errShmPeerClosed && r.tail.Load() != h {
					continue
				}
				return err
			}
			continue
		}
		w.progress()
		n := min(avail, want, shmChunk)
		if b != nil {
			off := h & r.mask
			k := copy(b[:n], r.buf[off:])
			copy(b[k:n], r.buf)
			b = b[n:]
		}
		h += n
		want -= n
		r.head.Store(h)
	}
	return nil
}

// send implements link: a message goes into the ring at once (more has
// nothing to gather).
func (sp *shmPeer) send(ctx context.Context, ch int, tag Tag, payload []byte, more bool) error {
	r := sp.tx[ch]
	r.mu.Lock()
	defer r.mu.Unlock()
	w := shmWait{sp: sp, ctx: ctx}
	if r.gone {
		return sp.fail(&w, "send", ch, tag, errClosed)
	}
	if sp.peerClosed.Load() != 0 {
		return sp.fail(&w, "send", ch, tag, errShmPeerClosed)
	}
	putHeader(r.hdr[:], tag, len(payload))
	if len(payload) >= shmCMAMin && sp.peerReads.Load() != 0 {
		return sp.sendByAddress(r, &w, ch, tag, payload)
	}
	t := r.tail.Load()
	// The header is published together with the first chunk of payload.
	if err := r.put(&w, &t, r.hdr[:], false); err != nil {
		return sp.fail(&w, "send", ch, tag, err)
	}
	if err := r.put(&w, &t, payload, true); err != nil {
		return sp.fail(&w, "send", ch, tag, err)
	}
	r.tail.Store(t)
	sp.count.sent.Add(uint64(headerBytes + len(payload)))
	return nil
}

// sendByAddress posts the header and the payload's address, and waits until
// the receiver has copied the payload out of this process's memory. The
// payload is Go heap (or foreign) memory, which does not move; it stays
// alive and unchanged while the Send blocks.
func (sp *shmPeer) sendByAddress(r *shmRing, w *shmWait, ch int, tag Tag, payload []byte) error {
	binary.LittleEndian.PutUint32(r.hdr[0:], shmCMAMagic)
	var addr [8]byte
	binary.LittleEndian.PutUint64(addr[:], uint64(uintptr(unsafe.Pointer(&payload[0]))))
	want := r.ack.Load() + 1
	r.claim.Store(0)
	t := r.tail.Load()
	if err := r.put(w, &t, r.hdr[:], false); err != nil {
		return sp.fail(w, "send", ch, tag, err)
	}
	if err := r.put(w, &t, addr[:], true); err != nil {
		return sp.fail(w, "send", ch, tag, err)
	}
	for r.ack.Load() != want {
		err := w.pause()
		if err == nil {
			continue
		}
		// Giving up (cancelled, timed out, peer gone): retract the message
		// so that the receiver never reads memory we no longer own. If it
		// is copying already, the copy is short: wait for it.
		if r.claim.CompareAndSwap(0, 2) || sp.dead.Load() || sp.closing.Load() {
			return sp.fail(w, "send", ch, tag, err)
		}
		w2 := shmWait{sp: sp, ctx: context.Background()}
		for r.ack.Load() != want {
			if err2 := w2.pause(); err2 != nil {
				return sp.fail(w, "send", ch, tag, err)
			}
		}
		break
	}
	runtime.KeepAlive(payload)
	if r.ackc.Load() != 0 {
		// The receiver could not read our memory after all: stream it.
		sp.peerReads.Store(0)
		w.progress()
		if err := r.put(w, &t, payload, true); err != nil {
			return sp.fail(w, "send", ch, tag, err)
		}
	}
	sp.count.sent.Add(uint64(headerBytes + len(payload)))
	return nil
}

// readAddress copies a single-copy payload from the sender's memory.
func (sp *shmPeer) readAddress(addr uint64, dst []byte) error {
	for len(dst) > 0 {
		n, err := unix.ProcessVMReadv(sp.pid, []unix.Iovec{{Base: &dst[0], Len: uint64(len(dst))}},
			[]unix.RemoteIovec{{Base: uintptr(addr), Len: len(dst)}}, 0)
		if err != nil {
			return err
		}
		if n <= 0 {
			return io.ErrUnexpectedEOF
		}
		dst, addr = dst[n:], addr+uint64(n)
	}
	return nil
}

// recv implements link.
func (sp *shmPeer) recv(ctx context.Context, ch int, want Tag, dst []byte) error {
	r := sp.rx[ch]
	r.mu.Lock()
	defer r.mu.Unlock()
	w := shmWait{sp: sp, ctx: ctx}
	if r.gone {
		return sp.fail(&w, "recv", ch, want, errClosed)
	}
	if err := r.get(&w, r.hdr[:], 0); err != nil {
		return sp.fail(&w, "recv", ch, want, err)
	}
	magic := binary.LittleEndian.Uint32(r.hdr[0:])
	if magic != frameMagic && magic != shmCMAMagic {
		return &PeerError{Self: sp.self, Peer: sp.peer, Host: sp.host, Op: "recv",
			Err: fmt.Errorf("garbage on shared-memory channel %d (bad frame header %08x): the ring is out of step", ch, magic)}
	}
	got, n := parseHeader(r.hdr[:])
	if magic == shmCMAMagic {
		var a [8]byte
		if err := r.get(&w, a[:], 0); err != nil {
			return sp.fail(&w, "recv", ch, want, err)
		}
		sp.count.recv.Add(uint64(headerBytes + n))
		if !r.claim.CompareAndSwap(0, 1) {
			return &PeerError{Self: sp.self, Peer: sp.peer, Host: sp.host, Op: "recv",
				Err: fmt.Errorf("rank %d gave up sending this message (shared-memory channel %d, %v)", sp.peer, ch, got)}
		}
		if got != want || n != len(dst) {
			r.ackc.Store(0)
			r.ack.Add(1)
			return &MismatchError{Self: sp.self, Peer: sp.peer, Channel: ch, Want: want, Got: got, WantLen: len(dst), GotLen: n}
		}
		err := sp.readAddress(binary.LittleEndian.Uint64(a[:]), dst)
		if err == nil {
			r.ackc.Store(0)
			r.ack.Add(1)
			return nil
		}
		if errors.Is(err, unix.ESRCH) {
			sp.dead.Store(true)
			return sp.fail(&w, "recv", ch, want, errShmPeerDied)
		}
		// Not allowed after all (or the sender's memory changed under
		// us): ask for the payload through the ring.
		r.ackc.Store(1)
		r.ack.Add(1)
		if err := r.get(&w, dst, 0); err != nil {
			return sp.fail(&w, "recv", ch, want, err)
		}
		return nil
	}
	if got != want || n != len(dst) {
		if n > 0 {
			if err := r.get(&w, nil, n); err != nil {
				return sp.fail(&w, "recv", ch, want, err)
			}
		}
		sp.count.recv.Add(uint64(headerBytes + n))
		return &MismatchError{Self: sp.self, Peer: sp.peer, Channel: ch, Want: want, Got: got, WantLen: len(dst), GotLen: n}
	}
	if n > 0 {
		if err := r.get(&w, dst, 0); err != nil {
			return sp.fail(&w, "recv", ch, want, err)
		}
	}
	sp.count.recv.Add(uint64(headerBytes + n))
	return nil
}
