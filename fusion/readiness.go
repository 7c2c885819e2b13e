package fusion

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// stepState is one communicating step.
type stepState struct {
	scale   float32
	marked  []bool
	left    []int
	ready   []chan struct{}
	done    []chan struct{}
	errs    []error
	stats   []BucketStats
	abort   chan struct{}
	abortE  error
	once    sync.Once
	bwdDone time.Time
	readyAt []time.Time // per parameter (for the cycle-time rebuild)
	sent0   uint64
	recv0   uint64

	// The layout and buffers of this step.
	buckets []Bucket
	bufs    [][]float32
	grads   [][]float32

	// AttachDevice mode.
	dev      GradStaging
	wbufs    [][]byte
	fences   []Fence // per bucket: its copy out (set before ready is closed)
	inMu     sync.Mutex
	copiedIn []bool // per bucket: its copy back is queued

	// PowerSGD: the step compresses (psgd), its number (stepNo), the
	// compressor's view of the buckets and the host pack buffers.
	psgd   bool
	stepNo int
	pbk    []psgdBucket
	dbufs  [][]float32
	pqOver []bool       // per bucket: its reduced P or Q holds an Inf or NaN (set before done)
	psgdNs atomic.Int64 // the compressor's time (PowerSGDStats.Compute)
	// With AttachDevice: per compressed bucket the copies out of its
	// other gradients and of P, when phase 1 was queued, and its phase 2
	// (queued by the device's goroutine when the launcher asks on devReq:
	// q2done closes, qfence is Q's copy out).
	cfences [][]Fence
	p1Start []time.Time
	devReq  chan int
	q2done  []chan struct{}
	qfence  []Fence
}

func (s *stepState) fail(err error) {
	s.once.Do(func() {
		s.abortE = err
		close(s.abort)
	})
}

// step returns the current step, starting one if needed. b.mu is held.
func (b *Bucketer) step() (*stepState, error) {
	if b.broken != nil {
		return nil, b.broken
	}
	if b.st != nil {
		return b.st, nil
	}
	if !b.attached() && len(b.params) > 0 {
		return nil, errors.New("bucketer: no gradients attached (call AttachFlat, Attach or AttachDevice)")
	}
	nb := len(b.buckets)
	s := &stepState{scale: b.scale, marked: make([]bool, len(b.params)), left: make([]int, nb),
		ready: make([]chan struct{}, nb), done: make([]chan struct{}, nb), errs: make([]error, nb),
		stats: make([]BucketStats, nb), abort: make(chan struct{}),
		buckets: b.buckets, bufs: b.bufs, grads: b.grads, dev: b.dev, wbufs: b.wbufs}
	if s.dev != nil {
		s.fences = make([]Fence, nb)
		s.copiedIn = make([]bool, nb)
	}
	if b.cfg.CycleTime > 0 && !b.rebuilt {
		s.readyAt = make([]time.Time, len(b.params))
	}
	if b.psgd != nil && b.stepNo >= b.psgd.cfg.StartStep {
		s.psgd, s.stepNo, s.pbk, s.dbufs, s.pqOver = true, b.stepNo, b.pbk, b.dbufs, make([]bool, nb)
		if s.dev != nil {
			s.cfences, s.p1Start, s.qfence = make([][]Fence, nb), make([]time.Time, nb), make([]Fence, nb)
			s.devReq, s.q2done = make(chan int), make([]chan struct{}, nb)
			for k := range s.q2done {
				s.q2done[k] = make(chan struct{})
			}
		}
	}
	for k, bk := range b.buckets {
		s.left[k] = bk.Hi - bk.Lo + 1
		s.ready[k] = make(chan struct{})
		s.done[k] = make(chan struct{})
		s.stats[k] = BucketStats{Index: k, Params: bk.Hi - bk.Lo + 1, Bytes: bk.Bytes()}
	}
	b.st = s
	check := !b.checked
	b.checked = true
	go b.launch(s, check)
	return s, nil
}

// MarkReady records that parameter i's gradient is final for this pass.
// With host gradients it may be called from any goroutine; with device
// gradients (AttachDevice) from the goroutine that owns the device, since
// the call that completes a bucket queues the bucket's copy to the host.
// In the passes that only accumulate it does nothing.
func (b *Bucketer) MarkReady(i int) {
	now := time.Now()
	b.mu.Lock()
	if b.pass < b.cfg.BackwardPassesPerStep-1 {
		b.mu.Unlock()
		return
	}
	s, err := b.step()
	if err != nil {
		b.mu.Unlock()
		return
	}
	if s.devReq != nil {
		defer b.serve(s) // phase 2 of the buckets whose P is reduced
	}
	if i < 0 || i >= len(b.params) {
		b.mu.Unlock()
		s.fail(fmt.Errorf("bucketer: MarkReady(%d): no such parameter (have %d)", i, len(b.params)))
		return
	}
	if s.marked[i] {
		b.mu.Unlock()
		s.fail(fmt.Errorf("bucketer: parameter %d %q marked ready twice in one step", i, b.params[i].Name))
		return
	}
	s.marked[i] = true
	if s.readyAt != nil {
		s.readyAt[i] = now
	}
	k := b.of[i]
	s.left[k]--
	if s.left[k] != 0 {
		b.mu.Unlock()
		return
	}
	s.stats[k].Ready = now
	b.mu.Unlock()
	if s.dev != nil {
		// Queued outside the lock (a device call); the launcher reads the
		// fence after ready[k] is closed.
		if s.psgd && s.pbk[k].compressed() {
			b.devPhase1(s, k)
		} else if bk := s.buckets[k]; bk.Elems > 0 {
			s.fences[k] = s.dev.CopyOut(s.wbufs[k], bk.Offset, bk.Elems, b.wire)
		}
	}
	close(s.ready[k])
}

// BackwardDone records the end of the backward pass: communication after
// it is exposed.
func (b *Bucketer) BackwardDone() {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pass < b.cfg.BackwardPassesPerStep-1 {
		return
	}
	if s, err := b.step(); err == nil && s.bwdDone.IsZero() {
		s.bwdDone = now
	}
}
