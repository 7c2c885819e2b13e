package transformer

import (
	"fmt"
	"math"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/kernels"
)

const f32 = dtype.Float32

// dropout site numbers (see site): encoder embedding 0, encoder layer l
// 1+4l+{0 attention weights, 1 attention output, 2 relu, 3 ffn output};
// decoder embedding 1<<20, decoder layer l 1<<20+1+8l+{0 self weights,
// 1 self output, 2 cross weights, 3 cross output, 4 relu, 5 ffn output}.
func encSite(l, j int) int { return 1 + 4*l + j }
func decSite(l, j int) int { return 1<<20 + 1 + 8*l + j }

const decEmbSite = 1 << 20

// Forward runs the model on a batch and returns the loss. With train set,
// dropout is on and the gradient of the loss with respect to the logits is
// kept for Backward. The loss is the mean over non-pad target tokens.
func (m *Model) Forward(b *Batch, train bool) (Loss, error) {
	if err := b.Validate(m.Cfg.Vocab); err != nil {
		return Loss{}, err
	}
	be, c := m.be, m.Cfg
	B, S, T := b.B, b.S, b.T
	Nt := B * T
	m.bt = *b
	m.train = train
	m.haveGrad = false
	if train {
		m.stepSeed = mix(m.Seed ^ mix(m.DropoutStep))
		m.DropoutStep++
	}
	m.positional(max(S, T))
	m.encode(b.Src, B, S)

	// decoder input: target shifted right, PAD (zero embedding) first.
	din := m.dinIDs.shape(be, dtype.Int32, B, T)
	tgt := m.tgtIDs.shape(be, dtype.Int32, Nt)
	if cap(m.hostIDs) < Nt {
		m.hostIDs = make([]int32, Nt)
	}
	host := m.hostIDs[:Nt]
	tokens := 0
	for i := 0; i < B; i++ {
		host[i*T] = PAD
		copy(host[i*T+1:(i+1)*T], b.Tgt[i*T:(i+1)*T-1])
		for _, id := range b.Tgt[i*T : (i+1)*T] {
			if id != PAD {
				tokens++
			}
		}
	}
	if tokens == 0 {
		return Loss{}, fmt.Errorf("transformer: batch has no target tokens")
	}
	m.tokens = tokens
	be.UploadI32(din, host)
	be.UploadI32(tgt, b.Tgt)
	m.decodeTrain(B, S, T)

	t0 := m.now()
	E := m.w[m.emb]
	logits := m.logits.shape(be, m.Activations, Nt, c.Vocab)
	m.gemm(false, true, m.decOut.T, E, 0, logits)
	var dl kernels.Tensor
	if train {
		dl = logits
	}
	gs := 1 / float32(tokens)
	if m.LossScale > 0 {
		gs *= m.LossScale
	}
	if ds, ok := be.(kernels.DeferredScalars); ok && m.DeferLoss && train {
		ds.CrossEntropySum(dl, logits, tgt, c.LabelSmoothing, PAD, gs)
		m.haveGrad = true
		m.traced("softmax", "forward", t0)
		return Loss{Raw: math.NaN(), Lab: math.NaN(), Tokens: tokens}, nil
	}
	sum, n := be.CrossEntropy(dl, logits, tgt, c.LabelSmoothing, PAD, gs)
	m.haveGrad = train
	m.traced("softmax", "forward", t0)
	raw := sum / float64(n)
	return Loss{Raw: raw, Lab: raw - SmoothedEntropy(c.Vocab, float64(c.LabelSmoothing)), Tokens: n}, nil
}

// sourceLengths uploads the per-sentence source lengths (number of
// non-pad ids; sentences are right-padded).
func (m *Model) sourceLengths(src []int32, B, S int) kernels.Tensor {
	if cap(m.srcLenI32) < B {
		m.srcLenI32 = make([]int32, B)
	}
	h := m.srcLenI32[:B]
	for i := 0; i < B; i++ {
		n := int32(0)
		for j, id := range src[i*S : (i+1)*S] {
			if id != PAD {
				n = int32(j + 1)
			}
		}
		h[i] = n
	}
	t := m.srcLen.shape(m.be, dtype.Int32, B)
	m.be.UploadI32(t, h)
	return t
}

// encode runs the encoder on src [B][S]; the result is m.encOut.T [B*S, d].
// A layer's input norm is computed with its input, by the step before it
// (residualNorm): the embeddings' dropout for the first layer, the last
// residual of the layer before for the others.
func (m *Model) encode(src []int32, B, S int) {
	be, c := m.be, m.Cfg
	d, F := c.DModel, c.FFN
	N := B * S
	ids := m.srcIDs.shape(be, dtype.Int32, B, S)
	be.UploadI32(ids, src)
	keyLen := m.sourceLengths(src, B, S)
	x := m.ea[0].x.shape(be, m.Activations, N, d)
	be.Embedding(x, m.w[m.emb], ids, m.embMul, PAD)
	be.AddPositional(x.Reshape(B, S, d), m.pe, 0)
	p := m.drop(c.PostDropout)
	m.residualNorm(x, kernels.Tensor{}, x, p, 0, m.encNorm(0), N)
	for l := range m.enc {
		t0 := m.now()
		a, L := &m.ea[l], &m.enc[l]
		x, ln1 := a.x.T, a.ln1.T
		// self-attention
		y := m.selfAttnFwd(&a.qkv, &a.ctx, &a.p, ln1, L.att, B, S, keyLen, false, encSite(l, 0))
		// residual, and the feed-forward block's input norm
		mid := a.mid.shape(be, m.Activations, N, d)
		ln2 := m.residualNorm(mid, x, y, p, encSite(l, 1), norm{&a.ln2, &a.m2, &a.r2, L.ln2}, N)
		y2 := m.ffnFwd(&a.h, &a.hd, ln2, N, F, L.ffn, encSite(l, 2))
		// residual: the next layer's input (or the final norm's), and its norm
		out := &m.encX
		if l+1 < len(m.enc) {
			out = &m.ea[l+1].x
		}
		m.residualNorm(out.shape(be, m.Activations, N, d), mid, y2, p, encSite(l, 3), m.encNorm(l+1), N)
		m.traced(m.encNames[l], "forward", t0)
	}
}

// decodeTrain runs the decoder over the whole (teacher-forced) target;
// input norms as in encode.
func (m *Model) decodeTrain(B, S, T int) {
	be, c := m.be, m.Cfg
	d, F := c.DModel, c.FFN
	Nt, Ns := B*T, B*S
	w := m.w
	keyLen := m.srcLen.T
	x := m.da[0].x.shape(be, m.Activations, Nt, d)
	be.Embedding(x, w[m.emb], m.dinIDs.T, m.embMul, PAD)
	be.AddPositional(x.Reshape(B, T, d), m.pe, 0)
	p := m.drop(c.PostDropout)
	m.residualNorm(x, kernels.Tensor{}, x, p, decEmbSite, m.decNorm(0), Nt)
	encOut := m.encOut.T
	for l := range m.dec {
		t0 := m.now()
		a, L := &m.da[l], &m.dec[l]
		x, ln1 := a.x.T, a.ln1.T
		// masked self-attention
		y := m.selfAttnFwd(&a.qkv, &a.ctx, &a.p1, ln1, L.self, B, T, kernels.Tensor{}, true, decSite(l, 0))
		mid1 := a.mid1.shape(be, m.Activations, Nt, d)
		ln2 := m.residualNorm(mid1, x, y, p, decSite(l, 1), norm{&a.ln2, &a.m2, &a.r2, L.ln2}, Nt)
		// encoder-decoder attention: K and V of the encoder output in one
		// product
		q2 := a.q2.shape(be, m.Activations, Nt, d)
		m.gemm(false, false, ln2, w[L.cross.q], 0, q2)
		kv2 := a.kv2.shape(be, m.Activations, 2, Ns, d)
		m.gemm(false, false, encOut, m.attnStack(m.Weights, L.cross.k, 2), 0, kv2)
		k2, v2 := part(kv2, 0, Ns, d), part(kv2, 1, Ns, d)
		ctx2 := a.ctx2.shape(be, m.Activations, Nt, d)
		args := m.attnArgs(B, T, S, keyLen, false, decSite(l, 2))
		be.Attention(ctx2.Reshape(B, T, d), a.p2.shape(be, m.Activations, B, c.Heads, T, S), q2.Reshape(B, T, d), k2.Reshape(B, S, d), v2.Reshape(B, S, d), args)
		y = m.scratch(0, Nt, d)
		m.gemm(false, false, ctx2, w[L.cross.o], 0, y)
		mid2 := a.mid2.shape(be, m.Activations, Nt, d)
		ln3 := m.residualNorm(mid2, mid1, y, p, decSite(l, 3), norm{&a.ln3, &a.m3, &a.r3, L.ln3}, Nt)
		// feed-forward
		y2 := m.ffnFwd(&a.h, &a.hd, ln3, Nt, F, L.ffn, decSite(l, 4))
		out := &m.decX
		if l+1 < len(m.dec) {
			out = &m.da[l+1].x
		}
		m.residualNorm(out.shape(be, m.Activations, Nt, d), mid2, y2, p, decSite(l, 5), m.decNorm(l+1), Nt)
		m.traced(m.decNames[l], "forward", t0)
	}
}
