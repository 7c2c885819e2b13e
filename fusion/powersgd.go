package fusion

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/kernels"
)

// PowerSGD configures PowerSGD gradient compression (Vogels, Karimireddy
// and Jaggi, NeurIPS 2019; PyTorch DDP's powerSGD_hook) for a Bucketer
// (BucketConfig.PowerSGD). From step StartStep on, each weight matrix M
// (n x m, ParamInfo.Rows x Cols) of a bucket is sent as two thin float32
// matrices instead of itself: with E this rank's error feedback and Q
// (m x R) the last step's,
//
//	M += E; P = M orth(Q); allreduce(P, sum); P = orth(P);
//	Q = Mᵀ P; allreduce(Q, sum); G = P Qᵀ; E = M - G/W
//
// (W ranks; G is the sum of the ranks' gradients, as the uncompressed
// buckets give it, or with Average their mean, G/W). Vectors and matrices
// that would not shrink by MinRate travel in the bucket's ordinary
// (Wire) allreduce. docs/fusion.md has the design and its reasons.
type PowerSGD struct {
	// Rank is R, the rank of the approximation (1 to kernels.OrthoMaxCols;
	// default DefaultPowerSGDRank). A matrix gets min(R, n, m) columns.
	Rank int
	// StartStep: the steps before it run uncompressed (DDP's
	// start_powerSGD_iter); see Bucketer.SetStep.
	StartStep int
	// MinRate: a matrix is compressed when n*m > MinRate*(n+m)*R (DDP's
	// min_compression_rate); 0 means DefaultPowerSGDMinRate.
	MinRate float64
	// Seed draws the initial Q (a standard normal, the same on every
	// rank).
	Seed uint64
	// Backend runs the compressor's products, sums and orthonormalisations
	// for host gradients (AttachFlat), on the Bucketer's own goroutines
	// while the backward pass goes on: a backend whose tensors are host
	// memory (the CPU backend) and that nothing else uses, since a
	// backend is not safe for concurrent use (not the model's). With
	// AttachDevice the staging's backend runs them, on the device's
	// goroutine, and Backend is not used.
	Backend kernels.Backend
}

// Defaults of PowerSGD.
const (
	// DefaultPowerSGDRank is nmt-train's --powersgd-rank: the least rank
	// whose eval loss stayed within 5 % of fp16's at every evaluation
	// after the start step on real text (8 did not; docs/fusion.md,
	// "Convergence"), and 11x fewer bytes than fp16 for Transformer-base.
	DefaultPowerSGDRank = 16
	// DefaultPowerSGDStartStep is nmt-train's --powersgd-start-step.
	DefaultPowerSGDStartStep = 1000
	// DefaultPowerSGDMinRate is DDP's min_compression_rate.
	DefaultPowerSGDMinRate = 2
	// powerSGDEps is added to each column's norm by Orthonormalize (DDP's
	// epsilon), so a vanishing gradient never divides by zero.
	powerSGDEps = 1e-8
)

// PowerSGDStats is what PowerSGD did in one step.
type PowerSGDStats struct {
	// Compressed: the step compressed (StartStep reached).
	Compressed bool
	// Matrices compressed each step.
	Matrices int
	// Bytes: the float32 bytes of P and Q this rank all-reduced (their
	// size, not the wire's traffic, which the algorithm multiplies).
	Bytes int64
	// FP16Bytes: the bytes the compressed matrices would have been
	// all-reduced as in float16.
	FP16Bytes int64
	// Compute: the time the compressor's work held the buckets up: on
	// the host, the wall time of its operations; on a device, the time
	// from queueing each phase to the end of its copy to the host (or
	// the time to queue the last phase), which includes work queued
	// before it.
	Compute time.Duration
}

// PowerSGDMatrix is one compressed matrix (Bucketer.PowerSGDMatrices).
type PowerSGDMatrix struct {
	Param      int    // index into the parameter list
	Name       string // the parameter's
	Rows, Cols int
	Rank       int // its P's and Q's columns: min(R, Rows, Cols)
}

// psgdMat is a compressed matrix and its places: the gradient's in the
// flat gradient buffer, the error's, P's (n x r) and Q's (m x r) in
// theirs.
type psgdMat struct {
	param                 int
	n, m, r               int
	off, eOff, pOff, qOff int
}

// psgdRun is a run of uncompressed gradients in the flat gradient buffer.
type psgdRun struct{ off, n int }

// psgdBucket is what a bucket holds for a compressed step: its matrices
// [mLo, mHi), whose P, Q and errors are contiguous, and the runs of the
// other gradients, packed in order for the ordinary allreduce.
type psgdBucket struct {
	mLo, mHi           int
	runs               []psgdRun
	dense              int
	pLo, pHi, qLo, qHi int
	eLo, eHi           int
}

func (pb *psgdBucket) compressed() bool { return pb.mHi > pb.mLo }

// compressor is a Bucketer's PowerSGD state.
type compressor struct {
	cfg  PowerSGD
	mats []psgdMat
	of   []int // parameter -> matrix, -1
	nE   int   // error elements (the matrices')
	nP   int
	nQ   int

	// Set when gradients are attached.
	be    kernels.Backend
	hs    kernels.HostStaging // AttachDevice; nil for host gradients
	grads kernels.Tensor      // the flat gradient buffer
	e     kernels.Tensor      // error feedback, this rank's
	p, q  kernels.Tensor
	qPrev kernels.Tensor // Q before the step, restored when it overflows
	// pWire, qWire: the host bytes P and Q are all-reduced in (host
	// gradients: P's and Q's own memory; a device: pinned buffers).
	pWire, qWire []byte
	// mu serialises the backend's use by the launcher and the finisher
	// (host gradients; on a device the device's goroutine runs it all).
	mu sync.Mutex
	// src is the GradStaging attached (AttachDevice).
	src GradStaging
}

// newCompressor picks the matrices of params to compress.
func newCompressor(params []ParamInfo, offsets []int, cfg PowerSGD) (*compressor, error) {
	if cfg.Rank == 0 {
		cfg.Rank = DefaultPowerSGDRank
	}
	if cfg.MinRate == 0 {
		cfg.MinRate = DefaultPowerSGDMinRate
	}
	switch {
	case cfg.Rank < 1 || cfg.Rank > kernels.OrthoMaxCols:
		return nil, fmt.Errorf("bucketer: PowerSGD rank %d (want 1 to %d)", cfg.Rank, kernels.OrthoMaxCols)
	case cfg.StartStep < 0:
		return nil, fmt.Errorf("bucketer: PowerSGD start step %d is negative", cfg.StartStep)
	case !(cfg.MinRate > 0) || math.IsInf(cfg.MinRate, 0):
		return nil, fmt.Errorf("bucketer: PowerSGD minimum compression rate %v", cfg.MinRate)
	}
	c := &compressor{cfg: cfg, of: make([]int, len(params))}
	for i, p := range params {
		c.of[i] = -1
		if p.Rows < 0 || p.Cols < 0 || (p.Rows > 0 || p.Cols > 0) && p.Rows*p.Cols != p.Len {
			return nil, fmt.Errorf("bucketer: parameter %d %q: %d x %d does not hold its %d elements", i, p.Name, p.Rows, p.Cols, p.Len)
		}
		if p.Rows == 0 || p.Cols == 0 {
			continue
		}
		r := min(cfg.Rank, p.Rows, p.Cols)
		if !(float64(p.Rows)*float64(p.Cols) > cfg.MinRate*float64(p.Rows+p.Cols)*float64(r)) {
			continue
		}
		c.of[i] = len(c.mats)
		c.mats = append(c.mats, psgdMat{param: i, n: p.Rows, m: p.Cols, r: r, off: offsets[i], eOff: c.nE, pOff: c.nP, qOff: c.nQ})
		c.nE += p.Len
		c.nP += p.Rows * r
		c.nQ += p.Cols * r
	}
	return c, nil
}

// describe is the compressor's part of the layout fingerprint.
func (c *compressor) describe() string {
	return fmt.Sprintf("rank %d, start step %d, minimum rate %g, seed %d, %d matrices", c.cfg.Rank, c.cfg.StartStep, c.cfg.MinRate, c.cfg.Seed, len(c.mats))
}

// buckets cuts the compressor's view of each bucket of bs.
func (c *compressor) buckets(params []ParamInfo, offsets []int, bs []Bucket) []psgdBucket {
	out := make([]psgdBucket, len(bs))
	for k, bk := range bs {
		pb := &out[k]
		pb.mLo, pb.mHi = -1, -1
		for i := bk.Lo; i <= bk.Hi; i++ {
			if j := c.of[i]; j >= 0 {
				if pb.mLo < 0 {
					pb.mLo = j
				}
				pb.mHi = j + 1
				continue
			}
			if params[i].Len == 0 {
				continue
			}
			if n := len(pb.runs); n > 0 && pb.runs[n-1].off+pb.runs[n-1].n == offsets[i] {
				pb.runs[n-1].n += params[i].Len
			} else {
				pb.runs = append(pb.runs, psgdRun{offsets[i], params[i].Len})
			}
			pb.dense += params[i].Len
		}
		if pb.mLo < 0 {
			pb.mLo, pb.mHi = 0, 0
			continue
		}
		first, last := c.mats[pb.mLo], c.mats[pb.mHi-1]
		pb.pLo, pb.pHi = first.pOff, last.pOff+last.n*last.r
		pb.qLo, pb.qHi = first.qOff, last.qOff+last.m*last.r
		pb.eLo, pb.eHi = first.eOff, last.eOff+last.n*last.m
	}
	return out
}

// attachHost sets the compressor up for host gradients flat.
func (c *compressor) attachHost(flat []float32) error {
	if c.cfg.Backend == nil {
		return errors.New("bucketer: PowerSGD on host gradients needs PowerSGD.Backend (a CPU backend of its own)")
	}
	if c.cfg.Backend.Device().Kind != kernels.CPU {
		return fmt.Errorf("bucketer: PowerSGD.Backend %s is not a host backend", c.cfg.Backend.Name())
	}
	if c.hs == nil && c.be != nil && len(flat) == c.grads.Len() && (len(flat) == 0 || &flat[0] == &c.grads.F32[0]) {
		return nil // attached again: the state stays
	}
	c.be, c.hs, c.src = c.cfg.Backend, nil, nil
	c.grads = kernels.FromF32(flat, len(flat))
	c.e = kernels.FromF32(make([]float32, c.nE), c.nE)
	c.p = kernels.FromF32(make([]float32, c.nP), c.nP)
	c.q = kernels.FromF32(make([]float32, c.nQ), c.nQ)
	c.qPrev = kernels.FromF32(make([]float32, c.nQ), c.nQ)
	c.pWire, c.qWire = collective.Float32Bytes(c.p.F32), collective.Float32Bytes(c.q.F32)
	c.initQ(c.q.F32)
	return nil
}

// deviceGrads is what AttachDevice needs of a GradStaging for PowerSGD:
// the backend and the gradient tensor (HostStaged's has them).
type deviceGrads interface {
	backendAndGrads() (kernels.Backend, kernels.HostStaging, kernels.Tensor)
}

func (h *hostStaged) backendAndGrads() (kernels.Backend, kernels.HostStaging, kernels.Tensor) {
	return h.be, h.hs, h.grads
}

// attachDevice sets the compressor up for the device gradients of s; it
// runs on the device's goroutine.
func (c *compressor) attachDevice(s GradStaging) error {
	dg, ok := s.(deviceGrads)
	if !ok {
		return errors.New("bucketer: PowerSGD on device gradients needs the GradStaging of HostStaged")
	}
	if c.src == s {
		return nil // attached again: the state and buffers stay
	}
	if c.hs != nil {
		for _, t := range []kernels.Tensor{c.e, c.p, c.q, c.qPrev} {
			if t.Len() > 0 {
				c.be.Free(t)
			}
		}
	}
	c.src = s
	c.be, c.hs, c.grads = dg.backendAndGrads()
	alloc := func(n int) kernels.Tensor {
		if n == 0 {
			return kernels.Tensor{}
		}
		return c.be.Alloc(dtype.Float32, n)
	}
	c.e, c.p, c.q, c.qPrev = alloc(c.nE), alloc(c.nP), alloc(c.nQ), alloc(c.nQ)
	c.pWire, c.qWire = c.hs.PinnedHost(4*c.nP), c.hs.PinnedHost(4*c.nQ)
	if len(c.pWire) < 4*c.nP || len(c.qWire) < 4*c.nQ {
		return errors.New("bucketer: short pinned host memory for PowerSGD's P and Q")
	}
	host := make([]float32, c.nQ)
	c.initQ(host)
	if c.nQ > 0 {
		c.be.Upload(c.q, host)
	}
	return nil
}

func (c *compressor) attached() bool { return c.be != nil }

// normalColumns writes standard normal values into the columns of q (an m
// x r row-major matrix) that mask selects, drawn from the seed, the
// parameter, the step (-1: the initial Q) and the column: the same on
// every rank.
func (c *compressor) normalColumns(q []float32, mt psgdMat, mask uint64, step int) {
	for col := 0; col < mt.r; col++ {
		if mask&(1<<col) == 0 {
			continue
		}
		rng := rand.New(rand.NewPCG(c.cfg.Seed^0x9e3779b97f4a7c15, uint64(mt.param)<<32^uint64(int64(step))<<8^uint64(col)))
		for i := 0; i < mt.m; i++ {
			q[i*mt.r+col] = float32(rng.NormFloat64())
		}
	}
}

func (c *compressor) initQ(q []float32) {
	for _, mt := range c.mats {
		c.normalColumns(q[mt.qOff:mt.qOff+mt.m*mt.r], mt, math.MaxUint64, -1)
	}
}

// Views of matrix j.
func (c *compressor) gOf(j int) kernels.Tensor {
	mt := c.mats[j]
	return c.grads.Slice(mt.off, mt.n, mt.m)
}
func (c *compressor) eOf(j int) kernels.Tensor {
	mt := c.mats[j]
	return c.e.Slice(mt.eOff, mt.n, mt.m)
}
func (c *compressor) pOf(j int) kernels.Tensor {
	mt := c.mats[j]
	return c.p.Slice(mt.pOff, mt.n, mt.r)
}
func (c *compressor) qOf(j int) kernels.Tensor {
	mt := c.mats[j]
	return c.q.Slice(mt.qOff, mt.m, mt.r)
}

// phase1 computes each matrix's M = scale*G + E (in place, in the
// gradient buffer), keeps Q for a rollback, orthonormalises Q and computes
// P = M Q.
func (c *compressor) phase1(pb *psgdBucket, scale float32) {
	be := c.be
	for j := pb.mLo; j < pb.mHi; j++ {
		g := c.gOf(j)
		if scale != 1 {
			be.Scale(g, scale)
		}
		be.Axpy(g, 1, c.eOf(j))
	}
	be.Copy(c.qPrev.Slice(pb.qLo, pb.qHi-pb.qLo), c.q.Slice(pb.qLo, pb.qHi-pb.qLo))
	for j := pb.mLo; j < pb.mHi; j++ {
		q := c.qOf(j)
		be.Orthonormalize(q, powerSGDEps)
		be.Gemm(false, false, 1, c.gOf(j), q, 0, c.pOf(j))
	}
}

// phase2 orthonormalises the all-reduced P and computes Q = Mᵀ P.
func (c *compressor) phase2(pb *psgdBucket) {
	be := c.be
	for j := pb.mLo; j < pb.mHi; j++ {
		p := c.pOf(j)
		be.Orthonormalize(p, powerSGDEps)
		be.Gemm(true, false, 1, c.gOf(j), p, 0, c.qOf(j))
	}
}

// phase3 decompresses the all-reduced Q: E = M, G = out * P Qᵀ, E -=
// G/(world*out), so that E = M - (P Qᵀ)/world whether out is 1 (sum) or
// 1/world (average). After an overflow it restores Q and leaves E as it
// was (the step is skipped).
func (c *compressor) phase3(pb *psgdBucket, out float32, world int, overflow bool) {
	be := c.be
	if overflow {
		be.Copy(c.q.Slice(pb.qLo, pb.qHi-pb.qLo), c.qPrev.Slice(pb.qLo, pb.qHi-pb.qLo))
		return
	}
	for j := pb.mLo; j < pb.mHi; j++ {
		g, e := c.gOf(j), c.eOf(j)
		be.Copy(e, g)
		be.Gemm(false, true, out, c.pOf(j), c.qOf(j), 0, g)
		be.Axpy(e, -1/(float32(world)*out), g)
	}
}

// checkQ reports whether the all-reduced P and Q of pb (host bytes) hold
// an Inf or a NaN, and replaces every column of Q that came back all
// zeros (a column Orthonormalize dropped from P: the gradient has lower
// rank) by fresh normal values, so that warm-starting from it does not
// lose that column for good. Its P column is zero, so the decompressed
// gradient does not change; every rank sees the same Q and draws the
// same values.
func (c *compressor) checkQ(pb *psgdBucket, step int) (overflow bool) {
	p := collective.Float32s(c.pWire)[pb.pLo:pb.pHi]
	q := collective.Float32s(c.qWire)[pb.qLo:pb.qHi]
	if !finite(p) || !finite(q) {
		return true
	}
	for j := pb.mLo; j < pb.mHi; j++ {
		mt := c.mats[j]
		qj := q[mt.qOff-pb.qLo : mt.qOff-pb.qLo+mt.m*mt.r]
		var nonzero uint64
		for i := 0; i < mt.m; i++ {
			for col, v := range qj[i*mt.r : (i+1)*mt.r] {
				if v != 0 {
					nonzero |= 1 << col
				}
			}
		}
		if zero := ^nonzero & (1<<mt.r - 1); zero != 0 {
			c.normalColumns(qj, mt, zero, step)
		}
	}
	return false
}

// finite reports whether x holds no Inf or NaN.
func finite(x []float32) bool {
	var acc float32
	for _, v := range x {
		acc += v * 0
	}
	return acc == acc
}

// stats is the per-step byte counts of the compressed matrices.
func (c *compressor) stats() PowerSGDStats {
	st := PowerSGDStats{Matrices: len(c.mats), Bytes: 4 * int64(c.nP+c.nQ)}
	st.FP16Bytes = 2 * int64(c.nE)
	return st
}

// PowerSGDMatrices lists the matrices PowerSGD compresses (none without
// BucketConfig.PowerSGD), in parameter order: the order of the error
// buffer and of Q in PowerSGDState.
func (b *Bucketer) PowerSGDMatrices() []PowerSGDMatrix {
	if b.psgd == nil {
		return nil
	}
	out := make([]PowerSGDMatrix, len(b.psgd.mats))
	for j, mt := range b.psgd.mats {
		out[j] = PowerSGDMatrix{Param: mt.param, Name: b.params[mt.param].Name, Rows: mt.n, Cols: mt.m, Rank: mt.r}
	}
	return out
}

// PowerSGDState returns copies of this rank's error feedback (every
// compressed matrix's, in PowerSGDMatrices' order, row-major) and of Q
// (each matrix's m x r, the same on every rank): what a checkpoint keeps
// so that a resumed run continues exactly. Call it between steps (with
// AttachDevice on the device's goroutine).
func (b *Bucketer) PowerSGDState() (errs, q []float32, err error) {
	c, err := b.psgdIdle()
	if err != nil {
		return nil, nil, err
	}
	errs, q = make([]float32, c.nE), make([]float32, c.nQ)
	if c.nE > 0 {
		c.be.Download(errs, c.e)
	}
	if c.nQ > 0 {
		c.be.Download(q, c.q)
	}
	return errs, q, nil
}

// SetPowerSGDState replaces this rank's error feedback (nil: zeros) and
// Q (nil: kept), as PowerSGDState returned them. Between steps, as
// PowerSGDState.
func (b *Bucketer) SetPowerSGDState(errs, q []float32) error {
	c, err := b.psgdIdle()
	if err != nil {
		return err
	}
	if errs != nil && len(errs) != c.nE || q != nil && len(q) != c.nQ {
		return fmt.Errorf("bucketer: PowerSGD state of %d error and %d Q elements, want %d and %d", len(errs), len(q), c.nE, c.nQ)
	}
	if errs == nil {
		errs = make([]float32, c.nE)
	}
	if c.nE > 0 {
		c.be.Upload(c.e, errs)
	}
	if q != nil && c.nQ > 0 {
		c.be.Upload(c.q, q)
	}
	return nil
}

func (b *Bucketer) psgdIdle() (*compressor, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.psgd == nil:
		return nil, errors.New("bucketer: no PowerSGD configured")
	case !b.psgd.attached():
		return nil, errors.New("bucketer: PowerSGD state before gradients are attached")
	case b.st != nil:
		return nil, errors.New("bucketer: PowerSGD state during a step")
	}
	return b.psgd, nil
}

// SetStep tells the Bucketer the number (from 0) of the step about to
// run, which decides whether PowerSGD compresses it (from
// PowerSGD.StartStep on); every rank must give the same. Without it the
// Bucketer counts its communicating steps from 0 itself. A resumed run
// calls it with the step it resumes from.
func (b *Bucketer) SetStep(n int) {
	b.mu.Lock()
	b.stepNo = n
	b.mu.Unlock()
}
