package train

import (
	"context"
	"fmt"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/fusion"
	"github.com/gorun/gorun/kernels"
	"github.com/gorun/gorun/kernels/cpu"
	"github.com/gorun/gorun/metrics"
	"github.com/gorun/gorun/transformer"
)

// commStats is what a reducer measured during one optimizer step.
type commStats struct {
	Comm     time.Duration // time collectives of gradients were in flight
	Exposed  time.Duration // of which after backward had finished
	Overflow bool          // inf or NaN in the reduced gradients
	// OverflowFlagged: the check was queued on the device instead
	// (kernels.DeferredScalars' FlagOverflow, read at the step's end);
	// Overflow says nothing then
	OverflowFlagged bool
	Buckets         int
	PowerSGD        fusion.PowerSGDStats // --compression powersgd
}

// reducer sums the gradients of all ranks into m.Grads.
type reducer interface {
	// Ready is called by the backward hook of the pass that communicates.
	Ready(param int)
	// BackwardDone marks the end of that backward pass.
	BackwardDone()
	// SetScale sets the factor the reduced gradients are multiplied by
	// (1/loss scale); the overflow check applies to the scaled values.
	SetScale(f float32)
	// Wait returns when every gradient has been reduced.
	Wait() (commStats, error)
	// SetStep gives the number of the step about to run (PowerSGD's
	// start step).
	SetStep(step int)
	Close()
}

// onCPU reports whether be is the CPU backend, whose tensors are host
// memory that the collectives use in place. Any other backend's tensors
// go through Download and Upload (or HostStaging).
func onCPU(be kernels.Backend) bool {
	_, ok := be.(*cpu.Backend)
	return ok
}

// plainReducer is the no-overlap reference: one allreduce of the whole
// gradient buffer after backward (what a naive data-parallel loop does).
type plainReducer struct {
	ctx   context.Context
	comm  *collective.Communicator
	m     *transformer.Model
	wire  dtype.DType
	start time.Time
	host  []float32 // the gradients' host copy, off the CPU (nil on it: in place)
	scale float32   // applied after the reduction (1: none)
	// flag, on one rank, queues the overflow check (always, scaled or
	// not) instead of waiting for it; set by the step that reads the flag
	flag kernels.DeferredScalars
}

func newPlainReducer(ctx context.Context, comm *collective.Communicator, m *transformer.Model, wire dtype.DType) *plainReducer {
	p := &plainReducer{ctx: ctx, comm: comm, m: m, wire: wire, scale: 1}
	if !onCPU(m.Backend()) && comm.Size() > 1 {
		p.host = make([]float32, m.Grads.Len())
	}
	return p
}

func (p *plainReducer) Ready(int)     {}
func (p *plainReducer) SetStep(int)   {}
func (p *plainReducer) BackwardDone() { p.start = time.Now() }
func (p *plainReducer) Close()        {}

func (p *plainReducer) SetScale(f float32) { p.scale = f }

func (p *plainReducer) Wait() (commStats, error) {
	be := p.m.Backend()
	if p.comm.Size() == 1 {
		// nothing to exchange; with a loss scale, unscale and check here
		if p.scale != 1 {
			be.Scale(p.m.Grads, p.scale)
		}
		if p.flag != nil {
			p.flag.FlagInfNaN(p.m.Grads, kernels.FlagOverflow)
			return commStats{OverflowFlagged: true}, nil
		}
		if p.scale == 1 {
			return commStats{}, nil
		}
		return commStats{Overflow: be.HasInfNaN(p.m.Grads)}, nil
	}
	g := p.m.Grads.F32
	if p.host != nil {
		be.Download(p.host, p.m.Grads)
		g = p.host
	}
	buf := collective.Float32Bytes(g)
	var opts []collective.CallOption
	if p.wire != dtype.Float32 {
		opts = append(opts, collective.WithWire(p.wire))
	}
	err := p.comm.Allreduce(p.ctx, buf, buf, dtype.Float32, collective.Sum, opts...)
	if err == nil && p.host != nil {
		be.Upload(p.m.Grads, p.host)
	}
	if err == nil && p.scale != 1 {
		be.Scale(p.m.Grads, p.scale)
	}
	d := time.Since(p.start)
	st := commStats{Comm: d, Exposed: d, Buckets: 1}
	if err == nil {
		st.Overflow = be.HasInfNaN(p.m.Grads)
	}
	return st, err
}

// bucketReducer is the overlapped path: the Bucketer all-reduces fused
// fp16 buckets while backward still runs. On the CPU the buckets are views
// of the gradient buffer; on a backend with kernels.HostStaging (a GPU)
// each bucket is cast and copied to pinned host memory as soon as its last
// gradient is ready, and copied back after the allreduce.
type bucketReducer struct {
	b    *fusion.Bucketer
	psgd bool // --compression powersgd
}

// compressPowerSGD is --compression's value for PowerSGD (fusion.PowerSGD):
// the weight matrices as rank-R factors, the other gradients in fp16.
const compressPowerSGD = "powersgd"

// powerSGDEmbedding: PowerSGD compresses the shared embedding/softmax
// matrix [V, d] too (measured: docs/fusion.md, "Convergence").
const powerSGDEmbedding = true

// compression is --compression as the Bucketer takes it: the wire of the
// uncompressed gradients, and PowerSGD's settings (nil unless powersgd).
func compression(o Options) (dtype.DType, *fusion.PowerSGD) {
	if o.Compression == compressPowerSGD {
		return dtype.Float16, &fusion.PowerSGD{Rank: o.PowerSGDRank, StartStep: o.PowerSGDStart, Seed: o.Seed}
	}
	wire, _ := fusion.ParseWire(o.Compression) // Validate checked it
	return wire, nil
}

func newBucketReducer(ctx context.Context, comm *collective.Communicator, m *transformer.Model, o Options, tl *metrics.Timeline) (reducer, error) {
	params, err := paramInfos(m.Params)
	if err != nil {
		return nil, err
	}
	comp, psgd := compression(o)
	if psgd != nil {
		if c, ok := m.Backend().(*cpu.Backend); ok {
			// the compressor runs on the Bucketer's goroutines while the
			// backward pass goes on: a backend of its own
			own := cpu.New()
			own.Threads = c.Threads
			psgd.Backend = own
		}
	}
	b, err := fusion.NewBucketer(comm, params, fusion.BucketConfig{
		CapBytes: int(o.BucketCapMB * (1 << 20)), FirstCapBytes: int(o.FirstBucketMB * (1 << 20)),
		Wire: comp, CycleTime: o.CycleTime, BackwardPassesPerStep: 1, Timeout: o.Timeout, Timeline: tl,
		PowerSGD: psgd,
	})
	if err != nil {
		return nil, err
	}
	if gs, ok := fusion.HostStaged(m.Backend(), m.Grads); ok {
		err = b.AttachDevice(gs)
	} else if m.Grads.F32 != nil || m.Grads.Len() == 0 {
		err = b.AttachFlat(m.Grads.F32)
	} else {
		err = fmt.Errorf("backend %s keeps the gradients off the host and cannot stage them (no kernels.HostStaging): run with --overlap=false", m.Backend().Name())
	}
	if err != nil {
		b.Close()
		return nil, err
	}
	return &bucketReducer{b: b, psgd: psgd != nil}, nil
}

// paramInfos is the gradients of the parameters ps (a model's, laid out
// one after another) as the Bucketer takes them.
func paramInfos(ps []transformer.Param) ([]fusion.ParamInfo, error) {
	params := make([]fusion.ParamInfo, len(ps))
	off := 0
	for i, p := range ps {
		if p.Offset != off {
			return nil, fmt.Errorf("internal: parameter %s at offset %d, want %d (gradients not contiguous)", p.Name, p.Offset, off)
		}
		params[i] = fusion.ParamInfo{Name: p.Name, Len: p.Len}
		// the matrices, for PowerSGD
		if len(p.Shape) == 2 && (powerSGDEmbedding || p.Name != "embedding_and_softmax/weights") {
			params[i].Rows, params[i].Cols = p.Shape[0], p.Shape[1]
		}
		off += p.Len
	}
	return params, nil
}

// BucketBytes is the fusion buckets' float32 bytes in the order they
// leave, as the Bucketer cuts them from the parameters ps with caps of
// capMB and firstMB MiB (--bucket-cap-mb, --first-bucket-mb; fusion.Layout,
// before a --cycle-time rebuild): run.json's record, and the planner's
// layout (nmt-train plan).
func BucketBytes(ps []transformer.Param, capMB, firstMB float64) ([]int, error) {
	params, err := paramInfos(ps)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, b := range fusion.Layout(params, fusion.BucketConfig{CapBytes: int(capMB * (1 << 20)), FirstCapBytes: int(firstMB * (1 << 20))}) {
		out = append(out, b.Bytes())
	}
	return out, nil
}

func (r *bucketReducer) Ready(p int)        { r.b.MarkReady(p) }
func (r *bucketReducer) BackwardDone()      { r.b.BackwardDone() }
func (r *bucketReducer) Close()             { r.b.Close() }
func (r *bucketReducer) SetScale(f float32) { r.b.SetScale(f) }
func (r *bucketReducer) SetStep(step int)   { r.b.SetStep(step) }

func (r *bucketReducer) Wait() (commStats, error) {
	st, err := r.b.Wait()
	return commStats{Comm: st.CommTime, Exposed: st.Exposed, Overflow: st.Overflow, Buckets: len(st.Buckets), PowerSGD: st.PowerSGD}, err
}
