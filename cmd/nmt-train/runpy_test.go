package main

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/testenv"
)

// labRun runs `gorun -np 2 nmt-train ARGS` in dir, as the lab starts
// run.py, with the corpus cache in cache; it returns the output and the
// exit status.
func labRun(t *testing.T, dir, cache string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(gorunBin, append([]string{"-np", "2", "-x", "LD_LIBRARY_PATH", trainBin}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(testenv.CleanEnv(), "GORUN_DATA_CACHE="+cache)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

// The lab's way end to end on one host: run.py's flags and an OpenSeq2Seq
// config naming the lab's files train with evaluation into the config's
// logdir (relative to where the job starts), preparing the files into a
// cache once; --mode=eval evaluates the latest checkpoint, --mode=infer
// writes one translation per input line; a second train_eval is refused
// without --continue_learning and continues with it.
func TestLabConfigModes(t *testing.T) {
	root := testenv.LabFiles(t, "", 1500)
	cfg := testenv.LabConfig(t, "../..", root)
	work, cache := t.TempDir(), t.TempDir()
	out, code := labRun(t, work, cache, "--config_file="+cfg, "--use_horovod=True", "--mode=train_eval", "--quiet")
	if code != 0 {
		t.Fatalf("train_eval: exit status %d:\n%s", code, out)
	}
	logdir := filepath.Join(work, "runs/lab-base")
	// rank 0 prepared the files, or rank 1 did while rank 0 waited
	if !regexp.MustCompile(`data: (prepared .* into|using) ` + regexp.QuoteMeta(cache) + "/").MatchString(out) {
		t.Errorf("train_eval's output names no corpus cache in %s:\n%s", cache, out)
	}
	for _, want := range []string{"step 40/40", "eval at step 20 |", "eval at step 40 |", "checkpoint " + filepath.Join("runs/lab-base", "ckpt-30")} {
		if !strings.Contains(out, want) {
			t.Errorf("train_eval's output lacks %q:\n%s", want, out)
		}
	}
	for _, f := range []string{"latest", "ckpt-30", "ckpt-40", "metrics.jsonl", "report.md", "run.json", "vocab.txt"} {
		if _, err := os.Stat(filepath.Join(logdir, f)); err != nil {
			t.Errorf("the config's logdir lacks %s: %v", f, err)
		}
	}
	if _, err := os.Stat(filepath.Join(logdir, "ckpt-20")); err == nil {
		t.Errorf("a checkpoint at step 20: save_checkpoint_steps is 30")
	}
	// run.json: the config's model and batch, not a preset's
	var ri struct {
		DModel int `json:"d_model"`
	}
	if b, err := os.ReadFile(filepath.Join(logdir, "run.json")); err != nil || json.Unmarshal(b, &ri) != nil || ri.DModel != 64 {
		t.Errorf("run.json: d_model %d (%v), want the config's 64", ri.DModel, err)
	}

	out, code = labRun(t, work, cache, "--config_file="+cfg, "--mode=eval")
	if code != 0 || !strings.Contains(out, "eval at step 40 |") || !strings.Contains(out, "using the prepared") {
		t.Errorf("eval: exit status %d, want 0, the eval of step 40 and the cache reused:\n%s", code, out)
	}

	inferOut := filepath.Join(work, "wmt14.out.tok")
	out, code = labRun(t, work, cache, "--config_file="+cfg, "--mode=infer", "--infer_output_file="+inferOut)
	if code != 0 {
		t.Fatalf("infer: exit status %d:\n%s", code, out)
	}
	f, err := os.Open(inferOut)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, words := 0, 0
	for sc := bufio.NewScanner(f); sc.Scan(); n++ {
		words += len(strings.Fields(sc.Text()))
	}
	if n != 25 || words == 0 {
		t.Errorf("infer wrote %d lines (%d pieces), want one for each of the 25 input lines", n, words)
	}

	out, code = labRun(t, work, cache, "--config_file="+cfg, "--mode=train_eval")
	if code == 0 || !strings.Contains(out, "already holds a run") {
		t.Errorf("a second train_eval without --continue_learning: exit status %d, want a refusal:\n%s", code, out)
	}
	out, code = labRun(t, work, cache, "--config_file="+cfg, "--mode=train", "--continue_learning", "--max_steps=50")
	if code != 0 || !strings.Contains(out, "resumed from step 40") || !strings.Contains(out, "step 50/50") || strings.Contains(out, "eval at step") {
		t.Errorf("--mode=train --continue_learning --max_steps=50: exit status %d, want a resume to step 50 without evaluation:\n%s", code, out)
	}
}

// What the lab's way refuses, each in one line naming the file (and the
// line) and with a non-zero status, before anything is written: a key the
// config may not have, a data file that is not there, --mode=infer
// without an output file, an unknown mode.
func TestLabConfigRefusals(t *testing.T) {
	root := testenv.LabFiles(t, "", 200)
	work, cache := t.TempDir(), t.TempDir()
	for _, c := range []struct {
		name  string
		edit  [2]string
		args  []string
		want  string
		usage bool
	}{
		{"unknown key", [2]string{`"max_steps": 40,`, `"max_steps": 40, "max_grad_nrom": 1.0,`}, []string{"--mode=train"}, `:33: unknown key "max_grad_nrom"`, true},
		{"missing file", [2]string{`"train.clean.de.shuffled.BPE_common.32K.tok"`, `"train.clean.de.missing.tok"`}, []string{"--mode=train"}, "train.clean.de.missing.tok", false},
		{"infer before training", [2]string{}, []string{"--mode=infer"}, "runs/lab-base holds no trained model", false},
		{"unknown mode", [2]string{}, []string{"--mode=trian"}, "--mode", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var cfg string
			if c.edit[0] != "" {
				cfg = testenv.LabConfig(t, "../..", root, c.edit)
			} else {
				cfg = testenv.LabConfig(t, "../..", root)
			}
			out, code := labRun(t, work, cache, append([]string{"--config_file=" + cfg}, c.args...)...)
			if code == 0 || !strings.Contains(out, c.want) {
				t.Errorf("exit status %d, want non-zero and %q:\n%s", code, c.want, out)
			}
			if c.usage && code != 2 {
				t.Errorf("exit status %d, want 2 (a mistake in the command line or the config)", code)
			}
			if _, err := os.Stat(filepath.Join(work, "runs")); err == nil {
				t.Errorf("a refused start left %s", filepath.Join(work, "runs"))
			}
		})
	}
}
