package report

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorun/gorun/metrics"
)

// TestReportNonFinite: the report of a run that recorded NaN and infinite
// values (a diverged eval loss), cut back to a step after them by a resume,
// is written (metrics' TestLogNonFinite: the records themselves).
func TestReportNonFinite(t *testing.T) {
	dir := t.TempDir()
	if err := metrics.WriteRunInfo(dir, metrics.RunInfo{Preset: "tiny", DModel: 512, WorldSize: 1, LearningRate: 2, Warmup: 8000}); err != nil {
		t.Fatal(err)
	}
	r, err := metrics.OpenRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	for s := int64(10); s <= 40; s += 10 {
		if err := r.Log("train", s, map[string]float64{"loss": 5 / float64(s), "lr": 1e-4}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Log("eval", 20, map[string]float64{"loss": math.NaN(), "bleu": 1.5}, nil); err != nil {
		t.Fatal(err)
	}
	if err := r.Log("eval", 40, map[string]float64{"loss": math.Inf(1), "loss_raw": math.Inf(-1), "bleu": 2}, nil); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := metrics.RewindRun(dir, 30); err != nil {
		t.Fatal(err)
	}
	path, err := Write(dir, nil)
	if err != nil {
		t.Fatalf("report: %v", err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		t.Fatalf("report %s: %v", path, err)
	}
}

// A run killed at step 13 after its checkpoint of step 10, its last line
// torn, and resumed (metrics.RewindRun, then steps 11 and 12): the report
// counts the steps the run really made (metrics' TestRewindRun: the files).
func TestReportRewoundRun(t *testing.T) {
	dir := t.TempDir()
	logSteps(t, dir, 1, 13)
	f, err := os.OpenFile(filepath.Join(dir, "metrics.jsonl"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"step":14,"ti`)
	f.Close()
	if _, err := metrics.RewindRun(dir, 10); err != nil {
		t.Fatal(err)
	}
	logSteps(t, dir, 11, 12)
	if err := metrics.WriteRunInfo(dir, metrics.RunInfo{Preset: "tiny", LRPolicy: "transformer"}); err != nil {
		t.Fatal(err)
	}
	rep, err := Write(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(rep); !strings.Contains(string(b), "**12 steps**") {
		t.Fatalf("report:\n%s", b)
	}
}

// logSteps records train records for steps from..to (and an eval record
// at every fifth step) in the run directory dir, as a run that stopped
// there (metrics' tests log the same).
func logSteps(t *testing.T, dir string, from, to int64) {
	t.Helper()
	r, err := metrics.OpenRun(dir)
	if err != nil {
		t.Fatal(err)
	}
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
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}
