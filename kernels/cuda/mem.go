package cuda

import (
	"fmt"
	"unsafe"
)

// allocator caches device memory like PyTorch's caching allocator: Free
// returns a block to a free list of its size class, and Alloc takes from
// there first, so a training step that frees and allocates the same
// shapes reaches the driver only in its first steps. All use is on the
// compute stream, so a block freed by one op and handed to the next is
// ordered after every earlier use.
type allocator struct {
	b     *Backend
	size  map[uintptr]int // live and cached blocks: their class size
	cache map[int][]uintptr
	inUse int64 // bytes handed out
	held  int64 // bytes obtained from the driver
	peak  int64 // most bytes in use at once
}

func newAllocator(b *Backend) *allocator {
	return &allocator{b: b, size: map[uintptr]int{}, cache: map[int][]uintptr{}}
}

// class rounds a request up: 512 bytes below 1 MiB, 2 MiB above.
func class(n int) int {
	if n <= 0 {
		return 512
	}
	if n < 1<<20 {
		return (n + 511) &^ 511
	}
	return (n + 2<<20 - 1) &^ (2<<20 - 1)
}

func (a *allocator) alloc(n int) uintptr {
	c := class(n)
	if l := a.cache[c]; len(l) > 0 {
		p := l[len(l)-1]
		a.cache[c] = l[:len(l)-1]
		a.use(c)
		return p
	}
	d := a.b.drv
	var p uintptr
	r := d.call(d.memAlloc, uintptr(unsafe.Pointer(&p)), uintptr(c))
	if r != cuSuccess {
		a.release() // give the cached blocks back and try once more
		r = d.call(d.memAlloc, uintptr(unsafe.Pointer(&p)), uintptr(c))
	}
	if r != cuSuccess {
		fr, tot := a.b.MemInfo()
		panic(fmt.Errorf("%w: %d bytes requested, %d in use by gorun (peak %d), %d of %d free on the GPU",
			d.check("cuMemAlloc", r), c, a.inUse, a.peak, fr, tot))
	}
	a.size[p] = c
	a.held += int64(c)
	a.use(c)
	return p
}

func (a *allocator) use(c int) {
	a.inUse += int64(c)
	a.peak = max(a.peak, a.inUse)
}

func (a *allocator) free(p uintptr) {
	c, ok := a.size[p]
	if !ok {
		panic(fmt.Sprintf("cuda: Free of %#x, which Alloc did not return (a view?)", p))
	}
	a.cache[c] = append(a.cache[c], p)
	a.inUse -= int64(c)
}

// release returns every cached block to the driver, after the queued work
// that may still use them.
func (a *allocator) release() {
	d := a.b.drv
	d.call(d.streamSynchronize, a.b.stream)
	for c, l := range a.cache {
		for _, p := range l {
			d.call(d.memFree, p)
			delete(a.size, p)
			a.held -= int64(c)
		}
		delete(a.cache, c)
	}
}

// MemStats reports the device memory gorun's allocator hands out now, at
// its peak, and holds from the driver (cached blocks included).
func (b *Backend) MemStats() (inUse, peak, held int64) {
	return b.mem.inUse, b.mem.peak, b.mem.held
}
