// Package gpu holds the dry run of bench/gpu/run.sh, the one prepared call
// a session with a lent GPU makes (docs/cuda.md, "Running on a GPU").
package gpu

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/cudaemu"
)

// TestRunShDryRun runs bench/gpu/run.sh as the GPU machine will (every
// group, in its order, under a budget), from the package bench/gpu/build.sh
// makes (the same binaries), with the GPU libraries replaced by the CPU
// emulator's presenting an H200 (compute capability 9.0, 132
// multiprocessors, two devices for tiny-np2) and QUICK=1's sizes, and with
// stand-ins for what this machine lacks (testdata/dryrun: compute-sanitizer,
// nvidia-smi, torch, safetensors), which check the arguments run.sh gives
// them. Every step must pass, the summary must say nothing was left out,
// and the results (summary.txt, results.tar.gz, torch.jsonl) must be in
// both the results directory and $OUT.
func TestRunShDryRun(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the dry run builds the binaries and runs every step (a few minutes)")
	}
	for _, tool := range []string{"bash", "tar", "timeout", "python3", "g++"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the dry run needs %s: %v", tool, err)
		}
	}
	emu := cudaemu.ForTest(t)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	stand, err := filepath.Abs("testdata/dryrun")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	build := exec.Command("bash", "bench/gpu/build.sh")
	build.Dir = root
	build.Env = append(os.Environ(), "GPU_OUT="+filepath.Join(tmp, "pkg"))
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("bench/gpu/build.sh: %v\n%s", err, out)
	}
	log := filepath.Join(tmp, "standins.log")
	// runSh runs run.sh with the dry run's environment (and env), its
	// results under tmp/name; it returns $OUT.
	runSh := func(name string, env []string, args ...string) (*exec.Cmd, string, string) {
		out, results := filepath.Join(tmp, name, "out"), filepath.Join(tmp, name, "results")
		if err := os.MkdirAll(out, 0o755); err != nil {
			t.Fatal(err)
		}
		run := exec.Command("bash", append([]string{"bench/gpu/run.sh"}, args...)...)
		run.Dir = root
		run.Env = append(append(os.Environ(),
			"PATH="+filepath.Join(stand, "bin")+string(os.PathListSeparator)+os.Getenv("PATH"),
			"PYTHONPATH="+filepath.Join(stand, "python"),
			"GORUN_DRYRUN_LOG="+log,
			"QUICK=1", "GPU_TARBALL="+filepath.Join(tmp, "pkg", "gpu.tar.gz"), "GPU_RESULTS="+results, "OUT="+out,
			"GORUN_CUDA_LIB_DIR="+emu, "GORUN_CUDA_EMU_DEVICES=2", "GORUN_CUDA_EMU_CC=9.0", "GORUN_CUDA_EMU_SMS=132",
			"GORUN_CUDA_TEST_DEVICE=emu", "GORUN_CUDA_TEST_EMU_LIBS="+emu, "GORUN_CUDA_EMU_QUIET=1"), env...)
		return run, out, results
	}
	summary := func(out string) []string {
		t.Helper()
		sum, err := os.ReadFile(filepath.Join(out, "summary.txt"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.Split(strings.TrimSpace(string(sum)), "\n")
	}

	// A budget that leaves no step time: every one is skipped and named.
	run, out, _ := runSh("budget", []string{"BUDGET=25"}, "torch", "net")
	if o, err := run.CombinedOutput(); err != nil {
		t.Errorf("run.sh torch net with BUDGET=25: %v\n%s", err, o)
	}
	if l := summary(out); !strings.HasPrefix(l[len(l)-1], "not run: env torch-check torch net-tcp-np2 ") ||
		!strings.HasSuffix(l[len(l)-1], " (skipped for the budget)") {
		t.Errorf("BUDGET=25: the summary does not name every step as skipped:\n%s", strings.Join(l, "\n"))
	}
	// A call stopped (SIGTERM) in the middle: the summary names what was not reached.
	run, out, _ = runSh("stopped", nil, "net")
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 200; i++ { // until a step has run
		if b, _ := os.ReadFile(filepath.Join(out, "summary.txt")); strings.Contains(string(b), "net-tcp-np2 ") {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	run.Process.Signal(syscall.SIGTERM)
	run.Wait()
	if l := summary(out); !strings.HasPrefix(l[len(l)-1], "not run: ") || !strings.HasSuffix(l[len(l)-1], "net-tcp-np2-1core (the call was stopped)") {
		t.Errorf("stopped: the summary's last line does not name what was not reached:\n%s", strings.Join(l, "\n"))
	}

	// The whole call. TestDryRunRerun fails unless CUDA_LAUNCH_BLOCKING=1:
	// the step group's failure is run again with it.
	run, out, results := runSh("all", []string{"BUDGET=1800", "GORUN_CUDA_TEST_FAIL_UNLESS_BLOCKING=1"})
	o, err := run.CombinedOutput()
	t.Logf("run.sh:\n%s", o)
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Errorf("run.sh with a failing step: %v, want exit status 1", err)
	}
	lines := summary(out)
	step := regexp.MustCompile(`^(\S+)\s+(rc=(\d+)|skipped)`)
	ran := map[string]bool{}
	for _, l := range lines[1:] {
		m := step.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		ran[m[1]] = true
		if want := map[string]string{"step": "1"}[m[1]]; m[3] != max(want, "0") {
			t.Errorf("step %s: %s (rc=%s wanted)", m[1], l, max(want, "0"))
		}
	}
	if last := lines[len(lines)-1]; last != "not run: none" {
		t.Errorf("summary's last line: %q, want \"not run: none\"", last)
	}
	// the plan: every group's steps, in run.sh's order
	want := []string{"env", "sanitize-small", "conform", "step", "step-blocking", "tiny-np1", "tiny-np2", "translate", "interop", "base",
		"gorun-fp16", "gorun-prof", "gorun-bf16", "gorun-fp32", "torch-check", "torch",
		"net-tcp-np2", "net-quic-np2", "net-gloo-np2", "net-tcp-np8", "net-tcp-np2-1core"}
	for _, s := range want {
		if !ran[s] {
			t.Errorf("step %s did not run", s)
		}
	}
	var order []string
	for _, l := range lines[1:] {
		if m := step.FindStringSubmatch(l); m != nil {
			order = append(order, m[1])
		}
	}
	seq := []string{"env", "sanitize-small", "conform", "step", "tiny-np1", "base", "gorun-fp16", "torch-check", "net-tcp-np2"}
	for i := 1; i < len(seq); i++ {
		if indexOf(order, seq[i]) < indexOf(order, seq[i-1]) {
			t.Errorf("step %s ran before %s: %v", seq[i], seq[i-1], order)
		}
	}
	for _, f := range []string{"summary.txt", "results.tar.gz", "torch.jsonl"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("$OUT: %v", err)
		}
		m, _ := filepath.Glob(filepath.Join(results, "*", f))
		if len(m) != 1 {
			t.Errorf("%s: %d copies of %s, want 1", results, len(m), f)
		}
	}
	// the rerun ran the failed test alone, with CUDA_LAUNCH_BLOCKING=1
	logs := untar(t, filepath.Join(out, "results.tar.gz"))
	if l := logs["logs/step-blocking.log"]; !strings.Contains(l, "--- PASS: TestDryRunRerun") || strings.Contains(l, "TestTransformerStepMatchesCPU") {
		t.Errorf("logs/step-blocking.log: not TestDryRunRerun alone, passing:\n%s", l)
	}
	if l := logs["logs/step.log"]; !strings.Contains(l, "--- FAIL: TestDryRunRerun") || !strings.Contains(l, "--- PASS: TestTransformerStepMatchesCPU") {
		t.Errorf("logs/step.log:\n%s", l)
	}
	// what the stand-ins were given
	got := readLines(t, log)
	for _, w := range []string{
		`^compute-sanitizer --tool memcheck --error-exitcode 86 --print-limit 50 \S+/cuda.test -test.run \^TestConformance\$/\^\(Scale\|Axpy\)\$`,
		`^compute-sanitizer --tool memcheck .* -test.run \^TestConformance\$ `,
		`^torch torch_transformer.py --self-check$`,
		`^torch torch_transformer.py --sweep --json \S+/torch.jsonl$`,
		`^torch gloo_allreduce.py --budget 0.1 --sizes 1048576$`,
		`^safetensors interop.py \S+/runs/tiny-np1$`,
		`^nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu --format=csv$`,
	} {
		re := regexp.MustCompile(w)
		found := false
		for _, l := range got {
			found = found || re.MatchString(l)
		}
		if !found {
			t.Errorf("no stand-in was called as %s; they were called:\n%s", w, strings.Join(got, "\n"))
		}
	}
}

// untar reads a .tar.gz into a map of its files' contents.
func untar(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	r := tar.NewReader(z)
	for {
		h, err := r.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimPrefix(h.Name, "./")] = string(b)
	}
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}
