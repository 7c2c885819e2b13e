package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/internal/testenv"
	"github.com/gorun/gorun/metrics"
)

// Faults of long runs, each through gorun with real processes and
// signals: a stop on SIGTERM (preemption) and a rank killed under
// --max-restarts; where the run continues, its final loss must be an
// uninterrupted run's.

// startGorun starts gorun with args; its output goes to the returned
// buffer (safe to read while it runs).
func startGorun(t *testing.T, args ...string) (*exec.Cmd, *testenv.Buffer) {
	t.Helper()
	cmd := exec.Command(gorunBin, args...)
	cmd.Env = testenv.CleanEnv()
	var out testenv.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	return cmd, &out
}

// waitStep waits until dir's metrics.jsonl has logged step >= step.
func waitStep(t *testing.T, dir string, step int64, out *testenv.Buffer) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		if recs, err := metrics.ReadJSONL(filepath.Join(dir, "metrics.jsonl")); err == nil && len(recs) > 0 && recs[len(recs)-1].Step >= step {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no step %d after 90 s:\n%s", step, out)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// exitCode waits for cmd and returns its exit status.
func exitCode(t *testing.T, cmd *exec.Cmd, out *testenv.Buffer) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
		return cmd.ProcessState.ExitCode()
	case <-time.After(90 * time.Second):
		t.Fatalf("gorun did not end:\n%s", out)
	}
	return -1
}

// SIGTERM to gorun (a scheduler's time limit, a preemption, Ctrl-C): every
// rank finishes its step, rank 0 writes a checkpoint, the job exits with
// 128+15 within gorun's --grace, and --resume continues to the loss of a
// run that was never stopped.
func TestStopOnSIGTERM(t *testing.T) {
	dir := t.TempDir()
	args := func(dir string, steps int) []string {
		return append(append([]string{}, tinyArgs...), "--batch-tokens", "1024", "--max-steps", fmt.Sprint(steps),
			"--checkpoint-every", "1000", "--eval-every", "0", "--run-dir", dir)
	}
	cmd, out := startGorun(t, append([]string{"-np", "2", "--grace", "60s", trainBin}, args(dir, 100000)...)...)
	waitStep(t, dir, 5, out)
	cmd.Process.Signal(syscall.SIGTERM)
	if code := exitCode(t, cmd, out); code != 128+int(syscall.SIGTERM) {
		t.Fatalf("gorun exit status %d, want %d:\n%s", code, 128+int(syscall.SIGTERM), out)
	}
	ck, err := checkpoint.Latest(dir)
	if err != nil {
		t.Fatalf("no checkpoint after SIGTERM: %v\n%s", err, out)
	}
	st, err := checkpoint.ReadState(ck)
	if err != nil {
		t.Fatal(err)
	}
	line := fmt.Sprintf("[0] nmt-train: stopped by terminated after step %d; checkpoint %s written: continue with --resume", st.Step, ck)
	if st.Step < 5 || !strings.Contains(out.String(), line) {
		t.Fatalf("checkpoint of step %d; output lacks %q:\n%s", st.Step, line, out)
	}
	if strings.Contains(out.String(), "SIGKILL") {
		t.Fatalf("a rank had to be killed:\n%s", out)
	}
	rep, _ := os.ReadFile(filepath.Join(dir, "report.md"))
	if want := fmt.Sprintf("Stopped by terminated after step %d (checkpoint ckpt-%d written)", st.Step, st.Step); !strings.Contains(string(rep), want) {
		t.Errorf("report.md lacks %q", want)
	}

	last := st.Step + 3
	runJob(t, 2, append(args(dir, last), "--resume")...)
	full := t.TempDir()
	runJob(t, 2, args(full, last)...)
	follow(t, fmt.Sprintf("stopped at step %d and resumed, against an uninterrupted run", st.Step), trainLosses(t, dir), trainLosses(t, full), 1, int64(last), 1e-6)
}

// A rank that fails before the job has met: gorun stops the others, and
// rank 0, waiting at the rendezvous, says it was interrupted (one line,
// naming the rank once), not that the rendezvous did not answer.
func TestInterruptedBeforeFirstStep(t *testing.T) {
	script := fmt.Sprintf(`if [ "$GORUN_RANK" = 1 ]; then sleep 3; echo rank 1 fails; exit 1; fi; exec %s "$@"`, trainBin)
	args := append([]string{"-np", "2", "sh", "-c", script, "sh"}, tinyArgs...)
	cmd, out := startGorun(t, append(args, "--max-steps", "5", "--run-dir", t.TempDir())...)
	if code := exitCode(t, cmd, out); code != 1 {
		t.Fatalf("gorun exit status %d, want 1 (rank 1's):\n%s", code, out)
	}
	got := out.String()
	if want := "[0] nmt-train: rank 0: interrupted by terminated before the first step\n"; !strings.Contains(got, want) {
		t.Fatalf("output lacks %q:\n%s", want, got)
	}
	for _, bad := range []string{"did not answer", "rank 0: rank 0:"} {
		if strings.Contains(got, bad) {
			t.Fatalf("output has %q:\n%s", bad, got)
		}
	}
}

// A rank killed under gorun --max-restarts 1: gorun stops the job, starts
// it again, nmt-train resumes from the last checkpoint, and the run ends
// with an uninterrupted run's loss; the log and the report name the
// restart, its cause and the steps lost.
func TestMaxRestartsResumes(t *testing.T) {
	const steps = 30
	args := func(dir string) []string {
		return append(append([]string{}, tinyArgs...), "--batch-tokens", "1024", "--max-steps", fmt.Sprint(steps),
			"--checkpoint-every", "5", "--eval-every", "0", "--run-dir", dir)
	}
	dir := t.TempDir()
	cmd, out := startGorun(t, append([]string{"-np", "2", "--max-restarts", "1", trainBin}, args(dir)...)...)
	waitStep(t, dir, 1, out)
	pid := rankPID(t, dir, 1) // found before step 12, so that the kill follows it at once
	waitStep(t, dir, 12, out)
	syscall.Kill(pid, syscall.SIGKILL)
	if code := exitCode(t, cmd, out); code != 0 {
		t.Fatalf("gorun exit status %d:\n%s", code, out)
	}
	s := out.String()
	for _, want := range []string{
		fmt.Sprintf("gorun: restarting the job (restart 1 of 1, GORUN_RESTART=1) after: rank 1 (host localhost, pid %d) killed by signal 9 (killed)", pid),
		"[0] nmt-train: restart 1 (gorun --max-restarts): resuming from the last checkpoint",
		"[0] nmt-train: done",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	var restart *metrics.Record
	recs, _ := metrics.ReadJSONL(filepath.Join(dir, "metrics.jsonl"))
	for i := range recs {
		if recs[i].Kind == "restart" {
			restart = &recs[i]
		}
	}
	if restart == nil || restart.Step < 10 || restart.Values["steps_lost"] < 1 || !strings.Contains(restart.Text["cause"], "rank 1 ") {
		t.Fatalf("restart record %+v", restart)
	}
	rep, _ := os.ReadFile(filepath.Join(dir, "report.md"))
	if want := fmt.Sprintf("Restart 1 (gorun --max-restarts) after rank 1 (host localhost, pid %d) killed by signal 9 (killed): resumed from step %d", pid, restart.Step); !strings.Contains(string(rep), want) {
		t.Errorf("report.md lacks %q", want)
	}
	checkMetricsSteps(t, dir, steps)

	full := t.TempDir()
	runJob(t, 2, args(full)...)
	follow(t, "restarted, against an uninterrupted run", trainLosses(t, dir), trainLosses(t, full), 1, steps, 1e-6)
}

// rankPID finds the nmt-train process of rank r of the job whose run
// directory is dir (its command line names dir, its environment the rank).
func rankPID(t *testing.T, dir string, r int) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cl, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if !bytes.Contains(cl, []byte(dir)) || !bytes.HasPrefix(cl, []byte(trainBin)) {
			continue
		}
		env, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		for _, kv := range bytes.Split(env, []byte{0}) {
			if string(kv) == fmt.Sprintf("GORUN_RANK=%d", r) {
				return pid
			}
		}
	}
	t.Fatalf("no process of rank %d for %s", r, dir)
	return 0
}

// A rank frozen with SIGSTOP during training: the other ranks end the job
// within a few --timeouts, each naming the frozen rank (not a healthy
// one), in every run.
func TestFrozenRankNamed(t *testing.T) {
	for run := 0; run < 2; run++ {
		dir := t.TempDir()
		args := append(append([]string{}, tinyArgs...), "--batch-tokens", "512", "--max-steps", "100000",
			"--checkpoint-every", "0", "--eval-every", "0", "--timeout", "2s", "--run-dir", dir)
		cmd, out := startGorun(t, append([]string{"-np", "3", "--grace", "1s", trainBin}, args...)...)
		waitStep(t, dir, 3, out)
		frozen := 1 + run // rank 1, then rank 2
		pid := rankPID(t, dir, frozen)
		syscall.Kill(pid, syscall.SIGSTOP)
		if code := exitCode(t, cmd, out); code == 0 {
			t.Fatalf("run %d: the job went on with rank %d frozen:\n%s", run, frozen, out)
		}
		syscall.Kill(pid, syscall.SIGCONT)
		for r := 0; r < 3; r++ {
			if r == frozen {
				continue
			}
			var line string
			for _, l := range strings.Split(out.String(), "\n") {
				if strings.HasPrefix(l, fmt.Sprintf("[%d] nmt-train: rank %d: ", r, r)) {
					line = l
				}
			}
			// "... timed out waiting for rank F" or "... rank F (pid N) is stopped"
			if !strings.HasSuffix(line, fmt.Sprintf("waiting for rank %d", frozen)) && !strings.Contains(line, fmt.Sprintf("rank %d (pid ", frozen)) {
				t.Errorf("run %d: rank %d's error does not name frozen rank %d: %q\n%s", run, r, frozen, line, out)
			}
		}
	}
}
