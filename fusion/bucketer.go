// Package fusion is the training policy above package collective: the
// Bucketer fuses gradients into buckets and all-reduces each one while the
// backward pass goes on (Horovod's tensor fusion, PyTorch DDP's Reducer),
// for gradients in host memory or, through GradStaging, on a device; the
// LossScaler is the loss scaling of mixed-precision training. Package
// collective keeps only the collectives they call.
package fusion

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/dtype"
)

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
