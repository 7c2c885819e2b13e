package main

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/testenv"
)

// startRank starts one ring process with a foreign launcher's environment;
// wait returns its output and exit error.
func startRank(t *testing.T, env ...string) (wait func() (string, error)) {
	t.Helper()
	cmd := exec.Command(ringBin, "-timeout", "20s")
	cmd.Env = append(testenv.CleanEnv(), env...)
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	return func() (string, error) { err := cmd.Wait(); return b.String(), err }
}

// Two torchrun-style jobs on one MASTER_PORT, with no GORUN_SECRET: rank 0
// of job A serves the rendezvous, and rank 1 of job B finds it there.
// Without a job id from the launcher the two would derive one secret and B's
// rank would join A: every rank refuses to start instead. With their run
// ids (TORCHELASTIC_RUN_ID) B's rank is refused by A's rendezvous, and A
// forms with its own rank 1.
func TestJobsOnOnePortStayApart(t *testing.T) {
	port := testenv.FreeUDPPort(t)
	torch := func(rank string, more ...string) []string {
		return append([]string{"RANK=" + rank, "WORLD_SIZE=2", "LOCAL_RANK=" + rank, "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port}, more...)
	}

	t.Run("no job id", func(t *testing.T) {
		// (an empty TORCHELASTIC_RUN_ID: none, even if this test runs under torchrun)
		a0, b1 := startRank(t, torch("0", "TORCHELASTIC_RUN_ID=")...), startRank(t, torch("1", "TORCHELASTIC_RUN_ID=")...)
		for name, wait := range map[string]func() (string, error){"job A's rank 0": a0, "job B's rank 1": b1} {
			out, err := wait()
			if err == nil || strings.Contains(out, "went 3 times around") {
				t.Errorf("%s ran in a job of two jobs' ranks:\n%s", name, out)
			}
			if !strings.Contains(out, "ring: started by torchrun without a job id (TORCHELASTIC_RUN_ID) or GORUN_SECRET: two jobs on MASTER_PORT "+port+" could join each other") {
				t.Errorf("%s: %v\n%s", name, err, out)
			}
		}
	})

	t.Run("run ids", func(t *testing.T) {
		a0 := startRank(t, torch("0", "TORCHELASTIC_RUN_ID=job-a")...)
		out, err := startRank(t, torch("1", "TORCHELASTIC_RUN_ID=job-b")...)()
		if err == nil || !strings.Contains(out, "authentication failed") || strings.Contains(out, "went 3 times around") {
			t.Fatalf("job B's rank 1 at job A's rendezvous: %v\n%s", err, out)
		}
		out1, err1 := startRank(t, torch("1", "TORCHELASTIC_RUN_ID=job-a")...)()
		out0, err0 := a0()
		if err0 != nil || err1 != nil || !strings.Contains(out0, "went 3 times around 2 ranks") {
			t.Fatalf("job A: rank 0: %v\n%s\nrank 1: %v\n%s", err0, out0, err1, out1)
		}
	})
}
