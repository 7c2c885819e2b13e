package report

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/gorun/gorun/metrics"
	"github.com/gorun/gorun/plan"
)

// The lab: Transformer-base (60,880,896 parameters) on 4 ranks over 1 Gbit/s.
// The least time: 2*3/4 * 4 B * 60.88e6 / 125e6 B/s = 2.922 s with fp32,
// half of that with fp16. The planner, for a run from before run.json
// recorded its buckets (one allreduce of every gradient): 4 hosts of one
// rank run the ring (Auto on the link's model takes it above a few hundred
// kB), which moves that least time's bytes, plus 2 x 3 steps of QUIC's
// cost (the link limits both transports to 0.125 GB/s, so auto keeps
// QUIC: TLS/TCP would need to move more than 1.1 times as much). 2 hosts
// of 2 ranks run the hierarchical allreduce: within each host a
// reduce-scatter and an allgather in the group segment, one shm
// allreduce's cost (2 x 3 µs + 121.76 MB / 3.0 GB/s), and, across the
// hosts, a ring of 2 on each local rank's half (60.88 MB at half the
// link: 0.974 s, plus 2 steps).
func TestBottleneckLab(t *testing.T) {
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-4 {
			t.Errorf("%s = %.5f, want %.5f", what, got, want)
		}
	}
	ri := metrics.RunInfo{Params: 60880896, WorldSize: 4, LinkGbps: 1, LinkSource: "flag", Compression: "fp16"}
	b := AnalyzeBottleneck(ri, StepTimes{Compute: 1.4})
	near("fp32 bound", b.MinCommFP32, 2.92228)
	near("fp16 bound", b.MinCommFP16, 1.46114)
	step := plan.QUIC.StepUs / 1e6
	near("fp16 prediction, 4 hosts", b.CommFP16, 2*3*step+1.5*121.761792e6/125e6)
	near("fp32 prediction, 4 hosts", b.CommFP32, 2*3*step+1.5*243.523584e6/125e6)
	if b.Verdict != "network-bound" || len(b.Pred.Buckets) != 1 || b.Pred.Buckets[0].Algorithm != "ring" {
		t.Errorf("4 hosts, 1.462 s of fp16 ring against 1.4 s of compute: verdict %q, buckets %+v", b.Verdict, b.Pred.Buckets)
	}
	if v := AnalyzeBottleneck(ri, StepTimes{Compute: 1.5}).Verdict; v != "compute-bound" {
		t.Errorf("4 hosts, 1.5 s of compute: verdict %q", v)
	}
	s := b.String()
	for _, want := range []string{"2.922 s with fp32", "1 Gbit/s link (given with --link-gbps)", "predicted allreduce time per step: 2.923 s with fp32, 1.462 s with fp16",
		"the largest by ring over QUIC at 0.125 GB/s each way, the link limits", "verdict: network-bound (communication needs at least 104 % of the compute time with fp16", "predicted to take 104 % of the compute time)"} {
		if !strings.Contains(s, want) {
			t.Errorf("the analysis lacks %q:\n%s", want, s)
		}
	}
	// Two hosts of two: hierarchical, half the bytes across the link.
	ri.Hosts = []string{"a", "a", "b", "b"}
	h := AnalyzeBottleneck(ri, StepTimes{Compute: 1.4})
	local := (2*plan.ShmGroup.StepUs)/1e6 + 121.761792e6/(plan.ShmGroup.CapGBs*1e9)
	near("fp16 prediction, 2 x 2", h.CommFP16, local+2*step+60.880896e6/62.5e6)
	if h.Verdict != "compute-bound" || !h.Pred.Buckets[0].Hierarchical {
		t.Errorf("2 x 2: verdict %q, buckets %+v", h.Verdict, h.Pred.Buckets)
	}
	// An unknown link (0) is the lab's, said to be assumed.
	ri.Hosts, ri.LinkGbps, ri.LinkSource = nil, 0, ""
	u := AnalyzeBottleneck(ri, StepTimes{Compute: 1.4})
	if u.LinkGbps != LabLinkGbps || u.MinCommFP16 != b.MinCommFP16 || u.CommFP16 != b.CommFP16 || !strings.Contains(u.String(), "1 Gbit/s link (unknown: the lab's link assumed") {
		t.Errorf("unknown link: %+v\n%s", u, u)
	}
	// The verdict is for the run's wire type: fp32 gradients (compression
	// none) take 2.923 s, more than 2.9 s of compute; fp16 ones do not.
	ri.LinkGbps, ri.Compression = 1, "none"
	if v := AnalyzeBottleneck(ri, StepTimes{Compute: 2.9}).Verdict; v != "network-bound" {
		t.Errorf("fp32 on the wire, 2.9 s of compute: verdict %q", v)
	}
	ri.Compression = "fp16"
	if v := AnalyzeBottleneck(ri, StepTimes{Compute: 2.9}).Verdict; v != "compute-bound" {
		t.Errorf("fp16 on the wire, 2.9 s of compute: verdict %q", v)
	}
	// One rank: nothing to exchange.
	if v := AnalyzeBottleneck(metrics.RunInfo{Params: 1000, WorldSize: 1}, StepTimes{Compute: 1}).Verdict; !strings.Contains(v, "one rank") {
		t.Errorf("one rank: verdict %q", v)
	}
}

// MeasureSteps: the intervals after the warm-up, compute less the
// token-count wait, and the spread from step to step: the intervals' own
// (compute_sd_s) pooled with that of their means.
func TestMeasureStepsAndWhatIf(t *testing.T) {
	var recs []metrics.Record
	for i, c := range []float64{0.5, 0.6, 0.7} {
		recs = append(recs, metrics.Record{Kind: "train", Step: int64(10 * (i + 1)), Values: map[string]float64{
			"step_time_s": 0.8, "compute_s": c, "sync_s": 0.1, "backward_s": 0.3, "compute_sd_s": 0.03 + 0.01*float64(i), "tokens_per_s": 1000}})
	}
	recs = append(recs, metrics.Record{Kind: "eval", Step: 30, Values: map[string]float64{"loss": 1}})
	st := MeasureSteps(recs, 2, 1)
	if st.Intervals != 2 || math.Abs(st.Own()-0.55) > 1e-12 || math.Abs(st.Step-0.8) > 1e-12 || math.Abs(st.Tokens-400) > 1e-9 {
		t.Errorf("%+v: want 2 intervals, own compute 0.55 s, step 0.8 s, 400 tokens a rank", st)
	}
	// sqrt((0.04² + 0.05²)/2 + (0.05² + 0.05²)/2)
	if want := math.Sqrt(0.00205 + 0.0025); math.Abs(st.OwnSD-want) > 1e-12 {
		t.Errorf("OwnSD %v, want %v", st.OwnSD, want)
	}
	ri := metrics.RunInfo{Params: 1e6, WorldSize: 2, Hosts: []string{"a", "b"}, LinkGbps: 1, Compression: "fp16", Threads: 1, CPUs: 1,
		Buckets: []int{1 << 20, 3 << 20}, Vocab: 1000, DModel: 64}
	lines := WhatIf(ri, st)
	w, err := RunWorkload(ri, st)
	if err != nil {
		t.Fatal(err)
	}
	own, err := plan.Predict(RunCluster(ri), w)
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) != 3 || !strings.Contains(lines[0], fmt.Sprintf("own configuration (2 hosts x 1 rank): **%.3f s** per step; it measured 0.800 s.", own.StepS)) ||
		!strings.Contains(lines[1], "twice the hosts (4 hosts x 1 rank, the same 1 Gbit/s link)") || !strings.Contains(lines[2], "ten times faster (2 hosts x 1 rank, 10 Gbit/s)") {
		t.Errorf("what if:\n%s", strings.Join(lines, "\n"))
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "*Prediction*") {
			t.Errorf("a line not marked as a prediction: %s", l)
		}
	}
	// one host: the link line asks about twice the hosts on a faster link
	ri.Hosts = []string{"a", "a"}
	if l := WhatIf(ri, st); !strings.Contains(l[2], "ten times faster (2 hosts x 2 ranks, 10 Gbit/s)") {
		t.Errorf("one host: %s", l[2])
	}
	if l := WhatIf(ri, StepTimes{}); len(l) != 1 || strings.Contains(l[0], "*Prediction*") {
		t.Errorf("no compute logged: %v", l)
	}
}

// MeasureRun leaves the warm-up interval out (with three or more) and
// counts the steps its intervals cover, from the start records on;
// WhyNotEnough refuses fewer than minSamples timed steps, as the report
// refuses a correlation of fewer logged intervals, and a spread as large
// as the mean.
func TestMeasureRunEnough(t *testing.T) {
	rec := func(kind string, step int64, compute, sd float64) metrics.Record {
		return metrics.Record{Kind: kind, Step: step, Values: map[string]float64{"step_time_s": compute, "compute_s": compute, "compute_sd_s": sd}}
	}
	// a run of 3 steps logged every step: 2 timed after the warm-up
	short := []metrics.Record{rec("start", 0, 0, 0), rec("train", 1, 0.15, 0), rec("train", 2, 0.05, 0), rec("train", 3, 0.1, 0)}
	st := MeasureRun(short, 2)
	if st.Steps != 2 || st.Intervals != 2 || st.Skipped != 1 {
		t.Errorf("3 steps: %+v: want 2 steps in 2 intervals after 1 left out", st)
	}
	if why := st.WhyNotEnough(); why != "2 step(s) timed after the first logged interval (the warm-up); a prediction needs at least 8 (a longer run: --max-steps)" {
		t.Errorf("3 steps: %q", why)
	}
	// logged every 10 steps, resumed from step 20: 10 + 10 steps after the
	// first interval, whatever the first log line's step
	long := []metrics.Record{rec("start", 0, 0, 0), rec("train", 10, 0.5, 0.01), rec("train", 20, 0.1, 0.01), rec("stop", 20, 0, 0),
		rec("start", 20, 0, 0), rec("train", 30, 0.1, 0.01)}
	if st := MeasureRun(long, 1); st.Steps != 20 || st.WhyNotEnough() != "" {
		t.Errorf("30 steps: %+v, %q: want 20 steps timed, enough", st, st.WhyNotEnough())
	}
	// two intervals: none left out
	if st := MeasureRun(long[:3], 1); st.Steps != 20 || st.Skipped != 0 || st.WhyNotEnough() != "" {
		t.Errorf("20 steps in 2 intervals: %+v, %q", st, st.WhyNotEnough())
	}
	// enough steps, but a spread as large as the mean
	wild := []metrics.Record{rec("train", 10, 0.1, 0), rec("train", 20, 0.1, 0.2), rec("train", 30, 0.1, 0.2)}
	if why := MeasureRun(wild, 1).WhyNotEnough(); !strings.HasPrefix(why, "the compute time of a step varied as much as its mean (sd 0.200 s of 0.100 s)") {
		t.Errorf("spread 2x the mean: %q", why)
	}
	if !strings.Contains(WhatIf(metrics.RunInfo{Params: 1000, WorldSize: 2}, MeasureRun(short, 2))[0], "**not enough data**") {
		t.Errorf("what if of 3 steps: %v", WhatIf(metrics.RunInfo{Params: 1000, WorldSize: 2}, MeasureRun(short, 2)))
	}
}

// The trainer's last line (AnalyzeBottleneck of its own totals, no
// counts of steps) for the lab's cluster with GPUs: Transformer-base on 2
// hosts x 2 ranks at 1 Gbit/s, 0.25 s of compute, is network-bound with
// fp16 and says what PowerSGD at the default rank would give, marked as a
// prediction: its bytes (P and Q 4 B x 4 x the 168,448 rows and columns
// of the 97 matrices, and the 63,488 other parameters in fp16), its
// allreduces as the planner times them, and the compressor's 6nmr + 3nm
// + 2(n+m)r² over the 60,817,408 elements, 100,352 rows and 68,096
// columns, 6.107 GFLOP, at the step's rate of FLOPs (6 x parameters x
// 4096 batch tokens in 0.25 s).
func TestBottleneckPowerSGD(t *testing.T) {
	buckets := []int{4200448, 26253312, 28348416, 29396992, 29405184, 29405184, 26255360, 3149824, 67108864}
	ri := metrics.RunInfo{Preset: "base", Params: 60880896, DModel: 512, Vocab: 32768, WorldSize: 4, Hosts: []string{"a", "a", "b", "b"},
		BatchTokens: 4096, LinkGbps: 1, LinkSource: "probe", Compression: "fp16", Buckets: buckets, Device: "cuda:0"}
	b := AnalyzeBottleneck(ri, StepTimes{Compute: 0.25, Sync: 0.002, Backward: 0.16})
	if b.Verdict != "network-bound" || b.PowerSGD == nil || b.PowerSGDPlan == nil {
		t.Fatalf("verdict %q, PowerSGD %v (%s)", b.Verdict, b.PowerSGD, b.PowerSGDNone)
	}
	if b.PowerSGD.WireBytes != 10907648 || b.Pred.WireBytes != 121761792 {
		t.Errorf("%d bytes a step with PowerSGD, %d with fp16; want 10,907,648 and 121,761,792", b.PowerSGD.WireBytes, b.Pred.WireBytes)
	}
	if got, want := b.PowerSGD.CompressS, 0.25*6107168768/(6*60880896*4096.0); math.Abs(got-want) > 1e-12 {
		t.Errorf("the compressor's compute %v s, want %v", got, want)
	}
	s := b.String()
	for _, want := range []string{
		"\n  prediction, not a measurement: with --compression powersgd at the default rank 16: the gradients would be 10.908 MB a step on the wire instead of 121.762 MB with fp16 (11x less)",
		fmt.Sprintf("their allreduces %.3f s and the compressor's compute %.4f s (from FLOPs: 6.11 GFLOP", b.PowerSGD.CommS, b.PowerSGD.CompressS),
		fmt.Sprintf("the step %.3f s against %.3f s predicted for this run: compute-bound.", b.PowerSGD.StepS, b.Pred.StepS),
	} {
		if !strings.Contains(s, want) {
			t.Errorf("the analysis lacks %q:\n%s", want, s)
		}
	}
	// the trainer's totals count no steps: no PowerSGD measurement line
	if strings.Contains(s, "not enough data") || strings.Contains(s, "PowerSGD (rank") {
		t.Errorf("the trainer's line:\n%s", s)
	}
	// compute-bound with fp16 (5 s of compute): no prediction
	if s := AnalyzeBottleneck(ri, StepTimes{Compute: 5}).String(); strings.Contains(s, "powersgd") {
		t.Errorf("compute-bound: %s", s)
	}
	// a PowerSGD run: its own verdict with PowerSGD, and, given the
	// trainer's PowerSGD totals, what it saved
	ri.Compression, ri.PowerSGDRank, ri.PowerSGDStartStep = "powersgd", 4, 100
	st := StepTimes{Compute: 0.25, PowerSGDSteps: 900, PowerSGDBytes: 2695168, PowerSGDFP16Bytes: 121634816, PowerSGDCompute: 0.003}
	p := AnalyzeBottleneck(ri, st)
	if p.Verdict != "compute-bound" || p.PowerSGD == nil || p.Pred.WireBytes != 2822144 || p.Comm() != p.PowerSGD.CommS {
		t.Errorf("PowerSGD run: verdict %q, %d bytes", p.Verdict, p.Pred.WireBytes)
	}
	for _, want := range []string{"0.023 s with powersgd", "this run sent powersgd",
		"\n  PowerSGD (rank 4, from step 100) all-reduced P and Q of 97 matrices, 2.695 MB a step (powersgd_bytes, the mean of 900 steps), where fp16 sends 121.635 MB for them (powersgd_fp16_bytes): 118.940 MB a step saved (45.1x less)",
		"its compute held the buckets up 3.0 ms a step (powersgd_compute_ms), 1.2 % of the 0.250 s a step computed."} {
		if !strings.Contains(p.String(), want) {
			t.Errorf("the PowerSGD run's analysis lacks %q:\n%s", want, p)
		}
	}
	if strings.Contains(p.String(), "prediction, not a measurement") {
		t.Errorf("a PowerSGD run is told what PowerSGD would give:\n%s", p)
	}
	// the shapes of an unknown preset: no verdict, and why
	ri.Preset = "huge"
	if v := AnalyzeBottleneck(ri, st).Verdict; !strings.HasPrefix(v, "unknown (the parameters' shapes: unknown preset") {
		t.Errorf("unknown preset: verdict %q", v)
	}
}
