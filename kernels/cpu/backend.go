package cpu

import (
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/kernels"
)

// Backend is the pure Go CPU backend. Big row-wise and element-wise ops are
// split across Threads goroutines. A Backend keeps small internal scratch
// buffers and is not safe for concurrent use by several goroutines.
type Backend struct {
	// Threads is the number of goroutines an op uses (GOMAXPROCS by default).
	Threads int

	partials []float64 // per-worker partial sums
	lnPart   []float32 // per-worker dgamma/dbeta partials
	pdrop    []float32 // attention weights after dropout
	ortho    []float64 // Orthonormalize's per-block partial sums
}

// New returns a CPU backend using GOMAXPROCS threads.
func New() *Backend { return &Backend{Threads: runtime.GOMAXPROCS(0)} }

var _ kernels.Backend = (*Backend)(nil)

// Name implements kernels.Backend.
func (be *Backend) Name() string { return "cpu" }

// Device implements kernels.Backend.
func (be *Backend) Device() kernels.Device { return kernels.Device{Kind: kernels.CPU} }

// Sync implements kernels.Backend.
func (be *Backend) Sync() {}

// Alloc implements kernels.Backend.
func (be *Backend) Alloc(dt dtype.DType, dims ...int) kernels.Tensor {
	n := 1
	for _, d := range dims {
		n *= d
	}
	switch dt {
	case dtype.Float32:
		return kernels.FromF32(make([]float32, n), dims...)
	case dtype.Int32:
		return kernels.FromI32(make([]int32, n), dims...)
	case dtype.Float16, dtype.BFloat16:
		t := kernels.Tensor{DType: dt, Rank: len(dims), U16: make([]uint16, n)}
		copy(t.Dims[:], dims)
		return t
	}
	panic(fmt.Sprintf("cpu: Alloc of a %v tensor (want float32, float16, bfloat16 or int32)", dt))
}

// Free implements kernels.Backend: Go's garbage collector owns CPU memory.
func (be *Backend) Free(kernels.Tensor) {}

// parts returns how many workers to use for n items of at least grain each.
func (be *Backend) parts(n, grain int) int {
	w := be.Threads
	if w < 1 {
		w = 1
	}
	if grain < 1 {
		grain = 1
	}
	if c := n / grain; c < w {
		w = c
	}
	if w < 1 {
		w = 1
	}
	return w
}

// parFor runs fn(part, lo, hi) over [0, n) split into w contiguous parts.
func parFor(w, n int, fn func(part, lo, hi int)) {
	if w <= 1 {
		fn(0, 0, n)
		return
	}
	var wg sync.WaitGroup
	wg.Add(w - 1)
	for p := 1; p < w; p++ {
		go func(p int) {
			fn(p, p*n/w, (p+1)*n/w)
			wg.Done()
		}(p)
	}
	fn(0, 0, n/w)
	wg.Wait()
}

func (be *Backend) par(n, grain int, fn func(part, lo, hi int)) int {
	w := be.parts(n, grain)
	parFor(w, n, fn)
	return w
}

func f32(t kernels.Tensor, what string) []float32 {
	if t.DType != dtype.Float32 || (t.F32 == nil && t.Len() > 0) {
		panic(fmt.Sprintf("cpu: %s must be an F32 CPU tensor, got %v", what, t))
	}
	return t.F32
}

func sameLen(a, b kernels.Tensor, op string) {
	if a.Len() != b.Len() {
		panic(fmt.Sprintf("cpu: %s: %v and %v differ in length", op, a, b))
	}
}

// Upload implements kernels.Backend.
func (be *Backend) Upload(dst kernels.Tensor, src []float32) { copy(f32(dst, "dst"), src) }

// UploadI32 implements kernels.Backend.
func (be *Backend) UploadI32(dst kernels.Tensor, src []int32) { copy(dst.I32, src) }

// Download implements kernels.Backend.
func (be *Backend) Download(dst []float32, src kernels.Tensor) { copy(dst, f32(src, "src")) }

// Copy implements kernels.Backend.
func (be *Backend) Copy(dst, src kernels.Tensor) {
	sameLen(dst, src, "Copy")
	switch {
	case dst.F32 != nil:
		copy(dst.F32, src.F32)
	case dst.I32 != nil:
		copy(dst.I32, src.I32)
	default:
		copy(dst.U16, src.U16)
	}
}

// Zero implements kernels.Backend.
func (be *Backend) Zero(t kernels.Tensor) {
	switch {
	case t.F32 != nil:
		x := t.F32
		be.par(len(x), 1<<16, func(_, lo, hi int) { clear(x[lo:hi]) })
	case t.I32 != nil:
		clear(t.I32)
	default:
		clear(t.U16)
	}
}

// Scale implements kernels.Backend.
func (be *Backend) Scale(t kernels.Tensor, s float32) {
	x := f32(t, "x")
	be.par(len(x), 1<<15, func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			x[i] *= s
		}
	})
}

// Axpy implements kernels.Backend.
func (be *Backend) Axpy(yt kernels.Tensor, a float32, xt kernels.Tensor) {
	sameLen(yt, xt, "Axpy")
	y, x := f32(yt, "y"), f32(xt, "x")
	be.par(len(y), 1<<15, func(_, lo, hi int) {
		yy, xx := y[lo:hi], x[lo:hi]
		for i := range yy {
			yy[i] += a * xx[i]
		}
	})
}

func (be *Backend) partialBuf(w int) []float64 {
	if len(be.partials) < w {
		be.partials = make([]float64, w)
	}
	p := be.partials[:w]
	clear(p)
	return p
}

// HasInfNaN implements kernels.Backend.
func (be *Backend) HasInfNaN(t kernels.Tensor) bool {
	x := f32(t, "x")
	w := be.parts(len(x), 1<<15)
	p := be.partialBuf(w)
	parFor(w, len(x), func(part, lo, hi int) {
		for _, v := range x[lo:hi] {
			if v-v != 0 { // NaN or ±Inf
				p[part] = 1
				return
			}
		}
	})
	for _, v := range p {
		if v != 0 {
			return true
		}
	}
	return false
}

// SumSquares implements kernels.Backend.
func (be *Backend) SumSquares(t kernels.Tensor) float64 {
	x := f32(t, "x")
	w := be.parts(len(x), 1<<15)
	p := be.partialBuf(w)
	parFor(w, len(x), func(part, lo, hi int) {
		var s float64
		for _, v := range x[lo:hi] {
			s += float64(v) * float64(v)
		}
		p[part] = s
	})
	var s float64
	for _, v := range p {
		s += v
	}
	return s
}

// Gemm implements kernels.Backend.
func (be *Backend) Gemm(transA, transB bool, alpha float32, a, b kernels.Tensor, beta float32, c kernels.Tensor) {
	A, B, C := f32(a, "A"), f32(b, "B"), f32(c, "C")
	if c.Rank >= 3 {
		batch := c.Len() / (c.Dim(-2) * c.Dim(-1))
		ar, ac := a.Dim(-2), a.Dim(-1)
		br, bc := b.Dim(-2), b.Dim(-1)
		m, n := c.Dim(-2), c.Dim(-1)
		k := ac
		if transA {
			k = ar
		}
		// a single A or B: the same matrix for every member (stride 0)
		sa, sb := ar*ac, br*bc
		if a.Len() == sa {
			sa = 0
		}
		if b.Len() == sb {
			sb = 0
		}
		if (transA && ac != m) || (!transA && ar != m) || (transB && (br != n || bc != k)) || (!transB && (bc != n || br != k)) ||
			(sa != 0 && a.Len() != batch*sa) || (sb != 0 && b.Len() != batch*sb) {
			panic(fmt.Sprintf("cpu: Gemm shapes %v x %v -> %v (transA %v transB %v)", a, b, c, transA, transB))
		}
		SgemmStrided(batch, transA, transB, m, n, k, alpha, A, ac, sa, B, bc, sb, beta, C, n, m*n)
		return
	}
	ar, ac := a.Rows(), a.Cols()
	br, bc := b.Rows(), b.Cols()
	m, n := c.Rows(), c.Cols()
	k := ac
	if transA {
		k = ar
	}
	if (transA && ac != m) || (!transA && ar != m) || (transB && (br != n || bc != k)) || (!transB && (bc != n || br != k)) {
		panic(fmt.Sprintf("cpu: Gemm shapes %v x %v -> %v (transA %v transB %v)", a, b, c, transA, transB))
	}
	if m == 0 || n == 0 {
		return
	}
	if k == 0 {
		if beta == 0 {
			clear(C)
		} else {
			be.Scale(c, beta)
		}
		return
	}
	Sgemm(transA, transB, m, n, k, alpha, A, ac, B, bc, beta, C, n)
}

// AddBias implements kernels.Backend.
func (be *Backend) AddBias(xt, bt kernels.Tensor) {
	x, bias := f32(xt, "x"), f32(bt, "bias")
	d := len(bias)
	rows := len(x) / d
	be.par(rows, 64, func(_, lo, hi int) {
		for r := lo; r < hi; r++ {
			row := x[r*d : r*d+d]
			for j, b := range bias {
				row[j] += b
			}
		}
	})
}

// BiasReLU implements kernels.Backend.
func (be *Backend) BiasReLU(xt, bt kernels.Tensor) {
	x, bias := f32(xt, "x"), f32(bt, "bias")
	d := len(bias)
	rows := len(x) / d
	be.par(rows, 32, func(_, lo, hi int) {
		for r := lo; r < hi; r++ {
			row := x[r*d : r*d+d]
			for j, b := range bias {
				row[j] = max(row[j]+b, 0)
			}
		}
	})
}

// BiasReLUDropout implements kernels.Backend: BiasReLU, then Dropout.
func (be *Backend) BiasReLUDropout(yt, xt, bt kernels.Tensor, p float32, seed uint64) {
	be.BiasReLU(xt, bt)
	be.Dropout(yt, xt, p, seed)
}

// ReLUBackward implements kernels.Backend.
func (be *Backend) ReLUBackward(dxt, yt kernels.Tensor) {
	sameLen(dxt, yt, "ReLUBackward")
	dx, y := f32(dxt, "dx"), f32(yt, "y")
	be.par(len(dx), 1<<15, func(_, lo, hi int) {
		// branchless: y is a ReLU output (>= 0), and the sign of the
		// inputs is random, so a branch would mispredict half the time.
		yy, dd := y[lo:hi], dx[lo:hi]
		for i, v := range yy {
			nz := math.Float32bits(v) & 0x7fffffff
			mask := uint32(int32(-nz) >> 31) // all ones when v != 0
			dd[i] = math.Float32frombits(math.Float32bits(dd[i]) & mask)
		}
	})
}

// BiasGrad implements kernels.Backend.
func (be *Backend) BiasGrad(dbt, dyt kernels.Tensor) {
	db, dy := f32(dbt, "dbias"), f32(dyt, "dy")
	d := len(db)
	rows := len(dy) / d
	be.par(d, 64, func(_, lo, hi int) {
		acc := db[lo:hi]
		for r := 0; r < rows; r++ {
			row := dy[r*d+lo : r*d+hi]
			for j, v := range row {
				acc[j] += v
			}
		}
	})
}

// LayerNorm implements kernels.Backend.
func (be *Backend) LayerNorm(yt, meant, rstdt, xt, gt, bt kernels.Tensor, eps float32) {
	y, mean, rstd, x := f32(yt, "y"), f32(meant, "mean"), f32(rstdt, "rstd"), f32(xt, "x")
	g, b := f32(gt, "gamma"), f32(bt, "beta")
	d := len(g)
	rows := len(x) / d
	be.par(rows, 16, func(_, lo, hi int) {
		for r := lo; r < hi; r++ {
			xr := x[r*d : r*d+d]
			var s float32
			for _, v := range xr {
				s += v
			}
			m := s / float32(d)
			var vs float32
			for _, v := range xr {
				dv := v - m
				vs += dv * dv
			}
			rs := float32(1 / math.Sqrt(float64(vs/float32(d)+eps)))
			mean[r], rstd[r] = m, rs
			yr := y[r*d : r*d+d]
			for j, v := range xr {
				yr[j] = (v-m)*rs*g[j] + b[j]
			}
		}
	})
}

// LayerNormBackward implements kernels.Backend.
func (be *Backend) LayerNormBackward(dxt, dgt, dbt, dyt, xt, meant, rstdt, gt kernels.Tensor) {
	dx, dg, db, dy, x := f32(dxt, "dx"), f32(dgt, "dgamma"), f32(dbt, "dbeta"), f32(dyt, "dy"), f32(xt, "x")
	mean, rstd, g := f32(meant, "mean"), f32(rstdt, "rstd"), f32(gt, "gamma")
	d := len(g)
	rows := len(x) / d
	w := be.parts(rows, 16)
	if len(be.lnPart) < 2*d*w {
		be.lnPart = make([]float32, 2*d*w)
	}
	part := be.lnPart[:2*d*w]
	clear(part)
	parFor(w, rows, func(p, lo, hi int) {
		pg, pb := part[2*d*p:2*d*p+d], part[2*d*p+d:2*d*p+2*d]
		for r := lo; r < hi; r++ {
			xr, dyr, dxr := x[r*d:r*d+d], dy[r*d:r*d+d], dx[r*d:r*d+d]
			m, rs := mean[r], rstd[r]
			var sdn, sdnn float32
			for j, v := range xr {
				n := (v - m) * rs
				dn := dyr[j] * g[j]
				sdn += dn
				sdnn += dn * n
				pg[j] += dyr[j] * n
				pb[j] += dyr[j]
			}
			sdn /= float32(d)
			sdnn /= float32(d)
			for j, v := range xr {
				n := (v - m) * rs
				dxr[j] += rs * (dyr[j]*g[j] - sdn - n*sdnn)
			}
		}
	})
	for p := 0; p < w; p++ {
		pg, pb := part[2*d*p:2*d*p+d], part[2*d*p+d:2*d*p+2*d]
		for j := range dg {
			dg[j] += pg[j]
			db[j] += pb[j]
		}
	}
}

// maskWord is the dropout randomness of elements 4g..4g+3: a counter-based
// hash (splitmix64) of (seed, g), 16 bits per element, so forward and
// backward agree and the mask does not depend on the number of threads.
func maskWord(seed uint64, g int) uint64 {
	z := seed + uint64(g)*0x9E3779B97F4A7C15
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// dropThresh: an element is kept when its 16 random bits are >= the
// threshold, i.e. with probability 1 - round(p*65536)/65536.
func dropThresh(p float32) uint16 { return uint16(math.Round(float64(p) * 65536)) }

// dropMask is all ones when the 16 random bits r say "drop" (r < th).
func dropMask(r, th uint32) uint32 { return uint32(int32(r-th) >> 31) }

// dropApply computes y[i] = res[i] + x[i]*sc for kept elements and
// y[i] = res[i] for dropped ones, over [lo, hi); res may be nil (zero).
// Branch-free: one hash per 4 elements, the mask applied to the bits.
func dropApply(y, res, x []float32, lo, hi int, seed uint64, th uint16, sc float32) {
	t := uint32(th)
	one := func(i int, z uint64) float32 {
		m := dropMask(uint32(uint16(z>>(uint(i&3)*16))), t)
		return math.Float32frombits(math.Float32bits(x[i]*sc) &^ m)
	}
	i := lo
	for ; i < hi && i&3 != 0; i++ {
		v := one(i, maskWord(seed, i>>2))
		if res != nil {
			v += res[i]
		}
		y[i] = v
	}
	end4 := i + (hi-i)&^3
	if res == nil {
		for ; i < end4; i += 4 {
			z := maskWord(seed, i>>2)
			xs, ys := x[i:i+4:i+4], y[i:i+4:i+4]
			ys[0] = math.Float32frombits(math.Float32bits(xs[0]*sc) &^ dropMask(uint32(uint16(z)), t))
			ys[1] = math.Float32frombits(math.Float32bits(xs[1]*sc) &^ dropMask(uint32(uint16(z>>16)), t))
			ys[2] = math.Float32frombits(math.Float32bits(xs[2]*sc) &^ dropMask(uint32(uint16(z>>32)), t))
			ys[3] = math.Float32frombits(math.Float32bits(xs[3]*sc) &^ dropMask(uint32(uint16(z>>48)), t))
		}
	} else {
		for ; i < end4; i += 4 {
			z := maskWord(seed, i>>2)
			xs, ys, rs := x[i:i+4:i+4], y[i:i+4:i+4], res[i:i+4:i+4]
			ys[0] = rs[0] + math.Float32frombits(math.Float32bits(xs[0]*sc)&^dropMask(uint32(uint16(z)), t))
			ys[1] = rs[1] + math.Float32frombits(math.Float32bits(xs[1]*sc)&^dropMask(uint32(uint16(z>>16)), t))
			ys[2] = rs[2] + math.Float32frombits(math.Float32bits(xs[2]*sc)&^dropMask(uint32(uint16(z>>32)), t))
			ys[3] = rs[3] + math.Float32frombits(math.Float32bits(xs[3]*sc)&^dropMask(uint32(uint16(z>>48)), t))
		}
	}
	for ; i < hi; i++ {
		v := one(i, maskWord(seed, i>>2))
		if res != nil {
			v += res[i]
		}
		y[i] = v
	}
}

// Dropout implements kernels.Backend.
func (be *Backend) Dropout(yt, xt kernels.Tensor, p float32, seed uint64) {
	sameLen(yt, xt, "Dropout")
	y, x := f32(yt, "y"), f32(xt, "x")
	if p <= 0 {
		copy(y, x)
		return
	}
	th, sc := dropThresh(p), 1/(1-p)
	be.par(len(y), 1<<14, func(_, lo, hi int) { dropApply(y, nil, x, lo, hi, seed, th, sc) })
}

// DropoutBackward implements kernels.Backend.
func (be *Backend) DropoutBackward(dxt, dyt kernels.Tensor, p float32, seed uint64) {
	be.Dropout(dxt, dyt, p, seed)
}

// ResidualDropout implements kernels.Backend.
func (be *Backend) ResidualDropout(outt, rest, yt kernels.Tensor, p float32, seed uint64) {
	sameLen(outt, yt, "ResidualDropout")
	sameLen(rest, yt, "ResidualDropout")
	out, res, y := f32(outt, "out"), f32(rest, "res"), f32(yt, "y")
	if p <= 0 {
		be.par(len(y), 1<<15, func(_, lo, hi int) {
			for i := lo; i < hi; i++ {
				out[i] = res[i] + y[i]
			}
		})
		return
	}
	th, sc := dropThresh(p), 1/(1-p)
	be.par(len(y), 1<<14, func(_, lo, hi int) { dropApply(out, res, y, lo, hi, seed, th, sc) })
}

// ResidualDropoutLayerNorm implements kernels.Backend: ResidualDropout (or
// Dropout without res), then LayerNorm.
func (be *Backend) ResidualDropoutLayerNorm(outt, yt, meant, rstdt, rest, xt, gt, bt kernels.Tensor, p float32, seed uint64, eps float32) {
	if rest.Len() == 0 {
		be.Dropout(outt, xt, p, seed)
	} else {
		be.ResidualDropout(outt, rest, xt, p, seed)
	}
	be.LayerNorm(yt, meant, rstdt, outt, gt, bt, eps)
}

// Embedding implements kernels.Backend.
func (be *Backend) Embedding(outt, tt, idt kernels.Tensor, scale float32, pad int32) {
	out, table, ids := f32(outt, "out"), f32(tt, "table"), idt.I32
	d := tt.Cols()
	vocab := tt.Rows()
	be.par(len(ids), 32, func(_, lo, hi int) {
		for i := lo; i < hi; i++ {
			o := out[i*d : i*d+d]
			id := ids[i]
			if id == pad {
				clear(o)
				continue
			}
			if id < 0 || int(id) >= vocab {
				panic(fmt.Sprintf("cpu: Embedding: id %d outside vocabulary of %d", id, vocab))
			}
			row := table[int(id)*d : int(id)*d+d]
			for j, v := range row {
				o[j] = v * scale
			}
		}
	})
}

// EmbeddingBackward implements kernels.Backend. Workers split the columns,
// so duplicate ids never race and the sum order is fixed.
func (be *Backend) EmbeddingBackward(dtt, doutt, idt kernels.Tensor, scale float32, pad int32) {
	dt, dout, ids := f32(dtt, "dtable"), f32(doutt, "dout"), idt.I32
	d := dtt.Cols()
	be.par(d, 64, func(_, lo, hi int) {
		for i, id := range ids {
			if id == pad {
				continue
			}
			row := dt[int(id)*d+lo : int(id)*d+hi]
			src := dout[i*d+lo : i*d+hi]
			for j, v := range src {
				row[j] += v * scale
			}
		}
	})
}

// AddPositional implements kernels.Backend.
func (be *Backend) AddPositional(xt, pet kernels.Tensor, t0 int) {
	x, pe := f32(xt, "x"), f32(pet, "pe")
	T, d := xt.Dim(-2), xt.Dim(-1)
	rows := len(x) / d
	be.par(rows, 32, func(_, lo, hi int) {
		for r := lo; r < hi; r++ {
			t := r%T + t0
			xr, pr := x[r*d:r*d+d], pe[t*d:t*d+d]
			for j, v := range pr {
				xr[j] += v
			}
		}
	})
}
