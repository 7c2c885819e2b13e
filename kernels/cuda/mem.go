package cuda

import (
	"fmt"
	"unsafe"
)

// EnvExactAlloc, set to 1, makes every device allocation exactly the
// bytes asked for (one byte for an empty tensor) and gives every Free back
// to the driver at once, after the queued work: no size classes, no cache
// (Settings.ExactAlloc). A kernel that writes past its tensor then
// leaves the allocation instead of landing in a size class's slack, where
// the emulator's guard regions or its AddressSanitizer build
// (internal/cudaemu) see it (on a GPU, so would compute-sanitizer's
// memcheck: not tried); a tensor used
// after its Free is no longer live memory. Every Alloc and Free is a
// driver call and every Free waits for the GPU: for tests and debugging,
// not for training. An environment variable, read at a program's start
// like GORUN_CUDA_PROFILE (internal/envconf.CUDA), so that the binaries
// (nmt-train, the GPU test binaries of bench/gpu) run in the mode
// unchanged.
const EnvExactAlloc = "GORUN_CUDA_EXACT_ALLOC"

// allocator caches device memory like PyTorch's caching allocator: Free
// returns a block to a free list of its size class, and Alloc takes from
// there first, so a training step that frees and allocates the same
// shapes reaches the driver only in its first steps. All use is on the
// compute stream, so a block freed by one op and handed to the next is
// ordered after every earlier use.
type allocator struct {
	b     *Backend
	exact bool            // Settings.ExactAlloc: exact sizes, no cache
	size  map[uintptr]int // live and cached blocks: their class size
	cache map[int][]uintptr
	inUse int64 // bytes handed out
	held  int64 // bytes obtained from the driver
	peak  int64 // most bytes in use at once
}

func newAllocator(b *Backend, exact bool) *allocator {
	return &allocator{b: b, exact: exact, size: map[uintptr]int{}, cache: map[int][]uintptr{}}
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
	if a.exact {
		c = max(n, 1)
	}
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
	a.inUse -= int64(c)
	if a.exact {
		// Every stream's work that may still use the block first (the
		// copy stream's too: a stage's buffer).
		d := a.b.drv
		d.must("cuCtxSynchronize", d.call(d.ctxSynchronize))
		d.must("cuMemFree", d.call(d.memFree, p))
		delete(a.size, p)
		a.held -= int64(c)
		return
	}
	a.cache[c] = append(a.cache[c], p)
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
