package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// tinyRun is a short run of the tiny preset on the built-in corpus into dir.
func tinyRun(dir string, extra ...string) []string {
	return append([]string{"train", "--preset", "tiny", "--synthetic-lines", "2000", "--max-length", "24", "--batch-tokens", "1024",
		"--warmup-steps", "10", "--eval-sentences", "0", "--eval-every", "0", "--quiet", "--threads", "1", "--run-dir", dir}, extra...)
}

// A learning rate whose first update overflows: the run stops at step 1
// with one line naming it and a smaller learning rate, and writes no
// checkpoint (today ckpt-1 held +Inf, latest named it, and translate and
// --resume refused it).
func TestDivergedRunSavesNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	code, _, stderr := nmt(t, t.TempDir(), "", tinyRun(dir, "--learning-rate", "1e41", "--log-every", "1", "--max-steps", "3", "--checkpoint-every", "1")...)
	want := "nmt-train: step 1: diverged: the update at learning rate 3.953e+38 made the weights non-finite (tensor embedding_and_softmax/weights holds +Inf at index 0); nothing saved (no checkpoint yet); try a smaller --learning-rate or more --warmup-steps\n"
	if code != 1 || !strings.HasSuffix(stderr, want) || strings.Count(stderr, "diverged") != 1 {
		t.Fatalf("status %d, stderr:\n%s\nwant it to end with:\n%s", code, stderr, want)
	}
	if _, err := os.Stat(filepath.Join(dir, "latest")); !os.IsNotExist(err) {
		t.Errorf("latest: %v, want none", err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "*ckpt-*")); len(m) > 0 {
		t.Errorf("written: %v", m)
	}
}

// A loss that grows by orders of magnitude (lr 1000) is warned about once,
// at the log line where it passes the rule, and report.md says so; the
// same run at the lab's learning rate, logging every step through its
// warm-up, gets no warning (today neither had one, and lr 1000 ended with
// "done").
func TestLossGrowthWarned(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	code, stdout, stderr := nmt(t, t.TempDir(), "", tinyRun(dir, "--learning-rate", "1000", "--log-every", "10", "--max-steps", "30", "--checkpoint-every", "0")...)
	if code != 0 {
		t.Fatalf("status %d:\n%s%s", code, stdout, stderr)
	}
	const warn = "nmt-train: warning: step 10: the loss is growing: smoothed raw loss "
	if strings.Count(stdout, "warning:") != 1 || !strings.Contains(stdout, warn) || !strings.Contains(stdout, "the run is diverging (a smaller --learning-rate or more --warmup-steps)") {
		t.Errorf("want one warning %q... in:\n%s", warn, stdout)
	}
	if i, j := strings.Index(stdout, "step 10/30"), strings.Index(stdout, warn); i < 0 || j < i || strings.Contains(stdout[i:j], "step 20/30") {
		t.Errorf("the warning is not at the log line of step 10:\n%s", stdout)
	}
	b, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil || !strings.Contains(string(b), "- **No: the training loss diverged.** At step 10 ") {
		t.Errorf("report.md (%v) lacks the diverged line:\n%s", err, b)
	}
	healthy := filepath.Join(t.TempDir(), "run")
	code, stdout, stderr = nmt(t, t.TempDir(), "", tinyRun(healthy, "--learning-rate", "2", "--log-every", "1", "--max-steps", "30", "--checkpoint-every", "0")...)
	b, _ = os.ReadFile(filepath.Join(healthy, "report.md"))
	if code != 0 || strings.Contains(stdout, "warning") || strings.Contains(string(b), "diverged") {
		t.Errorf("healthy run: status %d, a warning or a diverged line:\n%s%s\n%s", code, stdout, stderr, b)
	}
}

// Numbers that are not finite are refused at the flag, as a mistake in the
// command line (exit 2, one line); a --run-dir that is a file says so.
func TestNonFiniteFlagsAndFileRunDir(t *testing.T) {
	dir := t.TempDir()
	for _, c := range [][]string{{"--learning-rate", "NaN"}, {"--learning-rate", "Inf"}, {"--alpha", "NaN"}, {"--bucket-cap-mb", "+Inf"}} {
		code, stdout, stderr := nmt(t, dir, "", tinyRun(filepath.Join(dir, "flags"), append([]string{"--max-steps", "1"}, c...)...)...)
		shown := strings.Replace(c[1], "Inf", "+Inf", 1)
		shown = strings.Replace(shown, "++", "+", 1)
		want := "nmt-train: " + c[0] + " " + shown + ": must be a finite number"
		if code != 2 || stdout != "" || !strings.HasPrefix(stderr, want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%q: status %d, stdout %q, stderr %q, want status 2 and %q", c, code, stdout, stderr, want)
		}
	}
	file := filepath.Join(dir, "x")
	os.WriteFile(file, []byte("a file\n"), 0o644)
	code, _, stderr := nmt(t, dir, "", tinyRun(file, "--max-steps", "1")...)
	if want := "nmt-train: --run-dir " + file + ": is a file, not a directory\n"; code != 1 || stderr != want {
		t.Errorf("--run-dir a file: status %d, stderr %q, want %q", code, stderr, want)
	}
}

// `nmt-train report` of a run whose metrics.jsonl's last line was cut (a
// killed writer) writes the report, with a note; garbage in the middle is
// refused naming file:line (today the torn line failed the report).
func TestReportTornMetrics(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	if code, stdout, stderr := nmt(t, t.TempDir(), "", tinyRun(dir, "--learning-rate", "2", "--log-every", "1", "--max-steps", "4", "--checkpoint-every", "0")...); code != 0 {
		t.Fatalf("status %d:\n%s%s", code, stdout, stderr)
	}
	path := filepath.Join(dir, "metrics.jsonl")
	whole, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(strings.TrimSuffix(string(whole), "\n"), "\n")
	last := lines[len(lines)-1]
	os.WriteFile(path, []byte(strings.Join(lines[:len(lines)-1], "")+last[:len(last)/2]), 0o644)
	code, stdout, stderr := nmt(t, dir, "", "report", dir)
	b, _ := os.ReadFile(filepath.Join(dir, "report.md"))
	if note := "was cut short (its writer was killed mid-line) and is left out"; code != 0 || !strings.Contains(string(b), note) {
		t.Fatalf("report of a torn metrics.jsonl: status %d\n%s%s\nreport:\n%s", code, stdout, stderr, b)
	}
	os.WriteFile(path, []byte(lines[0]+"not json\n"+strings.Join(lines[1:], "")), 0o644)
	code, _, stderr = nmt(t, dir, "", "report", dir)
	if want := path + ":2: "; code != 1 || !strings.Contains(stderr, want) || strings.Count(stderr, "\n") != 1 {
		t.Fatalf("garbage in the middle: status %d, stderr %q, want one line naming %s", code, stderr, want)
	}
}
