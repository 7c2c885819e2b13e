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

// TestExitStatus: as gorun's, a mistake in the command line (an unknown
// command or flag, a missing or extra argument, a value a flag does not
// take, a --config file's) exits 2 and a failure 1, each with one line on
// stderr and nothing on stdout.
func TestExitStatus(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	notPrepared := filepath.Join(dir, "empty")
	os.Mkdir(notPrepared, 0o755)
	os.WriteFile(filepath.Join(dir, "ref.txt"), []byte("a b c\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "twice.yaml"), []byte("max-steps: 3\nmax_steps: 4\n"), 0o644)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"bogus"}, 2, "nmt-train: unknown command 'bogus' (see nmt-train --help)"},
		{[]string{"--bogus"}, 2, "nmt-train: flag provided but not defined: -bogus (see nmt-train --help)"},
		{[]string{"help", "bogus"}, 2, "nmt-train: No help topic for 'bogus'"},
		{[]string{"train", "--bogus"}, 2, "nmt-train: flag provided but not defined: -bogus (see nmt-train train --help)"},
		{[]string{"train", "--max-steps", "many"}, 2, `nmt-train: invalid value "many" for flag -max-steps`},
		{[]string{"train", "extra"}, 2, `nmt-train: train: unexpected argument "extra"`},
		{[]string{"train", "--max-steps", "0"}, 2, "nmt-train: --max-steps 0: must be positive"},
		{[]string{"train", "--config", "twice.yaml"}, 2, `nmt-train: twice.yaml:2: key "max_steps" is given twice (first at line 1 as "max-steps")`},
		{[]string{"train", "--config", missing + ".yaml"}, 2, "nmt-train: config: open " + missing + ".yaml"},
		{[]string{"prepare", "--bogus"}, 2, "nmt-train: flag provided but not defined: -bogus (see nmt-train prepare --help)"},
		{[]string{"report"}, 2, "nmt-train: report: want one run directory, got 0 arguments (nmt-train report RUN_DIR)"},
		{[]string{"report", "a", "b"}, 2, "nmt-train: report: want one run directory, got 2 arguments"},
		{[]string{"bleu"}, 2, "nmt-train: bleu: no reference: give one with -r REF.txt (see nmt-train bleu --help)"},
		{[]string{"bleu", "-r", "ref.txt", "a", "b"}, 2, "nmt-train: bleu: want at most one hypothesis file (or stdin), got 2 arguments"},
		{[]string{"bleu", "-r", "ref.txt", "--json", "-b"}, 2, "nmt-train: bleu: --json and --score-only: give one of them"},
		{[]string{"translate", "in.txt"}, 2, `nmt-train: translate: unexpected argument "in.txt" (it reads the sentences from stdin`},
		{[]string{"translate", "--beam", "0"}, 2, "nmt-train: translate: --beam 0: want at least 1 (1: greedy)"},
		{[]string{"translate", "--batch", "-1"}, 2, "nmt-train: translate: --batch -1: want at least 1 sentence"},
		{[]string{"translate", "--input", "bytes"}, 2, `nmt-train: translate: --input "bytes": want auto, text, pieces or words`},
		{[]string{"translate", "--device", "tpu"}, 2, `nmt-train: translate: unknown --device "tpu" (want auto, cpu or cuda)`},
		// failures: what the command line names is missing or no good
		{[]string{"report", missing}, 1, "nmt-train: " + missing + " is not a run directory"},
		{[]string{"translate", "--run-dir", missing, "--device", "cpu"}, 1, "nmt-train: translate: no run directory " + missing},
		{[]string{"bleu", "-r", missing, "ref.txt"}, 1, "nmt-train: bleu: open " + missing},
		{[]string{"train", "--data", notPrepared, "--max-steps", "1"}, 1, "nmt-train: --data " + notPrepared + " is not a prepared corpus"},
	} {
		code, out, errs := nmt(t, dir, "", c.args...)
		if code != c.code || !strings.HasPrefix(errs, c.want) || strings.Count(errs, "\n") != 1 || out != "" {
			t.Errorf("%q: status %d, stdout %q, stderr %q; want status %d and one line starting %q", c.args, code, out, errs, c.code, c.want)
		}
	}
}

// TestPresetError: an unknown --preset names the flag and the presets, in
// train and in plan, and the help lists the same.
func TestPresetError(t *testing.T) {
	dir := t.TempDir()
	want := `unknown preset "huge": --preset takes tiny, small, base or big` + "\n"
	code, _, errs := nmt(t, dir, "", "train", "--preset", "huge", "--synthetic-lines", "100", "--max-steps", "1", "--run-dir", filepath.Join(dir, "run"))
	if code == 0 || errs != "nmt-train: "+want {
		t.Errorf("train --preset huge: status %d, stderr %q, want %q", code, errs, "nmt-train: "+want)
	}
	if code, _, errs = nmt(t, dir, "", "plan", "--preset", "huge", "--compute-s", "1"); code != 2 || errs != "nmt-train: plan: "+want {
		t.Errorf("plan --preset huge: status %d, stderr %q", code, errs)
	}
	for _, cmd := range []string{"train", "plan"} {
		if _, out, _ := nmt(t, dir, "", cmd, "--help"); !strings.Contains(out, "model size: tiny | small | base | big") {
			t.Errorf("%s --help: no preset list:\n%s", cmd, out)
		}
	}
}

// TestHelpSaysWhatItDoes: the help of translate, bleu and plan says what
// the commands do where it once did not.
func TestHelpSaysWhatItDoes(t *testing.T) {
	dir := t.TempDir()
	for cmd, wants := range map[string][]string{
		"translate": {"translate [command options] < SOURCE.txt > TRANSLATION.txt", "detokenized unless --pieces", "auto (text when the run has bpe.codes; else pieces"},
		"bleu":      {"reference FILE, one segment per line (required;"},
		"plan":      {"1GB/s = 8 Gbit/s, 125MB/s = 1 Gbit/s", "with --compute-s as many as the ranks' threads", "with --from-run: the run's unless given"},
	} {
		code, out, errs := nmt(t, dir, "", cmd, "--help")
		for _, w := range wants {
			if code != 0 || !strings.Contains(out, w) {
				t.Errorf("%s --help: status %d, stderr %q, lacks %q:\n%s", cmd, code, errs, w, out)
			}
		}
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
