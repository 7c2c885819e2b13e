package plan

import (
	"fmt"

	"github.com/gorun/gorun/dtype"
)

// DefaultPowerSGDRank is PowerSGD's rank R (the columns of P and Q) when
// none is given, as measured (docs/fusion.md, "Convergence"). It is
// fusion.DefaultPowerSGDRank, the compressor's
// (plan sits below fusion, on collective/algo's cost model alone, and does
// not import it; cmd/nmt-train's tests hold the two equal).
const DefaultPowerSGDRank = 16

// PowerSGDMinCompressionRate is how many times fewer elements P and Q
// must have than the matrix they stand for (PyTorch DDP's
// min_compression_rate, 2; fusion.DefaultPowerSGDMinRate): a matrix that
// would save less goes with the uncompressed tensors.
const PowerSGDMinCompressionRate = 2

// AsMatrix is a parameter of the given shape as PowerSGD sees it: its
// first dimension the rows, the product of the others the columns
// (PyTorch's view(shape[0], -1)). ok is false for tensors of fewer than
// two dimensions (biases, LayerNorm), which are never compressed.
func AsMatrix(shape []int) (rows, cols int, ok bool) {
	if len(shape) < 2 {
		return 0, 0, false
	}
	cols = 1
	for _, d := range shape[1:] {
		cols *= d
	}
	return shape[0], cols, true
}

// PowerSGDCompresses says whether PowerSGD of rank r compresses an n x m
// matrix, as the compressor (fusion) and DDP's _should_compress decide:
// its n·m elements more than PowerSGDMinCompressionRate times the
// (n + m)·r' of P (n x r') and Q (m x r'), r' = PowerSGDColumns(n, m, r).
// A matrix exactly on the boundary is not compressed.
func PowerSGDCompresses(n, m, r int) bool {
	r = PowerSGDColumns(n, m, r)
	return n > 0 && m > 0 && r > 0 && int64(n)*int64(m) > PowerSGDMinCompressionRate*int64(n+m)*int64(r)
}

// PowerSGDColumns is the columns of an n x m matrix's P and Q at rank r:
// min(r, n, m).
func PowerSGDColumns(n, m, r int) int { return min(r, n, m) }

// powerSGDPhases is the compressor's extra work on one compressed n x m
// matrix with r columns per step, as fusion's compressor does it, split by
// when it runs: before P's allreduce (M += E, orthonormalise Q, P = M Q),
// between it and Q's (orthonormalise P, Q = Mᵀ P), after Q's (E = M,
// G = P Qᵀ, E −= G). In all: the three products (2nmr each), the error
// feedback (3nm) and Gram-Schmidt of Q and P (2mr² and 2nr²).
func powerSGDPhases(n, m, r int) [3]float64 {
	N, M, R := float64(n), float64(m), float64(r)
	return [3]float64{N*M + 2*M*R*R + 2*N*M*R, 2*N*R*R + 2*N*M*R, 2*N*M + 2*N*M*R}
}

// StepFLOPs is a Transformer training step's work, about 6 FLOPs per
// parameter per token (2 forward, 4 backward; the attention scores left
// out).
func StepFLOPs(params int64, tokens float64) float64 { return 6 * float64(params) * tokens }

// ComputeFromFLOPs is the time of flops of extra work on a device whose
// step of stepFLOPs takes computeS: the step's rate of FLOPs applied to
// them. A lower bound for PowerSGD's products, which have r columns and
// read their matrix once for 2r FLOPs a element: bound by memory
// bandwidth, not by the rate of the step's wide products.
func ComputeFromFLOPs(computeS, flops, stepFLOPs float64) float64 {
	if !(stepFLOPs > 0) {
		return 0
	}
	return computeS * flops / stepFLOPs
}

// PowerSGDBucket is what PowerSGD sends for one fusion bucket: one
// allreduce of the tensors it leaves uncompressed (in Workload.Wire, as
// every bucket without PowerSGD), then P of every compressed matrix of
// the bucket in float32, then Q in float32, one after the other.
type PowerSGDBucket struct {
	Matrices, Tensors int // compressed matrices; tensors left uncompressed
	Elems             int // the compressed matrices' elements
	// RestBytes: float32 bytes of the tensors left uncompressed; PBytes,
	// QBytes: float32 bytes of P (n x r of each matrix) and Q (m x r).
	RestBytes, PBytes, QBytes int
	// Phases: the compressor's FLOPs before P's allreduce, between P's
	// and Q's, and after Q's.
	Phases [3]float64
}

// FLOPs is the compressor's extra work on the bucket per step.
func (b PowerSGDBucket) FLOPs() float64 { return b.Phases[0] + b.Phases[1] + b.Phases[2] }

// WireBytes is the bytes of the bucket's allreduces, the uncompressed
// tensors in rest (the run's fp16, bf16 or fp32).
func (b PowerSGDBucket) WireBytes(rest dtype.DType) int {
	return b.RestBytes/4*rest.Size() + b.PBytes + b.QBytes
}

// PowerSGD is a step's gradients compressed by PowerSGD of rank Rank.
type PowerSGD struct {
	Rank int
	// Buckets: one for each of Workload.Buckets, in the same order.
	Buckets []PowerSGDBucket
	// ComputeS is the compressor's extra work per step, on the same
	// footing as Workload.ComputeS (one rank, its threads): measured, or
	// ComputeFromFLOPs of FLOPs(). The plan spreads it over the buckets
	// and phases in proportion to their FLOPs.
	ComputeS float64
	// StartStep: the first step PowerSGD compresses (before it, the
	// buckets go as they would without it); the plan is of the steps
	// from it on.
	StartStep int
}

// FLOPs is the compressor's extra work per step.
func (p *PowerSGD) FLOPs() float64 {
	s := 0.0
	for _, b := range p.Buckets {
		s += b.FLOPs()
	}
	return s
}

// WireBytes is a step's bytes of allreduces, the uncompressed tensors in
// rest.
func (p *PowerSGD) WireBytes(rest dtype.DType) int {
	s := 0
	for _, b := range p.Buckets {
		s += b.WireBytes(rest)
	}
	return s
}

// Totals counts the matrices compressed and their elements, and the
// tensors left alone and theirs.
func (p *PowerSGD) Totals() (matrices, elems, tensors, restElems int) {
	for _, b := range p.Buckets {
		matrices += b.Matrices
		elems += b.Elems
		tensors += b.Tensors
		restElems += b.RestBytes / 4
	}
	return matrices, elems, tensors, restElems
}

// SplitBuckets assigns parameters (their shapes, in the order the model
// registers them) to fusion buckets of the given float32 bytes, in the
// order they leave: bucket 0 takes the last parameters (backward's first
// gradients) up to its bytes, and so on, as the Bucketer cuts them. The
// bytes must add up to the parameters' and fall between them.
func SplitBuckets(shapes [][]int, buckets []int) ([][][]int, error) {
	out := make([][][]int, len(buckets))
	i := len(shapes) - 1
	for k, b := range buckets {
		have := 0
		for have < b && i >= 0 {
			n := 1
			for _, d := range shapes[i] {
				n *= d
			}
			out[k] = append([][]int{shapes[i]}, out[k]...)
			have += 4 * n
			i--
		}
		if have != b {
			return nil, fmt.Errorf("%w: bucket %d of %d bytes does not end at a parameter's end (%d bytes there)", errInput, k, b, have)
		}
	}
	if i >= 0 {
		return nil, fmt.Errorf("%w: %d parameters left over after %d buckets", errInput, i+1, len(buckets))
	}
	return out, nil
}

// NewPowerSGD is PowerSGD of rank r on parameters of the given shapes (in
// the order the model registers them) cut into buckets of the given
// float32 bytes (Workload.Buckets). ComputeS is left for the caller.
func NewPowerSGD(shapes [][]int, buckets []int, r int) (*PowerSGD, error) {
	if r < 1 {
		return nil, fmt.Errorf("%w: PowerSGD rank %d: want at least 1", errInput, r)
	}
	split, err := SplitBuckets(shapes, buckets)
	if err != nil {
		return nil, err
	}
	p := &PowerSGD{Rank: r, Buckets: make([]PowerSGDBucket, len(split))}
	for k, ps := range split {
		b := &p.Buckets[k]
		for _, s := range ps {
			n, m, ok := AsMatrix(s)
			if !ok || !PowerSGDCompresses(n, m, r) {
				e := 1
				for _, d := range s {
					e *= d
				}
				b.Tensors++
				b.RestBytes += 4 * e
				continue
			}
			rc := PowerSGDColumns(n, m, r)
			b.Matrices++
			b.Elems += n * m
			b.PBytes += 4 * n * rc
			b.QBytes += 4 * m * rc
			ph := powerSGDPhases(n, m, rc)
			for j := range ph {
				b.Phases[j] += ph[j]
			}
		}
	}
	return p, nil
}
