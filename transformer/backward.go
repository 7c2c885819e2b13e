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
