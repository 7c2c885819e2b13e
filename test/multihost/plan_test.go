package multihost

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// planErrBound is how far the planner may miss the measured step time in
// TestPlanPredictsRun: generous, against the 20 % of docs/plan.md's table,
// because this test runs beside other packages' tests on 2 cores.
const planErrBound = 0.35

// meanStep is the mean step_time_s of a run directory's train records
// after the first (warm-up).
func meanStep(t *testing.T, dir string) float64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var v []float64
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r struct {
			Kind   string             `json:"kind"`
			Values map[string]float64 `json:"values"`
		}
		if json.Unmarshal([]byte(l), &r) == nil && r.Kind == "train" {
			v = append(v, r.Values["step_time_s"])
		}
	}
	if len(v) < 3 {
		t.Fatalf("%s: %d train records, want at least 3", dir, len(v))
	}
	s := 0.0
	for _, x := range v[1:] {
		s += x
	}
	return s / float64(len(v)-1)
}

// The one timing check: nmt-train plan, from a one-rank baseline
// with the same threads, predicts the step time of the tiny preset on the
// two test hosts (one rank each, 1 Gbit/s) within planErrBound. Each
// attempt runs the baseline and right after it the job (like with like,
// under the same load); the best of up to 3 attempts counts, and the
// failure message lists every attempt.
func TestPlanPredictsRun(t *testing.T) {
	e := need(t)
	common := []string{"--preset", "tiny", "--synthetic-lines", "2000", "--max-steps", "60", "--log-every", "10",
		"--eval-every", "0", "--checkpoint-every", "0", "--eval-sentences", "10", "--threads", "1", "--quiet"}
	var tries []string
	best := math.Inf(1)
	for k := 0; k < 3 && best > planErrBound; k++ {
		base := filepath.Join(t.TempDir(), "base")
		c := exec.Command(e.train, append(append([]string{"train"}, common...), "--run-dir", base)...)
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("baseline: %v\n%s", err, out)
		}
		run := filepath.Join(t.TempDir(), "run")
		out, code := e.run(t, 120*time.Second, append([]string{"-np", "2", "--map-by", "node", e.train, "train"}, append(common, "--run-dir", run)...)...)
		if code != 0 {
			t.Fatalf("nmt-train on 2 hosts: exit status %d:\n%s", code, out)
		}
		p, err := exec.Command(e.train, "plan", "--from-run", base, "--hosts", "2", "--per-host", "1", "--link", "1gbit",
			"--cores-per-host", "1", "--threads", "1").CombinedOutput()
		m := regexp.MustCompile(`(?m)^predicted step time: ([0-9.]+) s$`).FindSubmatch(p)
		if err != nil || m == nil {
			t.Fatalf("nmt-train plan: %v\n%s", err, p)
		}
		pred, _ := strconv.ParseFloat(string(m[1]), 64)
		meas := meanStep(t, run)
		rel := math.Abs(pred-meas) / meas
		best = math.Min(best, rel)
		tries = append(tries, fmt.Sprintf("predicted %.4f s, measured %.4f s (baseline %.4f s): %.0f %% off", pred, meas, meanStep(t, base), 100*rel))
		t.Log(tries[len(tries)-1])
	}
	if best > planErrBound {
		load, _ := os.ReadFile("/proc/loadavg")
		t.Errorf("the plan missed the measured step time by more than %.0f %% in every attempt (load %s):\n%s",
			100*planErrBound, strings.TrimSpace(string(load)), strings.Join(tries, "\n"))
	}
}
