package main

// Issue 40, item 5, at the command line: prepare stops on the first
// SIGTERM or SIGINT, and refuses a word too long to be text.

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/data"
	"github.com/gorun/gorun/internal/testenv"
)

// rawPairs writes n synthetic sentence pairs as raw text to dir/NAME.{src,tgt}.
func rawPairs(t *testing.T, dir, name string, n int) (string, string) {
	t.Helper()
	s, g := data.Synthetic(data.SyntheticTrainSeed, n)
	return writeFile(t, dir, name+".src", strings.Join(s, "\n")+"\n"), writeFile(t, dir, name+".tgt", strings.Join(g, "\n")+"\n")
}

// dirFiles is the name and content of every entry of dir.
func dirFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		m[e.Name()] = string(b)
	}
	return m
}

// The first SIGTERM or SIGINT stops a prepare that is under way (it used
// to run on to the end, or for ever on a long word): one line saying
// "interrupted" on stderr, a non-zero status, and --out as an earlier
// prepare left it (its files byte for byte, no staging directory). The
// signal is sent once the staging directory exists, on 300,000 pairs
// that take seconds to prepare.
func TestPrepareStopsOnFirstSignal(t *testing.T) {
	dir := t.TempDir()
	ss, sg := rawPairs(t, dir, "small", 300)
	bs, bg := rawPairs(t, dir, "big", 300000)
	for _, c := range []struct {
		name string
		sig  syscall.Signal
	}{{"SIGTERM", syscall.SIGTERM}, {"SIGINT", syscall.SIGINT}} {
		sig := c.sig
		t.Run(c.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "corpus")
			if o, err := runCmd(t, "", "prepare", "--src", ss, "--tgt", sg, "--bpe-merges", "50", "--valid-lines", "10", "--out", out); err != nil {
				t.Fatalf("%v\n%s", err, o)
			}
			before := dirFiles(t, out)
			cmd := exec.Command(trainBin, "prepare", "--src", bs, "--tgt", bg, "--bpe-merges", "2000", "--out", out)
			cmd.Env = testenv.CleanEnv()
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			for {
				if m, _ := filepath.Glob(filepath.Join(out, ".prepare.tmp*")); len(m) > 0 {
					break
				}
				select {
				case err := <-exited:
					t.Fatalf("prepare of 300,000 pairs ended (%v) before its staging directory was seen:\n%s%s", err, stdout.String(), stderr.String())
				case <-time.After(time.Millisecond):
				}
			}
			cmd.Process.Signal(sig)
			var err error
			select {
			case err = <-exited:
			case <-time.After(3 * time.Minute):
				cmd.Process.Kill()
				<-exited
				t.Fatalf("prepare still running 3 minutes after one %s", c.name)
			}
			want := "nmt-train: prepare: interrupted: nothing written to " + out + "\n"
			if err == nil || stderr.String() != want || stdout.Len() != 0 {
				t.Errorf("after one %s: %v\nstdout %q\nstderr %q\nwant stderr %q and no report", c.name, err, stdout.String(), stderr.String(), want)
			}
			after := dirFiles(t, out)
			if len(after) != len(before) {
				t.Errorf("%s holds %d entries after the interrupted prepare, %d before", out, len(after), len(before))
			}
			for name, b := range before {
				if after[name] != b {
					t.Errorf("%s changed by the interrupted prepare", name)
				}
			}
		})
	}
}

// --max-word-bytes: the default (4192) refuses a word of 5,000 bytes
// naming file:line, 0 lifts the limit, a negative value is refused, and
// so is the flag with --synthetic. (data's TestPrepareLongWordRefused
// refuses a 1 MB word.)
func TestPrepareMaxWordBytesFlag(t *testing.T) {
	dir := t.TempDir()
	src := writeFile(t, dir, "src", "a house\nthe garden is big\nrooms\n")
	tgt := writeFile(t, dir, "tgt", "ein Haus\nder Garten ist "+strings.Repeat("gross", 1000)+"\nZimmer\n")
	out := filepath.Join(dir, "out")
	_, err := runCmd(t, "", "prepare", "--src", src, "--tgt", tgt, "--bpe-merges", "10", "--valid-lines", "1", "--out", out)
	if want := tgt + ":2: a word of 5000 bytes without white space at byte 16 (\"grossgrossgrossgross\"...) is longer than --max-word-bytes 4192: not text? remove or split the line, or raise --max-word-bytes"; err == nil || err.Error() != want {
		t.Errorf("a word of 5,000 bytes: %v\nwant %s", err, want)
	}
	if o, err := runCmd(t, "", "prepare", "--src", src, "--tgt", tgt, "--bpe-merges", "10", "--valid-lines", "1", "--max-word-bytes", "0", "--out", out); err != nil {
		t.Errorf("--max-word-bytes 0 and a word of 5,000 bytes: %v\n%s", err, o)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--src", src, "--tgt", tgt, "--bpe-merges", "10", "--max-word-bytes", "-1"}, "prepare: --max-word-bytes -1: want at least 1 (0: no limit)"},
		{[]string{"--synthetic", "--max-word-bytes", "100"}, "prepare: --synthetic makes its own data; --max-word-bytes does not apply"},
	} {
		if _, err := runCmd(t, "", append(append([]string{"prepare"}, c.args...), "--out", out)...); err == nil || err.Error() != c.want {
			t.Errorf("%q: %v, want %s", c.args, err, c.want)
		}
	}
}
