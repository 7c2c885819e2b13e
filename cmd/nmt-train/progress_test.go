package main

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv"
)

// progressArgs trains 8 steps, a log line every 4, with the progress on
// (tinyArgs without --quiet).
func progressArgs(t *testing.T) []string {
	args := slices.DeleteFunc(slices.Clone(tinyArgs), func(a string) bool { return a == "--quiet" })
	return append(args, "--batch-tokens", "1024", "--max-steps", "8", "--log-every", "4", "--checkpoint-every", "0",
		"--run-dir", filepath.Join(t.TempDir(), "run"))
}

var (
	// the progress text: step N/M, the bar and share, ETA, tokens/s, loss
	progressText = regexp.MustCompile(`step [1-8]/8 \[[= ]{10}\] +\d+% \| ETA (\?|\d+:\d\d) \| [\d,]+ tok/s \| loss \d+\.\d{4}`)
	// a log line: step N/M first, the ETA last
	logLine = regexp.MustCompile(`^step [48]/8 \| loss \d+\.\d{4} \(smoothed raw [\d.]+\) \| lr [\d.e+-]+ \| [\d.]+ s/step \| [\d,]+ tok/s( \| .*)? \| ETA \d+:\d\d$`)
)

// checkLogLines checks the log lines of rank 0 (lines, the tag taken
// off): steps 4 and 8 of 8, with the ETA; the communication figures only
// with more than one rank.
func checkLogLines(t *testing.T, lines []string, ranks int) {
	t.Helper()
	var steps []string
	for _, l := range lines {
		if !strings.HasPrefix(l, "step ") {
			continue
		}
		if !logLine.MatchString(l) {
			t.Errorf("log line %q is not step N/M ... | ETA m:ss", l)
		}
		// on one host shared memory carries the traffic: "| shm N MB/s out"
		traffic := strings.Contains(l, "| net ") || strings.Contains(l, "| shm ")
		if comm := strings.Contains(l, "comm exposed"); comm != (ranks > 1) || traffic != (ranks > 1) {
			t.Errorf("%d rank(s): log line %q", ranks, l)
		}
		steps = append(steps, l[:len("step 4/8")])
	}
	if !slices.Equal(steps, []string{"step 4/8", "step 8/8"}) {
		t.Errorf("log lines of steps %q, want 4/8 and 8/8", steps)
	}
}

// untag returns rank 0's lines of gorun's output, without their tag; any
// line that is not a whole line of a rank or of gorun fails the test.
func untag(t *testing.T, lines []string) []string {
	t.Helper()
	var zero []string
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "[0] "):
			zero = append(zero, l[4:])
		case strings.HasPrefix(l, "[1] "), strings.HasPrefix(l, "gorun: "):
		default:
			t.Errorf("a line of no rank: %q", l)
		}
	}
	return zero
}

// gorun on a terminal: rank 0's progress (step N/M, ETA, tokens/s, loss)
// is drawn on gorun's bottom line, and what stays on the screen is whole
// lines: the progress never mixes with a log line or another rank's.
func TestProgressUnderGorunOnTerminal(t *testing.T) {
	cmd := exec.Command(gorunBin, append([]string{"-np", "2", trainBin}, progressArgs(t)...)...)
	cmd.Env = testenv.CleanEnv()
	raw, err := testenv.RunInTerminal(t, cmd, 200, 3*time.Minute)
	if err != nil {
		t.Fatalf("%v\n%q", err, raw)
	}
	drawn := regexp.MustCompile(`\r\x1b\[K\[0\] `+progressText.String()).FindAllString(raw, -1)
	if len(drawn) == 0 {
		t.Fatalf("no progress drawn:\n%q", raw)
	}
	t.Logf("%d redraws, e.g. %q", len(drawn), drawn[len(drawn)-1])
	if n, k := strings.Count(raw, "\x1b"), strings.Count(raw, "\x1b[K"); n != k {
		t.Errorf("escape codes other than erase-line: %d of %d", n-k, n)
	}
	screen := testenv.Screen(raw)
	for _, l := range screen {
		if progressText.MatchString(l) {
			t.Errorf("progress left on the screen: %q", l)
		}
	}
	checkLogLines(t, untag(t, screen), 2)
	if !strings.HasSuffix(raw, "\r\n") {
		t.Errorf("the output does not end with a whole line: %q", raw[max(0, len(raw)-200):])
	}
}

// gorun not on a terminal (a file, CI, nohup): plain lines, no '\r' and
// no escape code anywhere, and the log lines say step N/M and the ETA.
func TestProgressUnderGorunNotOnTerminal(t *testing.T) {
	cmd := exec.Command(gorunBin, append([]string{"-np", "2", trainBin}, progressArgs(t)...)...)
	cmd.Env = testenv.CleanEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if strings.ContainsAny(string(out), "\r\x1b") {
		t.Errorf("'\\r' or an escape code without a terminal:\n%q", out)
	}
	checkLogLines(t, untag(t, strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")), 2)
}

// One nmt-train in a terminal, without gorun: its own bar, each redraw
// erasing what the last one left (no stray characters), gone from the
// screen at the end; the log lines claim no communication. Without a
// terminal: plain lines.
func TestProgressSingleRank(t *testing.T) {
	cmd := exec.Command(trainBin, progressArgs(t)...)
	cmd.Env = testenv.CleanEnv()
	raw, err := testenv.RunInTerminal(t, cmd, 200, 3*time.Minute)
	if err != nil {
		t.Fatalf("%v\n%q", err, raw)
	}
	drawn := regexp.MustCompile(`\r`+progressText.String()+`(\x1b\[K)?`).FindAllStringSubmatch(raw, -1)
	if len(drawn) == 0 {
		t.Fatalf("no bar drawn:\n%q", raw)
	}
	for _, d := range drawn {
		if d[2] == "" {
			t.Errorf("a redraw that does not erase the rest of the line: %q", d[0])
		}
	}
	screen := testenv.Screen(raw)
	for _, l := range screen {
		if progressText.MatchString(l) {
			t.Errorf("bar left on the screen: %q", l)
		}
	}
	checkLogLines(t, screen, 1)

	cmd = exec.Command(trainBin, progressArgs(t)...)
	cmd.Env = testenv.CleanEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if strings.ContainsAny(string(out), "\r\x1b") {
		t.Errorf("'\\r' or an escape code without a terminal:\n%q", out)
	}
	checkLogLines(t, strings.Split(string(out), "\n"), 1)
}
