package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/gorun/gorun/internal/testenv"
	"github.com/gorun/gorun/metrics"
)

// The prepared corpus (--data DIR) changes under a running job of two
// ranks (gorun -np 2): every rank reads train.bin through its mapping.

// changedCorpusJob prepares a corpus, starts a job on it and waits for
// its third step; it returns the corpus directory, the run directory and
// the running gorun.
func changedCorpusJob(t *testing.T) (string, string, *exec.Cmd, *testenv.Buffer) {
	t.Helper()
	dir := t.TempDir()
	corpus, run := filepath.Join(dir, "corpus"), filepath.Join(dir, "run")
	if out, err := exec.Command(trainBin, "prepare", "--synthetic", "--synthetic-lines", "20000", "--out", corpus).CombinedOutput(); err != nil {
		t.Fatalf("prepare: %v\n%s", err, out)
	}
	cmd, out := startGorun(t, "-np", "2", "--grace", "20s", trainBin, "train", "--preset", "tiny", "--data", corpus, "--max-length", "24",
		"--batch-tokens", "512", "--learning-rate", "1", "--warmup-steps", "10", "--log-every", "1", "--eval-sentences", "0", "--eval-every", "0",
		"--checkpoint-every", "0", "--quiet", "--threads", "1", "--max-steps", "1000000", "--run-dir", run)
	waitStep(t, run, 3, out)
	return corpus, run, cmd, out
}

// Truncated in place, or its offsets written over in place: the job ends
// (non-zero) with, from each rank, one line and no goroutine trace, and
// the ranks that read the file first name it and say what changed.
func TestCorpusChangedUnderJob(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(t *testing.T, path string)
		says   string
	}{
		{"truncated", func(t *testing.T, path string) {
			if err := os.Truncate(path, 4096); err != nil {
				t.Fatal(err)
			}
		}, `\(size \d+ → 4096 bytes: truncated, or written over in place, which nmt-train prepare never does`},
		{"offsets-overwritten", func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			b := make([]byte, 16*20000)
			for i := range b {
				b[i] = 0xff
			}
			if _, err := f.WriteAt(b, 128); err != nil {
				t.Fatal(err)
			}
		}, `\((written over in place at [0-9: -]+, same size|the offsets of line \d+ point outside it)`},
	} {
		t.Run(c.name, func(t *testing.T) {
			corpus, _, cmd, out := changedCorpusJob(t)
			path := filepath.Join(corpus, "train.bin")
			c.change(t, path)
			if code := exitCode(t, cmd, out); code == 0 {
				t.Fatalf("the job went on after %s changed:\n%s", path, out)
			}
			s := out.String()
			for _, bad := range []string{"goroutine ", "SIGBUS", "panic", "fatal error", "unexpected fault"} {
				if strings.Contains(s, bad) {
					t.Fatalf("output has %q:\n%s", bad, tail(s))
				}
			}
			line := regexp.MustCompile(`^\[(\d)\] nmt-train: rank (\d): step \d+: data: ` + regexp.QuoteMeta(path) +
				` changed under the running job ` + c.says + `[^)]*\): stop, and start again once it is whole \(a run resumes from its last checkpoint\)$`)
			named := 0
			for r := 0; r < 2; r++ {
				var errs []string
				for _, l := range strings.Split(s, "\n") {
					if strings.HasPrefix(l, fmt.Sprintf("[%d] nmt-train: rank %d: ", r, r)) {
						errs = append(errs, l)
					}
				}
				if len(errs) > 1 {
					t.Errorf("rank %d printed %d error lines, want one:\n%s", r, len(errs), strings.Join(errs, "\n"))
				}
				if len(errs) == 1 && line.MatchString(errs[0]) {
					named++
				}
			}
			if named == 0 {
				t.Fatalf("no rank named %s and what changed:\n%s", path, tail(s))
			}
		})
	}
}

// A second `nmt-train prepare` into the directory of a running job
// replaces its files by rename: the job goes on with the files it opened
// (their mappings stay valid), steps past the prepare, and stops cleanly
// when asked.
func TestCorpusPreparedAgainUnderJob(t *testing.T) {
	corpus, run, cmd, out := changedCorpusJob(t)
	path := filepath.Join(corpus, "train.bin")
	before, _ := os.Stat(path)
	if o, err := exec.Command(trainBin, "prepare", "--synthetic", "--synthetic-lines", "5000", "--out", corpus).CombinedOutput(); err != nil {
		t.Fatalf("second prepare: %v\n%s", err, o)
	}
	after, _ := os.Stat(path)
	if os.SameFile(before, after) || before.Size() == after.Size() {
		t.Fatalf("the second prepare did not replace %s", path)
	}
	recs, err := metrics.ReadJSONL(filepath.Join(run, "metrics.jsonl"))
	if err != nil || len(recs) == 0 {
		t.Fatalf("metrics: %v", err)
	}
	waitStep(t, run, recs[len(recs)-1].Step+50, out)
	cmd.Process.Signal(syscall.SIGTERM)
	if code := exitCode(t, cmd, out); code != 128+int(syscall.SIGTERM) {
		t.Fatalf("gorun exit status %d, want %d (stopped by SIGTERM):\n%s", code, 128+int(syscall.SIGTERM), tail(out.String()))
	}
	s := out.String()
	for _, bad := range []string{"changed under", "goroutine ", "SIGBUS", "panic"} {
		if strings.Contains(s, bad) {
			t.Fatalf("output has %q:\n%s", bad, tail(s))
		}
	}
	if !strings.Contains(s, "[0] nmt-train: stopped by terminated after step ") {
		t.Fatalf("no clean stop:\n%s", tail(s))
	}
}
