package cudaemu

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// A kernel that writes outside its allocation, even one element past it,
// fails its launch with CUDA_ERROR_ILLEGAL_ADDRESS and a line that names
// it (the guard regions of csrc/emu_guard.h); the guard is restored, so
// the next launch goes on; writes inside pass.
func TestGuardRegions(t *testing.T) {
	l := setup(t)
	x := l.alloc(t, 40) // 10 floats: the data ends 216 bytes before the next 256
	l.mustLaunch(t, "emu_test_fill_f32", d1(1), d1(32), x, float32(1), int64(10))
	l.quiet(t)
	for _, n := range []int64{11, 64, 118} { // one element past; into the rounding; to the end of the guard
		if r := l.launch(t, "emu_test_fill_f32", d1(1), d1(32), x, float32(2), n); r != cuIllegalAddress {
			t.Errorf("fill of %d floats: launch returned %d, want CUDA_ERROR_ILLEGAL_ADDRESS", n, r)
			continue
		}
		if msg := l.lastError(t); !strings.Contains(msg, "emu_test_fill_f32: wrote byte 40 of the 40-byte allocation") {
			t.Errorf("fill of %d floats: %s", n, msg)
		}
		// reported once: the guard is whole again
		l.mustLaunch(t, "emu_test_fill_f32", d1(1), d1(32), x, float32(3), int64(10))
	}
	got := make([]float32, 10)
	download(t, l, got, x)
	if got[0] != 3 || got[9] != 3 {
		t.Errorf("x after the launches: %v", got)
	}
	// Guards see writes only: a read past the end passes here (the ASan
	// build sees it).
	y := l.alloc(t, 400)
	l.mustLaunch(t, "emu_test_axpy", d1(1), d1(32), y, float32(1), x, int64(11))
}

// The ASan build: a kernel that writes or reads one element past its
// allocation is stopped by AddressSanitizer, which names the kernel; the
// same kernels inside their allocations, with barriers and shuffles on the
// fiber stacks, pass. Each in a process of its own, run with ASan's runtime
// preloaded.
func TestASanBuild(t *testing.T) {
	openLibs(t)
	env, err := ASanEnv()
	if errors.Is(err, ErrNoASan) {
		t.Skipf("skipping: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	dir, err := buildWith("", []string{testKernelsCU}, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ mode, want, kernel string }{
		{"write", "WRITE of size 4", "emu_test_fill_f32"},
		{"read", "READ of size 4", "emu_test_axpy"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperASan$", "-test.v")
		cmd.Env = append(os.Environ(), append(env, envHelper+"=asan", envHelperDir+"="+dir, "GORUN_EMU_ASAN_MODE="+c.mode)...)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != ASanExitCode {
			t.Fatalf("%s past the end: exit %v, want ASan's %d\n%s", c.mode, err, ASanExitCode, out)
		}
		s := string(out)
		for _, w := range []string{"inside: no report", "ERROR: AddressSanitizer: heap-buffer-overflow", c.want, "in " + c.kernel + " ", "0 bytes to the right of 40-byte region"} {
			if !strings.Contains(s, w) {
				t.Errorf("%s past the end: the output lacks %q:\n%s", c.mode, w, s)
			}
		}
	}
}

// TestHelperASan is not a test: TestASanBuild runs it in a process with
// ASan's runtime.
func TestHelperASan(t *testing.T) {
	if os.Getenv(envHelper) != "asan" {
		return
	}
	l := setup(t)
	for _, block := range []int{32, 256, 1024} {
		testBlockSum(t, l, "emu_test_block_sum", block)
		testBlockSum(t, l, "emu_test_block_sum_warps", block)
	}
	x, y := l.alloc(t, 40), l.alloc(t, 400)
	l.mustLaunch(t, "emu_test_fill_f32", d1(1), d1(32), x, float32(1), int64(10))
	l.mustLaunch(t, "emu_test_axpy", d1(1), d1(32), y, float32(1), x, int64(10))
	os.Stderr.WriteString("inside: no report\n")
	switch os.Getenv("GORUN_EMU_ASAN_MODE") {
	case "write": // one element past x
		l.launch(t, "emu_test_fill_f32", d1(1), d1(32), x, float32(2), int64(11))
	case "read":
		l.launch(t, "emu_test_axpy", d1(1), d1(32), y, float32(1), x, int64(11))
	}
	t.Fatal("ASan did not stop the process")
}
