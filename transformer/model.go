package transformer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/kernels"
)

// Param is one trainable tensor. Its weights are Weights[Offset:Offset+Len]
// of the model's flat weight buffer, and its gradient the same range of the
// flat gradient buffer.
//
// Parameters are registered in forward order (embedding, encoder layers,
// encoder final norm, decoder layers, decoder final norm) and the backward
// pass finishes their gradients in exactly the reverse order: the hook sees
// indices len(Params)-1, ..., 1, 0. So the gradient buffer, read from its
// end, is in order of readiness, and a run of consecutively ready gradients
// (a bucket) is one contiguous slice.
type Param struct {
	Name   string
	Shape  []int
	Offset int
	Len    int
}

type lnP struct{ g, b int }
type attnP struct{ q, k, v, o int }
type ffnP struct{ w1, b1, w2, b2 int }
type encLayer struct {
	ln1 lnP
	att attnP
	ln2 lnP
	ffn ffnP
}
type decLayer struct {
	ln1   lnP
	self  attnP
	ln2   lnP
	cross attnP
	ln3   lnP
	ffn   ffnP
}

// slot is a growable activation buffer; T is its view for the current batch.
type slot struct {
	back kernels.Tensor
	T    kernels.Tensor
}

func (s *slot) shape(be kernels.Backend, dt dtype.DType, dims ...int) kernels.Tensor {
	n := 1
	for _, d := range dims {
		n *= d
	}
	if s.back.Len() < n || s.back.DType != dt || s.back.Rank == 0 {
		if s.back.Rank > 0 {
			be.Free(s.back)
		}
		s.back = be.Alloc(dt, n+n/4+1)
	}
	s.T = s.back.Slice(0, dims...)
	return s.T
}

// The activations a layer keeps for its backward pass. qkv is [3, N, d]:
// Q, K and V of self-attention, made by one product (attnStack); kv2 is
// [2, Ns, d]: K and V of encoder-decoder attention.
type encActs struct {
	x, ln1, qkv, ctx, mid, ln2, h, hd slot
	m1, r1, m2, r2, p                 slot
}

type decActs struct {
	x, ln1, qkv, ctx, mid1, ln2, q2, kv2, ctx2, mid2, ln3, h, hd slot
	m1, r1, m2, r2, m3, r3, p1, p2                               slot
}

// part is matrix i of a stack of [rows, d] matrices (qkv, kv2 and their
// gradients).
func part(t kernels.Tensor, i, rows, d int) kernels.Tensor { return t.Slice(i*rows*d, rows, d) }

// Batch is one padded training batch: Src is [B][S] and Tgt is [B][T]
// row-major, padded on the right with PAD (0); every target sentence ends
// with EOS. The decoder input is built inside the model as the target
// shifted right by one position with a PAD (zero-embedding) start symbol,
// exactly as OpenSeq2Seq/tensor2tensor do.
type Batch struct {
	B, S, T int
	Src     []int32
	Tgt     []int32
}

// Validate checks the sizes of b and its ids against a vocabulary.
func (b *Batch) Validate(vocab int) error {
	if b.B < 1 || b.S < 1 || b.T < 1 {
		return fmt.Errorf("transformer: empty batch %dx%d/%d", b.B, b.S, b.T)
	}
	if len(b.Src) != b.B*b.S || len(b.Tgt) != b.B*b.T {
		return fmt.Errorf("transformer: batch has %d source and %d target ids, want %d and %d", len(b.Src), len(b.Tgt), b.B*b.S, b.B*b.T)
	}
	for _, ids := range [][]int32{b.Src, b.Tgt} {
		for _, id := range ids {
			if id < 0 || int(id) >= vocab {
				return fmt.Errorf("transformer: token id %d outside the vocabulary of %d", id, vocab)
			}
		}
	}
	return nil
}

// Loss is the result of a forward pass.
type Loss struct {
	// Raw is the label-smoothed cross entropy per target token (nats).
	Raw float64
	// Lab is Raw minus the smoothed target distribution's entropy, the
	// number OpenSeq2Seq logs as "Train loss".
	Lab float64
	// Tokens is the number of non-pad target tokens.
	Tokens int
}

// Model is a Transformer with its parameters, gradients and activations.
// It is not safe for concurrent use.
type Model struct {
	Cfg    Config
	Params []Param
	// Weights and Grads are the flat parameter and gradient buffers.
	Weights, Grads kernels.Tensor
	// AccumulateGrads makes Backward add to Grads instead of zeroing first.
	AccumulateGrads bool
	// LossScale, when positive, multiplies the loss before Backward
	// (mixed-precision loss scaling): the gradients come out scaled by it,
	// and the caller divides them back before the optimizer.
	LossScale float32
	// Activations is the type of the training activations: Float32 (as
	// New sets it), or Float16 or BFloat16 for mixed precision on a backend whose
	// ops take them (kernels.MixedPrecision: the CUDA backend). Weights,
	// gradients, optimizer state and LayerNorm's statistics stay float32;
	// decoding (Translate) computes in float32 after the encoder. Set it
	// before a Forward; the activation buffers follow it.
	Activations dtype.DType
	// DeferLoss, on a backend with kernels.DeferredScalars (a GPU), makes
	// a training Forward queue its loss (CrossEntropySum) instead of
	// waiting for it: the Loss it returns has Tokens (counted on the host)
	// and Raw and Lab NaN, and the caller reads the loss sum of the
	// Forwards since with the backend's TakeScalars, once a step. Other
	// backends, and evaluation, ignore it.
	DeferLoss bool
	// Seed and DropoutStep determine the dropout masks: the masks of a
	// training forward pass depend on (Seed, DropoutStep) only, and
	// DropoutStep is incremented by each training forward pass.
	Seed        uint64
	DropoutStep uint64
	// Trace, if set, is called after each layer's forward or backward
	// pass with the layer ("encoder/layer_0", "decoder/layer_5",
	// "softmax"), the phase ("forward", "backward") and the start and end
	// times, for timelines.
	Trace func(layer, phase string, start, end time.Time)

	be     kernels.Backend
	w, g   []kernels.Tensor
	emb    int
	enc    []encLayer
	encLN  lnP
	dec    []decLayer
	decLN  lnP
	pe     kernels.Tensor
	peLen  int
	embMul float32

	// state of the last forward pass
	bt        Batch
	train     bool
	stepSeed  uint64
	haveGrad  bool
	tokens    int
	srcIDs    slot
	dinIDs    slot
	tgtIDs    slot
	srcLen    slot
	ea        []encActs
	da        []decActs
	encX      slot // input of the final encoder norm (= last layer output)
	encOut    slot
	encM      slot
	encR      slot
	decX      slot
	decOut    slot
	decM      slot
	decR      slot
	logits    slot
	dx, dy    slot    // residual-stream gradients (encoder, decoder)
	dEnc      slot    // gradient of the encoder output
	scr       [8]slot // scratch buffers
	dh        slot    // [N, ffn] scratch
	dprobs    slot
	srcLenI32 []int32
	hostIDs   []int32
	encNames  []string
	decNames  []string
}

// New builds a model with freshly initialised weights: embedding
// N(0, d^-0.5) (tensor2tensor), projection matrices Glorot-uniform, biases 0,
// layer norms gamma 1 beta 0. seed fixes the initial weights and, with
// DropoutStep, the dropout masks.
func New(cfg Config, be kernels.Backend, seed uint64) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Model{Cfg: cfg, be: be, Seed: seed, Activations: dtype.Float32}
	off := m.register()
	m.Weights = be.Alloc(dtype.Float32, off)
	m.Grads = be.Alloc(dtype.Float32, off)
	if cc, ok := be.(kernels.CastCache); ok {
		// the weights' 16-bit casts for tensor-core products are kept
		// until the optimizer (or anything else) writes them: one a step
		cc.CacheCasts(m.Weights)
	}
	for _, p := range m.Params {
		m.w = append(m.w, m.Weights.Slice(p.Offset, p.Shape...))
		m.g = append(m.g, m.Grads.Slice(p.Offset, p.Shape...))
	}
	for l := 0; l < cfg.EncLayers; l++ {
		m.encNames = append(m.encNames, fmt.Sprintf("encoder/layer_%d", l))
	}
	for l := 0; l < cfg.DecLayers; l++ {
		m.decNames = append(m.decNames, fmt.Sprintf("decoder/layer_%d", l))
	}
	m.embMul = float32(math.Sqrt(float64(cfg.DModel)))
	m.checkStacks()
	m.ea = make([]encActs, cfg.EncLayers)
	m.da = make([]decActs, cfg.DecLayers)
	m.initWeights(seed)
	return m, nil
}

// ParamList is the parameters New registers for cfg, in registration
// (forward) order with their offsets in the flat buffers, without
// allocating or initialising anything (for planning: fusion.Layout cuts
// the buckets from it).
func ParamList(cfg Config) ([]Param, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Model{Cfg: cfg}
	m.register()
	return m.Params, nil
}

// register lays out the parameters of m.Cfg (m.Params and the layers'
// indices into it) and returns their total length.
func (m *Model) register() int {
	cfg := m.Cfg
	d, f := cfg.DModel, cfg.FFN
	off := 0
	add := func(name string, shape ...int) int {
		n := 1
		for _, s := range shape {
			n *= s
		}
		m.Params = append(m.Params, Param{Name: name, Shape: shape, Offset: off, Len: n})
		off += n
		return len(m.Params) - 1
	}
	addLN := func(pfx string) lnP { return lnP{add(pfx+"/gamma", d), add(pfx+"/beta", d)} }
	addAttn := func(pfx string) attnP {
		return attnP{add(pfx+"/q/kernel", d, d), add(pfx+"/k/kernel", d, d), add(pfx+"/v/kernel", d, d), add(pfx+"/output_transform/kernel", d, d)}
	}
	addFFN := func(pfx string) ffnP {
		return ffnP{add(pfx+"/filter_layer/kernel", d, f), add(pfx+"/filter_layer/bias", f), add(pfx+"/output_layer/kernel", f, d), add(pfx+"/output_layer/bias", d)}
	}
	m.emb = add("embedding_and_softmax/weights", cfg.Vocab, d)
	for l := 0; l < cfg.EncLayers; l++ {
		p := fmt.Sprintf("encoder/layer_%d/", l)
		var e encLayer
		e.ln1 = addLN(p + "self_attention/layer_norm")
		e.att = addAttn(p + "self_attention")
		e.ln2 = addLN(p + "ffn/layer_norm")
		e.ffn = addFFN(p + "ffn")
		m.enc = append(m.enc, e)
	}
	m.encLN = addLN("encoder/layer_norm")
	for l := 0; l < cfg.DecLayers; l++ {
		p := fmt.Sprintf("decoder/layer_%d/", l)
		var e decLayer
		e.ln1 = addLN(p + "self_attention/layer_norm")
		e.self = addAttn(p + "self_attention")
		e.ln2 = addLN(p + "encdec_attention/layer_norm")
		e.cross = addAttn(p + "encdec_attention")
		e.ln3 = addLN(p + "ffn/layer_norm")
		e.ffn = addFFN(p + "ffn")
		m.dec = append(m.dec, e)
	}
	m.decLN = addLN("decoder/layer_norm")
	return off
}

// attnStack is n projection matrices of an attention block, from parameter
// first on, as one [n, d, d] tensor of buf (Weights or Grads): W_q, W_k,
// W_v (n = 3, first = q) or W_k, W_v (n = 2, first = k). register adds them
// one after the other, so they are contiguous in the flat buffers, and one
// product covers them: Q, K and V of one input (self-attention), K and V of
// the encoder output (encoder-decoder attention), and their weight
// gradients. Checkpoints keep them as separate tensors, by name; the layout
// is the one the checkpoints of before had.
func (m *Model) attnStack(buf kernels.Tensor, first, n int) kernels.Tensor {
	d := m.Cfg.DModel
	return buf.Slice(m.Params[first].Offset, n, d, d)
}

// checkStacks makes sure every attention block's q, k, v are contiguous
// (attnStack).
func (m *Model) checkStacks() {
	dd := m.Cfg.DModel * m.Cfg.DModel
	var blocks []attnP
	for _, l := range m.enc {
		blocks = append(blocks, l.att)
	}
	for _, l := range m.dec {
		blocks = append(blocks, l.self, l.cross)
	}
	for _, a := range blocks {
		q, k, v := m.Params[a.q], m.Params[a.k], m.Params[a.v]
		if q.Len != dd || k.Offset != q.Offset+dd || v.Offset != k.Offset+dd {
			panic(fmt.Sprintf("transformer: %s, %s, %s are not contiguous", q.Name, k.Name, v.Name))
		}
	}
}

// Backend is the backend the model runs on.
func (m *Model) Backend() kernels.Backend { return m.be }

// NumParams is the number of trainable scalars.
func (m *Model) NumParams() int { return m.Weights.Len() }

// Weight and Grad return the tensors of parameter i.
func (m *Model) Weight(i int) kernels.Tensor { return m.w[i] }

// Grad returns the gradient tensor of parameter i.
func (m *Model) Grad(i int) kernels.Tensor { return m.g[i] }

// EmbeddingParam is the index of the shared embedding/softmax matrix.
func (m *Model) EmbeddingParam() int { return m.emb }

func (m *Model) initWeights(seed uint64) {
	r := rand.New(rand.NewPCG(seed, 0x7472616e73666f72))
	host := make([]float32, m.Weights.Len())
	for i, p := range m.Params {
		w := host[p.Offset : p.Offset+p.Len]
		switch {
		case i == m.emb:
			sd := 1 / math.Sqrt(float64(m.Cfg.DModel))
			for j := range w {
				w[j] = float32(r.NormFloat64() * sd)
			}
		case len(p.Shape) == 2:
			lim := math.Sqrt(6 / float64(p.Shape[0]+p.Shape[1]))
			for j := range w {
				w[j] = float32((2*r.Float64() - 1) * lim)
			}
		case len(p.Name) > 6 && p.Name[len(p.Name)-6:] == "/gamma":
			for j := range w {
				w[j] = 1
			}
		}
	}
	m.be.Upload(m.Weights, host)
}

// positional makes sure the sinusoid table has n rows: row t is
// [sin(t*inv_0..), cos(t*inv_0..)] with inv_i = exp(-i*log(1e4)/(d/2-1)).
func (m *Model) positional(n int) {
	if n <= m.peLen {
		return
	}
	if n < 256 {
		n = 256
	}
	d := m.Cfg.DModel
	half := d / 2
	inc := math.Log(1e4) / math.Max(float64(half-1), 1)
	host := make([]float32, n*d)
	for t := 0; t < n; t++ {
		for i := 0; i < half; i++ {
			a := float64(t) * math.Exp(-float64(i)*inc)
			host[t*d+i] = float32(math.Sin(a))
			host[t*d+half+i] = float32(math.Cos(a))
		}
	}
	m.pe = m.be.Alloc(dtype.Float32, n, d)
	m.be.Upload(m.pe, host)
	m.peLen = n
}

func mix(z uint64) uint64 {
	z += 0x9E3779B97F4A7C15
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// site returns the dropout seed of site k of the current step.
func (m *Model) site(k int) uint64 { return mix(m.stepSeed ^ uint64(k)*0xD1B54A32D192ED03) }

func (m *Model) drop(p float32) float32 {
	if !m.train {
		return 0
	}
	return p
}

func (m *Model) gemm(transA, transB bool, a, b kernels.Tensor, beta float32, c kernels.Tensor) {
	m.be.Gemm(transA, transB, 1, a, b, beta, c)
}

// now returns the time if tracing is on.
func (m *Model) now() time.Time {
	if m.Trace == nil {
		return time.Time{}
	}
	m.be.Sync()
	return time.Now()
}

func (m *Model) traced(layer, phase string, t0 time.Time) {
	if m.Trace != nil {
		m.be.Sync()
		m.Trace(layer, phase, t0, time.Now())
	}
}

// GradSlice returns the gradients of parameters lo..hi (inclusive) as one
// contiguous view of Grads: a bucket of consecutively ready parameters.
func (m *Model) GradSlice(lo, hi int) kernels.Tensor {
	if lo > hi {
		lo, hi = hi, lo
	}
	a, b := m.Params[lo], m.Params[hi]
	return m.Grads.Slice(a.Offset, b.Offset+b.Len-a.Offset)
}

// PadBatch builds a Batch from ragged source and target sentences (ids
// without padding; targets ending with EOS), padding each side to its
// longest sentence with PAD.
func PadBatch(src, tgt [][]int32) (*Batch, error) {
	if len(src) != len(tgt) || len(src) == 0 {
		return nil, fmt.Errorf("transformer: %d source and %d target sentences", len(src), len(tgt))
	}
	S, T := 1, 1
	for i := range src {
		S = max(S, len(src[i]))
		T = max(T, len(tgt[i]))
	}
	b := &Batch{B: len(src), S: S, T: T, Src: make([]int32, len(src)*S), Tgt: make([]int32, len(src)*T)}
	for i := range src {
		copy(b.Src[i*S:], src[i])
		copy(b.Tgt[i*T:], tgt[i])
	}
	return b, nil
}
