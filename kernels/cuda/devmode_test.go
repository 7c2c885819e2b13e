package cuda

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/gorun/gorun/dtype"
)

// The device the tests open: GORUN_CUDA_TEST_INDEX (default 0), as this
// process numbers them.
const envTestIndex = "GORUN_CUDA_TEST_INDEX"

// envTestChild names the case a test binary runs as a child of one of the
// tests below (they re-run this binary with the case in the environment).
const envTestChild = "GORUN_CUDA_TEST_CHILD"

// envTestEmuLibs names a directory holding the emulator's libraries built
// already (bench/gpu/run.sh's dry run, which runs this test binary from
// the repository root): with GORUN_CUDA_TEST_DEVICE=emu the tests load
// them instead of building their own.
const envTestEmuLibs = "GORUN_CUDA_TEST_EMU_LIBS"

func emuGiven() bool {
	d := os.Getenv(envTestEmuLibs)
	if d == "" {
		return false
	}
	os.Setenv(EnvLibDir, d)
	return true
}

func testIndex() int {
	i, _ := strconv.Atoi(os.Getenv(envTestIndex))
	return i
}

// runChild runs this test binary again with env added, running the tests
// that match run, and returns its output (the test fails when it does).
func runChild(t *testing.T, child, run string, env ...string) string {
	t.Helper()
	if os.Getenv(envTestChild) != "" {
		t.Skipf("in the child process of %s", os.Getenv(envTestChild))
	}
	cmd := exec.Command(os.Args[0], "-test.run", run, "-test.count=1", "-test.v", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), append([]string{envTestChild + "=" + child}, env...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s (%s): %v\n%s", child, strings.Join(env, " "), err, out)
	}
	return string(out)
}

// hopperEnv is the emulator as an H100/H200 (compute capability 9.0, 132
// multiprocessors), the tests on its second device.
var hopperEnv = []string{"GORUN_CUDA_EMU_CC=9.0", "GORUN_CUDA_EMU_SMS=132", "GORUN_CUDA_EMU_DEVICES=2", envTestIndex + "=1"}

// TestHopperEmulation runs the conformance table, the host staging round
// trip and a Transformer training step against the CPU on the emulator
// presenting compute capability 9.0 and 132 multiprocessors, as an H200
// does, on device 1 of 2: the PTX an H200 loads (compute_80's) is the one
// loaded, the flat kernels' grids are an H200's (up to 32 x 132 blocks),
// and nothing assumes device 0. (The emulator's default is 7.0 with 2
// multiprocessors; one driver per process, hence the child process.)
func TestHopperEmulation(t *testing.T) {
	if testMode != "emu" {
		t.Skip("on a GPU: its own compute capability")
	}
	out := runChild(t, "hopper", "^(TestConformance|TestTransformerStepMatchesCPU|TestHostStagingRoundTrip|TestPTXForDevice|TestFlatGridOfTheDevice|TestCublasOnAThreadWithoutContext)$",
		hopperEnv...)
	for _, want := range []string{"compute capability 9.0, 132 SMs", "--- PASS: TestConformance", "--- PASS: TestTransformerStepMatchesCPU",
		"--- PASS: TestPTXForDevice", "--- PASS: TestFlatGridOfTheDevice", "--- PASS: TestCublasOnAThreadWithoutContext"} {
		if !strings.Contains(out, want) {
			t.Errorf("the child's output lacks %q:\n%s", want, out)
		}
	}
}

// TestPTXForDevice: the backend picks compute_70's PTX on 7.x and
// compute_80's on 8.0 and above (an H200 is 9.0), and on the emulator
// the module it loaded is that one (the emulator, like the driver, refuses
// PTX for a newer architecture than the device's).
func TestPTXForDevice(t *testing.T) {
	for cc, want := range map[[2]int]string{{7, 0}: "sm70", {7, 5}: "sm70", {8, 0}: "sm80", {8, 6}: "sm80",
		{8, 9}: "sm80", {9, 0}: "sm80", {10, 0}: "sm80", {12, 0}: "sm80"} {
		if got, ptx := ptxFor(cc); got != want || !strings.Contains(string(ptx), ".target "+strings.Replace(want, "sm", "sm_", 1)) {
			t.Errorf("compute capability %d.%d: %s PTX, want %s", cc[0], cc[1], got, want)
		}
	}
	b := backend(t)
	name, _ := ptxFor(b.cc)
	t.Logf("%s: %s PTX, cuBLAS %s, driver %s", b.Describe(), name, b.blas.lib.path, b.drv.lib.path)
	if testMode != "emu" {
		return
	}
	if want := os.Getenv("GORUN_CUDA_EMU_CC"); want != "" && fmt.Sprintf("%d.%d", b.cc[0], b.cc[1]) != want {
		t.Errorf("GORUN_CUDA_EMU_CC=%s but the device says %d.%d", want, b.cc[0], b.cc[1])
	}
	target, err := purego.Dlsym(b.drv.lib.handle, "gorunEmuModuleTarget")
	if err != nil {
		t.Fatal(err)
	}
	got := int(int32(callRet(target, b.module)))
	if want, _ := strconv.Atoi(strings.TrimPrefix(name, "sm")); got != want {
		t.Errorf("compute capability %d.%d: the module loaded targets sm_%d, want %s", b.cc[0], b.cc[1], got, name)
	}
}

// TestFlatGridOfTheDevice: a flat kernel over many elements runs in 32
// blocks per multiprocessor of the device (4224 on an H200's 132).
func TestFlatGridOfTheDevice(t *testing.T) {
	b := backend(t)
	if testMode != "emu" {
		t.Skip("counts the emulator's blocks")
	}
	stats, err := purego.Dlsym(b.drv.lib.handle, "gorunEmuStats")
	if err != nil {
		t.Fatal(err)
	}
	var s0, s1 [5]uint64
	n := 32 * b.sms * flatThreads * 2
	x := b.Alloc(dtype.Float32, n)
	defer b.Free(x)
	b.Sync()
	callRet(stats, uintptr(unsafe.Pointer(&s0[0])))
	b.Scale(x, 2)
	b.Sync()
	callRet(stats, uintptr(unsafe.Pointer(&s1[0])))
	if launches, blocks := s1[0]-s0[0], s1[1]-s0[1]; launches != 1 || blocks != uint64(32*b.sms) {
		t.Errorf("%d SMs: a flat kernel over %d elements ran %d launches of %d blocks in all, want 1 of %d", b.sms, n, launches, blocks, 32*b.sms)
	}
}

// TestDryRunRerun lets bench/gpu/run.sh's dry run see its rerun of a
// failed test: with GORUN_CUDA_TEST_FAIL_UNLESS_BLOCKING=1 it fails unless
// CUDA_LAUNCH_BLOCKING=1 (which run.sh sets when it runs a failed test
// again); otherwise, on a GPU too, it passes.
func TestDryRunRerun(t *testing.T) {
	if os.Getenv("GORUN_CUDA_TEST_FAIL_UNLESS_BLOCKING") == "1" && os.Getenv("CUDA_LAUNCH_BLOCKING") != "1" {
		t.Fatal("GORUN_CUDA_TEST_FAIL_UNLESS_BLOCKING=1 and no CUDA_LAUNCH_BLOCKING=1: failing as the dry run asked")
	}
}
