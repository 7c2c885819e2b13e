package transformer

import (
	"math"

	"github.com/gorun/gorun/kernels"
)

// The sublayers of the encoder and decoder layers, each a forward helper
// beside its backward one: the residual step and layer norm (residualNorm,
// lnBwd), self-attention (selfAttnFwd, selfAttnBwd, with outBwd for its
// output projection) and the feed-forward block (ffnFwd, ffnBwd).
// Forward and decodeTrain (forward.go) and Backward (backward.go) run
// them layer by layer. A forward helper returns the sublayer's output
// before its dropout and residual (the next residualNorm's); a backward
// helper takes the residual stream's gradient dr and leaves the gradient
// of the sublayer's input (its layer norm's output) in scratch 1.

// scratch returns view i of the model's scratch buffers.
func (m *Model) scratch(i int, dims ...int) kernels.Tensor {
	return m.scr[i].shape(m.be, m.Activations, dims...)
}

// norm is a layer norm's parameters and where it writes: its output, and
// the mean and rstd its backward reads.
type norm struct {
	y, mean, rstd *slot
	p             lnP
}

// encNorm is encoder layer l's input norm, or for l past the last layer
// the encoder's final norm; decNorm likewise in the decoder.
func (m *Model) encNorm(l int) norm {
	if l < len(m.enc) {
		a := &m.ea[l]
		return norm{&a.ln1, &a.m1, &a.r1, m.enc[l].ln1}
	}
	return norm{&m.encOut, &m.encM, &m.encR, m.encLN}
}

func (m *Model) decNorm(l int) norm {
	if l < len(m.dec) {
		a := &m.da[l]
		return norm{&a.ln1, &a.m1, &a.r1, m.dec[l].ln1}
	}
	return norm{&m.decOut, &m.decM, &m.decR, m.decLN}
}

func (m *Model) seedOf(p float32, site int) uint64 {
	if p > 0 {
		return m.site(site)
	}
	return 0
}

// residualNorm is the step between two sublayers, as one op
// (ResidualDropoutLayerNorm, one kernel on a GPU): the residual connection
// out = res + dropout(y) (without res, the embeddings' out = dropout(y)),
// and n's layer norm of out, the next sublayer's input, which it returns.
func (m *Model) residualNorm(out, res, y kernels.Tensor, p float32, site int, n norm, N int) kernels.Tensor {
	be, d := m.be, m.Cfg.DModel
	ln := n.y.shape(be, m.Activations, N, d)
	be.ResidualDropoutLayerNorm(out, ln, n.mean.shape(be, f32, N), n.rstd.shape(be, f32, N), res, y,
		m.w[n.p.g], m.w[n.p.b], p, m.seedOf(p, site), m.Cfg.LNEps)
	return ln
}

// lnBwd adds the layer norm's input gradient (its output gradient being in
// scratch 1) into the residual gradient dr.
func (m *Model) lnBwd(dr, x, mean, rstd kernels.Tensor, L lnP, N int, ready func(...int)) {
	m.be.LayerNormBackward(dr, m.g[L.g], m.g[L.b], m.scratch(1, N, m.Cfg.DModel), x, mean, rstd, m.w[L.g])
	ready(L.b, L.g)
}

func (m *Model) attnArgs(B, Sq, Sk int, keyLen kernels.Tensor, causal bool, site int) kernels.AttnArgs {
	c := m.Cfg
	dh := c.DModel / c.Heads
	a := kernels.AttnArgs{B: B, H: c.Heads, Sq: Sq, Sk: Sk, Dh: dh, KeyLen: keyLen, Causal: causal,
		Scale: float32(1 / math.Sqrt(float64(dh))), Dropout: m.drop(c.AttnDropout)}
	if a.Dropout > 0 {
		a.Seed = m.site(site)
	}
	return a
}

// selfAttnFwd runs a self-attention block on the layer-norm output x
// [B*S, d]: Q, K and V in one product into qkv [3, B*S, d], the attention
// into ctx (its probabilities into probs), and returns ctx Wo in scratch 0.
func (m *Model) selfAttnFwd(qkv, ctx, probs *slot, x kernels.Tensor, L attnP, B, S int, keyLen kernels.Tensor, causal bool, site int) kernels.Tensor {
	be, c := m.be, m.Cfg
	d := c.DModel
	N := B * S
	qkvT := qkv.shape(be, m.Activations, 3, N, d)
	m.gemm(false, false, x, m.attnStack(m.Weights, L.q, 3), 0, qkvT)
	q, k, v := part(qkvT, 0, N, d), part(qkvT, 1, N, d), part(qkvT, 2, N, d)
	ctxT := ctx.shape(be, m.Activations, N, d)
	args := m.attnArgs(B, S, S, keyLen, causal, site)
	be.Attention(ctxT.Reshape(B, S, d), probs.shape(be, m.Activations, B, c.Heads, S, S), q.Reshape(B, S, d), k.Reshape(B, S, d), v.Reshape(B, S, d), args)
	y := m.scratch(0, N, d)
	m.gemm(false, false, ctxT, m.w[L.o], 0, y)
	return y
}

// selfAttnBwd back-propagates a self-attention block whose input is the
// layer-norm output x and whose Q, K, V are qkv [3, N, d]; it leaves d(x)
// in scratch 1.
func (m *Model) selfAttnBwd(dr, x, ctx, qkv, probs kernels.Tensor, L attnP, B, S int, keyLen kernels.Tensor, causal bool, wSite, oSite int, ready func(...int)) {
	be, c := m.be, m.Cfg
	d := c.DModel
	N := B * S
	w := m.w
	dctx := m.outBwd(dr, ctx, L.o, N, oSite, ready)
	dqkv := m.scratch(2, 3, N, d)
	dq, dk, dv := part(dqkv, 0, N, d), part(dqkv, 1, N, d), part(dqkv, 2, N, d)
	q, k, v := part(qkv, 0, N, d), part(qkv, 1, N, d), part(qkv, 2, N, d)
	args := m.attnArgs(B, S, S, keyLen, causal, wSite)
	be.AttentionBackward(dq.Reshape(B, S, d), dk.Reshape(B, S, d), dv.Reshape(B, S, d), m.dprobs.shape(be, m.Activations, B, c.Heads, S, S),
		dctx.Reshape(B, S, d), q.Reshape(B, S, d), k.Reshape(B, S, d), v.Reshape(B, S, d), probs, args)
	// dW_q, dW_k and dW_v in one product
	m.gemm(true, false, x, dqkv, 1, m.attnStack(m.Grads, L.q, 3))
	ready(L.v, L.k, L.q)
	dx := m.scratch(1, N, d)
	m.gemm(false, true, dq, w[L.q], 0, dx)
	m.gemm(false, true, dk, w[L.k], 1, dx)
	m.gemm(false, true, dv, w[L.v], 1, dx)
}

// outBwd handles out = res + drop(ctx Wo): accumulates dWo and returns
// d(ctx) in scratch 1.
func (m *Model) outBwd(dr, ctx kernels.Tensor, o int, N, site int, ready func(...int)) kernels.Tensor {
	be, c := m.be, m.Cfg
	dyo := m.scratch(0, N, c.DModel)
	if p := m.drop(c.PostDropout); p > 0 {
		be.DropoutBackward(dyo, dr, p, m.site(site))
	} else {
		be.Copy(dyo, dr)
	}
	m.gemm(true, false, ctx, dyo, 1, m.g[o])
	ready(o)
	dctx := m.scratch(1, N, c.DModel)
	m.gemm(false, true, dyo, m.w[o], 0, dctx)
	return dctx
}

// ffnFwd runs the feed-forward block on the layer-norm output x: relu(x W1
// + b1) into h and its dropout into hd (hd is h itself when dropout is
// off), and returns hd W2 + b2 in scratch 0.
func (m *Model) ffnFwd(h, hd *slot, x kernels.Tensor, N, F int, L ffnP, site int) kernels.Tensor {
	be := m.be
	ht := h.shape(be, m.Activations, N, F)
	m.gemm(false, false, x, m.w[L.w1], 0, ht)
	t := ht
	if p := m.drop(m.Cfg.ReLUDropout); p == 0 {
		be.BiasReLU(ht, m.w[L.b1])
		hd.T = ht
	} else {
		t = hd.shape(be, m.Activations, N, F)
		be.BiasReLUDropout(t, ht, m.w[L.b1], p, m.site(site))
	}
	y := m.scratch(0, N, m.Cfg.DModel)
	m.gemm(false, false, t, m.w[L.w2], 0, y)
	be.AddBias(y, m.w[L.b2])
	return y
}

// ffnBwd: the residual stream gradient dr holds d(out) where
// out = res + drop(relu(x W1 + b1)' W2 + b2); it accumulates the FFN's
// parameter gradients and leaves d(ln output) in scratch 1.
func (m *Model) ffnBwd(dr, x, h, hd kernels.Tensor, N int, L ffnP, reluSite, outSite int, ready func(...int)) {
	be, c := m.be, m.Cfg
	w, g := m.w, m.g
	dy2 := m.scratch(0, N, c.DModel)
	p := m.drop(c.PostDropout)
	if p > 0 {
		be.DropoutBackward(dy2, dr, p, m.site(outSite))
	} else {
		be.Copy(dy2, dr)
	}
	be.BiasGrad(g[L.b2], dy2)
	m.gemm(true, false, hd, dy2, 1, g[L.w2])
	ready(L.b2, L.w2)
	dh := m.dh.shape(be, m.Activations, N, c.FFN)
	m.gemm(false, true, dy2, w[L.w2], 0, dh)
	if rp := m.drop(c.ReLUDropout); rp > 0 {
		be.DropoutBackward(dh, dh, rp, m.site(reluSite))
	}
	be.ReLUBackward(dh, h)
	be.BiasGrad(g[L.b1], dh)
	m.gemm(true, false, x, dh, 1, g[L.w1])
	ready(L.b1, L.w1)
	m.gemm(false, true, dh, w[L.w1], 0, m.scratch(1, N, c.DModel))
}
