package metrics

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
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
// really made.
func TestRewindRun(t *testing.T) {
	dir := t.TempDir()
	r, err := OpenRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	logSteps(t, r, 1, 13)
	r.Close()
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
	r, err = OpenRun(dir)
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
		evs, err := ReadEvents(f)
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
	ri := RunInfo{Preset: "tiny", LRPolicy: "transformer"}
	if err := WriteRunInfo(dir, ri); err != nil {
		t.Fatal(err)
	}
	rep, err := WriteReport(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(rep); !strings.Contains(string(b), "**12 steps**") {
		t.Fatalf("report:\n%s", b)
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
