package kerneltest

import (
	"fmt"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/half"
	"github.com/gorun/gorun/kernels"
)

// Mixed precision: a backend that trains with activations in F16 or BF16
// (Tolerance.Activations) is checked by the same table. Run hands such a
// backend every activation (the tensors that are not parameters, their
// gradients, optimizer state, LayerNorm's mean and rstd, or ids) in the
// half type, through halfActs below, and every value the table uploads is
// first rounded to that type, so the float64 references see exactly the
// inputs the backend sees. What is then measured is the backend's own
// arithmetic and the rounding of its outputs.

// FP16 is the tolerance for activations in float16 (10 explicit mantissa
// bits): each output is rounded once, to a relative 2^-11 (4.9e-4);
// attention rounds its scores, weights and output in turn.
func FP16() Tolerance {
	return Tolerance{F32: 2e-3, Gemm: 2e-3, Attention: 5e-3, Softmax: 2e-3, Activations: dtype.Float16}
}

// BF16 is the tolerance for activations in bfloat16 (7 explicit mantissa
// bits, a relative 2^-8 = 3.9e-3 per rounding).
func BF16() Tolerance {
	return Tolerance{F32: 1e-2, Gemm: 1e-2, Attention: 4e-2, Softmax: 1e-2, Activations: dtype.BFloat16}
}

// roundTo rounds x in place to the nearest value of type dt (F16 or BF16;
// F32 leaves it).
func roundTo(dt dtype.DType, x []float32) {
	switch dt {
	case dtype.Float16:
		for i, v := range x {
			x[i] = half.F16ToF32(half.F32ToF16(v))
		}
	case dtype.BFloat16:
		for i, v := range x {
			x[i] = half.BF16ToF32(half.F32ToBF16(v))
		}
	}
}

// halfActs presents a backend whose activations are in dt as one whose
// activations are F32: for each op it casts the F32 activations it is
// given to dt (one copy per storage, so aliases stay aliases), runs the
// op on the copies and casts them back. Parameters and the rest pass
// through. Gemm alternates between the two shapes training uses: a
// half-precision activation times a float32 weight into a half output,
// and two half-precision activations into a float32 weight gradient.
type halfActs struct {
	kernels.Backend
	dt    dtype.DType
	pairs []actPair
	gemms int
}

type actPair struct{ f, h, back kernels.Tensor }

// in returns t's copy in dt. An empty tensor (an absent output) stays as
// it is. A device tensor at an odd element offset of its allocation (its
// address 4 mod 8: allocations are aligned), such as the table's views at
// offsets 1 and 3, gets a copy at an odd offset too, whose address is not
// 4-byte aligned: the backend's kernels must then not move its 16-bit
// values as 32-bit pairs.
func (a *halfActs) in(t kernels.Tensor) kernels.Tensor {
	if t.Len() == 0 {
		return t
	}
	if t.DType != dtype.Float32 {
		panic(fmt.Sprintf("kerneltest: activation %v is not F32", t))
	}
	for _, p := range a.pairs {
		if p.f.Ptr == t.Ptr && p.f.Len() == t.Len() && (p.f.Ptr != 0 || &p.f.F32[0] == &t.F32[0]) {
			h := p.h
			h.Rank, h.Dims = t.Rank, t.Dims
			return h
		}
	}
	off := 0
	if t.Ptr%8 == 4 {
		off = 1
	}
	back := a.Backend.Alloc(a.dt, t.Len()+off)
	h := back.Slice(off, t.Shape()...)
	a.Backend.Cast(h, t)
	a.pairs = append(a.pairs, actPair{t, h, back})
	return h
}

// done casts every copy back into its F32 tensor and frees the copies.
func (a *halfActs) done() {
	for _, p := range a.pairs {
		a.Backend.Cast(p.f, p.h)
		a.Backend.Free(p.back)
	}
	a.pairs = a.pairs[:0]
}

func (a *halfActs) Gemm(transA, transB bool, alpha float32, x, y kernels.Tensor, beta float32, c kernels.Tensor) {
	a.gemms++
	if a.gemms%2 == 1 {
		a.Backend.Gemm(transA, transB, alpha, a.in(x), y, beta, a.in(c))
	} else {
		a.Backend.Gemm(transA, transB, alpha, a.in(x), a.in(y), beta, c)
	}
	a.done()
}

func (a *halfActs) AddBias(x, bias kernels.Tensor) {
	a.Backend.AddBias(a.in(x), bias)
	a.done()
}

func (a *halfActs) BiasGrad(dbias, dy kernels.Tensor) {
	a.Backend.BiasGrad(dbias, a.in(dy))
	a.done()
}

func (a *halfActs) BiasReLU(x, bias kernels.Tensor) {
	a.Backend.BiasReLU(a.in(x), bias)
	a.done()
}

func (a *halfActs) BiasReLUDropout(y, x, bias kernels.Tensor, p float32, seed uint64) {
	a.Backend.BiasReLUDropout(a.in(y), a.in(x), bias, p, seed)
	a.done()
}

func (a *halfActs) ResidualDropoutLayerNorm(out, y, mean, rstd, res, x, gamma, beta kernels.Tensor, p float32, seed uint64, eps float32) {
	a.Backend.ResidualDropoutLayerNorm(a.in(out), a.in(y), mean, rstd, a.in(res), a.in(x), gamma, beta, p, seed, eps)
	a.done()
}

func (a *halfActs) ReLUBackward(dx, y kernels.Tensor) {
	a.Backend.ReLUBackward(a.in(dx), a.in(y))
	a.done()
}

func (a *halfActs) LayerNorm(y, mean, rstd, x, gamma, beta kernels.Tensor, eps float32) {
	a.Backend.LayerNorm(a.in(y), mean, rstd, a.in(x), gamma, beta, eps)
	a.done()
}

func (a *halfActs) LayerNormBackward(dx, dgamma, dbeta, dy, x, mean, rstd, gamma kernels.Tensor) {
	a.Backend.LayerNormBackward(a.in(dx), dgamma, dbeta, a.in(dy), a.in(x), mean, rstd, gamma)
	a.done()
}

func (a *halfActs) Dropout(y, x kernels.Tensor, p float32, seed uint64) {
	a.Backend.Dropout(a.in(y), a.in(x), p, seed)
	a.done()
}

func (a *halfActs) DropoutBackward(dx, dy kernels.Tensor, p float32, seed uint64) {
	a.Backend.DropoutBackward(a.in(dx), a.in(dy), p, seed)
	a.done()
}

func (a *halfActs) ResidualDropout(out, res, y kernels.Tensor, p float32, seed uint64) {
	a.Backend.ResidualDropout(a.in(out), a.in(res), a.in(y), p, seed)
	a.done()
}

func (a *halfActs) Embedding(out, table, ids kernels.Tensor, scale float32, padID int32) {
	a.Backend.Embedding(a.in(out), table, ids, scale, padID)
	a.done()
}

func (a *halfActs) EmbeddingBackward(dtable, dout, ids kernels.Tensor, scale float32, padID int32) {
	a.Backend.EmbeddingBackward(dtable, a.in(dout), ids, scale, padID)
	a.done()
}

func (a *halfActs) AddPositional(x, pe kernels.Tensor, t0 int) {
	a.Backend.AddPositional(a.in(x), pe, t0)
	a.done()
}

func (a *halfActs) Attention(o, probs, q, k, v kernels.Tensor, args kernels.AttnArgs) {
	a.Backend.Attention(a.in(o), a.in(probs), a.in(q), a.in(k), a.in(v), args)
	a.done()
}

func (a *halfActs) AttentionBackward(dq, dk, dv, dprobs, do, q, k, v, probs kernels.Tensor, args kernels.AttnArgs) {
	a.Backend.AttentionBackward(a.in(dq), a.in(dk), a.in(dv), a.in(dprobs), a.in(do), a.in(q), a.in(k), a.in(v), a.in(probs), args)
	a.done()
}

func (a *halfActs) CrossEntropy(dlogits, logits, targets kernels.Tensor, ls float32, padID int32, gradScale float32) (float64, int) {
	sum, n := a.Backend.CrossEntropy(a.in(dlogits), a.in(logits), targets, ls, padID, gradScale)
	a.done()
	return sum, n
}

func (a *halfActs) LogSoftmax(out, x kernels.Tensor) {
	a.Backend.LogSoftmax(a.in(out), a.in(x))
	a.done()
}

func (a *halfActs) GatherRows(dst, src, idx kernels.Tensor, cols int) {
	a.Backend.GatherRows(a.in(dst), a.in(src), idx, cols)
	a.done()
}

func (a *halfActs) WriteStep(cache, x kernels.Tensor, t int) {
	a.Backend.WriteStep(a.in(cache), a.in(x), t)
	a.done()
}
