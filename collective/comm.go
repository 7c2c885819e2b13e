// Package collective implements the collective operations of data-parallel
// training over a rank.Transport: Allreduce (ring, double binary tree,
// halving-doubling, direct, shared memory, hierarchical),
// Broadcast, Allgather, ReduceScatter and Barrier, for float32, float16 and
// bfloat16 buffers.
//
// Buffers are byte slices holding elements of the call's dtype.DType in the
// machine's byte order (Float32Bytes views a float32 slice as bytes
// without copying). Every rank must make the same calls in the same
// order with the same lengths, types, reductions and roots; a rank that
// does not gets a *MismatchError naming both ranks and what differs, and a
// peer that fails or stops answering makes the call fail with an error that
// names it (the transport's *rank.PeerError), within the transport's
// timeout or the context's deadline.
//
// Calls run one at a time per Communicator, in the order they were issued:
// the *Async forms queue a call and return a Handle at once, so several can
// be in flight while the caller computes (the fusion buffer issues bucket
// after bucket this way).
package collective

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/rank"
)

// The pipeline slices unless Config or GORUN_SLICE_BYTES sets one (then
// that one everywhere). Between two test hosts TLS/TCP rings with slices of
// exactly 64 or 128 KiB stalled (the CPUs 16 % idle, 0.6-0.7 GB/s at 16
// and 64 MiB), 256 KiB ones less, 96 KiB ones not: 1.15-1.20 GB/s from 4
// to 256 MiB against 0.99-1.13 for 256 KiB. Over shared memory within a
// host 128 KiB was faster than 256 KiB (docs/collective.md, "Slice size").
const (
	DefaultSliceBytes = 96 << 10  // rings and trees that cross hosts
	LocalSliceBytes   = 128 << 10 // those whose ranks are all on one host
)

// Config tunes a Communicator. The zero value reads the environment and
// otherwise uses the defaults.
type Config struct {
	// Algorithm for Allreduce; Auto (the default) picks by size and world
	// size with Model. (Programs take it from GORUN_ALLREDUCE: envconf.)
	Algorithm algo.Algorithm
	// SliceBytes is the pipelining unit. Must be the same on every rank.
	// 0: DefaultSliceBytes across hosts, LocalSliceBytes within one
	// (GORUN_SLICE_BYTES).
	SliceBytes int
	// Channels is how many transport channels a large call spreads over
	// (rings in parallel); default: one per two CPU cores, at most what
	// the transport has (GORUN_RINGS).
	Channels int
	// Flat turns the hierarchical allreduce off (GORUN_HIERARCHICAL=0):
	// ranks on several hosts run one flat algorithm over all of them.
	Flat bool
	// SharedRoundBytes is the piece of the buffer each round of the
	// shared-memory allreduce handles (GORUN_SHM_ROUND); 0: 256 KiB. At
	// most half a group slot is used. The same on every rank.
	SharedRoundBytes int
	// Timeout replaces the transport's timeout for the waits of each call
	// whose context has no deadline (rank.WithTimeout): a wait without
	// progress for this long names the peer if it is stopped, dead or
	// silent, and goes on up to twice as long for a live peer, which is
	// then most likely waiting itself and reports the rank really lost
	// (rank/stall.go). 0: the transport's own timeout applies.
	Timeout time.Duration
	// Model is the cost model behind Auto; zero means algo.DefaultModel.
	Model algo.CostModel
	// Across is the link between hosts as the job sees it: each rank's
	// rate each way to another host, both directions busy (the start-up
	// probe's), and the transport's cost per step. When set and a call's
	// ranks span hosts, Auto chooses with Model.OnLink(Across) for them
	// (shared by the ranks of a host that cross at once in the
	// hierarchical allreduce); zero: Model chooses for every call.
	// Every rank must be given the same Across.
	Across algo.Link
}

// Communicator runs collectives over one transport.
type Communicator struct {
	t     rank.Transport
	cfg   Config
	queue chan *Handle
	mu    sync.Mutex
	seq   uint32
	// pending counts calls submitted and not finished; exe is held by
	// whoever runs a call (the queue goroutine, or a caller running its
	// blocking call itself when nothing is pending).
	pending int
	exe     sync.Mutex
	err     error // sticky: a failed call leaves the links out of step
	done    chan struct{}
	once    sync.Once
	// settings go in every call's header (see run)
	settings []byte
	hier     *hier       // two-level allreduce layout, nil: flat
	sh       *groupState // every rank on this host, sharing a group segment (shared.go)
	hg       *groupState // hierarchical: this host's ranks, sharing its group segment
	dscratch []byte      // the direct allreduce's buffers (used by the queue goroutine only)
	// the most bytes per slice: of calls over all of t, and of the
	// hierarchical allreduce's phases within a host (across: cfg's)
	flatSlice, localSlice int
	// oneHost: every rank of t is on this host (Auto keeps Model for them)
	oneHost bool
}

// Handle is a queued or running call.
type Handle struct {
	c    call
	ctx  context.Context
	fn   func(ctx context.Context, c call) error
	done chan struct{}
	err  error
}

// Wait blocks until the call has finished and returns its error.
func (h *Handle) Wait() error {
	<-h.done
	return h.err
}

// Done is closed when the call has finished.
func (h *Handle) Done() <-chan struct{} { return h.done }

// New starts a Communicator over t with cfg. It fails on settings out of
// range.
func New(t rank.Transport, cfg Config) (*Communicator, error) {
	localSlice := cfg.SliceBytes
	if cfg.SliceBytes <= 0 {
		cfg.SliceBytes, localSlice = DefaultSliceBytes, LocalSliceBytes
	}
	if cfg.SliceBytes < 64 {
		return nil, fmt.Errorf("slice of %d bytes is too small (min 64)", cfg.SliceBytes)
	}
	if cfg.Channels <= 0 {
		// One ring per two cores: on the 2-core development box a second
		// ring over a second connection made QUIC and TCP allreduces 1.5-3x
		// slower (docs/collective.md), as the connections fight for cores.
		cfg.Channels = max(1, runtime.NumCPU()/2)
	}
	if cfg.Channels > t.Channels() {
		cfg.Channels = t.Channels()
	}
	if cfg.Model == (algo.CostModel{}) {
		cfg.Model = algo.DefaultModel
	}
	if cfg.Model.DirectMaxBytes < 0 || cfg.Model.DirectMaxBytes > algo.DirectLimit {
		return nil, fmt.Errorf("collective: cost model's DirectMaxBytes %d out of range [0, %d]", cfg.Model.DirectMaxBytes, algo.DirectLimit)
	}
	if a := cfg.Across; a.Gbps < 0 || a.StepUs < 0 || a.CapGBs < 0 || a != (algo.Link{}) && a.GBs() <= 0 {
		return nil, fmt.Errorf("collective: link across hosts %+v: want a rate (Gbps or CapGBs) above 0 and nothing negative", a)
	}
	c := &Communicator{t: t, cfg: cfg, queue: make(chan *Handle, 1024), done: make(chan struct{}),
		hier: hierFor(t, cfg.Flat), localSlice: localSlice, flatSlice: cfg.SliceBytes}
	// The host's group segment: for the whole call when every rank is on
	// this host, for the hierarchical allreduce's phases within the host
	// when the ranks span hosts.
	var err error
	if c.hier != nil {
		c.hg, err = hostGroup(t, cfg.Timeout, c.hier.local)
	} else {
		c.sh, err = sharedGroup(t, cfg.Timeout)
	}
	if err != nil {
		return nil, fmt.Errorf("collective: shared-memory group: %w", err)
	}
	for _, g := range []*groupState{c.sh, c.hg} {
		if g != nil {
			g.round = DefaultSharedRoundBytes
			if cfg.SharedRoundBytes > 0 {
				g.round = cfg.SharedRoundBytes
			}
		}
	}
	c.oneHost = oneHost(t)
	if c.oneHost {
		c.flatSlice = localSlice
	}
	c.settings = settings(cfg.SliceBytes, localSlice, cfg.Channels, t.Channels(), c.hier != nil)
	go c.loop()
	return c, nil
}

// group is the group segment's state this communicator's calls use, if
// any: they post themselves there.
func (c *Communicator) group() *groupState {
	if c.sh != nil {
		return c.sh
	}
	return c.hg
}

// Rank and Size of this rank's job.
func (c *Communicator) Rank() int { return c.t.Rank() }
func (c *Communicator) Size() int { return c.t.Size() }

// Transport returns the transport the communicator runs over.
func (c *Communicator) Transport() rank.Transport { return c.t }

// Close stops accepting calls; calls already queued fail. It does not
// close the transport.
func (c *Communicator) Close() error {
	c.once.Do(func() {
		c.mu.Lock()
		if c.err == nil {
			c.err = errors.New("collective: communicator closed")
		}
		close(c.done)
		c.mu.Unlock()
	})
	return nil
}

func (c *Communicator) loop() {
	for {
		select {
		case h := <-c.queue:
			c.runOne(h)
		case <-c.done:
			for {
				select {
				case h := <-c.queue:
					h.err = fmt.Errorf("rank %d: %s not run: %w", c.t.Rank(), h.c, c.err)
					close(h.done)
				default:
					return
				}
			}
		}
	}
}

// runOne runs a call unless an earlier one failed, counts it finished,
// and finishes its Handle.
func (c *Communicator) runOne(h *Handle) {
	c.exe.Lock()
	c.mu.Lock()
	err := c.err
	c.mu.Unlock()
	if err != nil {
		h.err = fmt.Errorf("rank %d: %s not run: an earlier collective failed: %w", c.t.Rank(), h.c, err)
	} else {
		h.err = c.exec(h)
	}
	c.mu.Lock()
	if h.err != nil && c.err == nil {
		c.err = h.err
	}
	c.pending--
	c.mu.Unlock()
	c.exe.Unlock()
	close(h.done)
}

// inlineKey marks the context of a blocking call (Allreduce rather than
// AllreduceAsync): when no call is pending, submit runs it in the
// caller's goroutine, saving two goroutine hand-offs (several
// microseconds, most of a small shared-memory allreduce).
type inlineKey struct{}

func inline(ctx context.Context) context.Context { return context.WithValue(ctx, inlineKey{}, true) }

func (c *Communicator) exec(h *Handle) error {
	ctx := h.ctx
	if _, ok := ctx.Deadline(); !ok && c.cfg.Timeout > 0 {
		// Not a deadline for the whole call: that would end the wait of
		// whichever rank started first, blaming a live peer (issue 15).
		ctx = rank.WithTimeout(ctx, c.cfg.Timeout)
	}
	if err := ctx.Err(); err != nil {
		c.abort(h.c, ctx, err)
		return fmt.Errorf("rank %d: %s: %w", c.t.Rank(), h.c, err)
	}
	if g := c.group(); g != nil && !h.c.bad {
		g.post(h.c)
	}
	err := h.fn(ctx, h.c)
	if err == nil {
		return nil
	}
	c.abort(h.c, ctx, err)
	var me *MismatchError
	var ab *AbortError
	if errors.As(err, &me) || errors.As(err, &ab) {
		return err
	}
	return fmt.Errorf("rank %d: %s: %w", c.t.Rank(), h.c, err)
}

// submit numbers a call and queues it.
func (c *Communicator) submit(ctx context.Context, cl call, fn func(context.Context, call) error) *Handle {
	h := &Handle{ctx: ctx, fn: fn, done: make(chan struct{})}
	c.mu.Lock()
	c.seq++
	cl.seq = c.seq
	h.c = cl
	closed := false
	select {
	case <-c.done:
		closed = true
	default:
	}
	if !closed {
		c.pending++
	}
	now := !closed && c.pending == 1 && ctx.Value(inlineKey{}) != nil
	c.mu.Unlock()
	if closed {
		h.err = fmt.Errorf("rank %d: %s: collective: communicator closed", c.t.Rank(), cl)
		close(h.done)
		return h
	}
	if now {
		c.runOne(h)
		return h
	}
	c.queue <- h
	return h
}

// invalid queues a call that fails with err (bad arguments on this rank):
// it takes its place in the sequence and aborts the peers, who would
// otherwise wait for this rank's part of the call until their timeout.
func (c *Communicator) invalid(ctx context.Context, k kind, err error) *Handle {
	return c.submit(ctx, call{kind: k, bad: true}, func(context.Context, call) error { return err })
}

// CallOption modifies one Allreduce or ReduceScatter call.
type CallOption func(*callOpts)

type callOpts struct {
	algo algo.Algorithm
	wire dtype.DType
}

// WithAlgorithm forces ring, tree, direct, shm or halving-doubling for
// this call.
func WithAlgorithm(a algo.Algorithm) CallOption { return func(o *callOpts) { o.algo = a } }

// WithWire sends float32 data as float16 or bfloat16: the sender rounds to
// the wire type, the receiver accumulates in float32, so the result is the
// float32 reduction rounded once per hop (half the bytes on the wire).
func WithWire(t dtype.DType) CallOption { return func(o *callOpts) { o.wire = t } }

func (c *Communicator) opts(dt dtype.DType, os []CallOption) (callOpts, error) {
	o := callOpts{wire: dt}
	for _, f := range os {
		f(&o)
	}
	if o.wire != dt && (dt != dtype.Float32 || (o.wire != dtype.Float16 && o.wire != dtype.BFloat16)) {
		return o, fmt.Errorf("collective: wire type %s for %s data (only float32 data can travel as float16 or bfloat16)", o.wire, dt)
	}
	return o, nil
}

func checkBuf(what string, b []byte, dt dtype.DType) error {
	if len(b)%dt.Size() != 0 {
		return fmt.Errorf("collective: %s buffer of %d bytes is not a whole number of %s elements", what, len(b), dt)
	}
	return nil
}

// Allreduce reduces send across all ranks with op and leaves the result in
// recv on every rank (bit-identical everywhere). send and recv have the same
// length; they may be the same slice (in place), or send may be nil (in
// place on recv).
func (c *Communicator) Allreduce(ctx context.Context, send, recv []byte, dt dtype.DType, op Op, o ...CallOption) error {
	return c.AllreduceAsync(inline(ctx), send, recv, dt, op, o...).Wait()
}

// AllreduceAsync queues an Allreduce and returns at once. The buffers must
// not be touched until the Handle's Wait returns.
func (c *Communicator) AllreduceAsync(ctx context.Context, send, recv []byte, dt dtype.DType, op Op, o ...CallOption) *Handle {
	if send == nil {
		send = recv
	}
	if !dt.Float() || !op.valid() {
		return c.invalid(ctx, kAllreduce, fmt.Errorf("collective: allreduce: bad data type %v or reduction %v", dt, op))
	}
	if len(send) != len(recv) {
		return c.invalid(ctx, kAllreduce, fmt.Errorf("collective: allreduce: send has %d bytes, recv %d", len(send), len(recv)))
	}
	if err := checkBuf("allreduce", recv, dt); err != nil {
		return c.invalid(ctx, kAllreduce, err)
	}
	co, err := c.opts(dt, o)
	if err != nil {
		return c.invalid(ctx, kAllreduce, err)
	}
	n := c.t.Size()
	count := len(recv) / dt.Size()
	a := c.AlgorithmFor(co.algo, count*co.wire.Size())
	cl := call{kind: kAllreduce, count: count, dtype: dt, op: op, wire: co.wire, algo: a}
	return c.submit(ctx, cl, func(ctx context.Context, cl call) error {
		if cl.algo == algo.Shared && n > 1 {
			return c.sh.allreduce(ctx, send, recv, count, cl)
		}
		var src []byte // out of place: the ring reads send where it lies
		if len(recv) > 0 && &send[0] != &recv[0] {
			src = send
		}
		if src != nil && (n == 1 || cl.algo == algo.Direct) {
			copy(recv, send)
			src = nil
		}
		if n == 1 {
			return nil
		}
		if cl.algo == algo.Direct {
			return c.directAllreduce(ctx, recv, count, cl)
		}
		if c.hier != nil {
			return c.hierAllreduce(ctx, recv, src, count, cl)
		}
		r := newRun(ctx, c.t, cl, c.settings)
		c.allreduceOn(r, c.t, recv, src, 0, count, cl, n, c.flatSlice)
		return r.wait()
	})
}

// AlgorithmFor is the algorithm an Allreduce of bytes (on the wire) runs
// with on this communicator when it asks for a (Auto: Config.Algorithm or
// GORUN_ALLREDUCE, else the cost model's choice). With a hierarchical
// layout (several hosts) the algorithm is the one of the phase across the
// hosts, so the model chooses for that phase: one host's share of the
// bytes among as many ranks as hosts (recursive doubling on two hosts up
// to DoublingMaxBytes a share); it never picks Direct there, which would
// send every rank's buffer across hosts to every rank. Direct asked for on
// more than algo.DirectLimit bytes runs the ring or tree (direct.go).
func (c *Communicator) AlgorithmFor(a algo.Algorithm, bytes int) algo.Algorithm {
	if a == algo.Auto {
		a = c.cfg.Algorithm
	}
	if (a == algo.Auto || a == algo.Shared) && c.sh != nil {
		return algo.Shared
	}
	if a != algo.Auto && a != algo.Shared && !(a == algo.Direct && bytes > algo.DirectLimit) {
		return a
	}
	m := c.cfg.Model
	if a == algo.Direct || c.hier != nil {
		m.DirectMaxBytes = 0
	}
	if h := c.hier; h != nil {
		per := len(h.local)
		return c.modelAcross(m, len(h.cross), per).Choose((bytes+per-1)/per, len(h.cross))
	}
	if !c.oneHost {
		m = c.modelAcross(m, c.t.Size(), 1)
	}
	return m.Choose(bytes, c.t.Size())
}

// AutoBasis says what Auto chooses the algorithm with on this
// communicator, for the logs.
func (c *Communicator) AutoBasis() string {
	switch known := c.cfg.Across != (algo.Link{}); {
	case c.cfg.Algorithm != algo.Auto:
		return fmt.Sprintf("none: %v asked for (GORUN_ALLREDUCE or Config.Algorithm)", c.cfg.Algorithm)
	case c.sh != nil:
		return "the shm algorithm (every rank on this host, in its group segment)"
	case known && c.hier != nil:
		g := len(c.hier.local)
		return fmt.Sprintf("the cost model of the link across hosts, for the phase across them: %v (each of a host's %d ranks)", c.linkShare(g), g)
	case known && !c.oneHost:
		return fmt.Sprintf("the cost model of the link across hosts: %v", c.linkShare(1))
	}
	return "the cost model fitted on one host's cores (algo.DefaultModel)"
}

// modelAcross is m for n ranks on different hosts, sharing of them
// crossing each host's link at once: on Config.Across where it is set
// (each of them with its share of the link), else m itself.
func (c *Communicator) modelAcross(m algo.CostModel, n, sharing int) algo.CostModel {
	if c.cfg.Across == (algo.Link{}) {
		return m
	}
	return m.OnLink(c.linkShare(sharing), n)
}

// linkShare is Config.Across as each of sharing ranks that cross a host's
// link at once has it: 1/sharing of its rate.
func (c *Communicator) linkShare(sharing int) algo.Link {
	l := c.cfg.Across
	l.Gbps /= float64(sharing)
	return l
}

// minChannelBytes: below this many bytes per channel, a call uses fewer
// channels (each costs messages and goroutines).
const minChannelBytes = 64 << 10

func (c *Communicator) channelsFor(bytes int) int {
	return max(1, min(c.cfg.Channels, bytes/minChannelBytes))
}

// sliceFor keeps at least a few slices per step for mid-size calls so that
// the pipeline has something to overlap, within [8 KiB, limit].
func sliceFor(bytes, n, limit int) int {
	per := bytes / max(1, n) / 4
	return max(min(limit, per), min(limit, 8<<10))
}

// Broadcast copies root's buf into buf on every rank (pipelined down a
// binary tree, spread over the channels).
func (c *Communicator) Broadcast(ctx context.Context, buf []byte, root int) error {
	return c.BroadcastAsync(inline(ctx), buf, root).Wait()
}

// BroadcastAsync queues a Broadcast.
func (c *Communicator) BroadcastAsync(ctx context.Context, buf []byte, root int) *Handle {
	n := c.t.Size()
	if root < 0 || root >= n || root > 0xffff {
		return c.invalid(ctx, kBroadcast, fmt.Errorf("collective: broadcast: root %d out of range (world size %d)", root, n))
	}
	cl := call{kind: kBroadcast, count: len(buf), dtype: dtype.Uint8, wire: dtype.Uint8, root: root}
	return c.submit(ctx, cl, func(ctx context.Context, cl call) error {
		if n == 1 {
			return nil
		}
		r := newRun(ctx, c.t, cl, c.settings)
		sh := algo.HeapTree(n, root)[c.t.Rank()]
		nch := c.channelsFor(len(buf))
		parts := split(len(buf), nch)
		for ch := 0; ch < nch; ch++ {
			r.tree(treeSpec{acc: buf, lo: parts[ch], hi: parts[ch+1], ch: ch, shape: sh,
				sliceBytes: c.flatSlice, dtype: dtype.Uint8, wire: dtype.Uint8, op: Sum})
		}
		return r.wait()
	})
}

// Allgather concatenates every rank's send, in rank order, into recv on
// every rank: len(recv) must be Size()*len(send).
func (c *Communicator) Allgather(ctx context.Context, send, recv []byte) error {
	return c.AllgatherAsync(inline(ctx), send, recv).Wait()
}

// AllgatherAsync queues an Allgather.
func (c *Communicator) AllgatherAsync(ctx context.Context, send, recv []byte) *Handle {
	n := c.t.Size()
	if len(recv) != n*len(send) {
		return c.invalid(ctx, kAllgather, fmt.Errorf("collective: allgather: recv has %d bytes, want %d x %d", len(recv), n, len(send)))
	}
	cl := call{kind: kAllgather, count: len(send), dtype: dtype.Uint8, wire: dtype.Uint8}
	return c.submit(ctx, cl, func(ctx context.Context, cl call) error {
		me := c.t.Rank()
		copy(recv[me*len(send):], send)
		if n == 1 {
			return nil
		}
		r := newRun(ctx, c.t, cl, c.settings)
		chunks := make([]int, n+1)
		for j := range chunks {
			chunks[j] = j * len(send)
		}
		r.ring(ringSpec{acc: recv, chunks: chunks, ag: true, nch: c.channelsFor(len(recv)),
			sliceBytes: sliceFor(len(recv), n, c.flatSlice), dtype: dtype.Uint8, wire: dtype.Uint8, op: Sum})
		return r.wait()
	})
}

// ReduceScatter reduces send (Size() blocks of len(recv) bytes) across the
// ranks and leaves block Rank() of the result in recv.
func (c *Communicator) ReduceScatter(ctx context.Context, send, recv []byte, dt dtype.DType, op Op, o ...CallOption) error {
	return c.ReduceScatterAsync(inline(ctx), send, recv, dt, op, o...).Wait()
}

// ReduceScatterAsync queues a ReduceScatter.
func (c *Communicator) ReduceScatterAsync(ctx context.Context, send, recv []byte, dt dtype.DType, op Op, o ...CallOption) *Handle {
	n := c.t.Size()
	if !dt.Float() || !op.valid() {
		return c.invalid(ctx, kReduceScatter, fmt.Errorf("collective: reduce-scatter: bad data type %v or reduction %v", dt, op))
	}
	if len(send) != n*len(recv) {
		return c.invalid(ctx, kReduceScatter, fmt.Errorf("collective: reduce-scatter: send has %d bytes, want %d x %d", len(send), n, len(recv)))
	}
	if err := checkBuf("reduce-scatter", recv, dt); err != nil {
		return c.invalid(ctx, kReduceScatter, err)
	}
	co, err := c.opts(dt, o)
	if err != nil {
		return c.invalid(ctx, kReduceScatter, err)
	}
	count := len(recv) / dt.Size()
	cl := call{kind: kReduceScatter, count: count, dtype: dt, op: op, wire: co.wire, algo: algo.Ring}
	return c.submit(ctx, cl, func(ctx context.Context, cl call) error {
		me := c.t.Rank()
		if n == 1 {
			copy(recv, send)
			return nil
		}
		work := append([]byte(nil), send...)
		chunks := make([]int, n+1)
		for j := range chunks {
			chunks[j] = j * count
		}
		r := newRun(ctx, c.t, cl, c.settings)
		r.ring(ringSpec{acc: work, chunks: chunks, rs: true, nch: c.channelsFor(len(send)),
			sliceBytes: sliceFor(len(send)/dt.Size()*cl.wire.Size(), n, c.flatSlice), dtype: dt, wire: cl.wire, op: op})
		err := r.wait()
		copy(recv, work[me*len(recv):])
		return err
	})
}

// Barrier returns once every rank has entered it.
func (c *Communicator) Barrier(ctx context.Context) error {
	return c.BarrierAsync(inline(ctx)).Wait()
}

// BarrierAsync queues a Barrier.
func (c *Communicator) BarrierAsync(ctx context.Context) *Handle {
	n := c.t.Size()
	cl := call{kind: kBarrier, dtype: dtype.Float32, wire: dtype.Float32, op: Sum}
	return c.submit(ctx, cl, func(ctx context.Context, cl call) error {
		if n == 1 {
			return nil
		}
		r := newRun(ctx, c.t, cl, c.settings)
		sh := algo.InorderTree(n)
		r.tree(treeSpec{acc: nil, ch: 0, shape: sh[c.t.Rank()], up: true, sliceBytes: c.flatSlice,
			dtype: dtype.Float32, wire: dtype.Float32, op: Sum})
		return r.wait()
	})
}
