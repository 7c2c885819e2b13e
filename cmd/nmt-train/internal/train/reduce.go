package train

import (
	"context"
	"fmt"
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
	if p.comm.Size() == 1 {
		return commStats{}, nil // nothing to exchange
	}
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

// bucketReducer is the overlapped path: the Bucketer all-reduces fused
// fp16 buckets while backward still runs.
type bucketReducer struct {
	b *collective.Bucketer
}

func newBucketReducer(ctx context.Context, comm *collective.Communicator, m *transformer.Model, o Options, wire collective.DType, tl *collective.Timeline) (reducer, error) {
	params := make([]collective.ParamInfo, len(m.Params))
	off := 0
	for i, p := range m.Params {
		if p.Offset != off {
			return nil, fmt.Errorf("internal: parameter %s at offset %d, want %d (gradients not contiguous)", p.Name, p.Offset, off)
		}
		params[i] = collective.ParamInfo{Name: p.Name, Len: p.Len}
		off += p.Len
	}
	comp := map[collective.DType]collective.Compression{collective.Float32: collective.CompressNone,
		collective.Float16: collective.CompressFP16, collective.BFloat16: collective.CompressBF16}[wire]
	b, err := collective.NewBucketer(comm, params, collective.BucketConfig{
		CapBytes: int(o.BucketCapMB * (1 << 20)), FirstCapBytes: int(o.FirstBucketMB * (1 << 20)),
		Compression: comp, CycleTime: o.CycleTime, BackwardPassesPerStep: 1, Timeout: o.Timeout, Timeline: tl,
	})
	if err != nil {
		return nil, err
	}
	if err := b.AttachFlat(m.Grads.F32); err != nil {
		return nil, err
	}
	return &bucketReducer{b: b}, nil
}

func (r *bucketReducer) Ready(p int)   { r.b.MarkReady(p) }
func (r *bucketReducer) BackwardDone() { r.b.BackwardDone() }
func (r *bucketReducer) Close()        { r.b.Close() }

func (r *bucketReducer) Wait() (commStats, error) {
	st, err := r.b.Wait()
	return commStats{Comm: st.CommTime, Exposed: st.Exposed, Overflow: st.Overflow, Buckets: len(st.Buckets)}, err
}
