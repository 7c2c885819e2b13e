package cudaemu

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// The order of blocks, threads and streams (GORUN_CUDA_EMU_SCHED,
// csrc/emu_sched.h and csrc/emu_streams.h).

const (
	envSched       = "GORUN_CUDA_EMU_SCHED"
	envSchedHelper = "GORUN_EMU_SCHED_HELPER"
	cuNotReady     = 600
)

// sched sets the emulator's schedule for the rest of the test (then the
// one of the environment again).
func (l *emuLibs) sched(t *testing.T, v string) {
	t.Helper()
	l.must(t, "gorunEmuSetSched", uintptr(unsafe.Pointer(cstr(v))))
	t.Cleanup(func() { l.call(t, "gorunEmuSetSched", uintptr(unsafe.Pointer(cstr(os.Getenv(envSched))))) })
}

func (l *emuLibs) queued(t *testing.T) int { return int(l.callPtr(t, "gorunEmuQueued")) }

// launchOn is launch on stream s.
func (l *emuLibs) launchOn(t *testing.T, name string, grid, block dim, s uintptr, args ...uintptr) int {
	t.Helper()
	vals := make([]uint64, len(args)+1)
	ptrs := make([]uintptr, len(args)+1)
	for i, a := range args {
		vals[i] = uint64(a)
		ptrs[i] = uintptr(unsafe.Pointer(&vals[i]))
	}
	r := l.call(t, "cuLaunchKernel", l.fn(t, name), uintptr(grid[0]), uintptr(grid[1]), uintptr(grid[2]),
		uintptr(block[0]), uintptr(block[1]), uintptr(block[2]), 0, s, uintptr(unsafe.Pointer(&ptrs[0])), 0)
	return r
}

// pinned returns n int32 of cuMemAllocHost memory.
func (l *emuLibs) pinned(t *testing.T, n int) []int32 {
	t.Helper()
	var p uintptr
	l.must(t, "cuMemAllocHost_v2", uintptr(unsafe.Pointer(&p)), uintptr(4*n))
	t.Cleanup(func() { l.call(t, "cuMemFreeHost", p) })
	return unsafe.Slice((*int32)(cptr(p)), n)
}

func (l *emuLibs) stream(t *testing.T) uintptr {
	t.Helper()
	var s uintptr
	l.must(t, "cuStreamCreate", uintptr(unsafe.Pointer(&s)), 1)
	t.Cleanup(func() { l.call(t, "cuStreamDestroy_v2", s) })
	return s
}

func (l *emuLibs) event(t *testing.T, flags int) uintptr {
	t.Helper()
	var e uintptr
	l.must(t, "cuEventCreate", uintptr(unsafe.Pointer(&e)), uintptr(flags))
	t.Cleanup(func() { l.call(t, "cuEventDestroy_v2", e) })
	return e
}

func all(s []int32, v int32) bool {
	for _, x := range s {
		if x != v {
			return false
		}
	}
	return true
}

// Blocks and threads run in grid order, reversed, or in a seeded random
// order (each thread takes a ticket before and after a barrier); the same
// schedule gives the same order, asynchronous or not.
func TestSchedOrder(t *testing.T) {
	l := setup(t)
	grid, block := dim{3, 2, 2}, dim{8, 4, 1}
	const tpb, nb = 32, 12
	const n = tpb * nb
	run := func(sched string) (before, after []int32) {
		l.sched(t, sched)
		ctr := upload(t, l, []int32{0})
		b, a := l.alloc(t, 4*n), l.alloc(t, 4*n)
		l.mustLaunch(t, "emu_test_ticket", grid, block, ctr, b, a)
		before, after = make([]int32, n), make([]int32, n)
		download(t, l, before, b)
		download(t, l, after, a)
		return before, after
	}
	// blockRanks gives each block's place in the run (its first ticket /
	// 2*tpb: a block runs all its threads before the next starts) and
	// checks that the tickets are a permutation.
	blockRanks := func(what string, before, after []int32) []int {
		seen := make([]bool, 2*n)
		ranks := make([]int, nb)
		for b := range nb {
			lo := int(slices.Min(before[b*tpb : (b+1)*tpb]))
			ranks[b] = lo / (2 * tpb)
			for i := b * tpb; i < (b+1)*tpb; i++ {
				for _, v := range []int32{before[i], after[i]} {
					if int(v) < ranks[b]*2*tpb || int(v) >= (ranks[b]+1)*2*tpb || seen[v] {
						t.Fatalf("%s: thread %d's ticket %d: blocks overlap or tickets repeat", what, i, v)
					}
					seen[v] = true
				}
				if int(after[i]) < ranks[b]*2*tpb+tpb {
					t.Fatalf("%s: thread %d took ticket %d after the barrier before all had arrived", what, i, after[i])
				}
			}
		}
		return ranks
	}
	fb, fa := run("forward")
	for i := range n {
		if b, tid := i/tpb, i%tpb; fb[i] != int32(2*tpb*b+tid) {
			t.Fatalf("forward: thread %d of block %d took ticket %d, want %d", tid, b, fb[i], 2*tpb*b+tid)
		}
	}
	blockRanks("forward", fb, fa)
	rb, ra := run("reverse")
	for i := range n {
		b, tid := i/tpb, i%tpb
		base := 2 * tpb * (nb - 1 - b)
		if rb[i] != int32(base+tpb-1-tid) || ra[i] != int32(base+2*tpb-1-tid) {
			t.Fatalf("reverse: thread %d of block %d took tickets %d and %d, want %d and %d", tid, b, rb[i], ra[i],
				base+tpb-1-tid, base+2*tpb-1-tid)
		}
	}
	xb, xa := run("random,seed=5")
	ranks := blockRanks("random", xb, xa)
	if slices.IsSorted(ranks) || slices.IsSortedFunc(ranks, func(a, b int) int { return b - a }) {
		t.Errorf("random: blocks ran in order %v", ranks)
	}
	for _, tk := range [][]int32{xb[:tpb], xa[:tpb]} {
		if slices.IsSorted(tk) || slices.IsSortedFunc(tk, func(a, b int32) int { return int(b - a) }) {
			t.Errorf("random: the threads of block 0 took tickets in order: %v", tk)
		}
	}
	if yb, ya := run("random,seed=5"); !slices.Equal(xb, yb) || !slices.Equal(xa, ya) {
		t.Errorf("random, seed 5 twice: different orders")
	}
	if yb, ya := run("async,random,seed=5"); !slices.Equal(xb, yb) || !slices.Equal(xa, ya) {
		t.Errorf("random, seed 5, async: another order than synchronous")
	}
	if yb, _ := run("random,seed=6"); slices.Equal(xb, yb) {
		t.Errorf("seeds 5 and 6 gave the same order")
	}
	l.quiet(t)
	l.expect(t, cuInvalidValue, "gorunEmuSetSched", uintptr(unsafe.Pointer(cstr("async,backwards"))))
	if e := l.lastError(t); !strings.Contains(e, "unknown word backwards") {
		t.Errorf("a bad schedule: %q", e)
	}
}

// With async, stream work runs when the host waits for it, in stream
// order, ordered across streams by events only: a missing wait reads stale
// data or sees its data overwritten, depending on which stream runs first.
func TestAsyncStreams(t *testing.T) {
	l := setup(t)
	const N = 256
	s1, s2 := l.stream(t), l.stream(t)
	ev, ev2 := l.event(t, 1), l.event(t, 0)
	dev := upload(t, l, make([]int32, N))
	host := l.pinned(t, N)
	set := func(v int32, s uintptr) { l.must(t, "cuMemsetD32Async", dev, uintptr(uint32(v)), N, s) }
	toHost := func(s uintptr) { l.must(t, "cuMemcpyDtoHAsync_v2", uintptr(unsafe.Pointer(&host[0])), dev, 4*N, s) }
	get := func() []int32 {
		out := make([]int32, N)
		download(t, l, out, dev) // synchronous: after everything queued
		return out
	}

	l.sched(t, "async")
	// queued, not run: the event is not ready until the work has run;
	// polling it makes progress
	set(7, s1)
	l.must(t, "cuEventRecord", ev, s1)
	if q := l.queued(t); q != 2 {
		t.Errorf("%d operations queued, want 2", q)
	}
	l.expect(t, cuNotReady, "cuEventQuery", ev)
	for i := 0; l.call(t, "cuEventQuery", ev) == cuNotReady; i++ {
		if i > 10 {
			t.Fatal("cuEventQuery never completes")
		}
	}
	if v := get(); !all(v, 7) {
		t.Errorf("after the event: %v", v[:4])
	}

	// forward: s1 (created first) runs ahead. The copy on s2 reads dev,
	// which s1 overwrites after it without waiting for the copy: the copy
	// sees the new value. With a wait for the copy's event it does not.
	set(1, s1)
	toHost(s2)
	set(2, s1)
	l.must(t, "cuStreamSynchronize", s2)
	if !all(host, 2) {
		t.Errorf("forward, no wait: the copy read %d, want the later write 2", host[0])
	}
	set(1, s1)
	toHost(s2)
	l.must(t, "cuEventRecord", ev, s2)
	l.must(t, "cuStreamWaitEvent", s1, ev, 0)
	set(2, s1)
	l.must(t, "cuCtxSynchronize")
	if !all(host, 1) {
		t.Errorf("forward, s1 waits for the copy: the copy read %d, want 1", host[0])
	}
	// cuStreamSynchronize of s1 runs s1's work, not s2's
	set(3, s1)
	toHost(s2)
	l.must(t, "cuStreamSynchronize", s1)
	if q := l.queued(t); q != 1 {
		t.Errorf("after synchronising s1: %d queued, want s2's copy", q)
	}
	l.must(t, "cuCtxSynchronize")

	// reverse: s2 runs as soon as it can. A copy on s2 that does not wait
	// for s1's write reads the old value; one that waits reads the new.
	l.sched(t, "async,reverse")
	set(0, s1)
	l.must(t, "cuCtxSynchronize")
	set(9, s1)
	toHost(s2)
	l.must(t, "cuStreamSynchronize", s2)
	if !all(host, 0) {
		t.Errorf("reverse, no wait: the copy read %d, want the stale 0", host[0])
	}
	l.must(t, "cuCtxSynchronize")
	set(11, s1)
	l.must(t, "cuEventRecord", ev, s1)
	l.must(t, "cuStreamWaitEvent", s2, ev, 0)
	toHost(s2)
	l.must(t, "cuStreamSynchronize", s2)
	if !all(host, 11) {
		t.Errorf("reverse, with the wait: the copy read %d, want 11", host[0])
	}
	// a wait is for the record made before it, not a later one
	set(1, s1)
	l.must(t, "cuEventRecord", ev, s1)
	l.must(t, "cuStreamWaitEvent", s2, ev, 0)
	toHost(s2)
	set(2, s1)
	l.must(t, "cuEventRecord", ev, s1)
	l.must(t, "cuStreamSynchronize", s2)
	if !all(host, 1) {
		t.Errorf("reverse, a wait then the event recorded again: the copy read %d, want 1", host[0])
	}
	l.must(t, "cuCtxSynchronize")

	// copies from pageable memory take the source at the call, from
	// page-locked memory when they run; a copy to pageable memory returns
	// when it has run
	l.sched(t, "async")
	src := make([]int32, N)
	for i := range src {
		src[i] = 5
	}
	l.must(t, "cuMemcpyHtoDAsync_v2", dev, uintptr(unsafe.Pointer(&src[0])), 4*N, s1)
	src[0] = 6
	if v := get(); v[0] != 5 {
		t.Errorf("a pageable source changed after the call: the copy gave %d, want 5", v[0])
	}
	for i := range host {
		host[i] = 5
	}
	l.must(t, "cuMemcpyHtoDAsync_v2", dev, uintptr(unsafe.Pointer(&host[0])), 4*N, s1)
	host[0] = 6
	if v := get(); v[0] != 6 {
		t.Errorf("a page-locked source changed after the call: the copy gave %d, want 6 (read when it runs)", v[0])
	}
	set(3, s1)
	out := make([]int32, N)
	l.must(t, "cuMemcpyDtoHAsync_v2", uintptr(unsafe.Pointer(&out[0])), dev, 4*N, s1)
	if !all(out, 3) || l.queued(t) != 0 {
		t.Errorf("a copy to pageable memory returned before it ran: %d, %d queued", out[0], l.queued(t))
	}

	// timing events: not ready while their records wait; a destroyed
	// stream's queued work still runs
	l.must(t, "cuEventRecord", ev2, s1)
	e3 := l.event(t, 0)
	l.must(t, "cuEventRecord", e3, s1)
	var ms float32
	l.quiet(t)
	l.expect(t, cuNotReady, "cuEventElapsedTime", uintptr(unsafe.Pointer(&ms)), ev2, e3)
	l.must(t, "cuEventSynchronize", e3)
	l.must(t, "cuEventElapsedTime", uintptr(unsafe.Pointer(&ms)), ev2, e3)
	var s3 uintptr
	l.must(t, "cuStreamCreate", uintptr(unsafe.Pointer(&s3)), 1)
	set(4, s3)
	l.must(t, "cuStreamDestroy_v2", s3)
	if v := get(); !all(v, 4) {
		t.Errorf("work queued on a destroyed stream: %d, want 4", v[0])
	}

	// cuBLAS queues its GEMMs on the handle's stream
	h := blasHandle(t, l)
	l.must(t, "cublasSetStream_v2", h, s1)
	a, b := upload(t, l, []float32{3}), upload(t, l, []float32{4})
	c := upload(t, l, []float32{0})
	alpha, beta := scalars(1, 0)
	l.must(t, "cublasGemmEx", h, opN, opN, 1, 1, 1, uintptr(unsafe.Pointer(alpha)), a, r32F, 1, b, r32F, 1,
		uintptr(unsafe.Pointer(beta)), c, r32F, 1, compute32F, ^uintptr(0))
	*alpha = 100 // read at the call, as cuBLAS reads host scalars
	if q := l.queued(t); q != 1 {
		t.Errorf("after cublasGemmEx: %d queued, want 1", q)
	}
	got := make([]float32, 1)
	download(t, l, got, c)
	if got[0] != 12 {
		t.Errorf("queued GEMM: %v, want 12", got[0])
	}
}

// A queued launch that fails is reported by the next synchronisation, and
// the context stays unusable, as on a GPU, until its last release (in a
// process of its own).
func TestAsyncFailureIsSticky(t *testing.T) {
	l := openLibs(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestSchedHelperProcess$", "-test.v", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), envSchedHelper+"=sticky", envHelperDir+"="+l.dir, envSched+"=async")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

func TestSchedHelperProcess(t *testing.T) {
	if os.Getenv(envSchedHelper) != "sticky" {
		return // not a test by itself
	}
	l := setup(t)
	l.quiet(t)
	s := l.stream(t)
	x := l.alloc(t, 64)
	if r := l.launchOn(t, "emu_test_trap", d1(2), d1(8), s, x); r != cuSuccess {
		t.Fatalf("the launch itself: %d (the kernel runs later)", r)
	}
	l.expect(t, cuLaunchFailed, "cuStreamSynchronize", s)
	if e := l.lastError(t); !strings.Contains(e, "__trap()") {
		t.Errorf("the error does not say what failed: %q", e)
	}
	l.expect(t, cuLaunchFailed, "cuMemsetD8Async", x, 0, 64, s)
	l.expect(t, cuLaunchFailed, "cuCtxSynchronize")
	if r := l.launchOn(t, "emu_test_fill_f32", d1(1), d1(32), s, x, 0, 16); r != cuLaunchFailed {
		t.Errorf("a launch after the failure: %d, want %d", r, cuLaunchFailed)
	}
	// the last release ends it: a new context works
	l.call(t, "cuStreamDestroy_v2", s)
	l.must(t, "cuDevicePrimaryCtxRelease_v2", 0)
	l.must(t, "cuDevicePrimaryCtxRetain", uintptr(unsafe.Pointer(&l.ctx)), 0)
	l.must(t, "cuCtxSetCurrent", l.ctx)
	l.must(t, "cuCtxSynchronize")
}
