package kerneltest

import (
	"fmt"
	"math"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/half"
	"github.com/gorun/gorun/kernels"
)

// randBits returns n float32s with random bit patterns (NaNs and Infs
// included).
func (e *env) randBits(n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = math.Float32frombits(e.rng.Uint32())
	}
	return x
}

func zeros(n int) []float32 { return make([]float32, n) }

// checkI32 checks an I32 tensor's contents through Embedding (ids index
// the rows of a table whose row r is all r+1), the only way to read
// integers back through the interface.
func (e *env) checkI32(what string, ids kernels.Tensor, want []int32) {
	e.t.Helper()
	vocab := 1
	for _, v := range want {
		vocab = max(vocab, int(v)+1)
	}
	const d = 3
	table := make([]float32, vocab*d)
	for i := range table {
		table[i] = float32(i/d + 1)
	}
	tt := e.up(table, vocab, d)
	out := e.alloc(dtype.Float32, len(want), d)
	e.be.Embedding(out, tt, ids, 1, -1)
	exp := make([]float32, 0, len(want)*d)
	for _, v := range want {
		exp = append(exp, float32(v+1), float32(v+1), float32(v+1))
	}
	e.exact(what+" (read through Embedding)", e.down(out), exp)
}

func testAllocUpload(e *env) {
	for _, dims := range [][]int{{1}, {7}, {33}, {3, 100}, {2, 3, 513}, {1, 2, 3, 4097}, {100003}} {
		e.run(fmt.Sprint(dims), func() {
			x := e.alloc(dtype.Float32, dims...)
			n := x.Len()
			e.exact("fresh F32 tensor", e.down(x), zeros(n))
			v := e.randBits(n)
			e.be.Upload(x, v)
			e.exact("downloaded", e.down(x), v)
			for _, dt := range []dtype.DType{dtype.Float16, dtype.BFloat16} {
				h := e.alloc(dt, dims...)
				y := e.alloc(dtype.Float32, dims...)
				e.be.Upload(y, e.randn(n, 1))
				e.be.Cast(y, h)
				e.exact("fresh "+dt.String()+" tensor, cast to F32", e.down(y), zeros(n))
			}
			if n <= 4097 {
				e.checkI32("fresh I32 tensor", e.alloc(dtype.Int32, dims...), make([]int32, n))
			}
		})
	}
	e.run("Name, Device, Sync", func() {
		if e.be.Name() == "" {
			e.errorf("Name() is empty")
		}
		if dev := e.be.Device().String(); dev == "" {
			e.errorf("Device() has no name")
		}
		x := e.up(e.randn(10, 1), 10)
		e.be.Scale(x, 2)
		e.be.Sync()
	})
	// Views: Upload into, and Download from, a part of a tensor.
	e.run("views", func() {
		base := e.randn(50, 1)
		big := e.up(base, 50)
		part := e.randn(7, 1)
		e.be.Upload(big.Slice(5, 7), part)
		want := clone(base)
		copy(want[5:], part)
		e.exact("whole after Upload into [5:12]", e.down(big), want)
		e.exact("Download of [3:12]", e.down(big.Slice(3, 9)), want[3:12])
		m := e.up(e.randn(6*33, 1), 6, 33)
		all := e.down(m)
		e.exact("Download of rows 2..5", e.down(m.RowSlice(2, 5)), all[2*33:5*33])
		rows := e.randn(2*33, 1)
		e.be.Upload(m.RowSlice(1, 3), rows)
		copy(all[33:], rows)
		e.exact("whole after Upload into rows 1..3", e.down(m), all)
		ids := e.upI([]int32{4, 1, 3, 3, 0, 2}, 6)
		e.checkI32("UploadI32", ids, []int32{4, 1, 3, 3, 0, 2})
		e.be.UploadI32(ids.Slice(2, 3), []int32{5, 0, 1})
		e.checkI32("UploadI32 into [2:5]", ids, []int32{4, 1, 5, 0, 1, 2})
	})
}

// testFree frees tensors (also right after queueing work on them) and
// allocates again: the new tensors must be zeroed and usable.
func testFree(e *env) {
	for _, n := range []int{1, 1000, 100003} {
		e.run(fmt.Sprint(n), func() {
			ones := make([]float32, n)
			for i := range ones {
				ones[i] = 1
			}
			for it := range 5 {
				a := e.be.Alloc(dtype.Float32, n)
				e.be.Upload(a, ones)
				e.be.Scale(a, 3) // queued work on a just before it is freed
				e.be.Free(a)
				h := e.be.Alloc(dtype.Float16, n)
				ids := e.be.Alloc(dtype.Int32, n)
				e.be.Free(h)
				e.be.Free(ids)
				b := e.alloc(dtype.Float32, n)
				e.exact(fmt.Sprintf("Alloc after Free (round %d)", it), e.down(b), zeros(n))
				x := e.randn(n, 1)
				e.be.Upload(b, x)
				e.be.Scale(b, 2)
				want := make([]float64, n)
				for i, v := range x {
					want[i] = 2 * float64(v)
				}
				e.near(fmt.Sprintf("Scale on a reallocated tensor (round %d)", it), e.down(b), want, e.tol.F32)
			}
		})
	}
}

func testCopy(e *env) {
	for _, n := range []int{1, 7, 33, 4097, 100003} {
		e.run(fmt.Sprint(n), func() {
			x := e.randBits(n)
			src := e.up(x, n)
			dst := e.up(e.randn(n, 1), n)
			e.be.Copy(dst, src)
			e.exact("F32 copy", e.down(dst), x)
		})
	}
	e.run("views", func() {
		bs, bd := e.randn(60, 1), e.randn(60, 1)
		src, dst := e.up(bs, 60), e.up(bd, 60)
		e.be.Copy(dst.Slice(3, 33), src.Slice(10, 3, 11))
		want := clone(bd)
		copy(want[3:36], bs[10:43])
		e.exact("dst[3:36] = src[10:43]", e.down(dst), want)
		e.exact("src untouched", e.down(src), bs)
	})
	for _, dt := range []dtype.DType{dtype.Float16, dtype.BFloat16} {
		e.run(dt.String(), func() {
			n := 1001
			x := e.randn(n, 10)
			h1, h2 := e.alloc(dt, n), e.alloc(dt, n)
			e.be.Cast(h1, e.up(x, n))
			e.be.Copy(h2, h1)
			y := e.alloc(dtype.Float32, n)
			e.be.Cast(y, h2)
			e.exact("copy cast back", e.down(y), roundTrip(dt, x))
		})
	}
	e.run("I32", func() {
		want := []int32{3, 0, 7, 7, 1, 2, 5}
		src := e.upI(want, 7)
		dst := e.upI([]int32{1, 1, 1, 1, 1, 1, 1}, 7)
		e.be.Copy(dst, src)
		e.checkI32("I32 copy", dst, want)
	})
}

func testZero(e *env) {
	for _, n := range []int{1, 7, 33, 4097, 200003} {
		e.run(fmt.Sprint(n), func() {
			x := e.up(e.randn(n, 1), n)
			e.be.Zero(x)
			e.exact("zeroed", e.down(x), zeros(n))
		})
	}
	e.run("view", func() {
		v := e.randn(100, 1)
		x := e.up(v, 4, 25)
		e.be.Zero(x.RowSlice(1, 3))
		clear(v[25:75])
		e.exact("rows 1..3 zeroed, others kept", e.down(x), v)
		e.be.Zero(x.Slice(77, 5))
		clear(v[77:82])
		e.exact("[77:82] zeroed, others kept", e.down(x), v)
	})
	for _, dt := range []dtype.DType{dtype.Float16, dtype.BFloat16} {
		e.run(dt.String(), func() {
			n := 513
			h := e.alloc(dt, n)
			e.be.Cast(h, e.up(e.randn(n, 1), n))
			e.be.Zero(h)
			y := e.up(e.randn(n, 1), n)
			e.be.Cast(y, h)
			e.exact("zeroed, cast to F32", e.down(y), zeros(n))
		})
	}
	e.run("I32", func() {
		ids := e.upI([]int32{3, 1, 2, 4}, 4)
		e.be.Zero(ids)
		e.checkI32("zeroed I32", ids, []int32{0, 0, 0, 0})
	})
}

// roundTrip is float32 -> dt -> float32 by package half's scalar
// converters (the reference Cast is checked against).
func roundTrip(dt dtype.DType, x []float32) []float32 {
	y := make([]float32, len(x))
	for i, v := range x {
		if dt == dtype.Float16 {
			y[i] = half.F16ToF32(half.F32ToF16(v))
		} else {
			y[i] = half.BF16ToF32(half.F32ToBF16(v))
		}
	}
	return y
}

// castSpecials are the inputs every Cast case starts with: signed zeros,
// Inf, NaN, the float16 limits (largest finite, the overflow threshold,
// smallest normal and subnormal, half of it: ties to even), float32
// subnormals, ties to even in both formats, and large float32s.
var castSpecials = []float32{
	0, float32(math.Copysign(0, -1)), 1, -1, -2,
	float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), -float32(math.NaN()),
	65504, -65504, 65519.99, 65520, 1e6, -1e6,
	6.103515625e-05, 6.0975552e-05, 5.960464477539063e-08, 2.980232238769531e-08, 2.9802326e-08, -8.940697e-08,
	1e-45, -1e-45, 1.1754942e-38, 1.1754944e-38,
	1.00048828125, 1.0009765625, 1.00146484375, // f16 ties
	1.00390625, 1.01171875, -1.00390625, // bf16 ties
	3.4028235e38, -3.4028235e38, 3.3e38, 1e-40, -2.5e-5, 1.5, 0.1,
}

func testCast(e *env) {
	for _, n := range []int{0, 1, 7, 8, 15, 16, 17, 33, 1000, 40000} {
		e.run(fmt.Sprint(n), func() {
			x := make([]float32, n)
			for i := range x {
				switch {
				case i < len(castSpecials):
					x[i] = castSpecials[i]
				case i%3 == 0:
					x[i] = math.Float32frombits(e.rng.Uint32())
				case i%3 == 1:
					x[i] = float32(e.rng.NormFloat64() * math.Pow(2, float64(e.rng.IntN(60)-40)))
				default: // around the float16 range and its subnormals
					x[i] = float32(e.rng.NormFloat64() * math.Pow(2, float64(e.rng.IntN(46)-28)))
				}
			}
			// n = 0 is a zero-length view of a real tensor.
			src := e.up(append(clone(x), 7), n+1).Slice(0, n)
			for _, dt := range []dtype.DType{dtype.Float16, dtype.BFloat16} {
				h := e.alloc(dt, n+1).Slice(0, n)
				back := e.alloc(dtype.Float32, n+1).Slice(0, n)
				e.be.Cast(h, src)
				e.be.Cast(back, h)
				e.exact("F32->"+dt.String()+"->F32", e.down(back), roundTrip(dt, x))
				h2 := e.alloc(dt, n+1).Slice(0, n)
				e.be.Cast(h2, h) // same type: a copy
				e.be.Cast(back, h2)
				e.exact(dt.String()+"->"+dt.String()+"->F32", e.down(back), roundTrip(dt, x))
			}
			same := e.alloc(dtype.Float32, n+1).Slice(0, n)
			e.be.Cast(same, src)
			e.exact("F32->F32", e.down(same), x)
		})
	}
	// Every 16-bit pattern: read as F32 (exactly), then cast back.
	for _, dt := range []dtype.DType{dtype.Float16, dtype.BFloat16} {
		e.run("all "+dt.String()+" values", func() {
			x := make([]float32, 1<<16)
			for i := range x {
				if dt == dtype.Float16 {
					x[i] = half.F16ToF32(uint16(i))
				} else {
					x[i] = half.BF16ToF32(uint16(i))
				}
			}
			h := e.alloc(dt, len(x))
			back := e.alloc(dtype.Float32, len(x))
			e.be.Cast(h, e.up(x, len(x)))
			e.be.Cast(back, h)
			e.exact("every value survives F32->"+dt.String()+"->F32", e.down(back), x)
		})
	}
}

func testScale(e *env) {
	for _, n := range []int{1, 7, 33, 4097, 100003} {
		for _, s := range []float32{0.5, -3, 1e-3, 0} {
			e.run(fmt.Sprintf("n=%d s=%g", n, s), func() {
				x := e.varied(n, 1)
				t := e.up(x, n)
				e.be.Scale(t, s)
				want := make([]float64, n)
				for i, v := range x {
					want[i] = float64(v) * float64(s)
				}
				e.near("x", e.down(t), want, e.tol.F32)
			})
		}
	}
	e.run("view", func() {
		x := e.randn(40, 1)
		t := e.up(x, 40)
		e.be.Scale(t.Slice(3, 33), 2)
		want := to64(x)
		for i := 3; i < 36; i++ {
			want[i] *= 2
		}
		e.near("x (only [3:36] scaled)", e.down(t), want, 0)
	})
}

func testAxpy(e *env) {
	for _, n := range []int{1, 7, 33, 4097, 100003} {
		for _, a := range []float32{2, -0.37, 0} {
			e.run(fmt.Sprintf("n=%d a=%g", n, a), func() {
				y, x := e.varied(n, 1), e.varied(n, 1)
				yt := e.up(y, n)
				e.be.Axpy(yt, a, e.up(x, n))
				want := make([]float64, n)
				for i := range y {
					want[i] = float64(y[i]) + float64(a)*float64(x[i])
				}
				e.near("y", e.down(yt), want, e.tol.F32)
			})
		}
	}
	e.run("view", func() {
		y, x := e.randn(40, 1), e.randn(40, 1)
		yt := e.up(y, 40)
		e.be.Axpy(yt.Slice(5, 30), 1, e.up(x, 40).Slice(1, 30))
		want := to64(y)
		for i := range 30 {
			want[5+i] += float64(x[1+i])
		}
		e.near("y (only [5:35] updated)", e.down(yt), want, e.tol.F32)
	})
}

func testHasInfNaN(e *env) {
	bads := []struct {
		name string
		v    float32
	}{{"+Inf", float32(math.Inf(1))}, {"-Inf", float32(math.Inf(-1))}, {"NaN", float32(math.NaN())}, {"-NaN", -float32(math.NaN())}}
	for _, n := range []int{1, 7, 33, 4097, 100003, 1 << 17} {
		e.run(fmt.Sprint(n), func() {
			x := e.varied(n, 1)
			x[n/2] = math.MaxFloat32 // large but finite
			x[0] = -math.MaxFloat32
			xt := e.up(x, n)
			if e.be.HasInfNaN(xt) {
				e.errorf("finite tensor reported to hold an Inf or a NaN")
			}
			for _, b := range bads {
				for _, at := range []int{0, n / 3, n - 1} {
					old := x[at]
					x[at] = b.v
					e.be.Upload(xt, x)
					if !e.be.HasInfNaN(xt) {
						e.errorf("%s at %d of %d not found", b.name, at, n)
					}
					if at > 0 && e.be.HasInfNaN(xt.Slice(0, at)) {
						e.errorf("%s at %d found in the view [0:%d] that excludes it", b.name, at, at)
					}
					x[at] = old
				}
			}
			e.be.Upload(xt, x)
			if e.be.HasInfNaN(xt) { // a flag left set by the calls before?
				e.errorf("finite tensor reported to hold an Inf or a NaN after tensors that did")
			}
		})
	}
}

func testSumSquares(e *env) {
	for _, n := range []int{1, 7, 33, 4097, 100003} {
		e.run(fmt.Sprint(n), func() {
			x := e.varied(n, 1)
			var want float64
			for _, v := range x {
				want += float64(v) * float64(v)
			}
			xt := e.up(x, n)
			e.scalar("sum", e.be.SumSquares(xt), want, want, e.tol.F32)
			var part float64
			for _, v := range x[1 : n/2+1] {
				part += float64(v) * float64(v)
			}
			e.scalar("sum of the view [1:n/2+1]", e.be.SumSquares(xt.Slice(1, n/2)), part, part, e.tol.F32)
		})
	}
	e.run("integers", func() {
		// small integers: every partial sum is exact in float64, so any
		// summation order gives the exact sum.
		n := 1 << 17
		x := make([]float32, n)
		var want float64
		for i := range x {
			x[i] = float32(i%7) - 3
			want += float64(x[i]) * float64(x[i])
		}
		if got := e.be.SumSquares(e.up(x, n)); got != want {
			e.errorf("sum = %v, want %v exactly", got, want)
		}
	})
}
