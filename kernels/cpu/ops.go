package cpu

import (
	"fmt"
	"math"

	"github.com/gorun/gorun/kernels"
)

// expShift sets dst[j] = exp(src[j] - mx) and returns the sum; dst may
// alias src, or be nil to only sum. Every src[j] must be <= mx (softmax),
// so exponents are <= 0 and values below e^-87 flush to zero. It is expf's
// algorithm with the loop inside, so the compiler keeps it in registers.
func expShift(dst, src []float32, mx float32) float32 {
	var sum float32
	for j, z := range src {
		x := z - mx
		var e float32
		if x >= -87 {
			t := x*1.44269504088896341 - 0.5
			n := int32(t) // t <= -0.5 rounds toward zero: round(x/ln2)
			fn := float32(n)
			r := x - fn*0.693145751953125 - fn*1.42860682030941723212e-6
			p := 1 + r*(1+r*(0.5+r*(1.0/6+r*(1.0/24+r*(1.0/120+r*(1.0/720))))))
			e = p * math.Float32frombits(uint32(n+127)<<23)
		}
		if dst != nil {
			dst[j] = e
		}
		sum += e
	}
	return sum
}

func (be *Backend) scratch(n int) []float32 {
	if cap(be.pdrop) < n {
		be.pdrop = make([]float32, n)
	}
	return be.pdrop[:n]
}

// validKeys is the number of keys row (b, i) may attend to.
func validKeys(a *kernels.AttnArgs, b, i int) int {
	n := a.Sk
	if a.KeyLen.Rank > 0 {
		if l := int(a.KeyLen.I32[b]); l < n {
			n = l
		}
	}
	if a.Causal {
		if c := i + a.Sk - a.Sq + 1; c < n {
			n = c
		}
	}
	return n
}

// Attention implements kernels.Backend.
func (be *Backend) Attention(ot, pt, qt, kt, vt kernels.Tensor, a kernels.AttnArgs) {
	skCap := a.MustCheck("cpu", ot, pt, qt, kt, vt)
	o, P, q, k, v := ot.F32, pt.F32, qt.F32, kt.F32, vt.F32
	B, H, Sq, Sk, Dh := a.B, a.H, a.Sq, a.Sk, a.Dh
	D := H * Dh
	hs := Sq * Sk
	be.par(B, 1, func(_, lo, hi int) {
		for b := lo; b < hi; b++ {
			SgemmStrided(H, false, true, Sq, Sk, Dh, a.Scale, q[b*Sq*D:], D, Dh, k[b*skCap*D:], D, Dh, 0, P[b*H*hs:], Sk, hs)
		}
	})
	rows := B * H * Sq
	be.par(rows, 16, func(_, lo, hi int) {
		for r := lo; r < hi; r++ {
			b, i := r/(H*Sq), r%Sq
			row := P[r*Sk : r*Sk+Sk]
			n := validKeys(&a, b, i)
			if n <= 0 {
				clear(row)
				continue
			}
			mx := row[0]
			for _, s := range row[1:n] {
				if s > mx {
					mx = s
				}
			}
			inv := 1 / expShift(row[:n], row[:n], mx)
			for j := 0; j < n; j++ {
				row[j] *= inv
			}
			clear(row[n:])
		}
	})
	pd := P
	if a.Dropout > 0 {
		pd = be.scratch(len(P))
		be.Dropout(kernels.FromF32(pd, len(pd)), pt.Reshape(len(P)), a.Dropout, a.Seed)
	}
	be.par(B, 1, func(_, lo, hi int) {
		for b := lo; b < hi; b++ {
			SgemmStrided(H, false, false, Sq, Dh, Sk, 1, pd[b*H*hs:], Sk, hs, v[b*skCap*D:], D, Dh, 0, o[b*Sq*D:], D, Dh)
		}
	})
}

// AttentionBackward implements kernels.Backend.
func (be *Backend) AttentionBackward(dqt, dkt, dvt, dpt, dot, qt, kt, vt, pt kernels.Tensor, a kernels.AttnArgs) {
	skCap := a.MustCheck("cpu", dot, pt, qt, kt, vt)
	sameLen(dpt, pt, "AttentionBackward dprobs")
	sameLen(dqt, qt, "AttentionBackward dq")
	sameLen(dkt, kt, "AttentionBackward dk")
	sameLen(dvt, vt, "AttentionBackward dv")
	dq, dk, dv, dP, do := dqt.F32, dkt.F32, dvt.F32, dpt.F32, dot.F32
	q, k, v, P := qt.F32, kt.F32, vt.F32, pt.F32
	B, H, Sq, Sk, Dh := a.B, a.H, a.Sq, a.Sk, a.Dh
	D := H * Dh
	hs := Sq * Sk
	pd := P
	if a.Dropout > 0 {
		pd = be.scratch(len(P))
		be.Dropout(kernels.FromF32(pd, len(pd)), pt.Reshape(len(P)), a.Dropout, a.Seed)
	}
	be.par(B, 1, func(_, lo, hi int) {
		for b := lo; b < hi; b++ {
			// dPd = dO V^T ; dV = Pd^T dO
			SgemmStrided(H, false, true, Sq, Sk, Dh, 1, do[b*Sq*D:], D, Dh, v[b*skCap*D:], D, Dh, 0, dP[b*H*hs:], Sk, hs)
			SgemmStrided(H, true, false, Sk, Dh, Sq, 1, pd[b*H*hs:], Sk, hs, do[b*Sq*D:], D, Dh, 0, dv[b*skCap*D:], D, Dh)
		}
	})
	if a.Dropout > 0 {
		be.DropoutBackward(dpt.Reshape(len(dP)), dpt.Reshape(len(dP)), a.Dropout, a.Seed)
	}
	rows := B * H * Sq
	be.par(rows, 16, func(_, lo, hi int) {
		for r := lo; r < hi; r++ {
			pr, dr := P[r*Sk:r*Sk+Sk], dP[r*Sk:r*Sk+Sk]
			var dot float32
			for j, p := range pr {
				dot += p * dr[j]
			}
			for j, p := range pr {
				dr[j] = p * (dr[j] - dot)
			}
		}
	})
	be.par(B, 1, func(_, lo, hi int) {
		for b := lo; b < hi; b++ {
			SgemmStrided(H, false, false, Sq, Dh, Sk, a.Scale, dP[b*H*hs:], Sk, hs, k[b*skCap*D:], D, Dh, 0, dq[b*Sq*D:], D, Dh)
			SgemmStrided(H, true, false, Sk, Dh, Sq, a.Scale, dP[b*H*hs:], Sk, hs, q[b*Sq*D:], D, Dh, 0, dk[b*skCap*D:], D, Dh)
		}
	})
}

// CrossEntropy implements kernels.Backend.
func (be *Backend) CrossEntropy(dlt, lt, tt kernels.Tensor, ls float32, pad int32, gradScale float32) (float64, int) {
	logits, tg := f32(lt, "logits"), tt.I32
	V := lt.Cols()
	N := lt.Rows()
	if len(tg) != N {
		panic(fmt.Sprintf("cpu: CrossEntropy: %d targets for logits %v", len(tg), lt))
	}
	var dl []float32
	if dlt.Len() > 0 {
		sameLen(dlt, lt, "CrossEntropy")
		dl = dlt.F32
	}
	conf := 1 - ls
	low := float32(0)
	if V > 1 {
		low = ls / float32(V-1)
	}
	w := be.parts(N, 4)
	part := be.partialBuf(2 * w)
	parFor(w, N, func(p, lo, hi int) {
		var sum float64
		var cnt int
		for r := lo; r < hi; r++ {
			y := tg[r]
			row := logits[r*V : r*V+V]
			if y == pad {
				if dl != nil {
					clear(dl[r*V : r*V+V])
				}
				continue
			}
			if y < 0 || int(y) >= V {
				panic(fmt.Sprintf("cpu: CrossEntropy: target %d outside vocabulary of %d", y, V))
			}
			mx := row[0]
			var sz float64
			for _, z := range row {
				if z > mx {
					mx = z
				}
				sz += float64(z)
			}
			zy := float64(row[y])
			var se float32
			if dl == nil {
				se = expShift(nil, row, mx)
			} else {
				// d may alias row: each z is read before its slot is
				// overwritten with exp(z - max).
				se = expShift(dl[r*V:r*V+V], row, mx)
			}
			lse := float64(mx) + math.Log(float64(se))
			sum += lse - (float64(conf)*zy + float64(low)*(sz-zy))
			cnt++
			if dl != nil {
				d := dl[r*V : r*V+V]
				inv := 1 / se
				for j, e := range d {
					d[j] = (e*inv - low) * gradScale
				}
				d[y] -= (conf - low) * gradScale
			}
		}
		part[2*p] = sum
		part[2*p+1] = float64(cnt)
	})
	var sum float64
	cnt := 0
	for p := 0; p < w; p++ {
		sum += part[2*p]
		cnt += int(part[2*p+1])
	}
	return sum, cnt
}

// LogSoftmax implements kernels.Backend.
func (be *Backend) LogSoftmax(ot, xt kernels.Tensor) {
	sameLen(ot, xt, "LogSoftmax")
	out, x := f32(ot, "out"), f32(xt, "x")
	V := xt.Cols()
	N := len(x) / V
	be.par(N, 2, func(_, lo, hi int) {
		for r := lo; r < hi; r++ {
			row, o := x[r*V:r*V+V], out[r*V:r*V+V]
			mx := row[0]
			for _, z := range row {
				if z > mx {
					mx = z
				}
			}
			se := expShift(nil, row, mx)
			l := mx + float32(math.Log(float64(se)))
			for j, z := range row {
				o[j] = z - l
			}
		}
	})
}

func adam(p, g, m, v []float32, a kernels.AdamArgs) {
	b1, b2 := a.Beta1, a.Beta2
	c1, c2 := 1-b1, 1-b2
	for i, gi := range g {
		mi := b1*m[i] + c1*gi
		vi := b2*v[i] + c2*gi*gi
		m[i], v[i] = mi, vi
		p[i] -= a.LR * mi / (float32(math.Sqrt(float64(vi))) + a.Eps)
	}
}

// Adam implements kernels.Backend.
func (be *Backend) Adam(pt, gt, mt, vt kernels.Tensor, a kernels.AdamArgs) {
	sameLen(pt, gt, "Adam")
	sameLen(pt, mt, "Adam")
	sameLen(pt, vt, "Adam")
	p, g, m, v := pt.F32, gt.F32, mt.F32, vt.F32
	be.par(len(p), 1<<14, func(_, lo, hi int) {
		adam(p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi], a)
	})
}

// AdamRows implements kernels.Backend.
func (be *Backend) AdamRows(pt, gt, mt, vt, rt kernels.Tensor, a kernels.AdamArgs) {
	sameLen(pt, gt, "AdamRows")
	sameLen(pt, mt, "AdamRows")
	sameLen(pt, vt, "AdamRows")
	p, g, m, v, rows := pt.F32, gt.F32, mt.F32, vt.F32, rt.I32
	d := pt.Cols()
	be.par(len(rows), 8, func(_, lo, hi int) {
		for _, r := range rows[lo:hi] {
			s := int(r) * d
			adam(p[s:s+d], g[s:s+d], m[s:s+d], v[s:s+d], a)
		}
	})
}

// GatherRows implements kernels.Backend.
func (be *Backend) GatherRows(dt, st, it kernels.Tensor, cols int) {
	dst, src, idx := f32(dt, "dst"), f32(st, "src"), it.I32
	rl := st.Len() / st.Dims[0]
	dl := dt.Len() / dt.Dims[0]
	if cols > rl || cols > dl || len(idx) > dt.Dims[0] {
		panic(fmt.Sprintf("cpu: GatherRows %v <- %v cols %d", dt, st, cols))
	}
	be.par(len(idx), 4, func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			s := int(idx[i]) * rl
			copy(dst[i*dl:i*dl+cols], src[s:s+cols])
		}
	})
}

// WriteStep implements kernels.Backend.
func (be *Backend) WriteStep(ct, xt kernels.Tensor, t int) {
	cache, x := f32(ct, "cache"), f32(xt, "x")
	R, Tc, D := ct.Dims[0], ct.Dims[1], ct.Dims[2]
	if t < 0 || t >= Tc || xt.Len() != R*D {
		panic(fmt.Sprintf("cpu: WriteStep %v <- %v at %d", ct, xt, t))
	}
	for r := 0; r < R; r++ {
		copy(cache[(r*Tc+t)*D:(r*Tc+t+1)*D], x[r*D:(r+1)*D])
	}
}
