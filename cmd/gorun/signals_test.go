package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestBrokenPipe: `gorun ... | head -n 1`, with a real head. When head
// has exited, gorun's next write to stdout fails (EPIPE): gorun does not
// die of SIGPIPE (which left the ranks to die without a word), it says so
// in one line on stderr, stops the job as for SIGTERM (each rank gets
// SIGTERM and may end cleanly: nmt-train writes its stop checkpoint,
// cmd/nmt-train's TestStopOnBrokenPipe) and exits 141, 128+SIGPIPE, as a
// pipeline's writer does. Nothing of the job is left.
func TestBrokenPipe(t *testing.T) {
	head, err := exec.LookPath("head")
	if err != nil {
		t.Skip("no head here")
	}
	dir := t.TempDir()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	g := exec.Command(gorunBin, "-np", "2", "--grace", "20s", "/bin/sh", "-c",
		`echo $$ > `+dir+`/pid.$GORUN_RANK; trap 'echo "rank $GORUN_RANK got TERM" >&2; exit 0' TERM
		while :; do echo "line from $GORUN_RANK"; sleep 0.05; done`)
	g.Env = testEnv()
	var e bytes.Buffer
	g.Stdout, g.Stderr = w, &e
	h := exec.Command(head, "-n", "1")
	var ho bytes.Buffer
	h.Stdin, h.Stdout = r, &ho
	if err := g.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Process.Kill() })
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	w.Close()
	if err := h.Wait(); err != nil {
		t.Fatalf("head: %v", err)
	}
	done := make(chan struct{})
	go func() { g.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second): // a hang guard, not a timing assertion
		t.Fatalf("gorun still runs after its stdout's reader exited; stderr:\n%s", e.String())
	}
	code := g.ProcessState.ExitCode()
	if !regexp.MustCompile(`^\[[01]\] line from [01]\n$`).MatchString(ho.String()) {
		t.Errorf("head printed %q", ho.String())
	}
	want := "gorun: stdout: broken pipe (its reader exited): stopping the job as for SIGTERM\n"
	stderr := e.String()
	if code != 141 || strings.Count(stderr, "gorun: ") != 1 || !strings.Contains(stderr, want) ||
		!strings.Contains(stderr, "[0] rank 0 got TERM\n") || !strings.Contains(stderr, "[1] rank 1 got TERM\n") {
		t.Fatalf("status %d (want 141); stderr (want gorun's one line %q and each rank's TERM):\n%s", code, want, stderr)
	}
	var pids []int
	for rk := 0; rk < 2; rk++ {
		b, err := os.ReadFile(filepath.Join(dir, "pid."+strconv.Itoa(rk)))
		if err != nil {
			t.Fatal(err)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		pids = append(pids, pid)
	}
	checkGone(t, pids)
}
