package cuda

import (
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/kernels"
)

// Attention on the GPU: the heads are split out of the [B, S, H*Dh]
// activations into [B*H, S, Dh] blocks so that each matrix product of the
// B*H heads is one strided-batched cuBLAS call, and merged back after.
// The CPU backend reads the heads in place instead; the results agree to
// rounding.

// attnScratch holds the per-head copies, grown to the largest call.
type attnScratch struct {
	qh, kh, vh, oh, pd, dqh, dkh, dvh kernels.Tensor
}

// buf returns a scratch tensor of n elements of type dt in *t,
// reallocating it when too small or of another type.
func (b *Backend) buf(t *kernels.Tensor, dt dtype.DType, n int) kernels.Tensor {
	if t.Len() < n || t.Rank == 0 || t.DType != dt {
		if t.Rank > 0 {
			b.Free(*t)
		}
		*t = b.Alloc(dt, n+n/4+1)
	}
	return t.Slice(0, n)
}

func (b *Backend) split(dst kernels.Tensor, src kernels.Tensor, B, S, H, Dh, srcS int) {
	b.kern(kSplitHeads.of(src.DType)).ptr(b.devA(dst, src.DType, "heads")).ptr(b.devA(src, src.DType, "attention input")).i32(B).i32(S).i32(H).i32(Dh).i32(srcS).flat(B * H * S * Dh)
}

func (b *Backend) merge(dst kernels.Tensor, src kernels.Tensor, B, S, H, Dh, dstS int) {
	b.kern(kMergeHeads.of(src.DType)).ptr(b.devA(dst, src.DType, "attention output")).ptr(b.devA(src, src.DType, "heads")).i32(B).i32(S).i32(H).i32(Dh).i32(dstS).flat(B * H * S * Dh)
}

// bgemm is one strided-batched product over the B*H heads of row-major
// matrices, each packed contiguously.
func (b *Backend) bgemm(transA, transB bool, m, n, k int, alpha float32, a, bm, c kernels.Tensor, batch int) {
	g := gemmCall{transA: transA, transB: transB, m: m, n: n, k: k, a: a, b: bm, c: c, alpha: alpha, batch: batch,
		sa: m * k, sb: k * n, sc: m * n}
	g.lda, g.ldb, g.ldc = k, n, n
	if transA {
		g.lda = m
	}
	if transB {
		g.ldb = k
	}
	b.gemm(&g)
}

// heads splits q, k and v into the per-head scratch buffers.
func (b *Backend) heads(q, k, v kernels.Tensor, a kernels.AttnArgs, skCap int) (qh, kh, vh kernels.Tensor) {
	s := &b.attn
	BH := a.B * a.H
	dt := q.DType
	qh, kh, vh = b.buf(&s.qh, dt, BH*a.Sq*a.Dh), b.buf(&s.kh, dt, BH*a.Sk*a.Dh), b.buf(&s.vh, dt, BH*a.Sk*a.Dh)
	b.split(qh, q, a.B, a.Sq, a.H, a.Dh, a.Sq)
	b.split(kh, k, a.B, a.Sk, a.H, a.Dh, skCap)
	b.split(vh, v, a.B, a.Sk, a.H, a.Dh, skCap)
	return qh, kh, vh
}

func (b *Backend) keyLen(a kernels.AttnArgs) uintptr {
	if a.KeyLen.Rank > 0 {
		return b.devI32(a.KeyLen, "KeyLen")
	}
	return 0
}

// Attention implements kernels.Backend.
func (b *Backend) Attention(o, probs, q, k, v kernels.Tensor, a kernels.AttnArgs) {
	skCap := a.MustCheck("cuda", o, probs, q, k, v)
	b.wrote(o, probs)
	B, H, Sq, Sk, Dh := a.B, a.H, a.Sq, a.Sk, a.Dh
	BH := B * H
	if BH == 0 || Sq == 0 {
		return
	}
	s := &b.attn
	qh, kh, vh := b.heads(q, k, v, a, skCap)
	dt := q.DType
	P := probs
	b.devA(P, dt, "probs")
	b.devA(o, dt, "o")
	b.bgemm(false, true, Sq, Sk, Dh, a.Scale, qh, kh, P, BH)
	b.kern(kAttnSoftmax.of(dt)).ptr(P.Ptr).ptr(b.keyLen(a)).i32(B).i32(H).i32(Sq).i32(Sk).i32(boolInt(a.Causal)).rows(BH*Sq, Sk)
	pd := b.droppedProbs(P, a)
	oh := b.buf(&s.oh, dt, BH*Sq*Dh)
	b.bgemm(false, false, Sq, Dh, Sk, 1, pd, vh, oh, BH)
	b.merge(o, oh, B, Sq, H, Dh, Sq)
}

// AttentionBackward implements kernels.Backend.
func (b *Backend) AttentionBackward(dq, dk, dv, dprobs, do, q, k, v, probs kernels.Tensor, a kernels.AttnArgs) {
	skCap := a.MustCheck("cuda", do, probs, q, k, v)
	sameLen(dprobs, probs, "AttentionBackward dprobs")
	sameLen(dq, q, "AttentionBackward dq")
	sameLen(dk, k, "AttentionBackward dk")
	sameLen(dv, v, "AttentionBackward dv")
	b.wrote(dq, dk, dv, dprobs)
	B, H, Sq, Sk, Dh := a.B, a.H, a.Sq, a.Sk, a.Dh
	BH := B * H
	if BH == 0 || Sq == 0 {
		return
	}
	s := &b.attn
	qh, kh, vh := b.heads(q, k, v, a, skCap)
	dt := q.DType
	doh := b.buf(&s.oh, dt, BH*Sq*Dh)
	b.split(doh, do, B, Sq, H, Dh, Sq)
	P, dP := probs, dprobs
	b.devA(P, dt, "probs")
	b.devA(dP, dt, "dprobs")
	pd := b.droppedProbs(P, a)
	dqh, dkh, dvh := b.buf(&s.dqh, dt, BH*Sq*Dh), b.buf(&s.dkh, dt, BH*Sk*Dh), b.buf(&s.dvh, dt, BH*Sk*Dh)
	// dPd = dO V^T; dV = Pd^T dO
	b.bgemm(false, true, Sq, Sk, Dh, 1, doh, vh, dP, BH)
	b.bgemm(true, false, Sk, Dh, Sq, 1, pd, doh, dvh, BH)
	if a.Dropout > 0 {
		b.dropout(dt, dP.Ptr, 0, dP.Ptr, dP.Len(), a.Dropout, a.Seed)
	}
	b.kern(kAttnSoftmaxBwd.of(dt)).ptr(dP.Ptr).ptr(P.Ptr).i32(BH*Sq).i32(Sk).rows(BH*Sq, Sk)
	// dQ = scale dS K; dK = scale dS^T Q
	b.bgemm(false, false, Sq, Dh, Sk, a.Scale, dP, kh, dqh, BH)
	b.bgemm(true, false, Sk, Dh, Sq, a.Scale, dP, qh, dkh, BH)
	b.merge(dq, dqh, B, Sq, H, Dh, Sq)
	b.merge(dk, dkh, B, Sk, H, Dh, skCap)
	b.merge(dv, dvh, B, Sk, H, Dh, skCap)
}

// droppedProbs is the attention weights P after dropout (regenerated from
// a.Seed, the same mask in forward and backward), in scratch; P itself
// when there is no dropout.
func (b *Backend) droppedProbs(P kernels.Tensor, a kernels.AttnArgs) kernels.Tensor {
	if a.Dropout <= 0 {
		return P
	}
	pd := b.buf(&b.attn.pd, P.DType, P.Len())
	b.dropout(P.DType, pd.Ptr, 0, P.Ptr, P.Len(), a.Dropout, a.Seed)
	return pd
}

func boolInt(v bool) int {
	if v {
		return 1
	}
	return 0
}
