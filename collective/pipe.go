package collective

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/gorun/gorun/rank"
)

// run is one collective call in progress on this rank: its goroutines,
// their first error, and a context cancelled by that error.
type run struct {
	t      rank.Transport
	c      call
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
	err    error
}

func newRun(ctx context.Context, t rank.Transport, c call) *run {
	r := &run{t: t, c: c}
	r.ctx, r.cancel = context.WithCancel(ctx)
	return r
}

func (r *run) fail(err error) {
	r.once.Do(func() {
		r.err = explainMismatch(err)
		r.cancel()
	})
}

func (r *run) goFn(f func() error) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		if err := f(); err != nil {
			r.fail(err)
		}
	}()
}

// wait waits for every goroutine and returns the first error.
func (r *run) wait() error {
	r.wg.Wait()
	r.cancel()
	return r.err
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
	r.goFn(func() error {
		k := 0
		for it := range s.q {
			if err := r.t.Send(r.ctx, peer, ch, r.c.tag(k), it.buf); err != nil {
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
	r.goFn(func() error {
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
					b = make([]byte, max(n, p.slotBytes))
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
type bufPool struct{ c chan []byte }

func newBufPool(depth int) *bufPool {
	p := &bufPool{c: make(chan []byte, depth)}
	for i := 0; i < depth; i++ {
		p.c <- nil
	}
	return p
}

func (p *bufPool) get(ctx context.Context, n int) ([]byte, bool) {
	select {
	case b := <-p.c:
		if cap(b) < n {
			b = make([]byte, n)
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
