package metrics

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorun/gorun/metrics/metricstest"
)

// TestLogNonFinite: a NaN or infinite value (a diverged eval loss) is
// recorded, the file stays valid JSON lines, reads back, and the
// TensorBoard file still works (the report of such a run: package
// report's TestReportNonFinite).
func TestLogNonFinite(t *testing.T) {
	dir := t.TempDir()
	if err := WriteRunInfo(dir, RunInfo{Preset: "tiny", DModel: 512, WorldSize: 1, LearningRate: 2, Warmup: 8000}); err != nil {
		t.Fatal(err)
	}
	r, err := OpenRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	for s := int64(10); s <= 40; s += 10 {
		if err := r.Log("train", s, map[string]float64{"loss": 5 / float64(s), "lr": 1e-4}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Log("eval", 20, map[string]float64{"loss": math.NaN(), "bleu": 1.5}, nil); err != nil {
		t.Fatalf("logging NaN: %v", err)
	}
	if err := r.Log("eval", 40, map[string]float64{"loss": math.Inf(1), "loss_raw": math.Inf(-1), "bleu": 2}, nil); err != nil {
		t.Fatalf("logging Inf: %v", err)
	}
	evPath := r.events.path
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 6 {
		t.Fatalf("%d lines, want 6:\n%s", len(lines), b)
	}
	for i, l := range lines {
		var any map[string]any
		if err := json.Unmarshal([]byte(l), &any); err != nil {
			t.Fatalf("line %d is not JSON: %v\n%s", i+1, err, l)
		}
	}
	if !strings.Contains(lines[4], `"loss":"NaN"`) || !strings.Contains(lines[5], `"loss":"Inf"`) || !strings.Contains(lines[5], `"loss_raw":"-Inf"`) {
		t.Fatalf("non-finite values not written as strings:\n%s", b)
	}
	recs, err := ReadJSONL(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 6 || !math.IsNaN(recs[4].Values["loss"]) || !math.IsInf(recs[5].Values["loss"], 1) ||
		!math.IsInf(recs[5].Values["loss_raw"], -1) || recs[5].Values["bleu"] != 2 || recs[0].Values["loss"] != 0.5 {
		t.Fatalf("read back %+v", recs)
	}
	evs, err := metricstest.ReadEvents(evPath)
	if err != nil {
		t.Fatal(err)
	}
	var sawNaN bool
	for _, e := range evs {
		if v, ok := e.Scalars["eval/loss"]; ok && math.IsNaN(float64(v)) {
			sawNaN = true
		}
	}
	if !sawNaN {
		t.Fatalf("no NaN eval/loss among the events: %+v", evs)
	}
	if _, err := RewindRun(dir, 30); err != nil {
		t.Fatal(err)
	}
	if recs, err := ReadJSONL(filepath.Join(dir, "metrics.jsonl")); err != nil || len(recs) != 4 {
		t.Fatalf("after rewind to 30: %d records, %v (the NaN line must be kept as a valid line)", len(recs), err)
	}
}
