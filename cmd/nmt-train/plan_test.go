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
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/fusion"
	"github.com/gorun/gorun/metrics"
	"github.com/gorun/gorun/plan"
	"github.com/gorun/gorun/rank/ranktest"
	"github.com/gorun/gorun/transformer"
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
		{[]string{"--compression", "zip", "--compute-s", "1"}, 2, `nmt-train: plan: --compression "zip": want fp16, bf16, none or powersgd`},
		{[]string{"--compression", "powersgd", "--overlap=false", "--compute-s", "1"}, 2, "nmt-train: plan: --compression powersgd needs --overlap"},
		{[]string{"--compression", "powersgd", "--powersgd-rank", "0", "--compute-s", "1"}, 2, "nmt-train: plan: --powersgd-rank 0 --powersgd-start-step 1000 --powersgd-compute-s 0: want a rank of 1 to 64 (the compressor's)"},
		{[]string{"--compression", "powersgd", "--powersgd-rank", "65", "--compute-s", "1"}, 2, "nmt-train: plan: --powersgd-rank 65 "},
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
		TokensPerRank: 4096, Wire: dtype.Float16, Overlap: true}
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

// labPowerSGD is what `plan` should predict for Transformer-base on the
// lab's cluster (2 hosts x 2 ranks, 1 Gbit/s, 0.25 s of compute) with
// PowerSGD of rank r, built here from the pieces: the preset's shapes in
// the buckets the Bucketer cuts, the compressor's FLOPs at the step's
// rate (6 x parameters x 4096 batch tokens in 0.25 s); and with fp16.
func labPowerSGD(t *testing.T, r int, gpu bool) (psgd, fp16 plan.Prediction, ps *plan.PowerSGD) {
	t.Helper()
	cfg, err := transformer.Preset("base", 32768)
	if err != nil {
		t.Fatal(err)
	}
	params, err := transformer.ParamList(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var shapes [][]int
	var infos []fusion.ParamInfo
	for _, p := range params {
		shapes = append(shapes, p.Shape)
		infos = append(infos, fusion.ParamInfo{Name: p.Name, Len: p.Len})
	}
	var buckets []int
	for _, b := range fusion.Layout(infos, fusion.BucketConfig{}) {
		buckets = append(buckets, b.Bytes())
	}
	if ps, err = plan.NewPowerSGD(shapes, buckets, r); err != nil {
		t.Fatal(err)
	}
	ps.ComputeS = 0.25 * ps.FLOPs() / (6 * 60880896 * 4096)
	w := plan.Workload{Params: 60880896, Buckets: buckets, HeadBytes: 4 * 32768 * 512, ComputeS: 0.25, TokensPerRank: 4096,
		Wire: dtype.Float16, Overlap: true}
	c := plan.Cluster{Hosts: 2, PerHost: 2, LinkGbps: 1, Transport: "auto", GPU: gpu}
	if fp16, err = plan.Predict(c, w); err != nil {
		t.Fatal(err)
	}
	w.PowerSGD = ps
	if psgd, err = plan.Predict(c, w); err != nil {
		t.Fatal(err)
	}
	return psgd, fp16, ps
}

// TestPlanPowerSGD: `plan --compression powersgd` on the lab's cluster
// prints plan.Predict's step with PowerSGD, its bytes a step against
// fp16's, the compressor's compute and where it came from (FLOPs and
// --compute-s, on the CPU or, said so, on a GPU), each bucket's three
// allreduces, and fp16's prediction beside it: network-bound with fp16,
// compute-bound with PowerSGD. --powersgd-rank and --powersgd-compute-s
// change what they say.
func TestPlanPowerSGD(t *testing.T) {
	dir := t.TempDir()
	// at rank 4, whose numbers the lines below were worked out for (the
	// default rank is TestPowerSGDMatchesCompressor's and the trainer's)
	lab := []string{"plan", "--preset", "base", "--hosts", "2", "--per-host", "2", "--link", "1gbit", "--compute-s", "0.25", "--compression", "powersgd", "--powersgd-rank", "4"}
	for _, gpu := range []bool{false, true} {
		args := lab
		if gpu {
			args = append(args[:len(args):len(args)], "--device", "h100")
		}
		code, out, errs := nmt(t, dir, "", args...)
		if code != 0 {
			t.Fatalf("%q: status %d: %s", args, code, errs)
		}
		p, p16, ps := labPowerSGD(t, 4, gpu)
		if got := predicted(t, out); math.Abs(got-p.StepS) > 1e-4 {
			t.Errorf("printed %v s, plan.Predict gives %v s:\n%s", got, p.StepS, out)
		}
		on := map[bool]string{false: "(on the CPU)", true: "(on the GPU, where nothing was measured)"}[gpu]
		for _, want := range []string{
			// P and Q: 16 B x the 168,448 rows and columns of the 97 matrices
			"compression: powersgd, rank 4, from step 1000 (before it: as fp16 below): 97 matrices compressed (60,817,408 parameters; P and Q 2.70 MB in float32), 88 tensors left in fp16 (63,488 parameters, 0.13 MB): 2.82 MB a step on the wire against 121.76 MB with fp16 (43.1x less)",
			fmt.Sprintf("powersgd compute: %.4f s per step per rank (1.65 GFLOP), from FLOPs and --compute-s %s: 1.65 GFLOP of the compressor at the rate of the step's 6 x 60,880,896 parameters x 4096 padded batch tokens = 1.496 TFLOP in 0.2500 s; a lower bound", ps.ComputeS, on),
			fmt.Sprintf("(%.0f %% of %.4f s of gradient allreduces and %.4f s of compression hidden behind backward)", 100*p.Hidden, p.CommS, p.CompressS),
			"verdict: compute-bound",
			"  bucket 8: 0.53 MB on the wire (P in float32 0.52 MB, ", // the embedding alone: P 32,768 x 16 B, Q 512 x 16 B
			"  bucket 0: 0.04 MB on the wire (the rest in fp16 0.00 MB, ",
			fmt.Sprintf("fp16 for comparison: predicted step time %.4f s (exposed communication %.4f s); the gradients' allreduces take %.4f s, 121.76 MB on the wire; network-bound", p16.StepS, p16.ExposedS, p16.CommS),
		} {
			if !strings.Contains(out, want) {
				t.Errorf("gpu %v: output lacks %q:\n%s", gpu, want, out)
			}
		}
		if strings.Count(out, "\n  bucket ") != 9 || !(p.StepS < p16.StepS/3) {
			t.Errorf("gpu %v: %d buckets, step %.4f s against fp16's %.4f s:\n%s", gpu, strings.Count(out, "\n  bucket "), p.StepS, p16.StepS, out)
		}
	}
	// rank 8 (P and Q twice as big) and a measured compressor
	code, out, errs := nmt(t, dir, "", append(lab[:len(lab):len(lab)], "--powersgd-rank", "8", "--powersgd-compute-s", "0.05", "--powersgd-start-step", "0")...)
	p8, _, _ := labPowerSGD(t, 8, false)
	if code != 0 || !strings.Contains(out, "compression: powersgd, rank 8: 97 matrices compressed (60,817,408 parameters; P and Q 5.39 MB in float32)") ||
		!strings.Contains(out, "powersgd compute: 0.0500 s per step per rank (3.12 GFLOP), given with --powersgd-compute-s") || predicted(t, out) <= p8.StepS {
		t.Errorf("rank 8, 0.05 s: status %d, stderr %s, output:\n%s", code, errs, out)
	}
	// fp16 (the default): no PowerSGD lines
	if code, out, _ := nmt(t, dir, "", lab[:len(lab)-4]...); code != 0 || strings.Contains(out, "powersgd") || strings.Contains(out, "fp16 for comparison") {
		t.Errorf("fp16: status %d, output:\n%s", code, out)
	}
}

// TestPlanFromPowerSGDRun: --from-run of a run that compressed with
// PowerSGD takes its rank, its buckets and its compressor's measured
// compute (the run's compute less it, plus it as PowerSGD's); asked for
// fp16 instead, the compressor's part is gone.
func TestPlanFromPowerSGDRun(t *testing.T) {
	dir := t.TempDir()
	run := filepath.Join(dir, "psgd")
	os.MkdirAll(run, 0o755)
	ov := true
	// tiny with 1000 ids: 296,192 parameters (TestPlanCommand), one bucket
	ri := metrics.RunInfo{Preset: "tiny", Params: 296192, DModel: 64, WorldSize: 2, Hosts: []string{"a", "b"}, Threads: 1, CPUs: 2,
		BatchTokens: 4096, LinkGbps: 1, LinkSource: "probe", Compression: "powersgd", PowerSGDRank: 2, PowerSGDStartStep: 5,
		Vocab: 1000, Overlap: &ov, Buckets: []int{4 * 296192}}
	if err := metrics.WriteRunInfo(run, ri); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for i, c := range []float64{0.5, 0.1, 0.1} {
		v := map[string]float64{"step_time_s": 0.12, "compute_s": c, "sync_s": 0.01, "compute_sd_s": 0.01, "tokens_per_s": 20000,
			"powersgd_bytes": 9000, "powersgd_compute_ms": 4}
		j, _ := json.Marshal(metrics.Record{Kind: "train", Step: int64(10 * (i + 1)), Values: v})
		fmt.Fprintf(&b, "%s\n", j)
	}
	if err := os.WriteFile(filepath.Join(run, "metrics.jsonl"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := nmt(t, dir, "", "plan", "--from-run", run)
	for _, want := range []string{"compute: 0.0860 s per step per rank", // 0.1 - 0.01 at the token count - 0.004 of compressor
		"compression: powersgd, rank 2, from step 5 (before it: as fp16 below)",
		"powersgd compute: 0.0040 s per step per rank", "measured by the run (powersgd_compute_ms, a mean over 20 steps)", "fp16 for comparison"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("status %d, stderr %s: output lacks %q:\n%s", code, errs, want, out)
		}
	}
	code, out, errs = nmt(t, dir, "", "plan", "--from-run", run, "--compression", "fp16")
	if code != 0 || strings.Contains(out, "powersgd") || !strings.Contains(out, "compute: 0.0860 s per step per rank") {
		t.Errorf("--compression fp16: status %d, stderr %s, output:\n%s", code, errs, out)
	}
	// another rank than the run's: its compute from FLOPs
	code, out, errs = nmt(t, dir, "", "plan", "--from-run", run, "--powersgd-rank", "4")
	if code != 0 || !strings.Contains(out, "compression: powersgd, rank 4") || !strings.Contains(out, "from FLOPs") {
		t.Errorf("--powersgd-rank 4: status %d, stderr %s, output:\n%s", code, errs, out)
	}
}

// The planner's PowerSGD is the compressor's: the same default rank and
// minimum compression rate, and for every preset at ranks 1 to 64 the
// same matrices compressed with the same columns (fusion's Bucketer given
// each parameter as its first dimension x the rest, as plan.AsMatrix).
func TestPowerSGDMatchesCompressor(t *testing.T) {
	if plan.DefaultPowerSGDRank != fusion.DefaultPowerSGDRank || plan.PowerSGDMinCompressionRate != fusion.DefaultPowerSGDMinRate {
		t.Errorf("plan's rank %d and rate %v, fusion's %d and %v", plan.DefaultPowerSGDRank, float64(plan.PowerSGDMinCompressionRate),
			fusion.DefaultPowerSGDRank, float64(fusion.DefaultPowerSGDMinRate))
	}
	comm, err := collective.New(ranktest.InMemory(1, 1)[0], collective.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer comm.Close()
	for _, preset := range []string{"tiny", "small", "base", "big"} {
		cfg, err := transformer.Preset(preset, 32768)
		if err != nil {
			t.Fatal(err)
		}
		params, err := transformer.ParamList(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range []int{1, 4, 16, 64} {
			var infos []fusion.ParamInfo
			var shapes [][]int
			total := 0
			for _, p := range params {
				total += p.Len
				info := fusion.ParamInfo{Name: p.Name, Len: p.Len}
				if n, m, ok := plan.AsMatrix(p.Shape); ok {
					info.Rows, info.Cols = n, m
				}
				infos = append(infos, info)
				shapes = append(shapes, p.Shape)
			}
			bk, err := fusion.NewBucketer(comm, infos, fusion.BucketConfig{PowerSGD: &fusion.PowerSGD{Rank: r}})
			if err != nil {
				t.Fatal(err)
			}
			var pq int
			for _, m := range bk.PowerSGDMatrices() {
				pq += 4 * (m.Rows + m.Cols) * m.Rank
			}
			ps, err := plan.NewPowerSGD(shapes, []int{4 * total}, r)
			if err != nil {
				t.Fatal(err)
			}
			mats, _, _, _ := ps.Totals()
			if mats != len(bk.PowerSGDMatrices()) || ps.Buckets[0].PBytes+ps.Buckets[0].QBytes != pq {
				t.Errorf("%s at rank %d: the plan compresses %d matrices into %d bytes of P and Q, the compressor %d into %d",
					preset, r, mats, ps.Buckets[0].PBytes+ps.Buckets[0].QBytes, len(bk.PowerSGDMatrices()), pq)
			}
		}
	}
}

// measurePowerSGD times every matrix the compressor compresses, as plan
// counts them, and nothing else: tiny's 33 at rank 4 (the embedding, 6 in
// each encoder layer, 10 in each decoder layer), 9 at rank 20 (64 x 64 no
// longer shrinks enough). How long it takes is not checked.
func TestMeasurePowerSGD(t *testing.T) {
	cfg, err := transformer.Preset("tiny", 1000)
	if err != nil {
		t.Fatal(err)
	}
	params, err := transformer.ParamList(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var shapes [][]int
	total := 0
	for _, p := range params {
		shapes = append(shapes, p.Shape)
		total += p.Len
	}
	for _, r := range []int{1, 4, 20} {
		ps, err := plan.NewPowerSGD(shapes, []int{4 * total}, r)
		if err != nil {
			t.Fatal(err)
		}
		want, _, _, _ := ps.Totals()
		sec, mats, err := measurePowerSGD(shapes, r, 1, 1)
		if err != nil || mats != want || !(sec > 0) {
			t.Errorf("rank %d: %v s for %d matrices, %v; want %d matrices timed", r, sec, mats, err, want)
		}
	}
	if _, _, err := measurePowerSGD(shapes, 4, 0, 1); err == nil {
		t.Error("0 threads: no error")
	}
}
