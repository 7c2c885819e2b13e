package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/data"
	"github.com/gorun/gorun/internal/cudaemu"
	"github.com/gorun/gorun/internal/testenv"
	"github.com/gorun/gorun/kernels/cuda"
	"github.com/gorun/gorun/metrics"
	"github.com/gorun/gorun/transformer"
)

var trainBin, gorunBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "nmttest")
	if err != nil {
		panic(err)
	}
	trainBin = filepath.Join(dir, "nmt-train")
	out, err := exec.Command("go", "build", "-o", trainBin, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "building nmt-train: %v\n%s", err, out)
		os.Exit(1)
	}
	gorunBin = filepath.Join(dir, "gorun")
	if out, err := exec.Command("go", "build", "-o", gorunBin, "../gorun").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building gorun: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// job is n nmt-train processes started the way torchrun would start them
// (rank 0 serves the rendezvous), so these tests need no launcher.
type job struct {
	cmds []*exec.Cmd
	outs []*bytes.Buffer
}

func startJob(t *testing.T, n int, args ...string) *job {
	t.Helper()
	return startJobEnv(t, n, nil, args...)
}

// startJobEnv is startJob with extra environment variables.
func startJobEnv(t *testing.T, n int, env []string, args ...string) *job {
	t.Helper()
	return startJobRanks(t, n, env, func(int) []string { return args })
}

// startJobRanks is startJobEnv with each rank's own arguments.
func startJobRanks(t *testing.T, n int, env []string, args func(r int) []string) *job {
	t.Helper()
	port := testenv.FreeUDPPort(t)
	j := &job{}
	for r := 0; r < n; r++ {
		cmd := exec.Command(trainBin, args(r)...)
		cmd.Env = append(testenv.CleanEnv(), fmt.Sprintf("RANK=%d", r), fmt.Sprintf("WORLD_SIZE=%d", n), fmt.Sprintf("LOCAL_RANK=%d", r),
			fmt.Sprintf("LOCAL_WORLD_SIZE=%d", n), "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+port, "GORUN_SECRET="+strings.Repeat("a7", 32))
		cmd.Env = append(cmd.Env, env...)
		var b bytes.Buffer
		cmd.Stdout, cmd.Stderr = &b, &b
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		j.cmds = append(j.cmds, cmd)
		j.outs = append(j.outs, &b)
	}
	t.Cleanup(func() {
		for _, c := range j.cmds {
			c.Process.Kill()
		}
	})
	return j
}

func (j *job) wait() []error {
	errs := make([]error, len(j.cmds))
	var wg sync.WaitGroup
	for i, c := range j.cmds {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = c.Wait() }()
	}
	wg.Wait()
	return errs
}

func runJob(t *testing.T, n int, args ...string) string {
	t.Helper()
	j := startJob(t, n, args...)
	errs := j.wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v\n%s", r, err, j.outs[r])
		}
	}
	return j.outs[0].String()
}

// trainLosses reads the train loss of every logged step of a run.
func trainLosses(t *testing.T, dir string) map[int64]float64 {
	t.Helper()
	recs, err := metrics.ReadJSONL(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]float64{}
	for _, r := range recs {
		if r.Kind == "train" {
			out[r.Step] = r.Values["loss_raw"]
		}
	}
	return out
}

var tinyArgs = []string{"train", "--preset", "tiny", "--synthetic-lines", "2000", "--max-length", "24",
	"--learning-rate", "1", "--warmup-steps", "10", "--log-every", "1", "--eval-sentences", "0", "--quiet", "--threads", "1"}

// The distributed gradient is the true gradient: 1 rank accumulating 4
// batches a step, 2 ranks 2 each and 4 ranks 1 each take the same batches
// and give the same loss curve (dropout off, fp32 on the wire).
func TestParity(t *testing.T) {
	const steps = 20
	const batches = 4
	var ref map[int64]float64
	for _, n := range []int{1, 2, 4} {
		dir := t.TempDir()
		args := append(append([]string{}, tinyArgs...), "--no-dropout", "--compression", "none",
			"--batch-tokens", "512", "--backward-passes-per-step", fmt.Sprint(batches/n), "--max-steps", fmt.Sprint(steps), "--checkpoint-every", "0",
			"--eval-every", "0", "--run-dir", dir)
		runJob(t, n, args...)
		got := trainLosses(t, dir)
		if len(got) != steps {
			t.Fatalf("np %d: %d logged steps, want %d", n, len(got), steps)
		}
		if n == 1 {
			ref = got
			if !(ref[steps] < ref[1]) {
				t.Fatalf("np 1: loss did not go down: step 1 %.4f, step %d %.4f", ref[1], steps, ref[steps])
			}
			continue
		}
		for s, want := range ref {
			if d := math.Abs(got[s] - want); d > 1e-4*math.Max(1, math.Abs(want)) {
				t.Errorf("np %d step %d: loss %.6f, 1 rank %.6f", n, s, got[s], want)
			}
		}
	}
}

// A job killed with SIGKILL after a checkpoint resumes and reaches the same
// loss as an uninterrupted run.
func TestKillAndResume(t *testing.T) {
	const steps = 40
	args := func(dir string) []string {
		return append(append([]string{}, tinyArgs...), "--batch-tokens", "1024", "--max-steps", fmt.Sprint(steps),
			"--checkpoint-every", "5", "--eval-every", "0", "--run-dir", dir)
	}
	full := t.TempDir()
	runJob(t, 2, args(full)...)
	want := trainLosses(t, full)[steps]

	cut := t.TempDir()
	j := startJob(t, 2, args(cut)...)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(cut, "latest")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint after 60 s:\n%s", j.outs[0])
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, c := range j.cmds {
		c.Process.Signal(syscall.SIGKILL)
	}
	j.wait()
	if _, err := os.Stat(filepath.Join(cut, fmt.Sprintf("ckpt-%d", steps))); err == nil {
		t.Fatalf("the run finished before it was killed; the test proves nothing")
	}
	latest, _ := os.ReadFile(filepath.Join(cut, "latest"))
	out := runJob(t, 2, append(args(cut), "--resume")...)
	if !strings.Contains(out, "resumed from step") {
		t.Fatalf("no resume line:\n%s", out)
	}
	got := trainLosses(t, cut)[steps]
	if math.Abs(got-want) > 1e-6*math.Max(1, want) {
		t.Fatalf("killed at %s and resumed: loss at step %d is %.7f, uninterrupted %.7f", strings.TrimSpace(string(latest)), steps, got, want)
	}
}

// A run continues on another number of ranks with the same global batch
// and data position: 12 steps on 2 ranks (2 batches a step), then --resume
// on 1 rank (both batches, gradients accumulated) and on 3 ranks (one
// batch split by rows between two of them), give at every later step (an
// epoch ends in between) the loss of 24 uninterrupted steps on 2 ranks
// (dropout off, fp32 on the wire: equal but for float32 summation order).
func TestResumeOnOtherRanks(t *testing.T) {
	const steps = 24
	args := func(dir string, last int) []string {
		return append(append([]string{}, tinyArgs...), "--no-dropout", "--compression", "none", "--batch-tokens", "1024",
			"--max-steps", fmt.Sprint(last), "--checkpoint-every", "0", "--eval-every", "0", "--run-dir", dir)
	}
	full := t.TempDir()
	runJob(t, 2, args(full, steps)...)
	want := trainLosses(t, full)
	cut := filepath.Join(t.TempDir(), "cut")
	runJob(t, 2, args(cut, steps/2)...)
	for _, c := range []struct {
		n    int
		note string // the resumed run's account of the global batch
	}{
		{1, "global batch is kept: 2 batches of 1024 tokens a step (not --backward-passes-per-step 1 x 1 rank(s) of --batch-tokens 1024); every rank takes 2, accumulating their gradients"},
		{3, "global batch is kept: 2 batches of 1024 tokens a step (not --backward-passes-per-step 1 x 3 rank(s) of --batch-tokens 1024); 1 or 2 ranks split each by rows"},
	} {
		dir := filepath.Join(t.TempDir(), fmt.Sprintf("np%d", c.n))
		if out, err := exec.Command("cp", "-a", cut, dir).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v\n%s", err, out)
		}
		out := runJob(t, c.n, append(args(dir, steps), "--resume")...)
		if !strings.Contains(out, fmt.Sprintf("resumed from step %d", steps/2)) || !strings.Contains(out, c.note) {
			t.Fatalf("np %d: want the resume line and %q:\n%s", c.n, c.note, out)
		}
		got := trainLosses(t, dir)
		if len(got) != steps {
			t.Fatalf("np %d: %d logged steps, want %d", c.n, len(got), steps)
		}
		for s := int64(steps/2 + 1); s <= steps; s++ {
			if d := math.Abs(got[s] - want[s]); d > 1e-5*math.Max(1, want[s]) || math.IsNaN(got[s]) {
				t.Errorf("np %d, resumed at step %d: loss at step %d is %.7f, uninterrupted on 2 ranks %.7f", c.n, steps/2, s, got[s], want[s])
			}
		}
	}
}

// A run's outputs: event files that parse with the tags, metrics.jsonl,
// plots, the report, and a translation from the checkpoint.
func TestRunOutputs(t *testing.T) {
	dir := t.TempDir()
	runJob(t, 2, append(append([]string{}, tinyArgs...), "--batch-tokens", "1024", "--max-steps", "12",
		"--eval-every", "6", "--eval-sentences", "16", "--checkpoint-every", "6", "--run-dir", dir,
		"--timeline", filepath.Join(dir, "timeline.json"))...)
	f, err := os.Open(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(f)
	lines := 0
	for sc.Scan() {
		var v map[string]any
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("metrics.jsonl line %d: %v", lines+1, err)
		}
		lines++
	}
	f.Close()
	if lines < 12 {
		t.Fatalf("metrics.jsonl has %d lines", lines)
	}
	evs, _ := filepath.Glob(filepath.Join(dir, "events.out.tfevents.*"))
	if len(evs) != 1 {
		t.Fatalf("event files: %v", evs)
	}
	events, err := metrics.ReadEvents(evs[0])
	if err != nil {
		t.Fatal(err)
	}
	tags := map[string]bool{}
	for _, e := range events {
		for k := range e.Scalars {
			tags[k] = true
		}
	}
	for _, tag := range []string{"train/loss", "eval/loss", "eval/bleu", "train/lr", "train/step_time_s", "train/tokens_per_s", "train/net_out_MBps", "train/net_in_MBps"} {
		if !tags[tag] {
			t.Errorf("event file lacks %s (has %v)", tag, tags)
		}
	}
	rep, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"checkpoint", "learning rate", "bottleneck"} {
		if !strings.Contains(strings.ToLower(string(rep)), want) {
			t.Errorf("report.md does not mention %q", want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "ckpt-12", "model.safetensors")); err != nil {
		t.Error(err)
	}
	var tl struct {
		TraceEvents []map[string]any `json:"traceEvents"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "timeline.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &tl); err != nil || len(tl.TraceEvents) == 0 {
		t.Fatalf("timeline.json: %v, %d events", err, len(tl.TraceEvents))
	}
	// translate from the checkpoint
	cmd := exec.Command(trainBin, "translate", "--run-dir", dir)
	cmd.Stdin = strings.NewReader(syntheticSample(t, dir) + "\n")
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) == 0 {
		t.Fatalf("translate: %v\n%s", err, out)
	}
}

// Bad input: one line, non-zero exit, no panic.
func TestBadInput(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(cfg, []byte("preset: tiny\nlearning_rat: 2\n"), 0o644)
	devCfg := filepath.Join(t.TempDir(), "d.yaml")
	os.WriteFile(devCfg, []byte("preset: tiny\ndevice: tpu\n"), 0o644)
	type badCase struct {
		args []string
		want string
	}
	cases := []badCase{
		{[]string{"train", "--data", "/nonexistent/dir"}, "/nonexistent/dir"},
		{[]string{"train", "--config", cfg}, cfg + ":2: unknown key"},
		{[]string{"train", "--compression", "fp8"}, "--compression"},
		{[]string{"train", "--preset", "huge", "--synthetic-lines", "200"}, "huge"},
		{[]string{"translate", "--run-dir", "/nonexistent/run"}, "/nonexistent/run"},
		{[]string{"train", "--device", "bogus"}, `"bogus"`},
		{[]string{"train", "--config", devCfg}, `"tpu"`},
		{[]string{"translate", "--device", "bogus"}, `"bogus"`},
	}
	if cuda.Available() == nil {
		t.Log("a GPU is usable here: --device cuda is not an error to test")
	} else {
		// No GPU here: one line that names cuda (the rest is the backend's).
		cases = append(cases, badCase{[]string{"train", "--device", "cuda"}, "cuda"},
			badCase{[]string{"translate", "--device", "cuda"}, "cuda"})
	}
	for _, c := range cases {
		cmd := exec.Command(trainBin, c.args...)
		cmd.Env = testenv.CleanEnv()
		out, err := cmd.CombinedOutput()
		s := strings.TrimSpace(string(out))
		if err == nil {
			t.Errorf("%v: exit 0\n%s", c.args, s)
			continue
		}
		if !strings.Contains(s, c.want) || strings.Contains(s, "goroutine ") || strings.Count(s, "\n") > 0 {
			t.Errorf("%v: want one line mentioning %q, got:\n%s", c.args, c.want, s)
		}
	}
}

// syntheticSample is a source sentence of the built-in corpus.
func syntheticSample(t *testing.T, dir string) string {
	src, _ := data.Synthetic(99, 1)
	return src[0]
}

// Training from a prepared directory; resuming with another vocabulary is
// refused with one line.
func TestPreparedDataAndVocabMismatch(t *testing.T) {
	tmp := t.TempDir()
	syn, lab, run := filepath.Join(tmp, "syn"), filepath.Join(tmp, "lab"), filepath.Join(tmp, "run")
	for _, args := range [][]string{
		{"prepare", "--synthetic", "--synthetic-lines", "1500", "--out", syn},
		{"prepare", "--src", "../../data/testdata/sample.en.tok", "--tgt", "../../data/testdata/sample.de.tok",
			"--vocab", "../../data/testdata/m_common.vocab", "--valid-src", "../../data/testdata/sample.en.tok",
			"--valid-tgt", "../../data/testdata/sample.de.tok", "--out", lab},
	} {
		if out, err := exec.Command(trainBin, args...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	runJob(t, 2, append(append([]string{}, tinyArgs...), "--data", syn, "--batch-tokens", "1024", "--max-steps", "4",
		"--checkpoint-every", "4", "--run-dir", run)...)
	cmd := exec.Command(trainBin, append(append([]string{}, tinyArgs...), "--data", lab, "--max-steps", "8", "--resume", "--run-dir", run)...)
	cmd.Env = testenv.CleanEnv()
	out, err := cmd.CombinedOutput()
	s := strings.TrimSpace(string(out))
	if err == nil || !strings.Contains(s, "vocabulary") || strings.Count(s, "\n") > 1 {
		t.Fatalf("resume with another vocabulary: err %v, output:\n%s", err, s)
	}
}

// The main job as the README runs it: gorun starts the ranks.
func TestUnderGorun(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(gorunBin, append([]string{"-np", "2", trainBin}, append(append([]string{}, tinyArgs...),
		"--batch-tokens", "1024", "--max-steps", "6", "--log-every", "3", "--eval-sentences", "8", "--run-dir", dir)...)...)
	cmd.Env = testenv.CleanEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	s := string(out)
	for _, want := range []string{"[0] nmt-train: device ", "[0] nmt-train: 2 rank(s)", "[0] step 6 |", "[0] eval at step 6", "[0] nmt-train: done"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
}

// TestCUDAEmulatorParity trains with --device cuda on the CPU emulator of
// the CUDA driver, cuBLAS and NVML (internal/cudaemu: kernels.cu compiled
// by g++): the whole GPU path of nmt-train (backend selection, kernels,
// cuBLAS calls, gradient buckets staged through pinned memory with fp16
// on the wire, the broadcast of the initial state) runs in real
// processes, and 1 and 2 ranks must follow the CPU backend's loss curve.
// It checks everything but the GPU itself (bench/gpu/run.sh does that).
func TestCUDAEmulatorParity(t *testing.T) {
	lib := cudaemu.ForTest(t)
	const steps = 4
	base := append(append([]string{}, tinyArgs...), "--no-dropout", "--batch-tokens", "256",
		"--max-steps", fmt.Sprint(steps), "--checkpoint-every", "0", "--eval-every", "0")
	var last metrics.Record // the last train record of the latest run
	run := func(n int, dev, prec string) map[int64]float64 {
		dir := t.TempDir()
		args := append(append([]string{}, base...), "--device", dev, "--precision", prec, "--backward-passes-per-step", fmt.Sprint(2/n), "--run-dir", dir)
		j := startJobEnv(t, n, []string{"GORUN_CUDA_LIB_DIR=" + lib, "GORUN_CUDA_EMU_DEVICES=2"}, args...)
		for r, err := range j.wait() {
			if err != nil {
				t.Fatalf("%s np %d rank %d: %v\n%s", dev, n, r, err, j.outs[r])
			}
		}
		if dev == "cuda" && !strings.Contains(j.outs[0].String(), "gorun CUDA emulator") {
			t.Fatalf("np %d did not run on the emulated GPU:\n%s", n, j.outs[0])
		}
		if dev == "cuda" {
			// every rank's NVML figures reach rank 0's metrics
			recs, err := metrics.ReadJSONL(filepath.Join(dir, "metrics.jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"gpu_util_pct", "gpu_mem_used_MiB", "gpu_mem_peak_MiB"}
			for r := 0; r < n && n > 1; r++ {
				want = append(want, fmt.Sprintf("gpu_mem_used_MiB_rank%d", r))
			}
			for _, r := range recs {
				if r.Kind == "train" {
					last = r
				}
			}
			for _, k := range want {
				if v, ok := last.Values[k]; !ok || math.IsNaN(v) || (strings.Contains(k, "mem") && v <= 0) {
					t.Errorf("np %d: last train record has %s = %v (present %v)", n, k, v, ok)
				}
			}
		}
		return trainLosses(t, dir)
	}
	ref := run(1, "cpu", "fp32")
	for _, n := range []int{1, 2} {
		got := run(n, "cuda", "fp32")
		if len(got) != steps {
			t.Fatalf("cuda np %d: %d logged steps, want %d", n, len(got), steps)
		}
		for s, want := range ref {
			if d := math.Abs(got[s] - want); d > 1e-4*math.Max(1, math.Abs(want)) {
				t.Errorf("cuda np %d step %d: loss %.6f, cpu %.6f", n, s, got[s], want)
			}
		}
	}
	// fp16 activations and matrix products with dynamic loss scaling: the same curve to
	// fp16's rounding, and the scale (2^14, no overflow yet) recorded
	got := run(1, "cuda", "fp16")
	for s, want := range ref {
		if d := math.Abs(got[s] - want); d > 1e-2*math.Max(1, math.Abs(want)) {
			t.Errorf("cuda fp16 step %d: loss %.6f, cpu fp32 %.6f", s, got[s], want)
		}
	}
	if sc := last.Values["loss_scale"]; sc != 1<<14 {
		t.Errorf("fp16: loss_scale %v, want 16384", sc)
	}
}

// ckptDirs lists the ckpt-* directories of dir, sorted.
func ckptDirs(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "ckpt-*"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range m {
		out = append(out, filepath.Base(p))
	}
	sort.Strings(out)
	return out
}

// checkLatest fails unless dir/latest names a complete checkpoint of step
// want.
func checkLatest(t *testing.T, dir string, want int) {
	t.Helper()
	ck, err := transformer.LatestCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := transformer.ReadState(ck)
	if err != nil {
		t.Fatalf("latest names %s: %v (checkpoints: %v)", ck, err, ckptDirs(t, dir))
	}
	if st.Step != want {
		t.Fatalf("latest names step %d, want %d", st.Step, want)
	}
	if _, err := os.Stat(filepath.Join(ck, "model.safetensors")); err != nil {
		t.Fatal(err)
	}
}

// checkTranslate runs translate on the run directory.
func checkTranslate(t *testing.T, dir string) {
	t.Helper()
	cmd := exec.Command(trainBin, "translate", "--run-dir", dir)
	cmd.Stdin = strings.NewReader(syntheticSample(t, dir) + "\n")
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) == 0 {
		t.Fatalf("translate: %v\n%s", err, out)
	}
}

// checkMetricsSteps fails unless metrics.jsonl's records have strictly
// increasing train steps (eval records at the step of the train record
// before them), the last train step is last, and the report says so.
func checkMetricsSteps(t *testing.T, dir string, last int64) {
	t.Helper()
	recs, err := metrics.ReadJSONL(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var prev, prevAny int64 = -1, -1
	for i, r := range recs {
		if r.Step < prevAny {
			t.Fatalf("metrics.jsonl record %d (%s) at step %d after step %d", i+1, r.Kind, r.Step, prevAny)
		}
		prevAny = r.Step
		if r.Kind == "train" {
			if r.Step <= prev {
				t.Fatalf("metrics.jsonl train record %d at step %d after step %d", i+1, r.Step, prev)
			}
			prev = r.Step
		}
	}
	if prev != last {
		t.Fatalf("last train record at step %d, want %d", prev, last)
	}
	rep, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("**%d steps**", last); !strings.Contains(string(rep), want) {
		t.Fatalf("report.md does not say %q:\n%s", want, rep)
	}
	// TensorBoard: every tag at most once per step over all event files,
	// none after the last step.
	files, _ := filepath.Glob(filepath.Join(dir, "*tfevents*"))
	seen := map[string]bool{}
	for _, f := range files {
		evs, err := metrics.ReadEvents(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			for tag := range e.Scalars {
				k := fmt.Sprintf("%s@%d", tag, e.Step)
				if seen[k] {
					t.Fatalf("TensorBoard: %s twice (event files %v)", k, files)
				}
				seen[k] = true
				if e.Step > last {
					t.Fatalf("TensorBoard: %s at step %d after the run's last step %d (%s)", tag, e.Step, last, f)
				}
			}
		}
	}
}

// A second run in a directory that holds a run is refused with one line
// and touches nothing: the first run's checkpoints, latest and metrics
// stay, and translate and --resume work on them.
func TestSecondRunInRunDirRefused(t *testing.T) {
	dir := t.TempDir()
	base := append(append([]string{}, tinyArgs...), "--batch-tokens", "1024", "--eval-every", "0",
		"--checkpoint-every", "5", "--keep-checkpoints", "3", "--run-dir", dir)
	runJob(t, 2, append(base, "--max-steps", "30")...)
	before, err := os.ReadFile(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	j := startJob(t, 2, append(base, "--max-steps", "12")...)
	errs := j.wait()
	out := strings.TrimSpace(j.outs[0].String())
	if errs[0] == nil {
		t.Fatalf("a second run in %s: exit 0; checkpoints now %v\n%s", dir, ckptDirs(t, dir), out)
	}
	if !strings.Contains(out, "already holds a run (latest ckpt-30)") || !strings.Contains(out, "--resume") || strings.Contains(out, "\n") {
		t.Fatalf("want one line saying the directory holds a run, got:\n%s", out)
	}
	if o1 := strings.TrimSpace(j.outs[1].String()); o1 != "" {
		t.Errorf("rank 1 printed more than rank 0's line:\n%s", o1)
	}
	if got := strings.Join(ckptDirs(t, dir), " "); got != "ckpt-20 ckpt-25 ckpt-30" {
		t.Fatalf("checkpoints after the refused run: %s", got)
	}
	checkLatest(t, dir, 30)
	after, _ := os.ReadFile(filepath.Join(dir, "metrics.jsonl"))
	if !bytes.Equal(before, after) {
		t.Fatal("the refused run changed metrics.jsonl")
	}
	checkTranslate(t, dir)
	out = runJob(t, 2, append(base, "--max-steps", "35", "--resume")...)
	if !strings.Contains(out, "resumed from step 30") {
		t.Fatalf("no resume line:\n%s", out)
	}
	checkLatest(t, dir, 35)
	checkMetricsSteps(t, dir, 35)
}

// Killed between the rename of ckpt-15 and the update of latest: latest
// still names ckpt-10 and ckpt-15 is an orphan, never confirmed. A resumed
// run with --keep-checkpoints 1 keeps its own checkpoints, and latest
// names one that exists.
func TestOrphanCheckpointKeepOne(t *testing.T) {
	dir := t.TempDir()
	base := append(append([]string{}, tinyArgs...), "--batch-tokens", "1024", "--eval-every", "0", "--run-dir", dir)
	runJob(t, 1, append(base, "--max-steps", "15", "--checkpoint-every", "5", "--keep-checkpoints", "5")...)
	if got := strings.Join(ckptDirs(t, dir), " "); got != "ckpt-10 ckpt-15 ckpt-5" {
		t.Fatalf("checkpoints: %s", got)
	}
	if err := os.WriteFile(filepath.Join(dir, "latest"), []byte("ckpt-10\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := runJob(t, 1, append(base, "--max-steps", "14", "--checkpoint-every", "2", "--keep-checkpoints", "1", "--resume")...)
	if !strings.Contains(out, "resumed from step 10") {
		t.Fatalf("no resume line:\n%s", out)
	}
	checkLatest(t, dir, 14)
	if got := strings.Join(ckptDirs(t, dir), " "); got != "ckpt-14" {
		t.Fatalf("checkpoints after resuming with --keep-checkpoints 1: %s", got)
	}
	checkTranslate(t, dir)
	checkMetricsSteps(t, dir, 14)
}

// Killed at step K after the checkpoint of step S < K-1, and resumed to
// S+1: metrics.jsonl and the event files hold the run as it went (no
// record after S of the abandoned attempt), the report says S+1 steps,
// and the temporary directories of a killed checkpoint write are gone.
func TestKillResumeMetrics(t *testing.T) {
	dir := t.TempDir()
	base := append(append([]string{}, tinyArgs...), "--batch-tokens", "256", "--eval-every", "0", "--checkpoint-every", "50", "--run-dir", dir)
	j := startJob(t, 1, append(base, "--max-steps", "100000")...)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if recs, err := metrics.ReadJSONL(filepath.Join(dir, "metrics.jsonl")); err == nil && len(recs) > 0 && recs[len(recs)-1].Step >= 60 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no step 60 after 60 s:\n%s", j.outs[0])
		}
		time.Sleep(2 * time.Millisecond)
	}
	j.cmds[0].Process.Signal(syscall.SIGKILL)
	j.wait()
	ck, err := transformer.LatestCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := transformer.ReadState(ck)
	if err != nil {
		t.Fatal(err)
	}
	recs, _ := metrics.ReadJSONL(filepath.Join(dir, "metrics.jsonl"))
	if k := recs[len(recs)-1].Step; k < int64(st.Step)+2 {
		t.Fatalf("killed at step %d, latest checkpoint %d: the test proves nothing", k, st.Step)
	}
	// a checkpoint write that was killed half way
	stale := []string{filepath.Join(dir, fmt.Sprintf(".ckpt-%d.tmp123456", st.Step+50)), filepath.Join(dir, ".ckpt-7.tmp1")}
	for _, s := range stale {
		if err := os.MkdirAll(s, 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(s, "model.safetensors"), []byte("half"), 0o644)
	}
	os.WriteFile(filepath.Join(dir, ".latest.tmp42"), []byte("ckpt-"), 0o644)
	last := st.Step + 1
	out := runJob(t, 1, append(base, "--max-steps", fmt.Sprint(last), "--resume")...)
	if !strings.Contains(out, fmt.Sprintf("resumed from step %d", st.Step)) {
		t.Fatalf("no resume line:\n%s", out)
	}
	for _, s := range append(stale, filepath.Join(dir, ".latest.tmp42")) {
		if _, err := os.Stat(s); err == nil {
			t.Errorf("%s left behind", filepath.Base(s))
		}
	}
	checkLatest(t, dir, last)
	checkMetricsSteps(t, dir, int64(last))
	// the killed attempt's records are kept aside, where TensorBoard does
	// not read them
	aside, err := metrics.ReadJSONL(filepath.Join(dir, fmt.Sprintf("metrics.jsonl.before-resume-%d", st.Step)))
	if err != nil || len(aside) != len(recs) {
		t.Fatalf("metrics.jsonl.before-resume-%d: %d records, %v; the killed run wrote %d", st.Step, len(aside), err, len(recs))
	}
}

// A run directory in use by a live nmt-train is refused to a second one,
// even with --resume, and the live writer's temporary files are left
// alone.
func TestRunDirInUse(t *testing.T) {
	dir := t.TempDir()
	base := append(append([]string{}, tinyArgs...), "--batch-tokens", "256", "--eval-every", "0", "--checkpoint-every", "5", "--run-dir", dir)
	j := startJob(t, 1, append(base, "--max-steps", "1000000")...)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(dir, "latest")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint after 60 s:\n%s", j.outs[0])
		}
		time.Sleep(5 * time.Millisecond)
	}
	deadline = time.Now().Add(60 * time.Second)
	live := filepath.Join(dir, ".ckpt-999999.tmp77")
	if err := os.Mkdir(live, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(trainBin, append(base, "--max-steps", "3", "--resume")...)
	out, err := cmd.CombinedOutput()
	s := strings.TrimSpace(string(out))
	if err == nil || !strings.Contains(s, "in use") || strings.Contains(s, "\n") {
		t.Fatalf("a second nmt-train in a run directory in use: err %v, output:\n%s", err, s)
	}
	if _, err := os.Stat(live); err != nil {
		t.Fatalf("the live writer's temporary directory: %v", err)
	}
	// the first run goes on checkpointing
	first, _ := os.ReadFile(filepath.Join(dir, "latest"))
	for {
		if now, _ := os.ReadFile(filepath.Join(dir, "latest")); len(now) > 0 && !bytes.Equal(now, first) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the first run stopped checkpointing:\n%s", j.outs[0])
		}
		time.Sleep(5 * time.Millisecond)
	}
	j.cmds[0].Process.Kill()
	j.wait()
}

// Ranks started with different settings are refused at once, every rank
// with the same line naming the first differing setting and the ranks, and
// nothing is written to the run directory.
func TestSettingsDifferBetweenRanks(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	t0 := time.Now()
	j := startJobRanks(t, 3, nil, func(r int) []string {
		a := append(append([]string{}, tinyArgs...), "--batch-tokens", "1024", "--max-steps", "5", "--run-dir", dir)
		if r == 1 {
			a = append(a, "--learning-rate", "2", "--seed", "7") // only the first (in the flags' order) is named
		}
		return a
	})
	errs := j.wait()
	if d := time.Since(t0); d > 60*time.Second {
		t.Errorf("refusal took %v", d)
	}
	want := "settings differ between ranks: --learning-rate is 1 on ranks 0, 2 and 2 on rank 1"
	for r, err := range errs {
		out := strings.TrimSpace(j.outs[r].String())
		if err == nil || !strings.Contains(out, want) || strings.Count(out, "settings differ") != 1 {
			t.Errorf("rank %d: err %v, want one line with %q, got:\n%s", r, err, want, out)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the refused job created %s (%v)", dir, err)
	}
}
