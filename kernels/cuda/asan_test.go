package cuda

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/cudaemu"
	"github.com/gorun/gorun/kernels/kerneltest"
)

// envASanChild marks the process TestConformanceASan runs: the test
// binary again, with the emulator's AddressSanitizer build loaded.
const envASanChild = "GORUN_CUDA_TEST_ASAN_CHILD"

// asanChildTests are what the child runs: the conformance table, the index
// checks (a bad index must not reach memory), a few training steps and the
// host staging of gradients.
const asanChildTests = "^(TestConformanceASan|TestIndexChecks|TestTransformerStepMatchesCPU|TestHostStagingRoundTrip)$"

// TestConformanceASan runs the conformance table (float32, fp16 and bf16),
// the index checks, TestTransformerStepMatchesCPU and
// TestHostStagingRoundTrip on the emulator built with AddressSanitizer
// (cudaemu.BuildASan) and with every allocation its exact size
// (GORUN_CUDA_EXACT_ALLOC=1): a kernel that reads or writes outside its
// tensors, by one element or more, is stopped there by ASan, where the
// allocator's size classes and the emulator's guard regions would miss a
// read, or a write into a class's slack. In a process of its own, which
// loads ASan's runtime first.
func TestConformanceASan(t *testing.T) {
	if os.Getenv(envASanChild) == "1" {
		be := backend(t)
		if !be.mem.exact {
			t.Fatalf("the ASan child runs without %s=1", EnvExactAlloc)
		}
		kerneltest.Run(t, be, kerneltest.FP32())
		t.Run("fp16", func(t *testing.T) { kerneltest.Run(t, be, kerneltest.FP16()) })
		t.Run("bf16", func(t *testing.T) { kerneltest.Run(t, be, kerneltest.BF16()) })
		return
	}
	if setupErr != nil {
		t.Fatal(setupErr)
	}
	if testMode != "emu" {
		t.Skip("skipping: on a GPU, run compute-sanitizer with GORUN_CUDA_EXACT_ALLOC=1 instead")
	}
	env, err := cudaemu.ASanEnv()
	if errors.Is(err, cudaemu.ErrNoASan) || errors.Is(err, cudaemu.ErrNoCompiler) {
		t.Skipf("skipping: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := cudaemu.BuildASan(dir, "kernels.cu"); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run="+asanChildTests, "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), env...)
	cmd.Env = append(cmd.Env, EnvLibDir+"="+dir, EnvExactAlloc+"=1", envASanChild+"=1", envTestDevice+"=emu",
		"GORUN_CUDA_EMU_QUIET=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == cudaemu.ASanExitCode {
			t.Fatalf("AddressSanitizer stopped the conformance table:\n%s", asanReport(string(out)))
		}
		t.Fatalf("the conformance table under ASan: %v\n%s", err, lastLinesOf(string(out), 60))
	}
	for _, name := range strings.Split(strings.Trim(asanChildTests, "^()$"), "|") {
		if !strings.Contains(string(out), "--- PASS: "+name+" ") {
			t.Errorf("the child did not pass %s:\n%s", name, lastLinesOf(string(out), 30))
		}
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "--- ") || strings.HasPrefix(line, "ok") {
			t.Log(line)
		}
	}
}

// asanReport is ASan's report in out with the test that was running.
func asanReport(out string) string {
	i := strings.Index(out, "==ERROR: AddressSanitizer")
	if i < 0 {
		return lastLinesOf(out, 60)
	}
	run := strings.LastIndex(out[:i], "=== RUN")
	if run < 0 {
		run = i
	}
	s := out[run:]
	if j := strings.Index(s, "Shadow bytes around"); j > 0 {
		s = s[:j]
	}
	return s
}

func lastLinesOf(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
