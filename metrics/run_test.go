package metrics

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/metrics/metricstest"
)

// logSteps logs train records for steps from..to (and an eval record at
// every fifth step) into a run opened on dir.
func logSteps(t *testing.T, r *Run, from, to int64) {
	t.Helper()
	for s := from; s <= to; s++ {
		if err := r.Log("train", s, map[string]float64{"loss": float64(100 - s)}, nil); err != nil {
			t.Fatal(err)
		}
		if s%5 == 0 {
			if err := r.Log("eval", s, map[string]float64{"bleu": float64(s)}, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// A run killed at step 13 after its checkpoint of step 10 and resumed:
// RewindRun cuts metrics.jsonl and the event files back to step 10 (the
// old file kept aside), so the records of the resumed run follow on
// without a step going backwards and the report counts the steps the run
// really made (package report's TestReportRewoundRun).
func TestRewindRun(t *testing.T) {
	dir := t.TempDir()
	loggedRun(t, dir, 1, 13)
	// the kill tore the last line
	f, _ := os.OpenFile(filepath.Join(dir, "metrics.jsonl"), os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"step":14,"ti`)
	f.Close()
	old, _ := os.ReadFile(filepath.Join(dir, "metrics.jsonl"))

	rw, err := RewindRun(dir, 10)
	if err != nil {
		t.Fatal(err)
	}
	if rw.Dropped != 4 || rw.LastStep != 13 || rw.Events != 1 || filepath.Base(rw.Aside) != "metrics.jsonl.before-resume-10" {
		t.Fatalf("rewind: %+v", rw)
	}
	if b, _ := os.ReadFile(rw.Aside); string(b) != string(old) {
		t.Fatal("the file put aside is not the old metrics.jsonl")
	}
	if strings.Contains(rw.Aside, "tfevents") {
		t.Fatal("TensorBoard would read the file put aside")
	}
	r, err := OpenRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	logSteps(t, r, 11, 12)
	r.Close()
	recs, err := ReadJSONL(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var prev int64
	for i, rec := range recs {
		if rec.Kind == "train" && rec.Step != prev+1 {
			t.Fatalf("record %d: train step %d after %d", i+1, rec.Step, prev)
		}
		if rec.Kind == "train" {
			prev = rec.Step
		}
	}
	if prev != 12 {
		t.Fatalf("last step %d", prev)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*tfevents*"))
	if len(files) != 2 {
		t.Fatalf("event files %v", files)
	}
	seen := map[string]bool{}
	for _, f := range files {
		evs, err := metricstest.ReadEvents(f)
		if err != nil {
			t.Fatal(err)
		}
		if evs[0].FileVersion != "brain.Event:2" {
			t.Fatalf("%s: first event %+v", f, evs[0])
		}
		for _, e := range evs {
			for tag := range e.Scalars {
				k := tag + "@" + itoa64(e.Step)
				if seen[k] || e.Step > 12 {
					t.Fatalf("%s: %s (twice or after step 12)", f, k)
				}
				seen[k] = true
			}
		}
	}
	if len(seen) != 12+2 {
		t.Fatalf("%d scalars in the event files, want 14", len(seen))
	}
	// A second rewind to the same step keeps the first file put aside.
	if rw, err := RewindRun(dir, 10); err != nil || filepath.Base(rw.Aside) != "metrics.jsonl.before-resume-10.2" {
		t.Fatalf("second rewind: %+v %v", rw, err)
	}
	// Nothing after the step: nothing changes, nothing is put aside.
	if rw, err := RewindRun(dir, 10); err != nil || rw.Dropped != 0 || rw.Aside != "" || rw.Events != 0 {
		t.Fatalf("third rewind: %+v %v", rw, err)
	}
}

// Two event writers opened in the same second in one directory (a run
// and its resume) write two files: the second does not truncate the first.
func TestEventWritersSameSecond(t *testing.T) {
	dir := t.TempDir()
	a, err := NewEventWriter(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewEventWriter(dir)
	if err != nil {
		t.Fatal(err)
	}
	if a.path == b.path {
		t.Fatalf("both writers write %s", a.path)
	}
	a.Close()
	b.Close()
	files, _ := filepath.Glob(filepath.Join(dir, "events.out.tfevents.*"))
	if len(files) != 2 {
		t.Fatalf("event files: %v", files)
	}
}

func itoa64(v int64) string { return strconv.FormatInt(v, 10) }

// trainSteps returns the steps of the train records of dir/metrics.jsonl,
// failing the test if a line does not parse.
func trainSteps(t *testing.T, dir string) []int64 {
	t.Helper()
	recs, err := ReadJSONL(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var steps []int64
	for _, r := range recs {
		if r.Kind == "train" {
			steps = append(steps, r.Step)
		}
	}
	return steps
}

// A last record killed before its newline is torn even if its JSON is
// complete: RewindRun removes it, or the next record would be appended to
// the same line and metrics.jsonl would no longer parse.
func TestRewindRunRecordWithoutNewline(t *testing.T) {
	dir := t.TempDir()
	loggedRun(t, dir, 1, 4)
	b, _ := json.Marshal(Record{Step: 5, Time: 1, Kind: "train", Values: map[string]float64{"loss": 95}})
	f, _ := os.OpenFile(filepath.Join(dir, "metrics.jsonl"), os.O_APPEND|os.O_WRONLY, 0)
	f.Write(b) // no newline: the writer was killed
	f.Close()
	rw, err := RewindRun(dir, 5)
	if err != nil || rw.Dropped != 1 {
		t.Fatalf("rewind to 5: %+v, %v; want the record without its newline dropped", rw, err)
	}
	r, err := OpenRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	logSteps(t, r, 5, 6)
	r.Close()
	if got := fmt.Sprint(trainSteps(t, dir)); got != "[1 2 3 4 5 6]" {
		t.Fatalf("train steps after the resume: %s", got)
	}
}

// Each rewind that removes records keeps its own copy of metrics.jsonl:
// .before-resume-STEP, then .2, .3, ...; none overwrites another.
func TestRewindRunKeepsEveryAside(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "metrics.jsonl")
	asides := map[string]string{}
	for i, want := range []string{"metrics.jsonl.before-resume-10", "metrics.jsonl.before-resume-10.2", "metrics.jsonl.before-resume-10.3"} {
		loggedRun(t, dir, int64(11-i), 13) // each attempt differs
		old, _ := os.ReadFile(path)
		rw, err := RewindRun(dir, 10)
		if err != nil || filepath.Base(rw.Aside) != want {
			t.Fatalf("rewind %d: %+v, %v; want the copy in %s", i+1, rw, err, want)
		}
		asides[rw.Aside] = string(old)
	}
	for p, want := range asides {
		if b, err := os.ReadFile(p); err != nil || string(b) != want {
			t.Errorf("%s no longer holds metrics.jsonl as it was at its rewind (%v)", filepath.Base(p), err)
		}
	}
}

// Only regular event files are cut: a directory or a symbolic link named
// like one is left alone and does not stop the resume.
func TestRewindRunSkipsNonRegularEvents(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	loggedRun(t, dir, 1, 13)
	o, err := OpenRun(other)
	if err != nil {
		t.Fatal(err)
	}
	logSteps(t, o, 1, 13)
	o.Close()
	theirs, _ := filepath.Glob(filepath.Join(other, "events.out.tfevents.*"))
	before, _ := os.ReadFile(theirs[0])
	os.Mkdir(filepath.Join(dir, "events.out.tfevents.0.dir"), 0o755)
	link := filepath.Join(dir, "events.out.tfevents.0.link")
	os.Symlink(theirs[0], link)
	os.Symlink(filepath.Join(other, "gone"), filepath.Join(dir, "events.out.tfevents.0.dangling"))
	rw, err := RewindRun(dir, 10)
	if err != nil || rw.Events != 1 {
		t.Fatalf("rewind: %+v, %v; want the one regular event file cut", rw, err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the symbolic link to another run's event file was replaced (%v)", err)
	}
	if after, _ := os.ReadFile(theirs[0]); string(after) != string(before) {
		t.Fatal("another run's event file, linked into the run directory, was cut")
	}
}

// The files RewindRun replaces keep their permissions, and the copy it
// puts aside is readable by all (as OpenRun's files are), not the 0600 of
// a temporary file: a TensorBoard run by another user still reads them.
func TestRewindRunKeepsModes(t *testing.T) {
	dir := t.TempDir()
	loggedRun(t, dir, 1, 13)
	evs, _ := filepath.Glob(filepath.Join(dir, "events.out.tfevents.*"))
	files := append([]string{filepath.Join(dir, "metrics.jsonl")}, evs...)
	for _, f := range files {
		if err := os.Chmod(f, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	rw, err := RewindRun(dir, 10)
	if err != nil || rw.Events != 1 || rw.Dropped == 0 {
		t.Fatalf("rewind: %+v, %v", rw, err)
	}
	for _, f := range files {
		if fi, err := os.Stat(f); err != nil || fi.Mode().Perm() != 0o640 {
			t.Errorf("%s: mode %v after the rewind, want -rw-r----- (%v)", filepath.Base(f), fi.Mode().Perm(), err)
		}
	}
	if fi, err := os.Stat(rw.Aside); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("%s: mode %v, want -rw-r--r-- (%v)", filepath.Base(rw.Aside), fi.Mode().Perm(), err)
	}
}

// eventFile writes scalar events of the given steps, in that order, to a
// new event file and returns its path and bytes.
func eventFile(t *testing.T, steps ...int64) (string, []byte) {
	t.Helper()
	ew, err := NewEventWriter(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range steps {
		if err := ew.Scalars(s, time.Now(), map[string]float64{"train/loss": float64(s)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := ew.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(ew.path)
	if err != nil {
		t.Fatal(err)
	}
	return ew.path, b
}

func eventSteps(t *testing.T, path string) string {
	t.Helper()
	evs, err := metricstest.ReadEvents(path)
	if err != nil {
		t.Fatalf("after CutEvents: %v", err)
	}
	var s []string
	for _, e := range evs {
		s = append(s, itoa64(e.Step))
	}
	return strings.Join(s, " ")
}

// CutEvents removes every event after the step, wherever it is in the
// file, and a torn or corrupt tail (a writer killed mid-record), even
// when no event is after the step.
func TestCutEvents(t *testing.T) {
	// events out of step order: the later ones of step <= 3 stay
	path, _ := eventFile(t, 1, 2, 5, 3, 4)
	if cut, err := CutEvents(path, 3); err != nil || !cut {
		t.Fatalf("cut at 3: %v, %v", cut, err)
	}
	if got := eventSteps(t, path); got != "0 1 2 3" {
		t.Fatalf("steps after the cut at 3: %s, want 0 (the file version) 1 2 3", got)
	}

	// a record of step 9, as a writer appends it
	_, one := eventFile(t)
	_, two := eventFile(t, 9)
	rec := two[len(one):]
	for name, tail := range map[string]func(b []byte) []byte{
		"torn header":    func(b []byte) []byte { return append(b, rec[:7]...) },
		"torn data":      func(b []byte) []byte { return append(b, rec[:len(rec)-5]...) },
		"corrupt data":   func(b []byte) []byte { b = append(b, rec...); b[len(b)-5] ^= 0x40; return b },
		"corrupt length": func(b []byte) []byte { b = append(b, rec...); b[len(b)-len(rec)] ^= 0x01; return b },
	} {
		path, b := eventFile(t, 1, 2, 3)
		if err := os.WriteFile(path, tail(append([]byte(nil), b...)), 0o644); err != nil {
			t.Fatal(err)
		}
		if cut, err := CutEvents(path, 100); err != nil || !cut {
			t.Errorf("%s: cut %v, %v; want the tail removed", name, cut, err)
			continue
		}
		if after, _ := os.ReadFile(path); string(after) != string(b) {
			t.Errorf("%s: the file after the cut is not the one before the tail (%d bytes, want %d)", name, len(after), len(b))
		}
	}
}

// loggedRun writes the train records of steps from..to into the run
// directory dir and closes it, as a run that stopped there.
func loggedRun(t *testing.T, dir string, from, to int64) {
	t.Helper()
	r, err := OpenRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	logSteps(t, r, from, to)
	r.Close()
}
