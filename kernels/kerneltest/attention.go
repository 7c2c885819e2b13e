package kerneltest

import (
	"fmt"
	"math"

	"github.com/gorun/gorun/kernels"
)

type attnCase struct {
	name                  string
	b, h, sq, sk, cap, dh int // cap: K and V hold cap >= sk positions
	keyLen                []int32
	causal                bool
	drop                  float32
	seed                  uint64
	scale                 float32 // 0: 1/sqrt(dh)
	sd                    float64 // of q and k (0: 1)
	// quant rounds q and k to multiples of 1/4: their products are then
	// exact in TF32 too, so scores far beyond exp's float32 range (the
	// softmax must subtract the row's maximum) stay exact on a GPU.
	quant bool
}

func attnCases() []attnCase {
	return []attnCase{
		{name: "plain", b: 2, h: 2, sq: 3, sk: 4, dh: 3, scale: 0.6},
		{name: "padding", b: 2, h: 2, sq: 3, sk: 4, dh: 3, keyLen: []int32{4, 2}, scale: 0.6},
		{name: "padding, no key left", b: 2, h: 2, sq: 3, sk: 4, dh: 3, keyLen: []int32{0, 3}},
		{name: "padding 5,2", b: 2, h: 2, sq: 3, sk: 5, dh: 3, keyLen: []int32{5, 2}, scale: 0.7},
		{name: "causal", b: 2, h: 2, sq: 4, sk: 4, dh: 3, causal: true, scale: 0.6},
		{name: "causal+dropout", b: 2, h: 2, sq: 4, sk: 4, dh: 3, causal: true, drop: 0.3, seed: 77, scale: 0.6},
		{name: "padding+dropout", b: 2, h: 2, sq: 2, sk: 5, dh: 3, keyLen: []int32{3, 1}, drop: 0.25, seed: 77, scale: 0.6},
		{name: "padding+dropout 3,4", b: 2, h: 2, sq: 3, sk: 4, dh: 3, keyLen: []int32{3, 4}, drop: 0.2, seed: 5, scale: 0.7},
		{name: "causal Sq<Sk+dropout", b: 2, h: 2, sq: 2, sk: 5, dh: 3, causal: true, drop: 0.3, seed: 5, scale: 0.7},
		{name: "causal Sq>Sk", b: 1, h: 2, sq: 5, sk: 3, dh: 4, causal: true},
		{name: "SkCap>Sk padding+causal", b: 2, h: 2, sq: 3, sk: 5, cap: 7, dh: 3, keyLen: []int32{5, 3}, causal: true},
		{name: "decode step", b: 2, h: 2, sq: 1, sk: 6, cap: 10, dh: 4, keyLen: []int32{6, 4}, causal: true},
		{name: "sharp scores", b: 1, h: 2, sq: 3, sk: 7, dh: 16, sd: 6, quant: true},
		{name: "B=3 H=4 17x33 Dh=16 padding+dropout", b: 3, h: 4, sq: 17, sk: 33, dh: 16, keyLen: []int32{33, 20, 1}, drop: 0.1, seed: 9},
		{name: "Dh=64 causal", b: 1, h: 2, sq: 9, sk: 9, dh: 64, causal: true},
		{name: "long rows Sk=1500 SkCap=1600", b: 1, h: 2, sq: 2, sk: 1500, cap: 1600, dh: 8, keyLen: []int32{1400}, drop: 0.1, seed: 3},
		{name: "Sk=4097", b: 1, h: 1, sq: 2, sk: 4097, dh: 4},
	}
}

func (c attnCase) skCap() int { return max(c.cap, c.sk) }

func (c attnCase) args(e *env) kernels.AttnArgs {
	a := kernels.AttnArgs{B: c.b, H: c.h, Sq: c.sq, Sk: c.sk, Dh: c.dh, Causal: c.causal, Scale: c.scale, Dropout: c.drop, Seed: c.seed}
	if a.Scale == 0 {
		a.Scale = float32(1 / math.Sqrt(float64(c.dh)))
	}
	if c.keyLen != nil {
		a.KeyLen = e.upI(c.keyLen, c.b)
	}
	return a
}

// valid is the number of keys query i of batch b sees (<= 0: none).
func (c attnCase) valid(b, i int) int {
	n := c.sk
	if c.keyLen != nil {
		n = min(n, int(c.keyLen[b]))
	}
	if c.causal {
		n = min(n, i+c.sk-c.sq+1)
	}
	return n
}

// keep is the dropout factor of weight (b, h, i, j): the mask indexes the
// probs tensor [B, H, Sq, Sk].
func (c attnCase) keep(b, h, i, j int) float64 {
	if c.drop <= 0 {
		return 1
	}
	if kept(c.seed, ((b*c.h+h)*c.sq+i)*c.sk+j, c.drop) {
		return 1 / (1 - float64(c.drop))
	}
	return 0
}

// attnFwd64 is the float64 attention: o [B, Sq, H*Dh] and the weights P
// [B, H, Sq, Sk] before dropout. q is [B, Sq, H*Dh], k and v [B, SkCap,
// H*Dh].
func attnFwd64(c attnCase, scale float64, q, k, v []float64) (o, P []float64) {
	D, capK := c.h*c.dh, c.skCap()
	o, P = make([]float64, c.b*c.sq*D), make([]float64, c.b*c.h*c.sq*c.sk)
	for b := range c.b {
		for h := range c.h {
			for i := range c.sq {
				row := P[((b*c.h+h)*c.sq+i)*c.sk:][:c.sk]
				n := c.valid(b, i)
				if n <= 0 {
					continue
				}
				mx := math.Inf(-1)
				for j := range n {
					var s float64
					for d := range c.dh {
						s += q[(b*c.sq+i)*D+h*c.dh+d] * k[(b*capK+j)*D+h*c.dh+d]
					}
					row[j] = s * scale
					mx = math.Max(mx, row[j])
				}
				var sum float64
				for j := range n {
					row[j] = math.Exp(row[j] - mx)
					sum += row[j]
				}
				for j := range n {
					row[j] /= sum
				}
				for d := range c.dh {
					var s float64
					for j := range n {
						s += row[j] * c.keep(b, h, i, j) * v[(b*capK+j)*D+h*c.dh+d]
					}
					o[(b*c.sq+i)*D+h*c.dh+d] = s
				}
			}
		}
	}
	return o, P
}

// attnBwd64 is the float64 backward of attnFwd64 at the weights P: the
// gradients of sum(do*o) with respect to q, k and v.
func attnBwd64(c attnCase, scale float64, q, k, v, P, do []float64) (dq, dk, dv []float64) {
	D, capK := c.h*c.dh, c.skCap()
	dq, dk, dv = make([]float64, len(q)), make([]float64, len(k)), make([]float64, len(v))
	dp := make([]float64, c.sk)
	for b := range c.b {
		for h := range c.h {
			for i := range c.sq {
				row := P[((b*c.h+h)*c.sq+i)*c.sk:][:c.sk]
				qi, doi := (b*c.sq+i)*D+h*c.dh, (b*c.sq+i)*D+h*c.dh
				var dot float64
				for j := range c.sk {
					kj := (b*capK+j)*D + h*c.dh
					m := c.keep(b, h, i, j)
					var s float64
					for d := range c.dh {
						s += do[doi+d] * v[kj+d]
						dv[kj+d] += row[j] * m * do[doi+d]
					}
					dp[j] = s * m
					dot += row[j] * dp[j]
				}
				for j := range c.sk {
					kj := (b*capK+j)*D + h*c.dh
					ds := row[j] * (dp[j] - dot) * scale
					for d := range c.dh {
						dq[qi+d] += ds * k[kj+d]
						dk[kj+d] += ds * q[qi+d]
					}
				}
			}
		}
	}
	return dq, dk, dv
}

// inputs draws q, k, v; K and V positions >= Sk hold large values that a
// backend must not read.
func (c attnCase) inputs(e *env) (q, k, v []float32) {
	D, capK := c.h*c.dh, c.skCap()
	sd := c.sd
	if sd == 0 {
		sd = 1
	}
	q, k, v = e.randn(c.b*c.sq*D, sd), e.randn(c.b*capK*D, sd), e.varied(c.b*capK*D, 1)
	if c.quant {
		for _, x := range [][]float32{q, k} {
			for i, a := range x {
				x[i] = float32(math.Round(float64(a)*4) / 4)
			}
		}
	}
	for b := range c.b {
		for j := c.sk; j < capK; j++ {
			for d := range D {
				k[(b*capK+j)*D+d], v[(b*capK+j)*D+d] = 1e3, -1e3
			}
		}
	}
	return q, k, v
}

// used keeps the positions j < Sk of a [B, SkCap, D] tensor.
func (c attnCase) used(x []float64) []float64 {
	D, capK := c.h*c.dh, c.skCap()
	var out []float64
	for b := range c.b {
		out = append(out, x[b*capK*D:(b*capK+c.sk)*D]...)
	}
	return out
}

func (c attnCase) used32(x []float32) []float32 { return f32s(c.used(to64(x))) }

// expand writes the positions j < Sk (as used returns them) into a copy
// of full.
func (c attnCase) expand(u, full []float64) []float64 {
	D, capK := c.h*c.dh, c.skCap()
	x := clone(full)
	for b := range c.b {
		copy(x[b*capK*D:(b*capK+c.sk)*D], u[b*c.sk*D:])
	}
	return x
}

func testAttention(e *env) {
	for _, c := range attnCases() {
		e.run(c.name+fmt.Sprintf(" (B=%d H=%d Sq=%d Sk=%d SkCap=%d Dh=%d)", c.b, c.h, c.sq, c.sk, c.skCap(), c.dh), func() {
			D, capK := c.h*c.dh, c.skCap()
			q, k, v := c.inputs(e)
			a := c.args(e)
			o := e.up(e.randn(c.b*c.sq*D, 1), c.b, c.sq, D)
			probs := e.up(e.randn(c.b*c.h*c.sq*c.sk, 1), c.b, c.h, c.sq, c.sk)
			e.be.Attention(o, probs, e.up(q, c.b, c.sq, D), e.up(k, c.b, capK, D), e.up(v, c.b, capK, D), a)
			wo, wp := attnFwd64(c, float64(a.Scale), to64(q), to64(k), to64(v))
			gp, gotO := e.down(probs), e.down(o)
			e.near("probs", gp, wp, e.tol.Attention)
			e.near("o", gotO, wo, e.tol.Attention)
			// masked weights are exactly zero; rows with no key give o = 0
			for b := range c.b {
				for h := range c.h {
					for i := range c.sq {
						n := max(c.valid(b, i), 0)
						r := ((b*c.h+h)*c.sq + i) * c.sk
						e.exact(fmt.Sprintf("masked probs[b=%d h=%d i=%d][%d:]", b, h, i, n), gp[r+n:r+c.sk], zeros(c.sk-n))
						if n == 0 {
							at := (b*c.sq+i)*D + h*c.dh
							e.exact(fmt.Sprintf("o[b=%d i=%d] head %d (no key)", b, i, h), gotO[at:at+c.dh], zeros(c.dh))
						}
					}
				}
			}
		})
	}
}

func testAttentionBackward(e *env) {
	for _, c := range attnCases() {
		e.run(c.name+fmt.Sprintf(" (B=%d H=%d Sq=%d Sk=%d SkCap=%d Dh=%d)", c.b, c.h, c.sq, c.sk, c.skCap(), c.dh), func() {
			D, capK := c.h*c.dh, c.skCap()
			q, k, v := c.inputs(e)
			a := c.args(e)
			q64, k64, v64 := to64(q), to64(k), to64(v)
			sc := float64(a.Scale)
			_, p64 := attnFwd64(c, sc, q64, k64, v64)
			P := f32s(p64) // the weights as a forward stores them
			do := e.varied(c.b*c.sq*D, 1)
			// dq, dk, dv are written, not accumulated: they start stale;
			// dprobs is scratch: it starts as NaN.
			dq := e.up(e.randn(len(q), 1), c.b, c.sq, D)
			dk := e.up(e.randn(len(k), 1), c.b, capK, D)
			dv := e.up(e.randn(len(v), 1), c.b, capK, D)
			nan := make([]float32, len(P))
			for i := range nan {
				nan[i] = float32(math.NaN())
			}
			dprobs := e.up(nan, c.b, c.h, c.sq, c.sk)
			e.be.AttentionBackward(dq, dk, dv, dprobs, e.up(do, c.b, c.sq, D),
				e.up(q, c.b, c.sq, D), e.up(k, c.b, capK, D), e.up(v, c.b, capK, D), e.up(P, c.b, c.h, c.sq, c.sk), a)
			wq, wk, wv := attnBwd64(c, sc, q64, k64, v64, to64(P), to64(do))
			loss := func(q, k, v []float64) float64 {
				o, _ := attnFwd64(c, sc, q, k, v)
				return dot64(do, o)
			}
			var fq, fk, fv func([]float64) float64
			if len(q)+2*len(k) <= 3*fdLimit {
				fq = func(x []float64) float64 { return loss(x, k64, v64) }
				fk = func(x []float64) float64 { return loss(q64, c.expand(x, k64), v64) }
				fv = func(x []float64) float64 { return loss(q64, k64, c.expand(x, v64)) }
			}
			tol := e.tol.Attention
			e.gradCheck("dq", e.down(dq), nil, wq, fq, q64, tol)
			e.gradCheck("dk (positions < Sk)", c.used32(e.down(dk)), nil, c.used(wk), fk, c.used(k64), tol)
			e.gradCheck("dv (positions < Sk)", c.used32(e.down(dv)), nil, c.used(wv), fv, c.used(v64), tol)
		})
	}
}
