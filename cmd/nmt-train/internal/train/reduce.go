package train

import (
	"context"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/transformer"
)

// commStats is what a reducer measured during one optimizer step.
type commStats struct {
	Comm     time.Duration // time collectives of gradients were in flight
	Exposed  time.Duration // of which after backward had finished
	Overflow bool          // inf or NaN in the reduced gradients
	Buckets  int
}

// reducer sums the gradients of all ranks into m.Grads.
type reducer interface {
	// Ready is called by the backward hook of the pass that communicates.
	Ready(param int)
	// BackwardDone marks the end of that backward pass.
	BackwardDone()
	// Wait returns when every gradient has been reduced.
	Wait() (commStats, error)
	Close()
}

// plainReducer is the no-overlap reference: one allreduce of the whole
// gradient buffer after backward (what a naive data-parallel loop does).
type plainReducer struct {
	ctx   context.Context
	comm  *collective.Communicator
	m     *transformer.Model
	wire  collective.DType
	start time.Time
}

func newPlainReducer(ctx context.Context, comm *collective.Communicator, m *transformer.Model, wire collective.DType) *plainReducer {
	return &plainReducer{ctx: ctx, comm: comm, m: m, wire: wire}
}

func (p *plainReducer) Ready(int)     {}
func (p *plainReducer) BackwardDone() { p.start = time.Now() }
func (p *plainReducer) Close()        {}

func (p *plainReducer) Wait() (commStats, error) {
	g := collective.Float32Bytes(p.m.Grads.F32)
	var opts []collective.CallOption
	if p.wire != collective.Float32 {
		opts = append(opts, collective.WithWire(p.wire))
	}
	err := p.comm.Allreduce(p.ctx, g, g, collective.Float32, collective.Sum, opts...)
	d := time.Since(p.start)
	st := commStats{Comm: d, Exposed: d, Buckets: 1}
	if err == nil {
		st.Overflow = p.m.Backend().HasInfNaN(p.m.Grads)
	}
	return st, err
}

// newBucketReducer: temporary until the Bucketer lands (overlap off).
func newBucketReducer(ctx context.Context, comm *collective.Communicator, m *transformer.Model, o Options, wire collective.DType, tl *collective.Timeline) (reducer, error) {
	return newPlainReducer(ctx, comm, m, wire), nil
}
