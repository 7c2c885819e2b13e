package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/testenv"
)

// nmt runs the nmt-train binary with stdin and returns its exit status,
// stdout and stderr.
func nmt(t *testing.T, dir, stdin string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(trainBin, args...)
	cmd.Dir = dir
	cmd.Env = testenv.CleanEnv()
	cmd.Stdin = strings.NewReader(stdin)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, o.String(), e.String()
}

// TestCLIErrors: each mistake gets one line on stderr that says what is
// wrong and where to look, and a non-zero status.
func TestCLIErrors(t *testing.T) {
	dir := t.TempDir()
	notPrepared := filepath.Join(dir, "empty")
	os.Mkdir(notPrepared, 0o755)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"train", "--bogus"}, "nmt-train: flag provided but not defined: -bogus (see nmt-train train --help)\n"},
		{[]string{"translate", "--beam"}, "nmt-train: flag needs an argument: -beam (see nmt-train translate --help)\n"},
		{[]string{"trian"}, "nmt-train: unknown command 'trian' (did you mean train?) (see nmt-train --help)\n"},
		{[]string{"bleu", "-r"}, "nmt-train: flag needs an argument: -r (see nmt-train bleu --help)\n"},
		{[]string{"train", "--data", notPrepared, "--max-steps", "1"}, "nmt-train: --data " + notPrepared + " is not a prepared corpus (no vocab.txt, train.bin, valid.bin): make one with `nmt-train prepare --out " + notPrepared + " ...`\n"},
		{[]string{"translate"}, "nmt-train: translate: no run directory runs/nmt (give the one you trained into with --run-dir)\n"},
		{[]string{"translate", "--run-dir", notPrepared}, "nmt-train: translate: " + notPrepared + " is not a run directory: open " + notPrepared + "/vocab.txt: no such file or directory\n"},
	} {
		code, _, errs := nmt(t, dir, "", c.args...)
		if code == 0 || errs != c.want {
			t.Errorf("%q: status %d, stderr %q, want %q", c.args, code, errs, c.want)
		}
	}
	code, out, _ := nmt(t, dir, "", "train", "--help")
	if code != 0 || !strings.Contains(out, "--data DIR ") || strings.Contains(out, "`") {
		t.Errorf("train --help: the --data line:\n%s", out)
	}
}

// TestBLEUFlagsAfterArguments: sacrebleu's order, the hypothesis file
// before a flag, works as the flag-first order does.
func TestBLEUFlagsAfterArguments(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "ref.txt"), []byte("the cat sat on the mat\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "hyp.txt"), []byte("the cat sat on a mat\n"), 0o644)
	c1, first, e1 := nmt(t, dir, "", "bleu", "--tokenized", "-r", "ref.txt", "hyp.txt")
	c2, after, e2 := nmt(t, dir, "", "bleu", "-r", "ref.txt", "hyp.txt", "--tokenized")
	if c1 != 0 || c2 != 0 || first != after || !strings.Contains(after, "tokenized") {
		t.Fatalf("flags first: %d %q %q; after: %d %q %q", c1, first, e1, c2, after, e2)
	}
}

// TestTranslateEmptyLine: an empty input line gets an empty output line, in
// its place, and the lines around it are translated.
func TestTranslateEmptyLine(t *testing.T) {
	run := t.TempDir()
	args := append(append([]string{}, tinyArgs...), "--batch-tokens", "1024", "--max-steps", "60", "--eval-every", "0", "--run-dir", run)
	if code, out, errs := nmt(t, run, "", args...); code != 0 {
		t.Fatalf("train: %d\n%s%s", code, out, errs)
	}
	s := strings.TrimSpace(syntheticSample(t, run))
	code, out, errs := nmt(t, run, s+"\n\n"+s+"\n", "translate", "--run-dir", run, "--batch", "1")
	lines := strings.Split(out, "\n")
	if code != 0 || len(lines) != 4 || lines[0] == "" || lines[1] != "" || lines[2] != lines[0] || lines[3] != "" {
		t.Fatalf("translate of line, empty line, line: %d %q %q", code, out, errs)
	}
}
