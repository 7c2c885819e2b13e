package main

// Issue 40, item 6: translate had no cap on an input line's length (a
// 100 KB line asked for one 9.5 GB block); run.py's --mode=infer neither.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorun/gorun/data"
	"github.com/gorun/gorun/internal/testenv"
)

// A line longer than --max-length tokens (256 by default, the EOS
// counted) is not translated: one line on stderr names it (stdin:LINE), its
// output line is empty, and the lines around it are translated, each in
// its place; so is a line of over 1 MiB (which used to stop translate with
// "token too long"). run.py's --mode=infer caps its input file's lines the
// same way (at the config's max_length), saying so once for a 2-rank job.
func TestTranslateMaxLength(t *testing.T) {
	run := t.TempDir()
	args := append(append([]string{}, tinyArgs...), "--batch-tokens", "1024", "--max-steps", "60", "--eval-every", "0", "--run-dir", run)
	if code, out, errs := nmt(t, run, "", args...); code != 0 {
		t.Fatalf("train: %d\n%s%s", code, out, errs)
	}
	s := strings.TrimSpace(syntheticSample(t, run))
	words := strings.Fields(s)
	var long []string
	for len(long) < 300 {
		long = append(long, words...)
	}
	long = long[:300] // 301 tokens with the EOS
	huge := strings.Repeat("word ", 220000)

	t.Run("translate", func(t *testing.T) {
		in := strings.Join([]string{s, strings.Join(long, " "), "", s, huge, s}, "\n") + "\n"
		code, out, errs := nmt(t, run, in, "translate", "--run-dir", run, "--batch", "2")
		lines := strings.Split(out, "\n")
		if code != 0 || len(lines) != 7 || lines[0] == "" || lines[1] != "" || lines[2] != "" || lines[3] != lines[0] || lines[4] != "" || lines[5] != lines[0] || lines[6] != "" {
			t.Errorf("translate of line, 300 words, empty line, line, 1.1 MB, line: status %d\n%.400q\nstderr %.400q", code, out, errs)
		}
		want := "nmt-train: translate: stdin:2: 301 tokens with EOS, more than --max-length 256: not translated, its output line left empty\n" +
			fmt.Sprintf("nmt-train: translate: stdin:5: a line of %d bytes (more than 1048576): not translated, its output line left empty\n", len(huge))
		if errs != want {
			t.Errorf("stderr:\n%s\nwant:\n%s", errs, want)
		}
		// the cap is a flag: 0 lifts it, and a lower one refuses the sample
		code, out, errs = nmt(t, run, s+"\n", "translate", "--run-dir", run, "--max-length", "3")
		if code != 0 || out != "\n" || !strings.HasPrefix(errs, "nmt-train: translate: stdin:1: ") || !strings.Contains(errs, "more than --max-length 3") {
			t.Errorf("--max-length 3: status %d, %q, stderr %q", code, out, errs)
		}
		code, _, errs = nmt(t, run, "", "translate", "--run-dir", run, "--max-length", "1")
		if want := "nmt-train: translate: --max-length 1: want 0 (no limit) or at least 2 (a token and the EOS)\n"; code != 2 || errs != want {
			t.Errorf("--max-length 1: status %d, stderr %q, want 2 and %q", code, errs, want)
		}
	})

	t.Run("infer", func(t *testing.T) {
		root := testenv.LabFiles(t, "", 20)
		pieces := func(ws []string) string { return strings.Join(data.WordPieces(strings.Join(ws, " ")), " ") }
		src := root + "wmt14-en-de.src.BPE_common.32K.tok"
		if err := os.WriteFile(src, []byte(pieces(words)+"\n"+pieces(long)+"\n"+pieces(words)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg := testenv.LabConfig(t, "../..", root, [2]string{`"logdir": "runs/lab-base",`, `"logdir": "` + run + `",`})
		work := t.TempDir()
		outFile := filepath.Join(work, "infer.out")
		out, code := labRun(t, work, t.TempDir(), "--config_file="+cfg, "--mode=infer", "--infer_output_file="+outFile)
		b, err := os.ReadFile(outFile)
		lines := strings.Split(string(b), "\n")
		if code != 0 || err != nil || len(lines) != 4 || lines[0] == "" || lines[1] != "" || lines[2] != lines[0] || lines[3] != "" {
			t.Errorf("infer of line, 300 words, line: status %d, %v, %q:\n%s", code, err, b, out)
		}
		want := "nmt-train: " + src + ":2: 301 tokens with EOS, more than max_length 256: not translated, its output line left empty"
		if n := strings.Count(out, want); n != 1 {
			t.Errorf("the output says %d times %q:\n%s", n, want, out)
		}
	})
}
