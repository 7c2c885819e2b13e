package collective

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/rank"
)

// run is one collective call in progress on this rank: its goroutines,
// their first error, and a context cancelled by that error.
//
// Every run starts with a header: each rank sends the call's tag with its
// settings (see settings) to its ring successor on channel 0, as the first
// message of the call on that link, and receives its predecessor's. If
// any two ranks disagree about the call, some pair of ring neighbours
// does, and that pair's receiver reports it, even when the disagreement
// changes who talks to whom (a different root, algorithm or collective),
// which tag checks on the data messages alone would not always catch.
type run struct {
	t        rank.Transport
	c        call
	ctx      context.Context
	cancel   context.CancelFunc
	sctx     context.Context // for Sends: outlives a failure by sendGrace
	scancel  context.CancelFunc
	wg       sync.WaitGroup
	once     sync.Once
	err      error
	settings []byte
	next     int
	prev     int
	hdrSent  bool
	hdrRecvd bool
	mu       sync.Mutex
	scratch  [][]byte // from takeScratch, back to the pool when the run succeeds
}

// hdrChunk is the Chunk of a call's header message.
const hdrChunk = ^uint32(0)

func newRun(ctx context.Context, t rank.Transport, c call, settings []byte) *run {
	n, me := t.Size(), t.Rank()
	r := &run{t: t, c: c, settings: settings, next: (me + 1) % n, prev: (me + n - 1) % n}
	r.ctx, r.cancel = context.WithCancel(ctx)
	r.sctx, r.scancel = context.WithCancel(ctx)
	return r
}

// sendGrace is how long a message being sent when the run fails may take
// to finish. Cutting it off would leave the link with half a message, and
// the peer would blame this rank instead of reading the abort frame that
// follows it and learning who really failed.
const sendGrace = time.Second

func (r *run) hdrTag() rank.Tag {
	tg := r.c.tag(0)
	tg.Chunk = hdrChunk
	return tg
}

// sendHeader sends the call's header (the first message to next on
// channel 0).
func (r *run) sendHeader() error {
	return r.t.Send(r.sctx, r.next, 0, r.hdrTag(), r.settings)
}

// recvHeader receives prev's header and compares the settings.
func (r *run) recvHeader() error {
	got := make([]byte, len(r.settings))
	if err := r.t.Recv(r.ctx, r.prev, 0, r.hdrTag(), got); err != nil {
		return err
	}
	if string(got) != string(r.settings) {
		return &MismatchError{Rank: r.t.Rank(), Peer: r.prev, Mine: r.c.String(), Peers: r.c.String(), bits: dSize,
			What: fmt.Sprintf("settings (rank %d: %s; rank %d: %s; set GORUN_SLICE_BYTES, GORUN_RINGS, GORUN_HIERARCHICAL and the transport's channels the same on every rank)",
				r.t.Rank(), describeSettings(r.settings), r.prev, describeSettings(got))}
	}
	return nil
}

func (r *run) fail(err error) {
	r.once.Do(func() {
		r.err = explainMismatch(err)
		r.cancel()
		time.AfterFunc(sendGrace, r.scancel)
	})
}

func (r *run) goFn(f func() error) {
	r.wg.Add(1)
	spawn(func() {
		defer r.wg.Done()
		if err := f(); err != nil {
			r.fail(err)
		}
	})
}

// wait waits for every goroutine and returns the first error. It sends
// and receives the header if no sender or receiver of the algorithm did.
func (r *run) wait() error {
	if !r.hdrSent {
		r.hdrSent = true
		r.goFn(r.sendHeader)
	}
	if !r.hdrRecvd {
		r.hdrRecvd = true
		r.goFn(r.recvHeader)
	}
	r.wg.Wait()
	r.cancel()
	r.scancel()
	if r.err == nil {
		// Every goroutine is done and every transport call returned, so
		// nothing holds these any more. (After a failure they are left to
		// the garbage collector: a transport may still be writing into a
		// receive that its context cut short.)
		for _, b := range r.scratch {
			spare.put(b)
		}
	}
	r.scratch = nil
	return r.err
}

// spare keeps the receive slots, wire buffers and float32 scratch of
// finished runs for the next ones. Without it an allreduce of 1 MiB at np 2
// allocated about as much again every call, which the runtime cleared and
// later collected: 5 % of the CPU there. (Not a sync.Pool: the race
// detector makes those drop buffers at random, and what is kept here is
// bounded anyway: what runs held at once, up to scratchKeep per size.)
var spare scratchPool

// scratchKeep is how many bytes of one size the pool keeps at most.
const scratchKeep = 16 << 20

// scratchPool holds free buffers by capacity, a power of two (the index's).
type scratchPool struct {
	mu   sync.Mutex
	free [64][][]byte
}

func (p *scratchPool) get(n int) []byte {
	k := bits.Len(uint(max(n, 4096) - 1))
	p.mu.Lock()
	defer p.mu.Unlock()
	if f := p.free[k]; len(f) > 0 {
		b := f[len(f)-1]
		p.free[k] = f[:len(f)-1]
		return b[:n]
	}
	return make([]byte, n, 1<<k)
}

func (p *scratchPool) put(b []byte) {
	k := bits.Len(uint(cap(b) - 1))
	p.mu.Lock()
	defer p.mu.Unlock()
	if (len(p.free[k])+1)*cap(b) <= scratchKeep {
		p.free[k] = append(p.free[k], b)
	}
}

// takeScratch returns a buffer of n bytes for this run; the run gives it
// back when it succeeds.
func (r *run) takeScratch(n int) []byte {
	b := spare.get(n)
	r.mu.Lock()
	r.scratch = append(r.scratch, b)
	r.mu.Unlock()
	return b
}

// newReducer is a reducer whose float32 scratch comes from the run's.
func (r *run) newReducer(dtype, wire dtype.DType, op Op, n int) *reducer {
	red := newReducer(dtype, wire, op, n)
	red.take = r.takeScratch
	return red
}

type sendItem struct {
	buf  []byte
	done func() // called once the transport no longer needs buf (may be nil)
}

// sender sends the items pushed to it, in order, to one peer on one
// channel; message k carries chunk index k.
type sender struct {
	r      *run
	q      chan sendItem
	sent   atomic.Int64
	notify chan struct{}
}

func (r *run) newSender(peer, ch, queue int) *sender {
	s := &sender{r: r, q: make(chan sendItem, queue), notify: make(chan struct{}, 1)}
	hdr := peer == r.next && ch == 0 && !r.hdrSent
	if hdr {
		r.hdrSent = true
	}
	r.goFn(func() error {
		if hdr {
			if err := r.sendHeader(); err != nil {
				for range s.q {
				}
				return err
			}
		}
		more, _ := r.t.(rank.MoreSender)
		k := 0
		for it := range s.q {
			if r.ctx.Err() != nil { // the run failed: send nothing new
				for range s.q {
				}
				return nil
			}
			send := r.t.Send
			if more != nil && len(s.q) > 0 { // the next is here: it goes out with this one
				send = more.SendMore
			}
			if err := send(r.sctx, peer, ch, r.c.tag(k), it.buf); err != nil {
				for range s.q { // let producers finish
				}
				return err
			}
			k++
			if it.done != nil {
				it.done()
			}
			s.sent.Store(int64(k))
			select {
			case s.notify <- struct{}{}:
			default:
			}
		}
		return nil
	})
	return s
}

// push queues a message; it returns false once the run has failed.
func (s *sender) push(buf []byte, done func()) bool {
	select {
	case s.q <- sendItem{buf, done}:
		return true
	case <-s.r.ctx.Done():
		if done != nil {
			done()
		}
		return false
	}
}

func (s *sender) close() { close(s.q) }

// waitSent waits until the first n messages have been handed to the
// transport (so their buffers may be overwritten). One waiter at a time.
func (s *sender) waitSent(n int) error {
	for int(s.sent.Load()) < n {
		select {
		case <-s.notify:
		case <-s.r.ctx.Done():
			return s.r.ctx.Err()
		}
	}
	return nil
}

type recvItem struct {
	buf  []byte
	slot bool
}

// receiver receives count messages from one peer on one channel, in order,
// ahead of the consumer: message k lands in plan(k)'s buffer if it gives
// one, else in a free slot of slotBytes (at most depth slots in use).
type receiver struct {
	r    *run
	out  chan recvItem
	free chan []byte
}

type recvPlan struct {
	count     int
	size      func(k int) int    // bytes of message k
	dst       func(k int) []byte // where message k goes; nil: a slot
	before    func(k int) error  // called before receiving message k (may be nil)
	slotBytes int
	depth     int
}

func (r *run) newReceiver(peer, ch int, p recvPlan) *receiver {
	if p.depth <= 0 {
		p.depth = 4
	}
	rv := &receiver{r: r, out: make(chan recvItem, p.depth), free: make(chan []byte, p.depth)}
	for i := 0; i < p.depth; i++ {
		rv.free <- nil // allocated on first use
	}
	hdr := peer == r.prev && ch == 0 && !r.hdrRecvd
	if hdr {
		r.hdrRecvd = true
	}
	r.goFn(func() error {
		if hdr {
			if err := r.recvHeader(); err != nil {
				return err
			}
		}
		for k := 0; k < p.count; k++ {
			if p.before != nil {
				if err := p.before(k); err != nil {
					return err
				}
			}
			n := p.size(k)
			var it recvItem
			if p.dst != nil {
				it.buf = p.dst(k)
			}
			if it.buf == nil {
				var b []byte
				select {
				case b = <-rv.free:
				case <-r.ctx.Done():
					return r.ctx.Err()
				}
				if cap(b) < n {
					b = r.takeScratch(max(n, p.slotBytes))
				}
				it.buf, it.slot = b[:n], true
			}
			if err := r.t.Recv(r.ctx, peer, ch, r.c.tag(k), it.buf); err != nil {
				return err
			}
			select {
			case rv.out <- it:
			case <-r.ctx.Done():
				return r.ctx.Err()
			}
		}
		return nil
	})
	return rv
}

// next returns the next received message; ok is false once the run failed.
func (rv *receiver) next() (recvItem, bool) {
	select {
	case it := <-rv.out:
		return it, true
	case <-rv.r.ctx.Done():
		return recvItem{}, false
	}
}

// release gives a slot back.
func (rv *receiver) release(it recvItem) {
	if it.slot {
		rv.free <- it.buf
	}
}

// bufPool hands out wire-format send buffers for one pipeline and takes
// them back when the transport is done with them.
type bufPool struct {
	r *run
	c chan []byte
}

func (r *run) newBufPool(depth int) *bufPool {
	p := &bufPool{r: r, c: make(chan []byte, depth)}
	for i := 0; i < depth; i++ {
		p.c <- nil
	}
	return p
}

func (p *bufPool) get(ctx context.Context, n int) ([]byte, bool) {
	select {
	case b := <-p.c:
		if cap(b) < n {
			b = p.r.takeScratch(n)
		}
		return b[:n], true
	case <-ctx.Done():
		return nil, false
	}
}

func (p *bufPool) put(b []byte) { p.c <- b }

// refDone returns a func that calls f after it has been called n times.
func refDone(n int, f func()) func() {
	if n <= 1 {
		return f
	}
	var c atomic.Int32
	c.Store(int32(n))
	return func() {
		if c.Add(-1) == 0 {
			f()
		}
	}
}

// split cuts n into parts near-equal pieces; it returns the start of piece
// i (starts[parts] == n).
func split(n, parts int) []int {
	s := make([]int, parts+1)
	q, rem := n/parts, n%parts
	for i := 1; i <= parts; i++ {
		s[i] = s[i-1] + q
		if i <= rem {
			s[i]++
		}
	}
	return s
}

// slices is how many pipeline slices a segment of ne elements of wire size
// ws is cut into: at least one, so that every step carries a message even
// for empty segments (and a mismatch is always seen).
func slices(ne, ws, sliceBytes int) int {
	b := ne * ws
	if b <= sliceBytes {
		return 1
	}
	return (b + sliceBytes - 1) / sliceBytes
}

// settings encodes what, besides the call, decides a call's messages:
// the slice sizes (across hosts and within one) and the channels used.
func settings(sliceBytes, localSlice, channels, transportChannels int, hier bool) []byte {
	b := make([]byte, 13)
	binary.LittleEndian.PutUint32(b, uint32(sliceBytes))
	binary.LittleEndian.PutUint32(b[4:], uint32(localSlice))
	binary.LittleEndian.PutUint16(b[8:], uint16(channels))
	binary.LittleEndian.PutUint16(b[10:], uint16(transportChannels))
	if hier {
		b[12] = 1
	}
	return b
}

func describeSettings(b []byte) string {
	if len(b) != 13 {
		return fmt.Sprintf("%d bytes of settings", len(b))
	}
	s := fmt.Sprintf("slices of %d bytes (%d within a host), %d of %d channels", binary.LittleEndian.Uint32(b),
		binary.LittleEndian.Uint32(b[4:]), binary.LittleEndian.Uint16(b[8:]), binary.LittleEndian.Uint16(b[10:]))
	if b[12] == 1 {
		s += ", hierarchical"
	}
	return s
}
