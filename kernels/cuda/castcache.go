package cuda

import (
	"fmt"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/kernels"
)

// The cast cache. A product with a 16-bit operand runs on tensor cores in
// that type (gemmType), so its float32 operand, a weight, is rounded to 16
// bits first (rounded). Without the cache that is one cast per product: a
// weight that a step reads in its forward and its backward pass is cast
// twice, the tied embedding three times. CacheCasts registers a float32
// region (the model's flat weight buffer) whose casts are kept: a 16-bit
// mirror of the whole region, element for element, and the ranges of it
// that are current. An operand inside the region is cast into the mirror
// once and read from there until a write to it: every op of the backend
// that writes a float32 tensor (Adam and AdamRows, the optimizer's update;
// Upload, Copy, Zero, Cast, Scale, Axpy, CopyIn, ...) calls wrote, which
// drops the current ranges it overlaps; Free of the region drops the
// region. So each weight is cast once per optimizer step, as PyTorch's
// autocast caches its casts within a step.
type castCache struct {
	base, end uintptr        // the region's bytes [base, end); 0, 0: none
	mirror    kernels.Tensor // its 16-bit copy (allocated at the first cast)
	valid     [][2]uintptr   // byte ranges [lo, hi) of the region whose mirror is current
	casts     int            // casts made into the mirror (for tests)
	hits      int            // operands served from the mirror (for tests)
}

var _ kernels.CastCache = (*Backend)(nil)

// CacheCasts implements kernels.CastCache: w (F32) is the region whose 16-bit
// casts are kept; it replaces the region of an earlier call.
// An empty w ends the region.
func (b *Backend) CacheCasts(w kernels.Tensor) {
	c := &b.casts
	c.drop(b)
	if w.Len() > 0 {
		b.dev32(w, "CacheCasts")
		c.base, c.end = w.Ptr, w.Ptr+uintptr(4*w.Len())
	}
}

// drop forgets the region and frees the mirror.
func (c *castCache) drop(b *Backend) {
	if c.mirror.Rank > 0 {
		b.mem.free(c.mirror.Ptr)
	}
	*c = castCache{casts: c.casts, hits: c.hits}
}

// cached returns t (F32) rounded to p from the mirror, casting it there
// first unless a current range holds it; ok is false when t is not inside
// the region.
func (b *Backend) cached(t kernels.Tensor, p dtype.DType) (h kernels.Tensor, ok bool) {
	c := &b.casts
	lo, hi := t.Ptr, t.Ptr+uintptr(4*t.Len())
	if c.base == c.end || lo < c.base || hi > c.end || t.Len() == 0 {
		return kernels.Tensor{}, false
	}
	if c.mirror.Rank == 0 || c.mirror.DType != p {
		if c.mirror.Rank > 0 {
			b.mem.free(c.mirror.Ptr)
		}
		n := int(c.end-c.base) / 4
		c.mirror = kernels.Tensor{DType: p, Rank: 1, Dev: b.Device(), Ptr: b.mem.alloc(n * p.Size())}
		c.mirror.Dims[0] = n
		c.valid = c.valid[:0]
	}
	off := int(lo-c.base) / 4
	h = c.mirror.Slice(off, t.Shape()...)
	for _, r := range c.valid {
		if r[0] <= lo && hi <= r[1] {
			c.hits++
			return h, true
		}
	}
	b.kern(kCast[[2]string{"f32", typeName(p)}]).ptr(h.Ptr).ptr(t.Ptr).i64(t.Len()).flat(t.Len())
	c.valid = append(c.valid, [2]uintptr{lo, hi})
	c.casts++
	return h, true
}

// wrote tells the cache that the backend queued a write to the tensors:
// the current ranges they overlap are dropped (their next use casts
// again). Every op that writes a float32 tensor calls it with its outputs.
func (b *Backend) wrote(ts ...kernels.Tensor) {
	c := &b.casts
	if len(c.valid) == 0 {
		return
	}
	for _, t := range ts {
		if t.DType != dtype.Float32 || t.Len() == 0 {
			continue
		}
		lo, hi := t.Ptr, t.Ptr+uintptr(4*t.Len())
		if hi <= c.base || lo >= c.end {
			continue
		}
		k := 0
		for _, r := range c.valid {
			if r[1] <= lo || hi <= r[0] {
				c.valid[k] = r
				k++
			}
		}
		c.valid = c.valid[:k]
	}
}

// CastStats reports the casts made into the cache's mirror and the
// operands served from it since the backend opened.
func (b *Backend) CastStats() (casts, hits int) { return b.casts.casts, b.casts.hits }

func (c *castCache) String() string {
	return fmt.Sprintf("region [%#x, %#x), %d current ranges", c.base, c.end, len(c.valid))
}
