// Package fusion is the training policy above package collective: the
// Bucketer fuses gradients into buckets and all-reduces each one while the
// backward pass goes on (Horovod's tensor fusion, PyTorch DDP's Reducer),
// for gradients in host memory or, through GradStaging, on a device; the
// LossScaler is the loss scaling of mixed-precision training. Package
// collective keeps only the collectives they call.
package fusion

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/metrics"
)

// ParseWire reads the gradients' type on the wire as nmt-train's
// --compression names it: none (float32, as they are; also "", fp32,
// float32), fp16 (float16, half) or bf16 (bfloat16), the last two rounded on
// the wire to half the bytes.
func ParseWire(s string) (dtype.DType, error) {
	switch strings.ToLower(s) {
	case "none", "", "fp32", "float32":
		return dtype.Float32, nil
	case "fp16", "float16", "half":
		return dtype.Float16, nil
	case "bf16", "bfloat16":
		return dtype.BFloat16, nil
	}
	return 0, fmt.Errorf("unknown compression %q (want none, fp16 or bf16)", s)
}

// wireName is the --compression name of wire type d, as ParseWire reads it.
func wireName(d dtype.DType) string {
	switch d {
	case dtype.Float16:
		return "fp16"
	case dtype.BFloat16:
		return "bf16"
	}
	return "none"
}

// ParamInfo describes one parameter's gradient: a name for messages and
// its length in float32 elements.
type ParamInfo struct {
	Name string
	Len  int
	// Rows and Cols give the gradient as a Rows x Cols row-major matrix
	// (Rows*Cols = Len), which BucketConfig.PowerSGD may compress; 0 for a
	// vector, or for a matrix that must travel uncompressed.
	Rows, Cols int
}

// Defaults of BucketConfig.
const (
	DefaultBucketCap      = 25 << 20 // bytes of float32 gradients (PyTorch DDP's bucket_cap_mb)
	DefaultFirstBucketCap = 1 << 20  // a small first bucket starts communication early
	DefaultReadyTimeout   = 5 * time.Minute
)

// BucketConfig tunes a Bucketer. The zero value means the defaults: 25 MiB
// buckets after a 1 MiB first one, float32 on the wire, sum (no average),
// one backward pass per step.
type BucketConfig struct {
	// CapBytes: a bucket is closed as soon as it holds this many bytes of
	// float32 gradients (default 25 MiB), so it overshoots by less than its
	// last parameter. A parameter of CapBytes or more gets a bucket of its
	// own.
	CapBytes int
	// FirstCapBytes is the first bucket's cap (default 1 MiB).
	FirstCapBytes int
	// Wire is the gradients' type on the wire: collective.Float16 or
	// BFloat16 round them to half the bytes; Float32 (or zero) sends them
	// as they are.
	Wire dtype.DType
	// CycleTime, if positive, rebuilds the buckets once, after the first
	// step, from rank 0's measured readiness times: a bucket is also closed
	// when the next gradient became ready more than CycleTime after the
	// bucket's first one (Horovod's HOROVOD_CYCLE_TIME, made deterministic:
	// rank 0 broadcasts the new layout, so every rank switches to the same
	// buckets at the same step).
	CycleTime time.Duration
	// BackwardPassesPerStep k: gradients are accumulated by the caller over
	// k backward passes and only the k-th communicates (default 1).
	BackwardPassesPerStep int
	// Average divides the sums by the world size (the Average reduction);
	// the scale set by SetScale applies on top.
	Average bool
	// Timeout bounds how long Wait and WaitBucket wait for gradients that
	// were never marked ready (default 5 minutes); the error names them.
	// Peers that stop answering are the communicator's business (its
	// Timeout and the transport's).
	Timeout time.Duration
	// Timeline, if not nil, records each bucket's pack, allreduce and
	// unpack (on a device: copy out, allreduce, check, copy in).
	Timeline *metrics.Timeline
	// PowerSGD, if not nil, compresses the weight matrices (ParamInfo.Rows
	// and Cols) from its StartStep on; the other gradients keep
	// Wire. Host gradients need AttachFlat (not Attach).
	PowerSGD *PowerSGD
}

// Bucket is one fused message: the gradients of parameters Lo..Hi
// (inclusive, indices into the parameter list). Readiness runs from Hi down
// to Lo, so a bucket is complete when Lo's gradient (usually the last of
// its run) is ready.
type Bucket struct {
	Index  int
	Lo, Hi int
	Elems  int // float32 elements
	Offset int // of parameter Lo in the flat gradient buffer (AttachFlat, AttachDevice)
}

// Bytes is the bucket's size in float32 bytes.
func (b Bucket) Bytes() int { return 4 * b.Elems }

// BucketStats is what happened to one bucket in one step.
type BucketStats struct {
	Index, Params, Bytes int
	// Ready: its last gradient was marked. Launch: its turn came (the
	// buckets before it were launched). Start: the allreduce began (the
	// previous one finished). Reduced: the allreduce finished. End: the
	// result was unpacked into the gradients (AttachDevice: checked in host
	// memory, ready for the copy back that Wait or WaitBucket queues).
	Ready, Launch, Start, Reduced, End time.Time
	Overflow                           bool
}

// StepStats summarises one step.
type StepStats struct {
	// Reduced is false for the backward passes of a step that only
	// accumulate (BackwardPassesPerStep > 1): nothing was communicated and
	// the optimizer should not run.
	Reduced bool
	Buckets []BucketStats
	// BytesSent and BytesRecv: the transport's counters (all peers)
	// between the first launch and the last bucket's end.
	BytesSent, BytesRecv uint64
	// CommTime is the time during which at least one bucket was being
	// packed, reduced or unpacked.
	CommTime time.Duration
	// Exposed is the time from BackwardDone to the last bucket's end.
	Exposed time.Duration
	// Hidden is 1 - Exposed/CommTime, clamped to [0, 1]: the part of the
	// communication that overlapped the backward pass.
	Hidden float64
	// BackwardDone is when BackwardDone (or Wait) was called.
	BackwardDone time.Time
	// Overflow: an inf or NaN in the reduced (and scaled) gradients.
	Overflow bool
	// PowerSGD: what the compressor did (BucketConfig.PowerSGD).
	PowerSGD PowerSGDStats
}

// String is a one-line summary for logs.
func (s StepStats) String() string {
	if !s.Reduced {
		return "accumulated (no communication)"
	}
	o := ""
	if s.Overflow {
		o = ", overflow"
	}
	return fmt.Sprintf("%d buckets, sent %.1f MB, recv %.1f MB, comm %v, exposed %v (%.0f%% hidden)%s",
		len(s.Buckets), float64(s.BytesSent)/1e6, float64(s.BytesRecv)/1e6,
		s.CommTime.Round(time.Millisecond), s.Exposed.Round(time.Millisecond), 100*s.Hidden, o)
}

// Bucketer fuses gradients into buckets and all-reduces each one as soon
// as its gradients are ready, while the backward pass goes on (Horovod's
// tensor fusion, PyTorch DDP's Reducer).
//
// Per step: MarkReady(i) for every parameter (any order), BackwardDone()
// when the backward pass returns, then WaitBucket/WaitParam (optional, per
// bucket, for an optimizer that updates bucket by bucket) and Wait
// (required: it ends the step and returns its stats). With host gradients
// (AttachFlat, Attach) MarkReady may be called from any goroutine; with
// device gradients (AttachDevice) MarkReady, WaitBucket, WaitParam and Wait
// run the GradStaging's copies and must be called on the goroutine that
// owns the device (the training goroutine, from the backward hook).
//
// The buckets are a pure function of the parameter list and the config
// (until a CycleTime rebuild, which rank 0 broadcasts), so they are the
// same on every rank; the first step checks that with a fingerprint. They
// are launched in index order on every rank whatever the order of
// MarkReady calls: a bucket that is complete waits for the ones before it.
//
// After an error the Bucketer (and the Communicator under it) is out of
// step with its peers: the error is returned by every later call.
type Bucketer struct {
	c       *collective.Communicator
	params  []ParamInfo
	offsets []int
	total   int // elements of all the gradients
	cfg     BucketConfig
	wire    dtype.DType
	desc    []byte // fingerprint material
	ctx     context.Context
	cancel  context.CancelFunc

	mu      sync.Mutex
	buckets []Bucket
	of      []int // parameter -> bucket
	flat    []float32
	grads   [][]float32 // Attach mode
	bufs    [][]float32 // per bucket: a view of flat, or a pack buffer
	dev     GradStaging // AttachDevice mode
	pinned  []byte      // AttachDevice: every gradient in the wire format, in host memory
	wbufs   [][]byte    // AttachDevice: per bucket, its view of pinned
	scale   float32
	pass    int
	st      *stepState
	checked bool
	rebuilt bool
	broken  error

	// PowerSGD (BucketConfig.PowerSGD): the compressor, its view of each
	// bucket, the host pack buffers of the other gradients (AttachFlat),
	// and the number of the next step (SetStep).
	psgd   *compressor
	pbk    []psgdBucket
	dbufs  [][]float32
	stepNo int
}

// NewBucketer lays out buckets for params, given in the model's parameter
// order: gradients become ready in the reverse of that order (the last
// parameter's first), and buckets are filled in readiness order, the first
// bucket holding the last parameters. c is the communicator the buckets
// are reduced on; it may carry other calls between steps.
func NewBucketer(c *collective.Communicator, params []ParamInfo, cfg BucketConfig) (*Bucketer, error) {
	cfg = cfg.withDefaults()
	switch {
	case cfg.CapBytes < 0 || cfg.FirstCapBytes < 0:
		return nil, fmt.Errorf("bucketer: negative bucket cap (%d, first %d)", cfg.CapBytes, cfg.FirstCapBytes)
	case cfg.BackwardPassesPerStep < 0:
		return nil, fmt.Errorf("bucketer: %d backward passes per step", cfg.BackwardPassesPerStep)
	case cfg.Wire != 0 && cfg.Wire != dtype.Float32 && cfg.Wire != dtype.Float16 && cfg.Wire != dtype.BFloat16:
		return nil, fmt.Errorf("bucketer: unknown wire type %v", cfg.Wire)
	case cfg.Timeout < 0 || cfg.CycleTime < 0:
		return nil, errors.New("bucketer: negative timeout or cycle time")
	}
	if cfg.Wire == 0 {
		cfg.Wire = dtype.Float32
	}
	b := &Bucketer{c: c, params: append([]ParamInfo(nil), params...), cfg: cfg, wire: cfg.Wire, scale: 1}
	off := 0
	for i, p := range params {
		if p.Len < 0 {
			return nil, fmt.Errorf("bucketer: parameter %d %q has length %d", i, p.Name, p.Len)
		}
		b.offsets = append(b.offsets, off)
		off += p.Len
	}
	b.total = off
	if cfg.PowerSGD != nil {
		c, err := newCompressor(params, b.offsets, *cfg.PowerSGD)
		if err != nil {
			return nil, err
		}
		b.psgd = c
	}
	b.setLayout(layout(params, b.offsets, cfg.CapBytes, cfg.FirstCapBytes, nil, nil, 0))
	if err := b.describe(); err != nil {
		return nil, err
	}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	return b, nil
}

// withDefaults fills in the zero fields of cfg.
func (cfg BucketConfig) withDefaults() BucketConfig {
	if cfg.CapBytes == 0 {
		cfg.CapBytes = DefaultBucketCap
	}
	if cfg.FirstCapBytes == 0 {
		cfg.FirstCapBytes = DefaultFirstBucketCap
	}
	if cfg.BackwardPassesPerStep == 0 {
		cfg.BackwardPassesPerStep = 1
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultReadyTimeout
	}
	return cfg
}

// Layout is the buckets NewBucketer cuts from params with cfg's caps
// (before any CycleTime rebuild): the same pure function, without a
// communicator, for a run's record and for planning.
func Layout(params []ParamInfo, cfg BucketConfig) []Bucket {
	cfg = cfg.withDefaults()
	offsets := make([]int, len(params))
	off := 0
	for i, p := range params {
		offsets[i] = off
		off += p.Len
	}
	return layout(params, offsets, cfg.CapBytes, cfg.FirstCapBytes, nil, nil, 0)
}

// layout forms buckets in readiness order (last parameter first). As in
// PyTorch DDP, a bucket is closed as soon as it holds at least its cap
// (firstCap for bucket 0), so it overshoots the cap by less than its last
// parameter; a parameter of capBytes or more never joins a non-empty
// bucket and is closed alone. A bucket is also closed before every
// parameter i with cut[i] set (when cut is given), and before a parameter
// that became ready more than cycle after the bucket's first one (when
// ready times are given).
func layout(params []ParamInfo, offsets []int, capBytes, firstCap int, cut []bool, ready []time.Time, cycle time.Duration) []Bucket {
	var out []Bucket
	open, hi, bytes := false, 0, 0
	closeAt := func(lo int) {
		out = append(out, Bucket{Lo: lo, Hi: hi})
		open = false
	}
	for i := len(params) - 1; i >= 0; i-- {
		pb := 4 * params[i].Len
		if open && (pb >= capBytes || cut != nil && cut[i] || ready != nil && ready[i].Sub(ready[hi]) > cycle) {
			closeAt(i + 1)
		}
		if !open {
			open, hi, bytes = true, i, 0
		}
		bytes += pb
		limit := capBytes
		if len(out) == 0 {
			limit = firstCap
		}
		if bytes >= limit || pb >= capBytes {
			closeAt(i)
		}
	}
	if open {
		closeAt(0)
	}
	for k := range out {
		bk := &out[k]
		bk.Index = k
		bk.Offset = offsets[bk.Lo]
		bk.Elems = offsets[bk.Hi] + params[bk.Hi].Len - bk.Offset
	}
	return out
}

func (b *Bucketer) setLayout(bs []Bucket) {
	b.buckets = bs
	b.of = make([]int, len(b.params))
	for _, bk := range bs {
		for i := bk.Lo; i <= bk.Hi; i++ {
			b.of[i] = bk.Index
		}
	}
	b.bufs, b.wbufs = nil, nil
	if b.psgd != nil {
		b.pbk = b.psgd.buckets(b.params, b.offsets, bs)
	}
	if b.attached() {
		b.makeBufs()
	}
}

type description struct {
	Compression string
	Average     bool
	Passes      int
	CapBytes    int
	FirstCap    int
	CycleTime   int64
	Names       []string
	Lens        []int
	// DeviceWire: the buckets are 16-bit data staged from a device, not
	// float32 data sent as 16 bits (different collectives).
	DeviceWire bool `json:",omitempty"`
	// PowerSGD: its settings; Shapes: each parameter's rows and columns.
	PowerSGD string  `json:",omitempty"`
	Shapes   [][]int `json:",omitempty"`
}

// describe sets the fingerprint material from the parameters, the config
// and the attach mode.
func (b *Bucketer) describe() error {
	d := description{Compression: wireName(b.wire), Average: b.cfg.Average, Passes: b.cfg.BackwardPassesPerStep,
		CapBytes: b.cfg.CapBytes, FirstCap: b.cfg.FirstCapBytes, CycleTime: int64(b.cfg.CycleTime),
		DeviceWire: b.dev != nil && b.wire != dtype.Float32}
	for _, p := range b.params {
		d.Names = append(d.Names, p.Name)
		d.Lens = append(d.Lens, p.Len)
	}
	if b.psgd != nil {
		d.PowerSGD = b.psgd.describe()
		for _, p := range b.params {
			d.Shapes = append(d.Shapes, []int{p.Rows, p.Cols})
		}
	}
	js, err := json.Marshal(d)
	if err != nil {
		return err
	}
	b.desc = js
	return nil
}

// Buckets returns the current layout.
func (b *Bucketer) Buckets() []Bucket {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]Bucket(nil), b.buckets...)
}

// BucketOf returns the index of the bucket holding parameter i.
func (b *Bucketer) BucketOf(i int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.of[i]
}

// AttachFlat hands the Bucketer the flat gradient buffer: parameter i's
// gradient is flat[o_i : o_i+Len_i] with o_i the sum of the lengths before
// it (the transformer's Grads buffer). Buckets are views of it: nothing is
// copied, and the reduced gradients are written back in place.
func (b *Bucketer) AttachFlat(flat []float32) error {
	if len(flat) != b.total {
		return fmt.Errorf("bucketer: flat gradient buffer has %d elements, the parameters %d", len(flat), b.total)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.st != nil {
		return errors.New("bucketer: Attach during a step")
	}
	b.flat, b.grads, b.dev = flat, nil, nil
	b.makeBufs()
	if b.psgd != nil {
		if err := b.psgd.attachHost(flat); err != nil {
			b.flat = nil
			return err
		}
	}
	return b.describe()
}

// Attach hands the Bucketer one gradient slice per parameter. Each bucket
// is packed into a buffer of its own before its allreduce and unpacked
// after it (AttachFlat avoids both copies).
func (b *Bucketer) Attach(grads [][]float32) error {
	if len(grads) != len(b.params) {
		return fmt.Errorf("bucketer: %d gradient slices for %d parameters", len(grads), len(b.params))
	}
	for i, g := range grads {
		if len(g) != b.params[i].Len {
			return fmt.Errorf("bucketer: gradient of parameter %d %q has %d elements, want %d", i, b.params[i].Name, len(g), b.params[i].Len)
		}
	}
	if b.psgd != nil {
		return errors.New("bucketer: PowerSGD needs the gradients as one flat buffer (AttachFlat or AttachDevice), not Attach")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.st != nil {
		return errors.New("bucketer: Attach during a step")
	}
	b.flat, b.grads, b.dev = nil, append([][]float32(nil), grads...), nil
	b.makeBufs()
	return b.describe()
}

// AttachDevice hands the Bucketer a flat gradient buffer that the host
// cannot read, laid out as for AttachFlat. When a bucket's last gradient
// is marked ready, MarkReady queues its copy to host memory in the wire
// format (s.CopyOut: the cast to float16 or bfloat16 runs on the device);
// the bucket's communication goroutine waits for the copy, all-reduces the
// host buffer and checks it for Inf and NaN there; WaitBucket and Wait
// queue the copy back (s.CopyIn, which also applies SetScale's factor to
// the float32 gradients). The host buffer, one for all the buckets, is
// taken from s.Pinned once.
func (b *Bucketer) AttachDevice(s GradStaging) error {
	if n := s.Len(); n != b.total {
		return fmt.Errorf("bucketer: device gradient buffer has %d elements, the parameters %d", n, b.total)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.st != nil {
		return errors.New("bucketer: Attach during a step")
	}
	if b.dev != s || len(b.pinned) != b.total*b.wire.Size() {
		b.pinned = nil
		if b.total > 0 {
			b.pinned = s.Pinned(b.total * b.wire.Size())
			if len(b.pinned) < b.total*b.wire.Size() {
				return fmt.Errorf("bucketer: %d bytes of pinned host memory for %d", len(b.pinned), b.total*b.wire.Size())
			}
		}
	}
	b.flat, b.grads, b.dev = nil, nil, s
	b.makeBufs()
	if b.psgd != nil {
		if err := b.psgd.attachDevice(s); err != nil {
			b.dev = nil
			return err
		}
	}
	return b.describe()
}

func (b *Bucketer) attached() bool { return b.flat != nil || b.grads != nil || b.dev != nil }

func (b *Bucketer) makeBufs() {
	b.dbufs = nil
	if b.psgd != nil && b.flat != nil {
		b.dbufs = make([][]float32, len(b.buckets))
		for k := range b.pbk {
			if pb := &b.pbk[k]; pb.compressed() && pb.dense > 0 {
				b.dbufs[k] = make([]float32, pb.dense)
			}
		}
	}
	if b.dev != nil {
		ws := b.wire.Size()
		b.bufs, b.wbufs = nil, make([][]byte, len(b.buckets))
		for k, bk := range b.buckets {
			lo, hi := bk.Offset*ws, (bk.Offset+bk.Elems)*ws
			b.wbufs[k] = b.pinned[lo:hi:hi]
		}
		return
	}
	b.bufs, b.wbufs = make([][]float32, len(b.buckets)), nil
	for k, bk := range b.buckets {
		if b.flat != nil {
			b.bufs[k] = b.flat[bk.Offset : bk.Offset+bk.Elems : bk.Offset+bk.Elems]
		} else {
			b.bufs[k] = make([]float32, bk.Elems)
		}
	}
}

// SetScale sets a factor applied to the reduced gradients when they are
// unpacked, from the next step that starts (its first MarkReady) on: for
// example 1/(loss scale * passes per step). With Average it multiplies the
// average.
func (b *Bucketer) SetScale(f float32) {
	b.mu.Lock()
	b.scale = f
	b.mu.Unlock()
}

// Communicating reports whether the current backward pass is the one that
// communicates (the last of BackwardPassesPerStep).
func (b *Bucketer) Communicating() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pass == b.cfg.BackwardPassesPerStep-1
}

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

type launched struct {
	k int
	h *collective.Handle
	// hq: a PowerSGD bucket's Q allreduce (h is then its other
	// gradients', or nil)
	hq *collective.Handle
}

// launch starts the buckets' allreduces in index order as they become
// ready (on a device: and their copy to the host has finished); a
// finisher goroutine unpacks (checks) them in the same order.
func (b *Bucketer) launch(s *stepState, check bool) {
	buckets := s.buckets
	fin := make(chan launched, len(buckets))
	go b.finish(s, fin)
	defer close(fin)
	op := collective.Sum
	if b.cfg.Average {
		op = collective.Average // each rank divides only the part it owns
	}
	var opts []collective.CallOption
	if b.wire != dtype.Float32 && s.dev == nil {
		opts = append(opts, collective.WithWire(b.wire))
	}
	failFrom := func(k int, err error) {
		s.fail(err)
		for j := k; j < len(buckets); j++ {
			s.errs[j] = err
			close(s.done[j])
		}
	}
	for k, bk := range buckets {
		select {
		case <-s.ready[k]:
		case <-s.abort:
			failFrom(k, s.abortE)
			return
		}
		st := &s.stats[k]
		st.Launch = time.Now()
		if k == 0 {
			if check {
				if err := b.verify(); err != nil {
					failFrom(0, err)
					return
				}
			}
			s.sent0, s.recv0 = b.traffic()
		}
		if s.psgd && s.pbk[k].compressed() {
			l, err := b.launchPSGD(s, k, op, opts)
			if err != nil {
				failFrom(k, err)
				return
			}
			fin <- l
			continue
		}
		var h *collective.Handle
		if s.dev != nil {
			if f := s.fences[k]; f != nil {
				if err := f.Wait(); err != nil {
					failFrom(k, fmt.Errorf("bucketer: rank %d: copying bucket %d to the host: %w", b.c.Rank(), k, err))
					return
				}
			}
			b.cfg.Timeline.Span("fusion", fmt.Sprintf("copy out b%d", k), st.Ready, time.Now())
			h = b.c.AllreduceAsync(b.ctx, nil, s.wbufs[k], b.wire, op)
		} else {
			buf := s.bufs[k]
			if s.grads != nil {
				o := 0
				for i := bk.Lo; i <= bk.Hi; i++ {
					o += copy(buf[o:], s.grads[i])
				}
				b.cfg.Timeline.Span("fusion", fmt.Sprintf("pack b%d", k), st.Launch, time.Now())
			}
			h = b.c.AllreduceAsync(b.ctx, nil, collective.Float32Bytes(buf), dtype.Float32, op, opts...)
		}
		st.Start = time.Now() // corrected by finish to when the call could run
		fin <- launched{k: k, h: h}
	}
}

func (b *Bucketer) finish(s *stepState, fin chan launched) {
	var prev time.Time
	for l := range fin {
		k, bk := l.k, s.buckets[l.k]
		st := &s.stats[k]
		var err error
		if l.hq != nil {
			err = b.finishPSGD(s, l)
		} else {
			err = l.h.Wait()
			st.Reduced = time.Now()
		}
		if st.Start.Before(prev) {
			st.Start = prev // the communicator runs calls one at a time
		}
		prev = st.Reduced
		if err == nil && l.hq == nil {
			if s.dev != nil {
				// The scale is applied on the device by the copy back.
				st.Overflow = wireOverflow(s.wbufs[k], b.wire, s.scale)
			} else {
				buf := s.bufs[k]
				st.Overflow = scaleAndCheck(buf, s.scale)
				if s.grads != nil {
					o := 0
					for i := bk.Lo; i <= bk.Hi; i++ {
						o += copy(s.grads[i], buf[o:])
					}
				}
			}
		}
		st.End = time.Now()
		if tl := b.cfg.Timeline; tl != nil {
			args := map[string]any{"bytes": bk.Bytes(), "wire": b.wire.String(), "params": bk.Hi - bk.Lo + 1,
				"first": b.params[bk.Hi].Name, "last": b.params[bk.Lo].Name}
			if l.hq != nil {
				pb := &s.pbk[k]
				args["powersgd_bytes"] = 4 * (pb.pHi - pb.pLo + pb.qHi - pb.qLo)
				args["matrices"] = pb.mHi - pb.mLo
			}
			tl.SpanArgs("allreduce", fmt.Sprintf("allreduce b%d", k), st.Start, st.Reduced, args)
			name := "unpack b%d"
			if l.hq != nil {
				name = "decompress b%d" // host: and unpack; device: the checks
			} else if s.dev != nil {
				name = "check b%d"
			}
			tl.Span("fusion", fmt.Sprintf(name, k), st.Reduced, st.End)
		}
		s.errs[k] = err
		if err != nil {
			s.fail(err)
		}
		close(s.done[k])
	}
}

// copyIn queues the copy of reduced bucket k back to the device gradients
// (AttachDevice mode), once per step; it runs on the device's goroutine.
func (b *Bucketer) copyIn(s *stepState, k int) {
	s.inMu.Lock()
	defer s.inMu.Unlock()
	if s.copiedIn[k] {
		return
	}
	s.copiedIn[k] = true
	t0 := time.Now()
	if s.psgd && s.pbk[k].compressed() {
		b.devPhase3(s, k)
	} else if bk := s.buckets[k]; bk.Elems > 0 {
		s.dev.CopyIn(bk.Offset, bk.Elems, s.wbufs[k], b.wire, s.scale)
	}
	b.cfg.Timeline.Span("fusion", fmt.Sprintf("copy in b%d", k), t0, time.Now())
}

// scaleAndCheck multiplies x by scale (unless it is 1) and reports whether
// x holds an inf or a NaN: x*0 is 0 for a finite x and NaN otherwise, so
// the sum of x[i]*0 is NaN exactly when one x[i] is not finite (one pass,
// no branches, four independent sums).
func scaleAndCheck(x []float32, scale float32) bool {
	var a0, a1, a2, a3 float32
	i := 0
	if scale != 1 {
		for ; i+4 <= len(x); i += 4 {
			v := x[i : i+4 : i+4]
			v[0] *= scale
			v[1] *= scale
			v[2] *= scale
			v[3] *= scale
			a0 += v[0] * 0
			a1 += v[1] * 0
			a2 += v[2] * 0
			a3 += v[3] * 0
		}
		for ; i < len(x); i++ {
			x[i] *= scale
			a0 += x[i] * 0
		}
	} else {
		for ; i+4 <= len(x); i += 4 {
			v := x[i : i+4 : i+4]
			a0 += v[0] * 0
			a1 += v[1] * 0
			a2 += v[2] * 0
			a3 += v[3] * 0
		}
		for ; i < len(x); i++ {
			a0 += x[i] * 0
		}
	}
	s := a0 + a1 + a2 + a3
	return s != s
}

func (b *Bucketer) traffic() (sent, recv uint64) {
	for _, p := range b.c.Transport().Stats() {
		sent += p.BytesSent
		recv += p.BytesRecv
	}
	return
}

// unready names the parameters of buckets 0..k not marked yet.
func (b *Bucketer) unready(s *stepState, k int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var names []string
	total := 0
	for j := 0; j <= k && j < len(b.buckets); j++ {
		bk := b.buckets[j]
		for i := bk.Hi; i >= bk.Lo; i-- {
			if !s.marked[i] {
				total++
				if len(names) < 4 {
					names = append(names, fmt.Sprintf("%d %q (%d elements, bucket %d)", i, b.params[i].Name, b.params[i].Len, j))
				}
			}
		}
	}
	msg := strings.Join(names, ", ")
	if total > len(names) {
		msg += fmt.Sprintf(" and %d more", total-len(names))
	}
	return msg
}

// waitBucket waits for bucket k of step s: its readiness (and that of the
// buckets before it) within the timeout, then its allreduce.
func (b *Bucketer) waitBucket(s *stepState, k int) error {
	timer := time.NewTimer(b.cfg.Timeout)
	defer timer.Stop()
	// With PowerSGD on a device, the launcher asks this (the device's)
	// goroutine on s.devReq for each bucket's phase 2 meanwhile (a nil
	// channel otherwise, never ready).
	for j := 0; j <= k; j++ {
	marked:
		for {
			select {
			case <-s.ready[j]:
				break marked
			case <-s.done[j]:
				break marked
			case <-s.abort:
				return s.abortE
			case kk := <-s.devReq:
				b.devPhase2(s, kk)
			case <-timer.C:
				err := fmt.Errorf("bucketer: rank %d: gradient not marked ready within %v: parameter %s", b.c.Rank(), b.cfg.Timeout, b.unready(s, j))
				s.fail(err)
				return err
			}
		}
	}
	for {
		select {
		case <-s.done[k]:
			return s.errs[k]
		case <-s.abort:
			return s.abortE
		case kk := <-s.devReq:
			b.devPhase2(s, kk)
		}
	}
}

// WaitBucket waits until bucket k's gradients are reduced and unpacked
// (AttachDevice: until their copy back is queued, ahead of the work queued
// after it). In passes that only accumulate it returns at once.
func (b *Bucketer) WaitBucket(k int) error {
	b.mu.Lock()
	if b.pass < b.cfg.BackwardPassesPerStep-1 {
		b.mu.Unlock()
		return nil
	}
	if k < 0 || k >= len(b.buckets) {
		b.mu.Unlock()
		return fmt.Errorf("bucketer: no bucket %d (have %d)", k, len(b.buckets))
	}
	s, err := b.step()
	b.mu.Unlock()
	if err != nil {
		return err
	}
	if err := b.waitBucket(s, k); err != nil {
		b.mu.Lock()
		if b.broken == nil {
			b.broken = err
		}
		b.mu.Unlock()
		return err
	}
	if s.dev != nil {
		b.copyIn(s, k)
	}
	return nil
}

// WaitParam waits for the bucket holding parameter i (an optimizer's
// per-parameter wait callback).
func (b *Bucketer) WaitParam(i int) error {
	if i < 0 || i >= len(b.params) {
		return fmt.Errorf("bucketer: no parameter %d (have %d)", i, len(b.params))
	}
	return b.WaitBucket(b.BucketOf(i))
}

// Wait ends the backward pass: in a pass that only accumulates it returns
// StepStats{Reduced: false} at once; otherwise it waits for every bucket
// (an implicit BackwardDone if none was called) and returns the step's
// stats. With AttachDevice it queues the copy back of every bucket that
// WaitBucket did not. Gradients never marked ready make it fail after the
// Timeout with an error naming them.
func (b *Bucketer) Wait() (StepStats, error) {
	now := time.Now()
	b.mu.Lock()
	if b.broken != nil {
		b.mu.Unlock()
		return StepStats{}, b.broken
	}
	if b.pass < b.cfg.BackwardPassesPerStep-1 {
		b.pass++
		b.mu.Unlock()
		return StepStats{}, nil
	}
	s, err := b.step()
	if err != nil {
		b.mu.Unlock()
		return StepStats{}, err
	}
	if s.bwdDone.IsZero() {
		s.bwdDone = now
	}
	b.mu.Unlock()

	if len(s.done) > 0 {
		err = b.waitBucket(s, len(s.done)-1)
		if err == nil {
			for k := range s.done { // all done: errors of earlier buckets
				if err = s.errs[k]; err != nil {
					break
				}
			}
		}
	}
	if err == nil && s.dev != nil {
		for k := range s.done {
			b.copyIn(s, k)
		}
	}
	st := StepStats{Reduced: err == nil, BackwardDone: s.bwdDone}
	if err == nil && s.psgd {
		st.PowerSGD = b.psgd.stats()
		st.PowerSGD.Compressed = true
		st.PowerSGD.Compute = time.Duration(s.psgdNs.Load())
	}
	if err == nil {
		st.Buckets = s.stats
		sent, recv := b.traffic()
		st.BytesSent, st.BytesRecv = sent-s.sent0, recv-s.recv0
		var last, covered time.Time
		for _, bs := range s.stats {
			st.Overflow = st.Overflow || bs.Overflow
			lo := bs.Launch
			if lo.Before(covered) {
				lo = covered
			}
			if bs.End.After(lo) {
				st.CommTime += bs.End.Sub(lo)
			}
			if bs.End.After(covered) {
				covered = bs.End
			}
			if bs.End.After(last) {
				last = bs.End
			}
		}
		if last.After(s.bwdDone) {
			st.Exposed = last.Sub(s.bwdDone)
		}
		if st.CommTime > 0 {
			st.Hidden = min(1, max(0, 1-float64(st.Exposed)/float64(st.CommTime)))
		}
	}
	b.mu.Lock()
	b.st = nil
	b.pass = 0
	b.stepNo++
	if err != nil && b.broken == nil {
		b.broken = err
	}
	rebuild := err == nil && b.cfg.CycleTime > 0 && !b.rebuilt
	b.mu.Unlock()
	if rebuild {
		if err := b.rebuild(s); err != nil {
			b.mu.Lock()
			b.broken = err
			b.mu.Unlock()
			return st, err
		}
	}
	return st, err
}

// rebuild re-lays out the buckets from rank 0's readiness times of the
// step just finished (see BucketConfig.CycleTime) and broadcasts the cuts.
func (b *Bucketer) rebuild(s *stepState) error {
	cut := make([]byte, len(b.params)) // 1: a bucket starts (in readiness order) at this parameter
	if b.c.Rank() == 0 {
		for _, bk := range layout(b.params, b.offsets, b.cfg.CapBytes, b.cfg.FirstCapBytes, nil, s.readyAt, b.cfg.CycleTime) {
			if bk.Index > 0 {
				cut[bk.Hi] = 1
			}
		}
	}
	if err := b.c.Broadcast(b.ctx, cut, 0); err != nil {
		return fmt.Errorf("bucketer: broadcasting the rebuilt layout: %w", err)
	}
	cuts := make([]bool, len(cut))
	for i, c := range cut {
		cuts[i] = c != 0
	}
	b.mu.Lock()
	b.setLayout(layout(b.params, b.offsets, b.cfg.CapBytes, b.cfg.FirstCapBytes, cuts, nil, 0))
	b.rebuilt = true
	b.mu.Unlock()
	return nil
}

// verify exchanges a fingerprint of the layout with every rank; on a
// mismatch it exchanges the layouts themselves and names the first
// difference between rank 0 and the first rank that differs from it.
func (b *Bucketer) verify() error {
	n := b.c.Size()
	if n == 1 {
		return nil
	}
	h := sha256.Sum256(b.desc)
	all := make([]byte, n*len(h))
	if err := b.c.Allgather(b.ctx, h[:], all); err != nil {
		return fmt.Errorf("bucketer: exchanging layout fingerprints: %w", err)
	}
	odd := -1
	for r := 1; r < n; r++ {
		if !bytes.Equal(all[r*len(h):(r+1)*len(h)], all[:len(h)]) {
			odd = r
			break
		}
	}
	if odd < 0 {
		return nil
	}
	// Every rank sees the same hashes, so every rank takes this branch.
	var ln [8]byte
	binary.LittleEndian.PutUint64(ln[:], uint64(len(b.desc)))
	lens := make([]byte, 8*n)
	if err := b.c.Allgather(b.ctx, ln[:], lens); err != nil {
		return fmt.Errorf("bucketer: layouts differ between rank 0 and rank %d (exchanging them failed: %w)", odd, err)
	}
	mx := 0
	for r := 0; r < n; r++ {
		mx = max(mx, int(binary.LittleEndian.Uint64(lens[8*r:])))
	}
	mine := make([]byte, mx)
	copy(mine, b.desc)
	descs := make([]byte, n*mx)
	if err := b.c.Allgather(b.ctx, mine, descs); err != nil {
		return fmt.Errorf("bucketer: layouts differ between rank 0 and rank %d (exchanging them failed: %w)", odd, err)
	}
	get := func(r int) (description, error) {
		var d description
		l := int(binary.LittleEndian.Uint64(lens[8*r:]))
		err := json.Unmarshal(descs[r*mx:r*mx+l], &d)
		return d, err
	}
	d0, err0 := get(0)
	d1, err1 := get(odd)
	if err0 != nil || err1 != nil {
		return fmt.Errorf("bucketer: layouts differ between rank 0 and rank %d", odd)
	}
	return fmt.Errorf("bucketer: rank %d: gradient layouts differ between ranks: %s", b.c.Rank(), diffDesc(d0, d1, odd))
}

func diffDesc(a, b description, rb int) string {
	pname := func(d description, i int) string {
		if i >= len(d.Names) {
			return "missing"
		}
		return fmt.Sprintf("%q (%d elements)", d.Names[i], d.Lens[i])
	}
	for i := 0; i < max(len(a.Names), len(b.Names)); i++ {
		if i >= len(a.Names) || i >= len(b.Names) || a.Names[i] != b.Names[i] || a.Lens[i] != b.Lens[i] {
			return fmt.Sprintf("parameter %d is %s on rank 0 but %s on rank %d (rank 0 has %d parameters, rank %d has %d)",
				i, pname(a, i), pname(b, i), rb, len(a.Names), rb, len(b.Names))
		}
	}
	field := func(what string, x, y any) string {
		return fmt.Sprintf("%s is %v on rank 0 but %v on rank %d", what, x, y, rb)
	}
	switch {
	case a.DeviceWire != b.DeviceWire:
		where := func(dev bool) string {
			if dev {
				return "16-bit data staged from a device"
			}
			return "float32 data sent as 16 bits"
		}
		return fmt.Sprintf("the buckets are %s on rank 0 but %s on rank %d (every rank must use the same kind of device, or --compression none)",
			where(a.DeviceWire), where(b.DeviceWire), rb)
	case a.Compression != b.Compression:
		return field("compression", a.Compression, b.Compression)
	case a.PowerSGD != b.PowerSGD:
		off := func(s string) string {
			if s == "" {
				return "off"
			}
			return s
		}
		return field("PowerSGD", off(a.PowerSGD), off(b.PowerSGD))
	case fmt.Sprint(a.Shapes) != fmt.Sprint(b.Shapes):
		for i := 0; i < min(len(a.Shapes), len(b.Shapes)); i++ {
			if fmt.Sprint(a.Shapes[i]) != fmt.Sprint(b.Shapes[i]) {
				return fmt.Sprintf("parameter %d %q is a %dx%d matrix on rank 0 but %dx%d on rank %d", i, a.Names[i], a.Shapes[i][0], a.Shapes[i][1], b.Shapes[i][0], b.Shapes[i][1], rb)
			}
		}
		return "the parameters' shapes differ"
	case a.Average != b.Average:
		return field("average", a.Average, b.Average)
	case a.Passes != b.Passes:
		return field("backward passes per step", a.Passes, b.Passes)
	case a.CapBytes != b.CapBytes:
		return field("bucket cap (bytes)", a.CapBytes, b.CapBytes)
	case a.FirstCap != b.FirstCap:
		return field("first bucket cap (bytes)", a.FirstCap, b.FirstCap)
	case a.CycleTime != b.CycleTime:
		return field("cycle time", time.Duration(a.CycleTime), time.Duration(b.CycleTime))
	}
	return "the bucket settings differ"
}

// Close aborts a step in progress. It does not close the communicator.
func (b *Bucketer) Close() error {
	b.mu.Lock()
	if b.st != nil {
		b.st.fail(errors.New("bucketer: closed"))
	}
	if b.broken == nil {
		b.broken = errors.New("bucketer: closed")
	}
	b.mu.Unlock()
	b.cancel()
	return nil
}
