package cuda

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"unsafe"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/half"
	"github.com/gorun/gorun/kernels"
)

// The backend under the emulator's schedules: GORUN_CUDA_EMU_SCHED
// (internal/cudaemu/csrc/emu_sched.h) runs blocks and threads in reverse or
// random order, and with async queues every stream operation and runs it
// only when the host waits, the compute stream ahead of the copy stream
// (forward), behind it (reverse) or at random: a missing event wait between
// the two streams then reads stale data or data overwritten too early.

const envEmuSched = "GORUN_CUDA_EMU_SCHED"

// emuSched returns whether the tests run on the emulator with asynchronous
// streams, and the order word in effect (forward, reverse, random).
func emuSched() (async bool, order string) {
	order = "forward"
	if testMode != "emu" {
		return false, order
	}
	for _, w := range strings.Split(os.Getenv(envEmuSched), ",") {
		switch w = strings.TrimSpace(w); w {
		case "async":
			async = true
		case "sync":
			async = false
		case "forward", "reverse", "random":
			order = w
		}
	}
	return async, order
}

// runUnderSched runs the tests that pattern matches in a process of their
// own, on the emulator with GORUN_CUDA_EMU_SCHED=sched.
func runUnderSched(t *testing.T, sched, pattern string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run="+pattern, "-test.count=1", "-test.v", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), envEmuSched+"="+sched, envTestDevice+"=emu")
	out, err := cmd.CombinedOutput()
	passed := regexp.MustCompile(`(?m)^--- PASS: (\S+)`).FindAllSubmatch(out, -1)
	if err != nil || len(passed) == 0 {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		var keep []string
		for _, l := range lines { // the failures, not every passing line
			if !strings.HasPrefix(strings.TrimSpace(l), "=== ") && !strings.Contains(l, "--- PASS") {
				keep = append(keep, l)
			}
		}
		if len(keep) > 80 {
			keep = keep[len(keep)-80:]
		}
		t.Fatalf("%s=%s go test -run '%s': %v, %d passed\n%s", envEmuSched, sched, pattern, err, len(passed), strings.Join(keep, "\n"))
	}
	var names []string
	for _, m := range passed {
		names = append(names, string(m[1]))
	}
	t.Logf("%s=%s: %s passed", envEmuSched, sched, strings.Join(names, ", "))
}

// TestEmulatorSchedules runs the backend's tests again on the emulator
// under other schedules, each in a process of its own: the conformance
// table, the staging round trip and its two hazards, and training steps
// against the CPU, with asynchronous streams in the three orders, and the
// conformance table with the blocks and threads reversed.
func TestEmulatorSchedules(t *testing.T) {
	if testMode != "emu" {
		t.Skip("skipping: a GPU runs in its own order")
	}
	if os.Getenv(envEmuSched) != "" {
		t.Logf("already under %s=%s", envEmuSched, os.Getenv(envEmuSched))
		return
	}
	const staging = "TestHostStagingRoundTrip|TestStagingCopiesSnapshot|TestStagingRestageWaits"
	for _, c := range []struct{ sched, tests string }{
		{"async", "TestConformance|TestTransformerStepMatchesCPU|TestProfileNamesEveryOp|TestAllocatorReuses|" + staging},
		{"async,reverse", "TestTransformerStepMatchesCPU|" + staging},
		{"async,random,seed=11", "TestConformance|TestTransformerStepMatchesCPU|" + staging},
		{"reverse", "TestConformance"},
	} {
		t.Run(c.sched, func(t *testing.T) {
			t.Parallel()
			runUnderSched(t, c.sched, "^("+c.tests+")$")
		})
	}
}

// copyOutFunc is a version of CopyOutAsync.
type copyOutFunc func(b *Backend, dst []byte, src kernels.Tensor, wire dtype.DType) kernels.Fence

func wireValue(pin []byte, i int, wire dtype.DType) float32 {
	switch wire {
	case dtype.Float16:
		return half.F16ToF32(le16(pin[2*i:]))
	case dtype.BFloat16:
		return half.BF16ToF32(le16(pin[2*i:]))
	}
	return math.Float32frombits(le32(pin[4*i:]))
}

func onWire(v float32, wire dtype.DType) float32 {
	switch wire {
	case dtype.Float16:
		return half.F16ToF32(half.F32ToF16(v))
	case dtype.BFloat16:
		return half.BF16ToF32(half.F32ToBF16(v))
	}
	return v
}

func checkWire(pin []byte, want []float32, wire dtype.DType, what string) error {
	for i, v := range want {
		if got := wireValue(pin, i, wire); math.Float32bits(got) != math.Float32bits(onWire(v, wire)) {
			return fmt.Errorf("%v: element %d copied out as %v, want %v (%s)", wire, i, got, onWire(v, wire), what)
		}
	}
	return nil
}

// checkSnapshot: the gradients change right after their copy out is
// queued (as the next step's zeroing would, or any op queued after it); the
// host must still get them as they were when the copy was queued.
func checkSnapshot(be *Backend, copyOut copyOutFunc, wire dtype.DType) error {
	const n = 3000
	vals := make([]float32, n)
	for i := range vals {
		vals[i] = float32(i) + 0.25
	}
	g := be.Alloc(dtype.Float32, n)
	defer be.Free(g)
	be.Upload(g, vals)
	pin := be.PinnedHost(n * wire.Size())
	f := copyOut(be, pin, g, wire)
	be.Zero(g)
	if err := f.Wait(); err != nil {
		return err
	}
	return checkWire(pin, vals, wire, "the value when the copy was queued")
}

// Hazard (a): with the float32 wire the copy stream read the live
// gradients, after whatever the compute stream did to them in the
// meantime. It copies a snapshot now (and the 16-bit wires always cast
// one). The version before the fix fails this under the async emulator,
// the compute stream running ahead (checked here too); the synchronous
// emulator, every copy done when queued, could not see it.
func TestStagingCopiesSnapshot(t *testing.T) {
	async, order := emuSched()
	if testMode == "emu" && !async {
		runUnderSched(t, "async", "^"+t.Name()+"$")
		return
	}
	be := backend(t)
	for _, wire := range []dtype.DType{dtype.Float32, dtype.Float16, dtype.BFloat16} {
		if err := checkSnapshot(be, (*Backend).CopyOutAsync, wire); err != nil {
			t.Error(err)
		}
	}
	if async && order == "forward" {
		err := checkSnapshot(be, oldStaging{}.copyOut, dtype.Float32)
		if err == nil {
			t.Error("the staging before the fix read the live gradients, and the async emulator did not show it")
		} else {
			t.Logf("the staging before the fix, as expected: %v", err)
		}
	}
}

// checkRestage: a copy out into a host buffer, then a larger one into the
// same buffer before the first has run: the stage's device buffer is
// replaced by a larger one and freed to the allocator, whose next block of
// that size goes to a new tensor, written at once on the compute stream.
// The first copy must still give its own values.
func checkRestage(t *testing.T, be *Backend, copyOut copyOutFunc, stageDev func(pin []byte) uintptr) error {
	const n = 1000 // as BF16 2000 bytes (the allocator's 2048-byte class), then 4000 (4096)
	v1, v2 := make([]float32, n), make([]float32, 2*n)
	for i := range v2 {
		v2[i] = float32(i%97) - 40.5
	}
	copy(v1, v2) // so that the host buffer's first half is right whichever copy ran last
	g1, g2 := be.Alloc(dtype.Float32, n), be.Alloc(dtype.Float32, 2*n)
	defer be.Free(g1)
	defer be.Free(g2)
	be.Upload(g1, v1)
	be.Upload(g2, v2)
	pin := be.PinnedHost(2 * 2 * n)
	f1 := copyOut(be, pin[:2*n], g1, dtype.BFloat16)
	old := stageDev(pin)
	f2 := copyOut(be, pin, g2, dtype.BFloat16)
	if stageDev(pin) == old {
		t.Fatal("the second, larger copy out kept the stage's device buffer: the test does not test a free")
	}
	x := be.Alloc(dtype.Float32, n/2) // 2000 bytes: the class of the freed buffer
	defer be.Free(x)
	if x.Ptr != old {
		if os.Getenv(EnvExactAlloc) == "1" {
			t.Skipf("skipping: %s=1 gives freed memory back to the driver", EnvExactAlloc)
		}
		t.Fatalf("the allocator did not hand out the freed stage buffer %#x again (got %#x): the test does not test its reuse", old, x.Ptr)
	}
	junk := make([]float32, n/2)
	for i := range junk {
		junk[i] = -1e30
	}
	be.Upload(x, junk)
	if err := f1.Wait(); err != nil {
		return err
	}
	if err := checkWire(pin[:2*n], v1, dtype.BFloat16, "the first copy, out of the buffer freed after it was queued"); err != nil {
		return err
	}
	if err := f2.Wait(); err != nil {
		return err
	}
	return checkWire(pin, v2, dtype.BFloat16, "the second copy")
}

// Hazard (b): stageFor freed the device buffer of a stage that the copy
// stream might still be reading; the block went to the next Alloc of its
// size, which the compute stream wrote before the copy ran. The compute
// stream now waits for the stage's last copy before the buffer is freed
// (or overwritten). The version before the fix fails this under the async
// emulator, the compute stream running ahead (checked here too).
func TestStagingRestageWaits(t *testing.T) {
	async, order := emuSched()
	if testMode == "emu" && !async {
		runUnderSched(t, "async", "^"+t.Name()+"$")
		return
	}
	be := backend(t)
	dev := func(pin []byte) uintptr { return be.staging[uintptr(unsafe.Pointer(&pin[0]))].dev }
	if err := checkRestage(t, be, (*Backend).CopyOutAsync, dev); err != nil {
		t.Error(err)
	}
	if async && order == "forward" {
		m := oldStaging{}
		err := checkRestage(t, be, m.copyOut, func(pin []byte) uintptr { return m[uintptr(unsafe.Pointer(&pin[0]))].dev })
		if err == nil {
			t.Error("the staging before the fix freed a buffer the copy stream was reading, and the async emulator did not show it")
		} else {
			t.Logf("the staging before the fix, as expected: %v", err)
		}
	}
}

// oldStaging is staging.go's CopyOutAsync before the fixes (commit
// 8936009), kept to show that the tests above catch both hazards: for F32
// the copy stream reads the live tensor, and a larger copy into the same
// host buffer frees the stage's device buffer at once.
type oldStaging map[uintptr]*oldStage

type oldStage struct {
	dev        uintptr
	bytes      int
	cast, done uintptr
	used       bool
}

func (m oldStaging) stageFor(b *Backend, host []byte, n int, wire dtype.DType) *oldStage {
	key := uintptr(unsafe.Pointer(&host[0]))
	s := m[key]
	if s == nil || s.bytes < n {
		if s != nil && s.dev != 0 {
			b.mem.free(s.dev)
		}
		s = &oldStage{bytes: n, cast: b.event(), done: b.event()}
		if wire != dtype.Float32 {
			s.dev = b.mem.alloc(n)
		}
		m[key] = s
	}
	if wire != dtype.Float32 && s.dev == 0 {
		s.dev = b.mem.alloc(s.bytes)
	}
	return s
}

func (m oldStaging) copyOut(b *Backend, dst []byte, src kernels.Tensor, wire dtype.DType) kernels.Fence {
	n := wireCheck(src, dst, wire, "CopyOutAsync")
	d := b.drv
	s := m.stageFor(b, dst, n, wire)
	from := src.Ptr
	if s.used {
		d.must("cuStreamWaitEvent", d.call(d.streamWaitEvent, b.stream, s.done, 0))
	}
	if wire != dtype.Float32 {
		b.kern(kCast[[2]string{"f32", typeName(wire)}]).ptr(s.dev).ptr(src.Ptr).i64(src.Len()).flat(src.Len())
		from = s.dev
	}
	d.must("cuEventRecord", d.call(d.eventRecord, s.cast, b.stream))
	d.must("cuStreamWaitEvent", d.call(d.streamWaitEvent, b.copy, s.cast, 0))
	if n > 0 {
		d.must("cuMemcpyDtoHAsync", d.call(d.memcpyDtoHAsync, uintptr(unsafe.Pointer(&dst[0])), from, uintptr(n), b.copy))
	}
	d.must("cuEventRecord", d.call(d.eventRecord, s.done, b.copy))
	s.used = true
	return fence{d: d, ev: s.done}
}
