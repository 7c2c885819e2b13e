package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/internal/testenv"
)

// The ways a job is told to stop besides SIGTERM to gorun alone
// (TestStopOnSIGTERM): SIGTERM to every process of the job at once (Slurm
// at its time limit, scancel, systemd, Kubernetes), SIGHUP (a closed
// terminal), and gorun's stdout closed by its reader (`gorun ... | head`,
// an ssh session that drops). Each must end with rank 0's stop checkpoint
// and its line, never a rank killed or exiting at once.

// stopArgs is a 2-rank training job that runs until stopped.
func stopArgs(dir string) []string {
	return append([]string{"-np", "2", "--grace", "60s", trainBin}, append(append([]string{}, tinyArgs...),
		"--batch-tokens", "1024", "--max-steps", "100000", "--checkpoint-every", "1000", "--eval-every", "0", "--run-dir", dir)...)
}

// checkStopCheckpoint checks that the job in dir stopped after step 5 or
// later with rank 0's checkpoint and its line, stopped by sig, and that no
// rank exited at once or was killed.
func checkStopCheckpoint(t *testing.T, dir, sig, out string) {
	t.Helper()
	ck, err := checkpoint.Latest(dir)
	if err != nil {
		t.Fatalf("no stop checkpoint: %v\n%s", err, out)
	}
	st, err := checkpoint.ReadState(ck)
	if err != nil {
		t.Fatal(err)
	}
	line := fmt.Sprintf("[0] nmt-train: stopped by %s after step %d; checkpoint %s written: continue with --resume", sig, st.Step, ck)
	if st.Step < 5 || !strings.Contains(out, line) {
		t.Fatalf("checkpoint of step %d; output lacks %q:\n%s", st.Step, line, out)
	}
	for _, bad := range []string{"again: exiting now", "SIGKILL", "panic", "goroutine "} {
		if strings.Contains(out, bad) {
			t.Fatalf("output has %q:\n%s", bad, out)
		}
	}
}

// jobProcesses is pid and every process descended from it, as a cgroup
// holds them: gorun, its ranks, the reaper.
func jobProcesses(t *testing.T, pid int) []int {
	t.Helper()
	children := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 1 {
			pp, _ := strconv.Atoi(f[1])
			children[pp] = append(children[pp], p)
		}
	}
	all := []int{pid}
	for i := 0; i < len(all); i++ {
		all = append(all, children[all[i]]...)
	}
	return all
}

// SIGTERM to every process of the job at once: each rank gets it directly
// and again from gorun, which must count as one stop request, not as the
// second signal that exits at once. Both orders: gorun first (its
// forwarded signal may reach a rank before the direct one), then the ranks
// first.
func TestStopOnSIGTERMToEveryProcess(t *testing.T) {
	for _, gorunFirst := range []bool{true, false} {
		dir := t.TempDir()
		cmd, out := startGorun(t, stopArgs(dir)...)
		waitStep(t, dir, 5, out)
		pids := jobProcesses(t, cmd.Process.Pid)
		if len(pids) < 4 { // gorun, 2 ranks, the reaper
			t.Fatalf("found only %v in the job", pids)
		}
		if !gorunFirst {
			pids = append(pids[1:], pids[0])
		}
		for _, p := range pids {
			syscall.Kill(p, syscall.SIGTERM)
		}
		if code := exitCode(t, cmd, out); code != 128+int(syscall.SIGTERM) {
			t.Fatalf("gorun first %v: exit status %d, want 143:\n%s", gorunFirst, code, out)
		}
		checkStopCheckpoint(t, dir, "terminated", out.String())
	}
}

// SIGHUP to gorun (its terminal closed; not under nohup, where it stays
// ignored: TestNohup) stops the job as SIGTERM does: a checkpoint, the
// line, gorun's own line about it, and 128+1.
func TestStopOnSIGHUP(t *testing.T) {
	dir := t.TempDir()
	cmd, out := startGorun(t, stopArgs(dir)...)
	waitStep(t, dir, 5, out)
	cmd.Process.Signal(syscall.SIGHUP)
	if code := exitCode(t, cmd, out); code != 128+int(syscall.SIGHUP) {
		t.Fatalf("exit status %d, want 129:\n%s", code, out)
	}
	checkStopCheckpoint(t, dir, "hangup", out.String())
	if !strings.Contains(out.String(), "gorun: hangup: stopping the job") {
		t.Fatalf("gorun says nothing of the hangup:\n%s", out)
	}
}

// gorun's stdout is a pipe whose reader exits (`gorun ... | head`): gorun
// says so in one line on stderr and stops the job as on SIGTERM, so rank
// 0 writes its checkpoint; gorun exits 128+SIGPIPE, as a pipeline's
// writer does.
func TestStopOnBrokenPipe(t *testing.T) {
	dir := t.TempDir()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(gorunBin, stopArgs(dir)...)
	cmd.Env = testenv.CleanEnv()
	var errs testenv.Buffer
	cmd.Stdout, cmd.Stderr = w, &errs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	w.Close()
	// The reader: it reads up to the log line of step 5 and exits.
	var seen bytes.Buffer
	br := bufio.NewReader(r)
	for {
		l, err := br.ReadString('\n')
		seen.WriteString(l)
		if strings.HasPrefix(l, "[0] step 5/") {
			break
		}
		if err == io.EOF {
			t.Fatalf("gorun's stdout ended before step 5:\n%s%s", seen.String(), errs.String())
		}
	}
	r.Close()
	if code := exitCode(t, cmd, &errs); code != 128+int(syscall.SIGPIPE) {
		t.Fatalf("exit status %d, want 141 (128+SIGPIPE):\n%s", code, errs.String())
	}
	checkStopCheckpoint(t, dir, "terminated", errs.String())
	if want := "gorun: stdout: broken pipe (its reader exited): stopping the job as for SIGTERM\n"; strings.Count(errs.String(), "gorun: ") != 1 || !strings.Contains(errs.String(), want) {
		t.Fatalf("stderr should have gorun's one line %q:\n%s", want, errs.String())
	}
}
