package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/cmd/nmt-train/internal/train"
	"github.com/gorun/gorun/data"
	"github.com/gorun/gorun/internal/cudaemu"
	"github.com/gorun/gorun/internal/envconf"
	"github.com/gorun/gorun/internal/testenv"
	"github.com/gorun/gorun/kernels/cuda"
	"github.com/gorun/gorun/metrics"
	"github.com/gorun/gorun/metrics/metricstest"
	"github.com/gorun/gorun/report"
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

// freezeWhen waits (up to 90 s) until cond holds while every process of the
// job is stopped (SIGSTOP), and returns with them stopped: what the caller
// does next (a SIGKILL) then happens in the state cond saw, whatever the
// machine's speed. cond is polled on the running job and tried again once
// it is stopped; if it no longer holds, the job goes on (SIGCONT) and so
// does the wait. A rank that exits first fails the test.
func (j *job) freezeWhen(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for tries := 1; ; tries++ {
		for !cond() {
			for r, c := range j.cmds {
				if exited(c.Process.Pid) {
					t.Fatalf("rank %d exited before the %s:\n%s", r, what, tail(j.outs[r].String()))
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %s after 90 s:\n%s", what, tail(j.outs[0].String()))
			}
			time.Sleep(5 * time.Millisecond)
		}
		for _, c := range j.cmds {
			c.Process.Signal(syscall.SIGSTOP)
		}
		for r, c := range j.cmds { // the signal is delivered a little later
			for !stopped(c.Process.Pid) {
				if exited(c.Process.Pid) {
					t.Fatalf("rank %d exited before the %s:\n%s", r, what, tail(j.outs[r].String()))
				}
				time.Sleep(time.Millisecond)
			}
		}
		if cond() {
			t.Logf("frozen at the %s (try %d)", what, tries)
			return
		}
		for _, c := range j.cmds {
			c.Process.Signal(syscall.SIGCONT)
		}
	}
}

// kill sends SIGKILL to every rank and waits for them.
func (j *job) kill() {
	for _, c := range j.cmds {
		c.Process.Signal(syscall.SIGKILL)
	}
	j.wait()
}

// procState is the state letter of a /proc stat file (R, S, T for
// stopped, Z, ...; "" when it is gone).
func procState(stat string) string {
	b, err := os.ReadFile(stat)
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// exited reports whether process pid has ended (a zombie not yet waited
// for, or gone).
func exited(pid int) bool {
	s := procState(fmt.Sprintf("/proc/%d/stat", pid))
	return s == "" || s == "Z" || s == "X"
}

// stopped reports whether every thread of process pid is stopped.
func stopped(pid int) bool {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	for _, st := range tasks {
		if procState(st) != "T" {
			return false
		}
	}
	return len(tasks) > 0
}

// tail is the end of a long output.
func tail(s string) string {
	if len(s) > 3000 {
		return "..." + s[len(s)-3000:]
	}
	return s
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

// losses is the train loss (loss_raw) of each logged step of a run.
type losses map[int64]float64

// trainLosses reads the train loss of every logged step of a run. A train
// record without loss_raw, or a step logged twice, fails the test.
func trainLosses(t *testing.T, dir string) losses {
	t.Helper()
	recs, err := metrics.ReadJSONL(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	out := losses{}
	for _, r := range recs {
		if r.Kind != "train" {
			continue
		}
		v, ok := r.Values["loss_raw"]
		if !ok {
			t.Fatalf("%s: the train record of step %d has no loss_raw: %v", dir, r.Step, r.Values)
		}
		if _, dup := out[r.Step]; dup {
			t.Fatalf("%s: step %d logged twice", dir, r.Step)
		}
		out[r.Step] = v
	}
	return out
}

// at is the loss of step s. A step the run did not log fails the test: it
// must not read as loss 0 on both sides of a comparison.
func (l losses) at(t *testing.T, s int64) float64 {
	t.Helper()
	v, ok := l[s]
	if !ok {
		steps := make([]int64, 0, len(l))
		for k := range l {
			steps = append(steps, k)
		}
		sort.Slice(steps, func(a, b int) bool { return steps[a] < steps[b] })
		t.Fatalf("no train record of step %d (logged steps: %v)", s, steps)
	}
	return v
}

// follow fails the test unless got logs every step of from..to with the
// loss of want (relative tolerance tol).
func follow(t *testing.T, what string, got, want losses, from, to int64, tol float64) {
	t.Helper()
	for s := from; s <= to; s++ {
		g, w := got.at(t, s), want.at(t, s)
		if d := math.Abs(g - w); !(d <= tol*math.Max(1, math.Abs(w))) {
			t.Errorf("%s: loss at step %d is %.7f, want %.7f", what, s, g, w)
		}
	}
}

var tinyArgs = []string{"train", "--preset", "tiny", "--synthetic-lines", "2000", "--max-length", "24",
	"--learning-rate", "1", "--warmup-steps", "10", "--log-every", "1", "--eval-sentences", "0", "--quiet", "--threads", "1"}

// The distributed gradient is the true gradient: 1 rank accumulating 4
// batches a step, 2 ranks 2 each and 4 ranks 1 each take the same batches
// and give the same loss curve (dropout off, fp32 on the wire).
func TestParity(t *testing.T) {
	const steps = 20
	const batches = 4
	var ref losses
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
			if !(ref.at(t, steps) < ref.at(t, 1)) {
				t.Fatalf("np 1: loss did not go down: step 1 %.4f, step %d %.4f", ref.at(t, 1), steps, ref.at(t, steps))
			}
			continue
		}
		follow(t, fmt.Sprintf("np %d against 1 rank", n), got, ref, 1, steps, 1e-4)
	}
}

// A job killed with SIGKILL between checkpoints resumes from the last one
// and follows an uninterrupted run step by step. The killed run has no end
// of its own (--max-steps 100000) and is frozen when it has logged two
// steps past its latest checkpoint (checked while frozen), then killed: the
// kill lands between checkpoints however fast or slow the machine is.
func TestKillAndResume(t *testing.T) {
	args := func(dir string, steps int64) []string {
		return append(append([]string{}, tinyArgs...), "--batch-tokens", "1024", "--max-steps", fmt.Sprint(steps),
			"--checkpoint-every", "5", "--eval-every", "0", "--run-dir", dir)
	}
	cut := t.TempDir()
	j := startJob(t, 2, args(cut, 100000)...)
	var ckpt, killedAt int64
	j.freezeWhen(t, "step two past a checkpoint", func() bool {
		ckpt, killedAt = progress(cut)
		return ckpt >= 5 && killedAt >= ckpt+2
	})
	j.kill()
	t.Logf("killed at step %d; latest checkpoint: step %d", killedAt, ckpt)
	killed := trainLosses(t, cut)
	last := killedAt + 3
	out := runJob(t, 2, append(args(cut, last), "--resume")...)
	if !strings.Contains(out, fmt.Sprintf("resumed from step %d", ckpt)) {
		t.Fatalf("killed at step %d after the checkpoint of step %d: no resume line for it:\n%s", killedAt, ckpt, out)
	}
	full := t.TempDir()
	runJob(t, 2, args(full, last)...)
	want := trainLosses(t, full)
	follow(t, fmt.Sprintf("the killed run (at step %d)", killedAt), killed, want, 1, killedAt, 1e-6)
	got := trainLosses(t, cut)
	if len(got) != int(last) {
		t.Errorf("the resumed run's metrics.jsonl has %d train steps, want %d", len(got), last)
	}
	follow(t, fmt.Sprintf("killed at step %d, resumed from step %d", killedAt, ckpt), got, want, 1, last, 1e-6)
}

// progress reads a running job's run directory: the step of the checkpoint
// latest names (0 for none yet) and the last train step in metrics.jsonl
// (0 for none, or a line half written).
func progress(dir string) (ckpt, logged int64) {
	if ck, err := checkpoint.Latest(dir); err == nil {
		if st, err := checkpoint.ReadState(ck); err == nil {
			ckpt = int64(st.Step)
		}
	}
	recs, _ := metrics.ReadJSONL(filepath.Join(dir, "metrics.jsonl"))
	for _, r := range recs {
		if r.Kind == "train" {
			logged = r.Step
		}
	}
	return ckpt, logged
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
		follow(t, fmt.Sprintf("np %d, resumed at step %d, against 2 ranks uninterrupted", c.n, steps/2), got, want, steps/2+1, steps, 1e-5)
	}
}

// A run's outputs: event files that parse with the tags, metrics.jsonl,
// plots, the timeline, the report and a translation from the checkpoint.
// The report's numbers are checked against metrics.jsonl, run.json and the
// checkpoint's files (each to the digits it prints), and the translations'
// form: one line per input, made of the run's vocabulary.
func TestRunOutputs(t *testing.T) {
	const steps = 12
	dir := t.TempDir()
	runJob(t, 2, append(append([]string{}, tinyArgs...), "--batch-tokens", "1024", "--max-steps", fmt.Sprint(steps),
		"--eval-every", "6", "--eval-sentences", "16", "--checkpoint-every", "6", "--link-gbps", "1", "--run-dir", dir,
		"--timeline", filepath.Join(dir, "timeline.json"))...)
	recs, err := metrics.ReadJSONL(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	// --log-every 1: one train record a step, then evals at steps 6 and 12
	var train, eval []metrics.Record
	for _, r := range recs {
		switch r.Kind {
		case "train":
			if r.Step != int64(len(train)+1) {
				t.Fatalf("metrics.jsonl: train record of step %d after %d train records", r.Step, len(train))
			}
			train = append(train, r)
		case "eval":
			eval = append(eval, r)
		}
	}
	if len(train) != steps || len(eval) != 2 || eval[0].Step != 6 || eval[1].Step != 12 {
		t.Fatalf("metrics.jsonl: %d train records, evals at %v; want %d, evals at steps 6 and 12", len(train), recSteps(eval), steps)
	}
	val := func(r metrics.Record, k string) float64 {
		t.Helper()
		v, ok := r.Values[k]
		if !ok || math.IsNaN(v) || math.IsInf(v, 0) {
			t.Fatalf("metrics.jsonl: the %s record of step %d has %s = %v (present %v)", r.Kind, r.Step, k, v, ok)
		}
		return v
	}
	col := func(rs []metrics.Record, k string) []float64 {
		t.Helper()
		var out []float64
		for _, r := range rs {
			out = append(out, val(r, k))
		}
		return out
	}
	evs, _ := filepath.Glob(filepath.Join(dir, "events.out.tfevents.*"))
	if len(evs) != 1 {
		t.Fatalf("event files: %v", evs)
	}
	events, err := metricstest.ReadEvents(evs[0])
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

	// The report, against the records it was made from.
	rb, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	rep := string(rb)
	defer func() {
		if t.Failed() {
			t.Logf("report.md:\n%s", rep)
		}
	}()
	// reported finds re (one group: a number as the report prints it) and
	// checks that it is want to the printed digits.
	reported := func(re string, want float64) {
		t.Helper()
		m := regexp.MustCompile(re).FindStringSubmatch(rep)
		if m == nil {
			t.Errorf("report.md has no %s", re)
			return
		}
		got, err := strconv.ParseFloat(strings.ReplaceAll(m[1], ",", ""), 64)
		if err != nil {
			t.Errorf("report.md: %q: %v", m[0], err)
			return
		}
		if d := math.Abs(got - want); !(d <= halfUnit(m[1])*(1+1e-9)) {
			t.Errorf("report.md says %q; from the run's records: %.10g", m[0], want)
		}
	}
	params := safetensorsElements(t, filepath.Join(dir, "ckpt-12", "model.safetensors"))
	reported("preset `tiny` \\(([\\d,]+) parameters\\), 2 rank\\(s\\) on ", float64(params))
	stepTime, toks, lr := col(train, "step_time_s"), col(train, "tokens_per_s"), col(train, "lr")
	reported(`for \*\*([\d,]+) steps\*\*`, steps)
	reported(`Average step time: \*\*([\d.]+) s\*\*`, meanOf(stepTime))
	reported(`\(median ([\d.]+) s\)`, upperMedian(stepTime))
	reported(`over (\d+) logged intervals`, float64(len(stepTime)))
	reported(`Throughput: \*\*([\d,]+) target tokens/s\*\*`, meanOf(toks))
	reported(`peak \*\*([\d.e+-]+)\*\*`, slices.Max(lr)) // warmup 10: step 10 is the peak, logged
	reported(`went from ([\d.e+-]+) \(step 1\)`, lr[0])
	reported(`to ([\d.e+-]+) \(step 12\)`, lr[steps-1])
	el, eraw := col(eval, "loss"), col(eval, "loss_raw")
	reported(`over the last (\d+) evaluations`, 2)
	reported(`\*\*([+-][\d.]+) nats per 1000 steps\*\*`, (el[1]-el[0])/6*1000)
	bleu := col(eval, "bleu")
	reported(`BLEU \(2 evaluations\): ([\d.]+) at step 6`, bleu[0])
	reported(`\*\*([\d.]+)\*\* at step 12`, bleu[1])
	trainRaw := col(train, "loss_raw")
	reported(`eval: without\): ([+-][\d.]+) at step 6`, eraw[0]-trainRaw[5])
	reported(`, ([+-][\d.]+) at step 12\.`, eraw[1]-trainRaw[11])
	reported(`CPU use: \*\*(\d+) %\*\*`, meanOf(col(train, "cpu_util_pct")))
	// each rank's, and the mean of the two
	cpu0, cpu1 := col(train, "cpu_util_pct_rank0"), col(train, "cpu_util_pct_rank1")
	reported(`\(rank 0 (\d+) %, rank 1 \d+ %\)`, meanOf(cpu0))
	reported(`\(rank 0 \d+ %, rank 1 (\d+) %\)`, meanOf(cpu1))
	for i, r := range train {
		if m := (cpu0[i] + cpu1[i]) / 2; math.Abs(val(r, "cpu_util_pct")-m) > 1e-3*m {
			t.Errorf("metrics.jsonl step %d: cpu_util_pct %v, not the mean of the ranks' %v and %v", r.Step, val(r, "cpu_util_pct"), cpu0[i], cpu1[i])
		}
	}
	if !strings.Contains(rep, "No GPU was used.") {
		t.Errorf("report.md does not say that no GPU was used")
	}
	compute := meanOf(col(train, "compute_s"))
	reported(`Compute \(forward, backward, optimizer\) is \*\*(\d+) %\*\*`, 100*compute/meanOf(stepTime))
	exposed := meanOf(col(train, "comm_exposed_ms"))
	reported(`Exposed communication \(after backward finished\): \*\*([\d.]+) ms\*\*`, exposed)
	reported(`\*\*(\d+) %\*\* of the allreduce time was hidden`, meanOf(col(train, "comm_hidden_pct")))
	reported(`Exposed communication is \*\*([\d.]+) %\*\* of the step time`, 100*exposed/1000/meanOf(stepTime))
	// one host: the gradients go through shared memory, and the report
	// counts them (none over the network)
	reported(`network ([\d.]+) MB/s out`, meanOf(col(train, "net_out_MBps")))
	reported(`network [\d.]+ MB/s out, ([\d.]+) MB/s in`, meanOf(col(train, "net_in_MBps")))
	shmOut := meanOf(col(train, "shm_out_MBps"))
	if !(shmOut > 0) {
		t.Errorf("metrics.jsonl: shm_out_MBps %v on one host, where shared memory carries the gradients", shmOut)
	}
	reported(`shared memory ([\d.]+) MB/s out`, shmOut)
	reported(`shared memory [\d.]+ MB/s out, ([\d.]+) MB/s in`, meanOf(col(train, "shm_in_MBps")))
	if !strings.Contains(rep, "no gradient crossed a network; shared memory carried them") {
		t.Errorf("report.md does not say that shared memory carried the gradients")
	}
	// the least allreduce time on 1 Gbit/s for 2 ranks: 2(n-1)/n = 1 x the gradient bytes
	fp32, fp16 := 4*float64(params)/125e6, 2*float64(params)/125e6
	reported(`bottleneck analysis: ([\d.]+) M parameters, 2 ranks, 1 Gbit/s link`, float64(params)/1e6)
	reported(`least allreduce time per step: ([\d.]+) s with fp32`, fp32)
	reported(`, ([\d.]+) s with fp16`, fp16)
	reported(`measured compute per step: +([\d.]+) s`, compute)
	verdict := "compute-bound"
	if fp16 > compute {
		verdict = "network-bound"
	}
	if !strings.Contains(rep, "verdict: "+verdict+" (communication needs") {
		t.Errorf("report.md lacks the verdict %q (fp16 allreduce %.4f s against compute %.4f s)", verdict, fp16, compute)
	}
	reported(`needs at least (\d+) % of the compute time with fp16`, 100*fp16/compute)
	reported(`with fp16, (\d+) % with fp32`, 100*fp32/compute)
	reported(`\*\*([\d,]+) lines\*\* \(sentence pairs\)`, 2000)
	if !strings.Contains(rep, "made in memory at start (no file;") {
		t.Errorf("report.md does not say the built-in corpus was made in memory")
	}
	// checkpoints: the newest is the one described, file by file
	reported(`- (\d+) checkpoint\(s\) kept; `+"`latest` points to `ckpt-12`", 2)
	entries, err := os.ReadDir(filepath.Join(dir, "ckpt-12"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rep, "- `ckpt-12` holds:") {
		t.Errorf("report.md does not describe ckpt-12, the checkpoint latest names")
	}
	var total int64
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		total += info.Size()
		reported(fmt.Sprintf(`\| %s \| ([\d,]+) \|`, regexp.QuoteMeta(e.Name())), float64(info.Size()))
	}
	reported(`\| \*\*total\*\* \| \*\*([\d,]+)\*\*`, float64(total))

	// translate from the checkpoint: 5 sentences in batches of 2, as
	// vocabulary pieces and as text
	src, _ := data.Synthetic(99, 5)
	vocab := map[string]bool{}
	vb, err := os.ReadFile(filepath.Join(dir, "vocab.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(vb)), "\n") {
		if p, _, _ := strings.Cut(l, "\t"); !strings.HasPrefix(p, "<") { // not <pad>, <s>, </s>, <unk>
			vocab[p] = true
		}
	}
	translate := func(extra ...string) []string {
		t.Helper()
		cmd := exec.Command(trainBin, append([]string{"translate", "--run-dir", dir, "--batch", "2"}, extra...)...)
		cmd.Stdin = strings.NewReader(strings.Join(src, "\n") + "\n")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil || stderr.Len() > 0 {
			t.Fatalf("translate %v: %v\n%s%s", extra, err, out, stderr.String())
		}
		lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
		if len(lines) != len(src) || !strings.HasSuffix(string(out), "\n") {
			t.Fatalf("translate %v: %d lines for %d sentences:\n%s", extra, len(lines), len(src), out)
		}
		return lines
	}
	pieces, text := translate("--pieces"), translate()
	nonEmpty := 0
	for i, l := range pieces {
		ps := strings.Fields(l)
		for _, p := range ps {
			if !vocab[p] {
				t.Errorf("translation %d: %q is not in the run's vocabulary: %q", i+1, p, l)
				break
			}
		}
		if n := len(strings.Fields(src[i])) + 1 + 50; len(ps) > n { // the source, </s>, and 50 more at most
			t.Errorf("translation %d: %d pieces for a source of %d words", i+1, len(ps), n-51)
		}
		if want := strings.TrimSpace(strings.ReplaceAll(strings.ReplaceAll(l, " ", ""), "\u2581", " ")); text[i] != want {
			t.Errorf("translation %d: text %q, want the pieces %q joined: %q", i+1, text[i], l, want)
		}
		if len(ps) > 0 {
			nonEmpty++
		}
	}
	if nonEmpty == 0 {
		t.Errorf("every translation is empty: %q", pieces)
	}
}

// recSteps lists the steps of records.
func recSteps(rs []metrics.Record) []int64 {
	var out []int64
	for _, r := range rs {
		out = append(out, r.Step)
	}
	return out
}

func meanOf(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// upperMedian is the middle value, the upper one of an even count.
func upperMedian(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// halfUnit is half a unit in the last digit of a printed number ("0.031":
// 0.0005, "3.953e-02": 0.0005e-02, "1,234": 0.5).
func halfUnit(s string) float64 {
	mant, exp := s, 0
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		mant = s[:i]
		exp, _ = strconv.Atoi(s[i+1:])
	}
	dec := 0
	if i := strings.IndexByte(mant, '.'); i >= 0 {
		dec = len(mant) - i - 1
	}
	return 0.5 * math.Pow(10, float64(exp-dec))
}

// safetensorsElements counts the elements of every tensor in a
// safetensors file, from its header (read here, not by the code under
// test).
func safetensorsElements(t *testing.T, path string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 8 {
		t.Fatalf("%s: %d bytes", path, len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	var hdr map[string]json.RawMessage
	if n > uint64(len(b)-8) || json.Unmarshal(b[8:8+n], &hdr) != nil {
		t.Fatalf("%s: no safetensors header", path)
	}
	var total int64
	for name, raw := range hdr {
		if name == "__metadata__" {
			continue
		}
		var ti struct{ Shape []int64 }
		if err := json.Unmarshal(raw, &ti); err != nil {
			t.Fatalf("%s: tensor %s: %v", path, name, err)
		}
		e := int64(1)
		for _, d := range ti.Shape {
			e *= d
		}
		total += e
	}
	return total
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
	set, err := envconf.CUDA(os.LookupEnv) // as the nmt-train started here reads them
	if err != nil {
		t.Fatal(err)
	}
	if cuda.Available(set) == nil {
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
	for _, want := range []string{"[0] nmt-train: device ", "[0] nmt-train: 2 rank(s)", "[0] step 6/6 |", "[0] eval at step 6", "[0] nmt-train: done"} {
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
	var lastDir, lastOut string
	var extra []string // more flags for the next run
	run := func(n int, dev, prec string, env ...string) losses {
		dir := t.TempDir()
		lastDir = dir
		args := append(append(append([]string{}, base...), extra...), "--device", dev, "--precision", prec, "--backward-passes-per-step", fmt.Sprint(2/n), "--run-dir", dir)
		j := startJobEnv(t, n, append([]string{"GORUN_CUDA_LIB_DIR=" + lib, "GORUN_CUDA_EMU_DEVICES=2"}, env...), args...)
		for r, err := range j.wait() {
			if err != nil {
				t.Fatalf("%s np %d rank %d: %v\n%s", dev, n, r, err, j.outs[r])
			}
		}
		lastOut = j.outs[0].String()
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
		follow(t, fmt.Sprintf("cuda np %d against cpu", n), got, ref, 1, steps, 1e-4)
	}
	// np 2 with the float32 wire, under the emulator's asynchronous streams
	// in a random order (GORUN_CUDA_EMU_SCHED, internal/cudaemu): a bucket's
	// copy to the host runs when the communication goroutine waits for it,
	// interleaved at random with the backward pass queued on the compute
	// stream, and blocks and threads run in random order; the same curve.
	extra = []string{"--compression", "none"}
	got := run(2, "cuda", "fp32", "GORUN_CUDA_EMU_SCHED=async,random,seed=3")
	extra = nil
	follow(t, "cuda np 2, float32 wire, async streams, against cpu", got, ref, 1, steps, 1e-4)
	// fp16 activations and matrix products with dynamic loss scaling: the same curve to
	// fp16's rounding, and the scale (2^14, no overflow yet) recorded; profiled
	// (GORUN_CUDA_PROFILE=1), which changes no number, and the profile written;
	// on the emulator presenting an H200 (compute capability 9.0, 132
	// multiprocessors: the PTX and grid sizes an H200 gets)
	got = run(1, "cuda", "fp16", "GORUN_CUDA_PROFILE=1", "GORUN_CUDA_EMU_CC=9.0", "GORUN_CUDA_EMU_SMS=132")
	if !strings.Contains(lastOut, "compute capability 9.0, 132 SMs") {
		t.Errorf("fp16: not on the emulated H200:\n%s", lastOut)
	}
	follow(t, "cuda fp16 against cpu fp32", got, ref, 1, steps, 1e-2)
	if sc := last.Values["loss_scale"]; sc != 1<<14 {
		t.Errorf("fp16: loss_scale %v, want 16384", sc)
	}
	prof, err := os.ReadFile(filepath.Join(lastDir, train.GPUProfileFile))
	if err != nil {
		t.Fatalf("GORUN_CUDA_PROFILE=1: %v", err)
	}
	for _, want := range []string{fmt.Sprintf("over %d steps", steps), "gr_residual_dropout_layernorm_f16", "gemm F16,F16->F16 ", "gr_adam_f32", "all, on the GPU"} {
		if !strings.Contains(string(prof), want) {
			t.Errorf("the GPU profile lacks %q:\n%s", want, prof)
		}
	}
	// every kernel the run launched is a hot kernel: one that make ptx-check
	// forbids to spill (kernels/cuda/hot_kernels.txt)
	hot, err := os.ReadFile("../../kernels/cuda/hot_kernels.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(prof), "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], "gr_") && !regexp.MustCompile(`(?m)^`+f[0]+`$`).Match(hot) {
			t.Errorf("the run launched %s, which kernels/cuda/hot_kernels.txt does not list", f[0])
		}
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
	ck, err := checkpoint.Latest(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := checkpoint.ReadState(ck)
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
		evs, err := metricstest.ReadEvents(f)
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
	j.freezeWhen(t, "step 60 or later, two past a checkpoint", func() bool {
		ckpt, logged := progress(dir)
		return logged >= 60 && ckpt >= 50 && logged >= ckpt+2
	})
	j.kill()
	ck, err := checkpoint.Latest(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := checkpoint.ReadState(ck)
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
	// the report's time adds up the two segments: the first start's up to
	// the checkpoint, the resumed one's
	rep, _ := os.ReadFile(filepath.Join(dir, "report.md"))
	if want := fmt.Sprintf("the sum of 2 segments: steps 1-%s in ", report.Commas(st.Step)); !strings.Contains(string(rep), want) ||
		!strings.Contains(string(rep), fmt.Sprintf("steps %s-%s in ", report.Commas(last), report.Commas(last))) {
		t.Errorf("report.md does not list the segments (%q, then step %d):\n%s", want, last, rep)
	}
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
