package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/metrics"
	"github.com/gorun/gorun/plan"
)

// TestPlanErrors: bad input to `plan` gets one line on stderr naming what
// is wrong and, as gorun's, status 2 for a mistake in the command line and
// 1 for what it names (a directory that is no run), never a panic.
func TestPlanErrors(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--preset", "huge", "--compute-s", "1"}, 2, `nmt-train: plan: unknown preset "huge": --preset takes tiny, small, base or big` + "\n"},
		{[]string{"--link", "fast", "--compute-s", "1"}, 2, `nmt-train: plan: --link "fast": want a positive rate in bits per second with a lower-case b or bit (1gbit,`},
		{[]string{"--link", "-1gbit", "--compute-s", "1"}, 2, `nmt-train: plan: --link "-1gbit"`},
		{[]string{"--link", "1G", "--compute-s", "1"}, 2, `nmt-train: plan: --link "1G": want a positive rate in bits per second`},
		{[]string{"--hosts", "0", "--compute-s", "1"}, 2, "nmt-train: plan: --hosts 0 --per-host 1: want at least 1 each"},
		{[]string{"--compute-s", "-1"}, 2, "nmt-train: plan: --compute-s -1: must not be negative"},
		{[]string{"--compute-s", "1", "--threads", "-2"}, 2, "nmt-train: plan: --threads -2 --cores-per-host 0: must not be negative"},
		{[]string{"--device", "h100"}, 2, "nmt-train: plan: --device h100: no compute time measured on a GPU in this project (nothing has run on one yet): give --compute-s"},
		{[]string{"--compression", "zip", "--compute-s", "1"}, 2, `nmt-train: plan: --compression "zip": want fp16, bf16 or none`},
		{[]string{"--transport", "pigeon", "--compute-s", "1"}, 2, `nmt-train: plan: --transport: unknown transport "pigeon"`},
		{[]string{"--from-run", filepath.Join(dir, "nothing")}, 1, "nmt-train: plan: --from-run " + filepath.Join(dir, "nothing") + " is not a run directory: "},
		{[]string{"stray"}, 2, `nmt-train: plan: unexpected argument "stray"`},
	} {
		code, out, errs := nmt(t, dir, "", append([]string{"plan"}, c.args...)...)
		if code != c.code || !strings.HasPrefix(errs, c.want) || strings.Count(errs, "\n") != 1 || out != "" || strings.Contains(errs, "panic") {
			t.Errorf("%q: status %d, stdout %q, stderr %q, want status %d and one line starting %q", c.args, code, out, errs, c.code, c.want)
		}
	}
}

// TestParseLink: a capital B is bytes per second, a lower-case b or "bit"
// bits; a bare number or an unknown unit is refused.
func TestParseLink(t *testing.T) {
	for s, want := range map[string]float64{
		"1gbit": 1, "1Gbit": 1, "10Gbit/s": 10, "2.5Gbit/s": 2.5, "1Gbps": 1, "400Mbps": 0.4, "1Gb/s": 1, "1Gb": 1, "100mbit": 0.1,
		"1 Gbit/s": 1, "1tbit": 1000, "1GBit": 1, "1e3mbit": 1, "8bit/s": 8e-9,
		"1GB": 8, "1GBps": 8, "1GB/s": 8, "125MB/s": 1, "125MB": 1, "1 GB/s": 8, "125MBps": 1, "1.25GB/s": 10, "1gbyte/s": 8,
		"100MiB/s": 100 * (1 << 20) * 8 / 1e9, "1GiB/s": (1 << 30) * 8 / 1e9, "1Gibit": (1 << 30) / 1e9, "1KiB": 1024 * 8 / 1e9,
	} {
		got, err := parseLink(s)
		if err != nil || math.Abs(got-want) > 1e-9*want {
			t.Errorf("%q: %v Gbit/s, %v; want %v Gbit/s", s, got, err, want)
		}
	}
	for _, s := range []string{"", "1", "1000", "1G", "1g", "gbit", "1gbits/s/s", "0gbit", "-1gbit", "1 gigabit", "1Xbit", "1GBB", "1e999GB/s", "NaNgbit", "1Gbit/h", "1 G bit"} {
		if got, err := parseLink(s); err == nil || !strings.Contains(err.Error(), "1GB/s = 8 Gbit/s") || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: %v Gbit/s, error %v; want refused, naming the forms", s, got, err)
		}
	}
}

// predicted reads `plan`'s predicted step time.
func predicted(t *testing.T, out string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^predicted step time: ([0-9.]+) s$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no predicted step time in:\n%s", out)
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// TestPlanCommand: the preset's buckets as the Bucketer cuts them and the
// numbers given go into package plan; the printed step time is its
// prediction; a GPU with --compute-s; the sweep's 10 rows; a run
// directory's measured compute.
func TestPlanCommand(t *testing.T) {
	dir := t.TempDir()
	code, out, errs := nmt(t, dir, "", "plan", "--preset", "tiny", "--vocab", "1000", "--hosts", "2", "--link", "2.5Gbit/s",
		"--compute-s", "0.05", "--compute-sd-s", "0.01", "--transport", "tcp")
	if code != 0 {
		t.Fatalf("status %d: %s", code, errs)
	}
	// tiny with 1000 ids: the 1000 x 64 embedding; 2 encoder layers of
	// 2 norms (256), attention (4 x 64 x 64) and the FFN (64 x 256 + 256 +
	// 256 x 64 + 64): 49,728 each; 2 decoder layers of 3 norms, 2
	// attentions and the FFN: 66,240 each; the 2 final norms: 256. One
	// bucket: the layers' 0.93 MB stay under the 1 MiB first cap until
	// the embedding joins them.
	w := plan.Workload{Params: 296192, Buckets: []int{4 * 296192}, HeadBytes: 4 * 1000 * 64, ComputeS: 0.05, ComputeSD: 0.01,
		TokensPerRank: 4096, Wire: collective.Float16, Overlap: true}
	p, err := plan.Predict(plan.Cluster{Hosts: 2, PerHost: 1, LinkGbps: 2.5, Transport: "tcp"}, w)
	if err != nil {
		t.Fatal(err)
	}
	if got := predicted(t, out); math.Abs(got-p.StepS) > 1e-4 {
		t.Errorf("printed %v s, plan.Predict gives %v s:\n%s", got, p.StepS, out)
	}
	for _, want := range []string{"plan: preset tiny (296,192 parameters), 2 hosts x 1 rank = 2 ranks, link 2.5 Gbit/s, TLS/TCP",
		"bucket 0: 0.59 MB on the wire, ring", "verdict: compute-bound", "padded batch tokens/s"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	code, out, errs = nmt(t, dir, "", "plan", "--preset", "base", "--per-host", "8", "--link", "100gbit", "--device", "h100", "--compute-s", "0.1", "--sweep")
	if code != 0 || strings.Count(out, "\n| ") != 11 || !strings.Contains(out, "| 512 | 4096 |") {
		t.Errorf("sweep: status %d, stderr %s, output:\n%s", code, errs, out)
	}
	run := writeRun(t, dir)
	code, out, errs = nmt(t, dir, "", "plan", "--from-run", run, "--hosts", "4")
	if code != 0 || !strings.Contains(out, "4 hosts x 1 rank = 4 ranks, link 1 Gbit/s") || !strings.Contains(out, "the run itself measured 0.1200 s per step (2 ranks on 2 hosts)") ||
		!strings.Contains(out, "compute: 0.0900 s per step per rank") {
		t.Errorf("--from-run: status %d, stderr %s, output:\n%s", code, errs, out)
	}
	// --link in bytes per second: 125MB/s is 1 Gbit/s, 1GB/s 8
	for link, gbit := range map[string]string{"125MB/s": "1", "1GB/s": "8", "1GB": "8", "1Gbps": "1"} {
		code, out, errs = nmt(t, dir, "", "plan", "--from-run", run, "--link", link)
		if code != 0 || !strings.Contains(out, "2 hosts x 1 rank = 2 ranks, link "+gbit+" Gbit/s") {
			t.Errorf("--link %s: status %d, stderr %s, want a %s Gbit/s link:\n%s", link, code, errs, gbit, out)
		}
	}
	// a run of 3 steps logged every step: 2 timed after the warm-up are
	// not enough, as report.md says; --compute-s stands in for them
	short := writeRunSteps(t, dir, "short", 1)
	code, out, errs = nmt(t, dir, "", "plan", "--from-run", short)
	if want := "nmt-train: plan: --from-run " + short + ": not enough data: 2 step(s) timed after the first logged interval (the warm-up); a prediction needs at least 8 (a longer run: --max-steps); or give --compute-s\n"; code != 1 || errs != want || out != "" {
		t.Errorf("3 steps: status %d, stderr %q, want %q; output:\n%s", code, errs, want, out)
	}
	if code, out, errs = nmt(t, dir, "", "plan", "--from-run", short, "--compute-s", "0.09"); code != 0 || !strings.Contains(out, "compute: 0.0900 s per step per rank") {
		t.Errorf("3 steps with --compute-s: status %d, stderr %s, output:\n%s", code, errs, out)
	}
}

// writeRun makes a run directory of 2 ranks on 2 hosts: 3 intervals,
// the first one's compute an outlier (warm-up), then compute 0.1 s of
// which 0.01 s waiting at the token count.
func writeRun(t *testing.T, dir string) string {
	t.Helper()
	return writeRunSteps(t, dir, "run", 10)
}

// writeRunSteps is writeRun's run directory dir/name with a log line
// every steps steps.
func writeRunSteps(t *testing.T, dir, name string, steps int) string {
	t.Helper()
	run := filepath.Join(dir, name)
	os.MkdirAll(run, 0o755)
	ov := true
	ri := metrics.RunInfo{Preset: "tiny", Params: 192448, DModel: 64, WorldSize: 2, Hosts: []string{"a", "b"}, Threads: 1, CPUs: 2,
		BatchTokens: 4096, LinkGbps: 1, LinkSource: "probe", Compression: "fp16", Vocab: 1000, Overlap: &ov, Buckets: []int{4 * 192448}}
	if err := metrics.WriteRunInfo(run, ri); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for i, c := range []float64{0.5, 0.1, 0.1} {
		v := map[string]float64{"step_time_s": 0.12, "compute_s": c, "sync_s": 0.01, "compute_sd_s": 0.01, "tokens_per_s": 20000}
		j, _ := json.Marshal(metrics.Record{Kind: "train", Step: int64(steps * (i + 1)), Values: v})
		fmt.Fprintf(&b, "%s\n", j)
	}
	if err := os.WriteFile(filepath.Join(run, "metrics.jsonl"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return run
}
