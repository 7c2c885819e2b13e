package transformer

import (
	"errors"

	"github.com/gorun/gorun/kernels"
)

// Backward computes the gradient of the last training Forward's loss into
// Grads (zeroed first unless AccumulateGrads is set). hook, if not nil, is
// called with a parameter's index as soon as its gradient is final; the
// indices come strictly decreasing, from len(Params)-1 down to 0 (the
// shared embedding, whose last contribution comes from the encoder input).
func (m *Model) Backward(hook func(param int)) error {
	if !m.haveGrad {
		return errors.New("transformer: Backward without a training Forward")
	}
	m.haveGrad = false
	be, c := m.be, m.Cfg
	d := c.DModel
	B, S, T := m.bt.B, m.bt.S, m.bt.T
	Ns, Nt := B*S, B*T
	w, g := m.w, m.g
	ready := func(i ...int) {
		if hook != nil {
			for _, j := range i {
				hook(j)
			}
		}
	}
	if !m.AccumulateGrads {
		be.Zero(m.Grads)
	}
	// softmax projection (tied to the embedding): logits = decOut E^T
	t0 := m.now()
	dlogits := m.logits.T
	m.gemm(true, false, dlogits, m.decOut.T, 1, g[m.emb])
	dout := m.scratch(0, Nt, d)
	m.gemm(false, false, dlogits, w[m.emb], 0, dout)
	dy := m.dy.shape(be, m.Activations, Nt, d)
	be.Zero(dy)
	be.LayerNormBackward(dy, g[m.decLN.g], g[m.decLN.b], dout, m.decX.T, m.decM.T, m.decR.T, w[m.decLN.g])
	ready(m.decLN.b, m.decLN.g)
	m.traced("softmax", "backward", t0)

	dEnc := m.dEnc.shape(be, m.Activations, Ns, d)
	be.Zero(dEnc)
	encOut := m.encOut.T
	keyLen := m.srcLen.T
	p := m.drop(c.PostDropout)
	for l := len(m.dec) - 1; l >= 0; l-- {
		t0 := m.now()
		a, L := &m.da[l], &m.dec[l]
		m.ffnBwd(dy, a.ln3.T, a.h.T, a.hd.T, Nt, L.ffn, decSite(l, 4), decSite(l, 5), ready)
		m.lnBwd(dy, a.mid2.T, a.m3.T, a.r3.T, L.ln3, Nt, ready)
		// encoder-decoder attention
		dctx := m.outBwd(dy, a.ctx2.T, L.cross.o, Nt, decSite(l, 3), ready)
		dq, dkv := m.scratch(2, Nt, d), m.scratch(3, 2, Ns, d)
		dk, dv := part(dkv, 0, Ns, d), part(dkv, 1, Ns, d)
		k2, v2 := part(a.kv2.T, 0, Ns, d), part(a.kv2.T, 1, Ns, d)
		args := m.attnArgs(B, T, S, keyLen, false, decSite(l, 2))
		be.AttentionBackward(dq.Reshape(B, T, d), dk.Reshape(B, S, d), dv.Reshape(B, S, d), m.dprobs.shape(be, m.Activations, B, c.Heads, T, S),
			dctx.Reshape(B, T, d), a.q2.T.Reshape(B, T, d), k2.Reshape(B, S, d), v2.Reshape(B, S, d), a.p2.T, args)
		// dW_k and dW_v in one product
		m.gemm(true, false, encOut, dkv, 1, m.attnStack(m.Grads, L.cross.k, 2))
		ready(L.cross.v, L.cross.k)
		m.gemm(false, true, dv, w[L.cross.v], 1, dEnc)
		m.gemm(false, true, dk, w[L.cross.k], 1, dEnc)
		m.gemm(true, false, a.ln2.T, dq, 1, g[L.cross.q])
		ready(L.cross.q)
		dln := m.scratch(1, Nt, d)
		m.gemm(false, true, dq, w[L.cross.q], 0, dln)
		be.LayerNormBackward(dy, g[L.ln2.g], g[L.ln2.b], dln, a.mid1.T, a.m2.T, a.r2.T, w[L.ln2.g])
		ready(L.ln2.b, L.ln2.g)
		// masked self-attention
		m.selfAttnBwd(dy, a.ln1.T, a.ctx.T, a.qkv.T, a.p1.T, L.self, B, T, kernels.Tensor{}, true, decSite(l, 0), decSite(l, 1), ready)
		m.lnBwd(dy, a.x.T, a.m1.T, a.r1.T, L.ln1, Nt, ready)
		m.traced(m.decNames[l], "backward", t0)
	}
	if p > 0 {
		be.DropoutBackward(dy, dy, p, m.site(decEmbSite))
	}
	be.EmbeddingBackward(g[m.emb], dy, m.dinIDs.T, m.embMul, PAD)

	// encoder
	dx := m.dx.shape(be, m.Activations, Ns, d)
	be.Zero(dx)
	be.LayerNormBackward(dx, g[m.encLN.g], g[m.encLN.b], dEnc, m.encX.T, m.encM.T, m.encR.T, w[m.encLN.g])
	ready(m.encLN.b, m.encLN.g)
	for l := len(m.enc) - 1; l >= 0; l-- {
		t0 := m.now()
		a, L := &m.ea[l], &m.enc[l]
		m.ffnBwd(dx, a.ln2.T, a.h.T, a.hd.T, Ns, L.ffn, encSite(l, 2), encSite(l, 3), ready)
		m.lnBwd(dx, a.mid.T, a.m2.T, a.r2.T, L.ln2, Ns, ready)
		m.selfAttnBwd(dx, a.ln1.T, a.ctx.T, a.qkv.T, a.p.T, L.att, B, S, keyLen, false, encSite(l, 0), encSite(l, 1), ready)
		m.lnBwd(dx, a.x.T, a.m1.T, a.r1.T, L.ln1, Ns, ready)
		m.traced(m.encNames[l], "backward", t0)
	}
	if p > 0 {
		be.DropoutBackward(dx, dx, p, m.site(0))
	}
	be.EmbeddingBackward(g[m.emb], dx, m.srcIDs.T, m.embMul, PAD)
	ready(m.emb)
	return nil
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

// lnBwd adds the layer norm's input gradient (its output gradient being in
// scratch 1) into the residual gradient dr.
func (m *Model) lnBwd(dr, x, mean, rstd kernels.Tensor, L lnP, N int, ready func(...int)) {
	m.be.LayerNormBackward(dr, m.g[L.g], m.g[L.b], m.scratch(1, N, m.Cfg.DModel), x, mean, rstd, m.w[L.g])
	ready(L.b, L.g)
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
