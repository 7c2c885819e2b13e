package cuda

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/kernels"
)

// TestCastCache: a float32 operand of a 16-bit product inside the region
// given to CacheCasts is cast once and then read from the cache until a
// write; after each op that writes the region (each in turn), the next
// product casts again and sees the new values. Every product is compared
// bit for bit with the same product of a copy of the weights outside the
// region (cast on every use, as before the cache).
func TestCastCache(t *testing.T) {
	b := backend(t)
	defer b.CacheCasts(kernels.Tensor{})
	r := rand.New(rand.NewPCG(8, 9))
	host := func(n int) []float32 {
		h := make([]float32, n)
		for i := range h {
			h[i] = float32(r.NormFloat64())
		}
		return h
	}
	const d, rows = 8, 5
	w := b.Alloc(dtype.Float32, 4, d, d) // four [d, d] weights in one region
	b.Upload(w, host(w.Len()))
	b.CacheCasts(w)
	x32 := b.Alloc(dtype.Float32, rows, d)
	b.Upload(x32, host(rows*d))
	x := b.Alloc(dtype.Float16, rows, d) // an activation: the product runs in fp16
	b.Cast(x, x32)
	defer b.Free(x32)
	defer b.Free(x)
	W := func(i, n int) kernels.Tensor { // weights i..i+n-1
		if n == 1 {
			return w.Slice(i*d*d, d, d)
		}
		return w.Slice(i*d*d, n, d, d)
	}
	product := func(wv kernels.Tensor) []float32 {
		dims := []int{rows, d}
		if wv.Rank == 3 {
			dims = []int{wv.Dims[0], rows, d}
		}
		out := b.Alloc(dtype.Float16, dims...)
		defer b.Free(out)
		b.Gemm(false, false, 1, x, wv, 0, out)
		o32 := b.Alloc(dtype.Float32, dims...)
		defer b.Free(o32)
		b.Cast(o32, out)
		h := make([]float32, o32.Len())
		b.Download(h, o32)
		return h
	}
	// check: the product with wv, and whether it cast (else a hit),
	// against the product with an uncached copy of wv.
	check := func(what string, wv kernels.Tensor, cast bool) {
		t.Helper()
		c0, h0 := b.CastStats()
		got := product(wv)
		c1, h1 := b.CastStats()
		if cast && (c1 != c0+1 || h1 != h0) || !cast && (c1 != c0 || h1 != h0+1) {
			t.Errorf("%s: %d casts and %d hits, want a %s", what, c1-c0, h1-h0, map[bool]string{true: "cast", false: "hit"}[cast])
		}
		ref := b.Alloc(dtype.Float32, wv.Shape()...)
		defer b.Free(ref)
		b.Copy(ref, wv)
		want := product(ref)
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Errorf("%s: element %d = %g, the uncached product %g (a stale cast?)", what, i, got[i], want[i])
				return
			}
		}
	}
	check("first product with W0", W(0, 1), true)
	check("W0 again", W(0, 1), false)
	check("W1", W(1, 1), true)
	check("W0..W2 stacked: not within one cast", W(0, 3), true)
	check("W2 inside the stack's cast", W(2, 1), false)
	check("W1 again", W(1, 1), false)

	// Each op that writes W0 (and nothing else of the region).
	g, m, v := b.Alloc(dtype.Float32, d, d), b.Alloc(dtype.Float32, d, d), b.Alloc(dtype.Float32, d, d)
	b.Upload(g, host(d*d))
	rowsI := b.Alloc(dtype.Int32, 2)
	b.UploadI32(rowsI, []int32{1, 6})
	h16 := b.Alloc(dtype.Float16, d, d)
	b.Cast(h16, g)
	for _, t := range []kernels.Tensor{g, m, v, rowsI, h16} {
		defer b.Free(t)
	}
	args := kernels.AdamArgs{LR: 0.5, Beta1: 0.9, Beta2: 0.99, Eps: 1e-8}
	for _, op := range []struct {
		name  string
		write func(w0 kernels.Tensor)
	}{
		{"Adam", func(w0 kernels.Tensor) { b.Adam(w0, g, m, v, args) }},
		{"AdamRows", func(w0 kernels.Tensor) { b.AdamRows(w0, g, m, v, rowsI, args) }},
		{"Upload", func(w0 kernels.Tensor) { b.Upload(w0, host(d*d)) }},
		{"Copy", func(w0 kernels.Tensor) { b.Copy(w0, g) }},
		{"Zero of a row", func(w0 kernels.Tensor) { b.Zero(w0.Slice(3*d, d)) }},
		{"Scale", func(w0 kernels.Tensor) { b.Scale(w0, -2) }},
		{"Axpy", func(w0 kernels.Tensor) { b.Axpy(w0, 3, g) }},
		{"Cast from fp16", func(w0 kernels.Tensor) { b.Cast(w0, h16) }},
		{"Gemm into it", func(w0 kernels.Tensor) { b.Gemm(false, false, 1, g, g, 0.5, w0) }},
		{"Orthonormalize", func(w0 kernels.Tensor) { b.Orthonormalize(w0, 1e-8) }},
	} {
		check("W0 before "+op.name, W(0, 1), false)
		op.write(W(0, 1))
		check("W0 after "+op.name, W(0, 1), true)
		check("W1 after "+op.name+" of W0", W(1, 1), false)
	}
	// Free of the region ends it: memory handed out again is not served
	// from the mirror.
	b.Free(w)
	if b.casts.base != b.casts.end || b.casts.mirror.Rank != 0 {
		t.Fatalf("Free of the region left %v", &b.casts)
	}
	w = b.Alloc(dtype.Float32, 4, d, d)
	b.Upload(w, host(w.Len()))
	c0, h0 := b.CastStats()
	product(W(0, 1))
	if c1, h1 := b.CastStats(); c1 != c0 || h1 != h0 {
		t.Errorf("a product with a tensor outside any region went through the cache (%d casts, %d hits)", c1-c0, h1-h0)
	}
	b.Free(w)
}
