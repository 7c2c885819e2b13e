package report

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gorun/gorun/metrics"
)

// tornRun writes a run directory of 4 train records and returns it.
func tornRun(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := metrics.WriteRunInfo(dir, metrics.RunInfo{Preset: "tiny", DModel: 64, WorldSize: 1, LRPolicy: "transformer", LearningRate: 2, Warmup: 10, Vocab: 411}); err != nil {
		t.Fatal(err)
	}
	r, err := metrics.OpenRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	for s := int64(1); s <= 4; s++ {
		if err := r.Log("train", s, map[string]float64{"loss": 5 - float64(s)/2, "loss_raw": 6 - float64(s)/2, "step_time_s": 0.1}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// `nmt-train report` of a run whose writer was killed mid-line: the last
// line, cut short (no newline after it), is left out with a note in the
// report, as --resume (RewindRun) drops it; garbage anywhere else, or a
// last line that ends with its newline, is still an error naming
// file:line (today's report failed on the torn line).
func TestReportTornLastLine(t *testing.T) {
	dir := tornRun(t)
	path := filepath.Join(dir, "metrics.jsonl")
	whole, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cut := append(append([]byte{}, whole...), `{"step":5,"time":17.5,"kind":"tra`...)
	if err := os.WriteFile(path, cut, 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := Write(dir, nil)
	if err != nil {
		t.Fatalf("report of a torn metrics.jsonl: %v", err)
	}
	b, _ := os.ReadFile(rep)
	for _, want := range []string{"Note: line 5 of `metrics.jsonl`, its last, was cut short (its writer was killed mid-line) and is left out; this report is of the 4 records before it.", "**4 steps**"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("report lacks %q:\n%s", want, b)
		}
	}
	if recs, err := metrics.ReadJSONL(path); err != nil || len(recs) != 4 {
		t.Errorf("ReadJSONL of the torn file: %d records, %v", len(recs), err)
	}
	lines := strings.SplitAfter(string(whole), "\n")
	for _, c := range []struct {
		what, text, want string
	}{
		{"garbage in the middle", lines[0] + "{\"step\": 2, garbage\n" + strings.Join(lines[2:], ""), "metrics.jsonl:2: "},
		{"a torn line in the middle", lines[0] + lines[1][:20] + "\n" + strings.Join(lines[2:], ""), "metrics.jsonl:2: "},
		{"a bad last line with its newline", string(whole) + "{\"step\": 5,\n", "metrics.jsonl:5: "},
	} {
		if err := os.WriteFile(path, []byte(c.text), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Write(dir, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %q", c.what, err, c.want)
		}
	}
	// a whole file has no note
	if err := os.WriteFile(path, whole, 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err = Write(dir, nil)
	if b, _ := os.ReadFile(rep); err != nil || strings.Contains(string(b), "cut short") {
		t.Errorf("whole file: %v\n%s", err, b)
	}
}

// A training loss that grew by orders of magnitude (lr 1000: 6.55 to
// tens of thousands) is said in the "is the model trained" section, with
// the step where it passed the rule; a run whose loss falls, or rises a
// little, has no such line (today's report had none at all).
func TestReportDivergedLoss(t *testing.T) {
	for _, c := range []struct {
		what     string
		smoothed []float64 // logged every 10 steps
		lowest   []float64 // the trainer's lowest so far (nil: not logged)
		want     string    // "" none
	}{
		{"lr 1000", []float64{2532.05, 16439.02, 36101.19, 42962}, []float64{6.55, 6.55, 6.55, 6.55},
			"- **No: the training loss diverged.** At step 10 the smoothed raw loss was 2,532, 386 times its lowest before (6.55) and above ln(411) = 6.02"},
		{"lr 1000, an older run without the lowest", []float64{6.5, 70, 36101.19, 42962}, nil,
			"At step 20 the smoothed raw loss was 70.00, 10 times its lowest before (6.50)"},
		{"healthy", []float64{6.5, 6.3, 5.7, 3.1}, []float64{6.5, 6.3, 5.7, 3.1}, ""},
		{"a spike below ln(V)", []float64{6.5, 0.4, 5.9, 0.3}, []float64{6.5, 0.4, 0.4, 0.3}, ""},
		{"warm-up above ln(V), not 10x", []float64{6.6, 6.9, 7.5, 6.0}, []float64{6.55, 6.55, 6.55, 6.0}, ""},
	} {
		t.Run(c.what, func(t *testing.T) {
			dir := t.TempDir()
			if err := metrics.WriteRunInfo(dir, metrics.RunInfo{Preset: "tiny", DModel: 64, WorldSize: 1, Vocab: 411}); err != nil {
				t.Fatal(err)
			}
			r, err := metrics.OpenRun(dir)
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range c.smoothed {
				vals := map[string]float64{"loss": v, "loss_raw": v, "loss_raw_smoothed": v, "step_time_s": 0.1}
				if c.lowest != nil {
					vals["loss_raw_smoothed_lowest"] = c.lowest[i]
				}
				r.Log("train", int64(10*(i+1)), vals, nil)
			}
			r.Close()
			rep, err := Write(dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := os.ReadFile(rep)
			sec := string(b)[strings.Index(string(b), "## Is the model fully trained?"):]
			sec = sec[:strings.Index(sec, "\n## ")]
			if c.want == "" && strings.Contains(sec, "diverged") || c.want != "" && !strings.Contains(sec, c.want) {
				t.Fatalf("section:\n%s\nwant %q", sec, c.want)
			}
		})
	}
	// the fixtures' runs (real runs among them, warm-up included) are
	// healthy
	for _, name := range []string{"compute-bound", "network-bound", "one-rank", "onehost-shm", "resumed", "stopped-between-logs", "three-steps"} {
		if rep := reportFixture(t, name, nil, nil); strings.Contains(rep, "diverged") {
			t.Errorf("fixture %s: a healthy run is said to diverge:\n%s", name, rep)
		}
	}
}
