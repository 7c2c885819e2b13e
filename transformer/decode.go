package transformer

import (
	"fmt"
	"math"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/kernels"
)

// DecodeOptions configure Translate.
type DecodeOptions struct {
	// Beam is the beam width; 1 or less is greedy decoding.
	Beam int
	// Alpha is the GNMT length penalty exponent: a hypothesis of length L
	// scores logP / ((5+L)/6)^Alpha.
	Alpha float64
	// MaxExtra bounds the output: at most len(source)+MaxExtra tokens
	// (EOS included).
	MaxExtra int

	forceBeam bool
}

// DefaultDecode is the lab's setting: beam 4, alpha 0.6, input length + 50.
var DefaultDecode = DecodeOptions{Beam: 4, Alpha: 0.6, MaxExtra: 50}

// decoder holds the incremental-decoding buffers: per layer the self
// attention key/value cache [R, Tcap, d] (and a second copy for beam
// reordering) and the cross-attention keys/values [R, S, d].
type decoder struct {
	R, S, Tcap         int
	kc, vc, kc2, vc2   []slot
	ck, cv             []slot
	x, ln, q, k, v     slot
	ctx, y, h          slot
	mean, rstd, probs  slot
	logits, ids, order slot
	keyLen, tmp        slot
}

func lengthPenalty(n int, alpha float64) float64 {
	return math.Pow((5+float64(n))/6, alpha)
}

// Translate decodes a batch of source sentences (ids without padding,
// normally ending with EOS). It returns, for each, the output ids without
// the final EOS. Decoding is incremental: each step runs the decoder on
// the newest position only, attending over cached keys and values.
func (m *Model) Translate(src [][]int32, opt DecodeOptions) ([][]int32, error) {
	if len(src) == 0 {
		return nil, nil
	}
	beam := max(opt.Beam, 1)
	B := len(src)
	S := 1
	for _, s := range src {
		S = max(S, len(s))
		for _, id := range s {
			if id < 0 || int(id) >= m.Cfg.Vocab {
				return nil, fmt.Errorf("transformer: source id %d outside the vocabulary of %d", id, m.Cfg.Vocab)
			}
		}
	}
	maxLen := make([]int, B)
	Tcap := 1
	for i, s := range src {
		maxLen[i] = max(len(s)+opt.MaxExtra, 1)
		Tcap = max(Tcap, maxLen[i])
	}
	be, c := m.be, m.Cfg
	d := c.DModel
	flat := make([]int32, B*S)
	for i, s := range src {
		copy(flat[i*S:], s)
	}
	m.train, m.haveGrad = false, false
	m.positional(max(S, Tcap))
	m.encode(flat, B, S)

	R := B * beam
	dc := &decoder{R: R, S: S, Tcap: Tcap}
	L := len(m.dec)
	dc.kc, dc.vc, dc.kc2, dc.vc2 = make([]slot, L), make([]slot, L), make([]slot, L), make([]slot, L)
	dc.ck, dc.cv = make([]slot, L), make([]slot, L)
	expand := make([]int32, R)
	for r := range expand {
		expand[r] = int32(r / beam)
	}
	idx := dc.order.shape(be, dtype.Int32, R)
	be.UploadI32(idx, expand)
	lens := make([]int32, R)
	for r := range lens {
		lens[r] = m.srcLenI32[r/beam]
	}
	be.UploadI32(dc.keyLen.shape(be, dtype.Int32, R), lens)
	tmp := dc.tmp.shape(be, f32, B*S, d)
	for l := range m.dec {
		for _, kv := range []struct {
			w   int
			dst *slot
		}{{m.dec[l].cross.k, &dc.ck[l]}, {m.dec[l].cross.v, &dc.cv[l]}} {
			m.gemm(false, false, m.encOut.T, m.w[kv.w], 0, tmp)
			dst := kv.dst.shape(be, f32, R, S, d)
			be.GatherRows(dst, tmp.Reshape(B, S*d), idx, S*d)
		}
		dc.kc[l].shape(be, f32, R, Tcap, d)
		dc.vc[l].shape(be, f32, R, Tcap, d)
		if beam > 1 || opt.forceBeam {
			dc.kc2[l].shape(be, f32, R, Tcap, d)
			dc.vc2[l].shape(be, f32, R, Tcap, d)
		}
	}
	if beam == 1 && !opt.forceBeam {
		return m.greedy(dc, maxLen, Tcap), nil
	}
	return m.beamSearch(dc, B, beam, maxLen, Tcap, opt.Alpha), nil
}

// step runs the decoder for position t on the last tokens ids ([R]) and
// leaves log-probabilities in dc.logits [R, V] (downloaded to host).
func (m *Model) step(dc *decoder, ids []int32, t int, host []float32) {
	be, c := m.be, m.Cfg
	d, R := c.DModel, dc.R
	w := m.w
	idt := dc.ids.shape(be, dtype.Int32, R)
	be.UploadI32(idt, ids)
	x := dc.x.shape(be, f32, R, d)
	be.Embedding(x, w[m.emb], idt, m.embMul, PAD)
	be.AddPositional(x.Reshape(R, 1, d), m.pe, t)
	ln := dc.ln.shape(be, f32, R, d)
	mean, rstd := dc.mean.shape(be, f32, R), dc.rstd.shape(be, f32, R)
	q, k, v := dc.q.shape(be, f32, R, d), dc.k.shape(be, f32, R, d), dc.v.shape(be, f32, R, d)
	ctx, y := dc.ctx.shape(be, f32, R, d), dc.y.shape(be, f32, R, d)
	h := dc.h.shape(be, f32, R, c.FFN)
	dh := d / c.Heads
	scale := float32(1 / math.Sqrt(float64(dh)))
	for l := range m.dec {
		L := &m.dec[l]
		be.LayerNorm(ln, mean, rstd, x, w[L.ln1.g], w[L.ln1.b], c.LNEps)
		m.gemm(false, false, ln, w[L.self.q], 0, q)
		m.gemm(false, false, ln, w[L.self.k], 0, k)
		m.gemm(false, false, ln, w[L.self.v], 0, v)
		be.WriteStep(dc.kc[l].T, k, t)
		be.WriteStep(dc.vc[l].T, v, t)
		a := kernels.AttnArgs{B: R, H: c.Heads, Sq: 1, Sk: t + 1, Dh: dh, Scale: scale}
		be.Attention(ctx.Reshape(R, 1, d), dc.probs.shape(be, f32, R, c.Heads, 1, t+1), q.Reshape(R, 1, d), dc.kc[l].T, dc.vc[l].T, a)
		m.gemm(false, false, ctx, w[L.self.o], 0, y)
		be.Axpy(x, 1, y)
		be.LayerNorm(ln, mean, rstd, x, w[L.ln2.g], w[L.ln2.b], c.LNEps)
		m.gemm(false, false, ln, w[L.cross.q], 0, q)
		a = kernels.AttnArgs{B: R, H: c.Heads, Sq: 1, Sk: dc.S, Dh: dh, Scale: scale, KeyLen: dc.keyLen.T}
		be.Attention(ctx.Reshape(R, 1, d), dc.probs.shape(be, f32, R, c.Heads, 1, dc.S), q.Reshape(R, 1, d), dc.ck[l].T, dc.cv[l].T, a)
		m.gemm(false, false, ctx, w[L.cross.o], 0, y)
		be.Axpy(x, 1, y)
		be.LayerNorm(ln, mean, rstd, x, w[L.ln3.g], w[L.ln3.b], c.LNEps)
		m.gemm(false, false, ln, w[L.ffn.w1], 0, h)
		be.BiasReLU(h, w[L.ffn.b1])
		m.gemm(false, false, h, w[L.ffn.w2], 0, y)
		be.AddBias(y, w[L.ffn.b2])
		be.Axpy(x, 1, y)
	}
	be.LayerNorm(ln, mean, rstd, x, w[m.decLN.g], w[m.decLN.b], c.LNEps)
	logits := dc.logits.shape(be, f32, R, c.Vocab)
	m.gemm(false, true, ln, w[m.emb], 0, logits)
	be.LogSoftmax(logits, logits)
	be.Download(host, logits)
}

func (m *Model) greedy(dc *decoder, maxLen []int, Tcap int) [][]int32 {
	R, V := dc.R, m.Cfg.Vocab
	out := make([][]int32, R)
	done := make([]bool, R)
	ids := make([]int32, R) // PAD: the zero start symbol
	host := make([]float32, R*V)
	for t := 0; t < Tcap; t++ {
		m.step(dc, ids, t, host)
		alive := 0
		for r := 0; r < R; r++ {
			if done[r] {
				continue
			}
			row := host[r*V : r*V+V]
			best := 0
			for j, v := range row {
				if v > row[best] {
					best = j
				}
			}
			ids[r] = int32(best)
			if int32(best) == EOS {
				done[r] = true
				continue
			}
			out[r] = append(out[r], int32(best))
			if len(out[r]) >= maxLen[r] {
				done[r] = true
				continue
			}
			alive++
		}
		if alive == 0 {
			break
		}
	}
	for r := range out {
		if out[r] == nil {
			out[r] = []int32{}
		}
	}
	return out
}

type hyp struct {
	seq   []int32
	logp  float64
	score float64
}

type cand struct {
	logp   float64
	parent int
	tok    int32
}

// beamSearch is tensor2tensor's beam search (as OpenSeq2Seq uses it): each
// step extends every alive hypothesis, keeps the 2*beam best candidates,
// moves those ending in EOS to the finished set (scored with the length
// penalty) and keeps the beam best others alive; a sentence stops when its
// worst finished score beats the best alive log-probability divided by the
// largest possible length penalty, or at its maximum length.
func (m *Model) beamSearch(dc *decoder, B, beam int, maxLen []int, Tcap int, alpha float64) [][]int32 {
	be := m.be
	R, V := dc.R, m.Cfg.Vocab
	host := make([]float32, R*V)
	ids := make([]int32, R)
	alive := make([][]hyp, B)
	fin := make([][]hyp, B)
	done := make([]bool, B)
	for b := range alive {
		alive[b] = make([]hyp, beam)
		for k := range alive[b] {
			alive[b][k].logp = math.Inf(-1)
		}
		alive[b][0].logp = 0
	}
	order := make([]int32, R)
	cands := make([]cand, 0, 2*beam)
	for t := 0; t < Tcap; t++ {
		m.step(dc, ids, t, host)
		for b := 0; b < B; b++ {
			if done[b] {
				for k := 0; k < beam; k++ {
					order[b*beam+k] = int32(b*beam + k)
				}
				continue
			}
			// top 2*beam candidates over beam x V
			cands = cands[:0]
			for k := 0; k < beam; k++ {
				lp := alive[b][k].logp
				if math.IsInf(lp, -1) {
					continue
				}
				row := host[(b*beam+k)*V : (b*beam+k+1)*V]
				for j, v := range row {
					s := lp + float64(v)
					if len(cands) == 2*beam && s <= cands[len(cands)-1].logp {
						continue
					}
					c := cand{s, k, int32(j)}
					i := len(cands)
					if i < 2*beam {
						cands = append(cands, c)
					} else {
						i--
					}
					for i > 0 && cands[i-1].logp < s {
						cands[i] = cands[i-1]
						i--
					}
					cands[i] = c
				}
			}
			L := t + 1
			var next []hyp
			for _, c := range cands {
				par := alive[b][c.parent]
				if c.tok == EOS || L >= maxLen[b] {
					seq := append([]int32(nil), par.seq...)
					if c.tok != EOS {
						seq = append(seq, c.tok)
					}
					fin[b] = insertFinished(fin[b], hyp{seq: seq, logp: c.logp, score: c.logp / lengthPenalty(L, alpha)}, beam)
					continue
				}
				if len(next) < beam {
					seq := append(append(make([]int32, 0, L), par.seq...), c.tok)
					order[b*beam+len(next)] = int32(b*beam + c.parent)
					ids[b*beam+len(next)] = c.tok
					next = append(next, hyp{seq: seq, logp: c.logp})
				}
			}
			for k := len(next); k < beam; k++ {
				order[b*beam+k] = int32(b * beam)
				ids[b*beam+k] = PAD
				next = append(next, hyp{logp: math.Inf(-1)})
			}
			alive[b] = next
			if L >= maxLen[b] || len(fin[b]) > 0 && fin[b][len(fin[b])-1].score > alive[b][0].logp/lengthPenalty(maxLen[b], alpha) {
				done[b] = true
			}
		}
		all := true
		for _, d := range done {
			all = all && d
		}
		if all {
			break
		}
		// reorder the self-attention caches to follow the surviving parents
		ot := dc.order.shape(be, dtype.Int32, R)
		be.UploadI32(ot, order)
		cols := (t + 1) * m.Cfg.DModel
		for l := range m.dec {
			be.GatherRows(dc.kc2[l].T, dc.kc[l].T, ot, cols)
			be.GatherRows(dc.vc2[l].T, dc.vc[l].T, ot, cols)
			dc.kc[l], dc.kc2[l] = dc.kc2[l], dc.kc[l]
			dc.vc[l], dc.vc2[l] = dc.vc2[l], dc.vc[l]
		}
	}
	out := make([][]int32, B)
	for b := range out {
		if len(fin[b]) > 0 {
			out[b] = fin[b][0].seq
		} else {
			best := alive[b][0]
			out[b] = best.seq
		}
		if out[b] == nil {
			out[b] = []int32{}
		}
	}
	return out
}

// insertFinished keeps the beam best finished hypotheses, best first.
func insertFinished(f []hyp, h hyp, beam int) []hyp {
	i := len(f)
	for i > 0 && f[i-1].score < h.score {
		i--
	}
	if i >= beam {
		return f
	}
	f = append(f, hyp{})
	copy(f[i+1:], f[i:])
	f[i] = h
	if len(f) > beam {
		f = f[:beam]
	}
	return f
}
