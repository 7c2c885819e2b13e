package report

import (
	"fmt"
	"math"
	"strings"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/fusion"
	"github.com/gorun/gorun/internal/words"
	"github.com/gorun/gorun/metrics"
	"github.com/gorun/gorun/plan"
	"github.com/gorun/gorun/transformer"
)

// StepTimes is what a run measured of its steps (seconds, means over the
// logged intervals used; zero when not recorded).
type StepTimes struct {
	Intervals int
	// Steps: the optimizer steps the intervals used cover; Skipped: the
	// logged intervals left out at the start (the warm-up).
	Steps    int64
	Skipped  int
	Step     float64 // step_time_s
	Compute  float64 // compute_s: the step less its exposed communication
	Sync     float64 // sync_s: of compute, the token-count allreduce (waiting for the slowest rank's forward)
	Backward float64 // backward_s
	// OwnSD: the standard deviation from step to step of compute less
	// sync (the intervals' own spreads, compute_sd_s, with the spread of
	// their means).
	OwnSD float64
	// Tokens: target tokens of one rank's step.
	Tokens float64
	// PowerSGD's own numbers (a run with --compression powersgd): of the
	// intervals used, those it compressed throughout (compressed): the
	// steps they cover, and the means of a step's P
	// and Q bytes, of the fp16 bytes the matrices they replace would have
	// been (0: not logged), of the compressor's compute (seconds) and of
	// the step time.
	PowerSGDSteps                    int64
	PowerSGDBytes, PowerSGDFP16Bytes float64
	PowerSGDCompute, PowerSGDStep    float64
}

// powerSGDFull is the largest MetricPowerSGDBytes the train records
// logged: a step's P and Q, the same every step PowerSGD compresses. The
// trainer averages an interval's values over all its steps, so an
// interval that straddles --powersgd-start-step logs less, and
// compressed leaves it out of PowerSGD's numbers.
func powerSGDFull(recs []metrics.Record) float64 {
	m := 0.0
	for _, r := range recs {
		if r.Kind == "train" {
			m = math.Max(m, r.Values[MetricPowerSGDBytes])
		}
	}
	return m
}

// compressed says whether the train record's values v are of an interval
// every step of which PowerSGD compressed (full: powerSGDFull).
func compressed(v map[string]float64, full float64) bool {
	b := v[MetricPowerSGDBytes]
	return b > 0 && b >= full*(1-1e-9)
}

// The values the trainer logs in its train records for the steps PowerSGD
// compressed (fusion.PowerSGDStats of each step; the means over all of
// the interval's steps, 0 before --powersgd-start-step).
const (
	// MetricPowerSGDBytes: the float32 bytes of P and Q that one rank
	// all-reduced in a step (PowerSGDStats.Bytes: the buffers, not the
	// traffic, which the algorithm multiplies; the tensors left
	// uncompressed go in the ordinary fp16 allreduces besides).
	MetricPowerSGDBytes = "powersgd_bytes"
	// MetricPowerSGDFP16Bytes: the bytes the compressed matrices would
	// have been all-reduced as in fp16 (PowerSGDStats.FP16Bytes).
	MetricPowerSGDFP16Bytes = "powersgd_fp16_bytes"
	// MetricPowerSGDComputeMS: the time in ms the compressor's work held
	// a step's buckets up (PowerSGDStats.Compute: its products,
	// orthonormalisations and error feedback).
	MetricPowerSGDComputeMS = "powersgd_compute_ms"
)

// Own is one rank's own work per step: compute less the token-count wait.
func (s StepTimes) Own() float64 { return s.Compute - s.Sync }

// MeasureSteps averages the train records of a run of world ranks from
// the from-th on (1 leaves the first interval, the warm-up, out).
func MeasureSteps(recs []metrics.Record, world, from int) StepTimes {
	st := StepTimes{Skipped: from}
	full := powerSGDFull(recs)
	var owns, sds []float64
	var tokens float64
	i, psgd := 0, 0
	var prev int64 // the step the interval starts after
	for _, r := range recs {
		if r.Kind == "start" {
			prev = r.Step
		}
		if r.Kind != "train" {
			continue
		}
		i++
		steps := max(r.Step-prev, 0)
		prev = r.Step
		if i <= from {
			continue
		}
		v := r.Values
		st.Intervals++
		st.Steps += steps
		st.Step += v["step_time_s"]
		st.Compute += v["compute_s"]
		st.Sync += v["sync_s"]
		st.Backward += v["backward_s"]
		tokens += v["tokens_per_s"] * v["step_time_s"]
		owns = append(owns, v["compute_s"]-v["sync_s"])
		sds = append(sds, v["compute_sd_s"])
		if compressed(v, full) {
			psgd++
			st.PowerSGDSteps += steps
			st.PowerSGDBytes += v[MetricPowerSGDBytes]
			st.PowerSGDFP16Bytes += v[MetricPowerSGDFP16Bytes]
			st.PowerSGDCompute += v[MetricPowerSGDComputeMS] / 1000
			st.PowerSGDStep += v["step_time_s"]
		}
	}
	if psgd > 0 {
		n := float64(psgd)
		st.PowerSGDBytes, st.PowerSGDFP16Bytes, st.PowerSGDCompute, st.PowerSGDStep = st.PowerSGDBytes/n, st.PowerSGDFP16Bytes/n, st.PowerSGDCompute/n, st.PowerSGDStep/n
	}
	if st.Intervals == 0 {
		return st
	}
	n := float64(st.Intervals)
	st.Step, st.Compute, st.Sync, st.Backward = st.Step/n, st.Compute/n, st.Sync/n, st.Backward/n
	st.Tokens = tokens / n / float64(max(world, 1))
	var within, between float64
	for k := range owns {
		within += sds[k] * sds[k]
		between += (owns[k] - st.Own()) * (owns[k] - st.Own())
	}
	st.OwnSD = math.Sqrt(within/n + between/n)
	return st
}

// MeasureRun is a run's step times as the report's predictions and
// `nmt-train plan --from-run` take them: the logged intervals after the
// first (its steps warm up: allocation, the first batches) when there are
// three or more, else all of them. WhyNotEnough says whether they
// suffice.
func MeasureRun(recs []metrics.Record, world int) StepTimes {
	trains := 0
	for _, r := range recs {
		if r.Kind == "train" {
			trains++
		}
	}
	from := 0
	if trains >= 3 {
		from = 1
	}
	return MeasureSteps(recs, world, from)
}

// WhyNotEnough says why st is not enough data to predict from ("" when
// it is): the rule of the report's other "not enough data" answers
// (notEnough: fewer than minSamples samples, here timed steps), and a
// spread from step to step as large as the mean itself, which a run that
// had not settled shows (a mean known no better than that predicts
// nothing).
func (st StepTimes) WhyNotEnough() string {
	after := ""
	if st.Skipped > 0 {
		after = " after the first logged interval (the warm-up)"
	}
	if why := notEnough(int(st.Steps), "step(s) timed"+after, "a prediction", "a longer run: --max-steps"); why != "" {
		return why
	}
	if !(st.Own() > 0) {
		return "no compute time was logged"
	}
	if st.OwnSD >= st.Own() {
		return fmt.Sprintf("the compute time of a step varied as much as its mean (sd %.3f s of %.3f s): the run had not settled (a longer run: --max-steps)", st.OwnSD, st.Own())
	}
	return ""
}

// RunWorkload is a run's step as the planner takes it: its own compute
// and spread, its backward pass, its buckets (one of every gradient for a
// run from before they were recorded), its wire type and overlap; for a
// run that compressed with PowerSGD, PowerSGD at its rank (RunPowerSGD),
// and as its compute the run's less the compressor's, which the plan
// adds back as PowerSGD's (the trainer's compute_s is taken to include
// the compressor's work, which runs on the training cores or device).
func RunWorkload(ri metrics.RunInfo, st StepTimes) (plan.Workload, error) {
	w := plan.Workload{Params: ri.Params, Buckets: ri.Buckets, HeadBytes: 4 * ri.Vocab * ri.DModel,
		ComputeS: st.Own(), ComputeSD: st.OwnSD, BackwardS: st.Backward, Threads: ri.Threads,
		TokensPerRank: st.Tokens, Wire: WireType(ri.Compression), Overlap: ri.Overlap == nil || *ri.Overlap}
	if len(w.Buckets) == 0 {
		w.Buckets = []int{int(4 * ri.Params)}
	}
	if ri.Compression == "powersgd" && st.PowerSGDCompute > 0 && st.PowerSGDCompute < w.ComputeS {
		w.ComputeS -= st.PowerSGDCompute
	}
	if w.BackwardS > w.ComputeS {
		w.BackwardS = 0
	}
	if ri.Compression == "powersgd" {
		ps, _, err := RunPowerSGD(ri, w, st, ri.PowerSGDRank)
		if err != nil {
			return w, err
		}
		w.PowerSGD = ps
	}
	return w, nil
}

// RunShapes is the shapes of a run's parameters in the order its model
// registers them: its preset with its vocabulary (run.json's, or for a
// run from before it was recorded the one that gives its parameter
// count).
func RunShapes(ri metrics.RunInfo) ([][]int, error) {
	count := func(cfg transformer.Config) ([]transformer.Param, int64, error) {
		ps, err := transformer.ParamList(cfg)
		n := int64(0)
		for _, p := range ps {
			n += int64(p.Len)
		}
		return ps, n, err
	}
	vocab := ri.Vocab
	if vocab <= 0 {
		probe, err := transformer.Preset(ri.Preset, 1000)
		if err != nil {
			return nil, fmt.Errorf("the parameters' shapes: %w", err)
		}
		_, n, err := count(probe)
		if err != nil {
			return nil, fmt.Errorf("the parameters' shapes: %w", err)
		}
		vocab = int((ri.Params - (n - int64(1000*probe.DModel))) / int64(probe.DModel))
	}
	cfg, err := transformer.Preset(ri.Preset, vocab)
	if err != nil {
		return nil, fmt.Errorf("the parameters' shapes: %w", err)
	}
	ps, n, err := count(cfg)
	if err != nil {
		return nil, fmt.Errorf("the parameters' shapes: %w", err)
	}
	if ri.Params > 0 && n != ri.Params {
		return nil, fmt.Errorf("the parameters' shapes: preset %s with %d ids has %d parameters, the run %d", ri.Preset, vocab, n, ri.Params)
	}
	shapes := make([][]int, len(ps))
	for i, p := range ps {
		shapes[i] = p.Shape
	}
	return shapes, nil
}

// RunPowerSGD is PowerSGD of rank r (0: the run's, else
// plan.DefaultPowerSGDRank) on a run's parameters in w's buckets, with
// the compressor's compute per step: the run's own measurement where it
// compressed at that rank (st.PowerSGDCompute), else from FLOPs: the
// compressor's FLOPs at the rate the run's steps ran at (w's compute for
// 6 x parameters x the padded batch tokens, or the target tokens of a run
// that did not record them), a lower bound (plan.ComputeFromFLOPs). how
// says which, for the reader.
func RunPowerSGD(ri metrics.RunInfo, w plan.Workload, st StepTimes, r int) (*plan.PowerSGD, string, error) {
	if r <= 0 {
		r = ri.PowerSGDRank
	}
	if r <= 0 {
		r = plan.DefaultPowerSGDRank
	}
	shapes, err := RunShapes(ri)
	if err != nil {
		return nil, "", err
	}
	ps, err := plan.NewPowerSGD(shapes, w.Buckets, r)
	if err != nil {
		return nil, "", err
	}
	ps.StartStep = ri.PowerSGDStartStep
	runRank := ri.PowerSGDRank
	if runRank <= 0 {
		runRank = plan.DefaultPowerSGDRank
	}
	if ri.Compression == "powersgd" && runRank == r && st.PowerSGDCompute > 0 {
		ps.ComputeS = st.PowerSGDCompute
		return ps, fmt.Sprintf("measured by the run (%s, a mean over %s)", MetricPowerSGDComputeMS, words.Plural(int(st.PowerSGDSteps), "step")), nil
	}
	tokens, what := float64(ri.BatchTokens), "padded batch tokens"
	if tokens <= 0 {
		tokens, what = w.TokensPerRank, "target tokens"
	}
	step := plan.StepFLOPs(w.Params, tokens)
	ps.ComputeS = plan.ComputeFromFLOPs(w.ComputeS, ps.FLOPs(), step)
	return ps, fmt.Sprintf("from FLOPs: %.3g GFLOP of the compressor at the rate of the step's 6 x %s parameters x %.0f %s = %.4g TFLOP in %.3f s; a lower bound, its thin products are bound by memory",
		ps.FLOPs()/1e9, Commas(w.Params), tokens, what, step/1e12, w.ComputeS), nil
}

// WireType is the gradients' type on the wire for a run's --compression
// (run.json's): fusion.ParseWire's, and fp16 for powersgd (its other
// gradients' wire) and for a run that recorded none.
func WireType(compression string) dtype.DType {
	if w, err := fusion.ParseWire(compression); err == nil && compression != "" {
		return w
	}
	return dtype.Float16
}

// RunCluster is the cluster a run ran on: its hosts and ranks per host
// (flat, a host per rank, when the hosts hold different numbers), its
// link (LabLinkGbps when unknown), the cores of rank 0's host and the
// threads per rank, a GPU when it trained on one.
func RunCluster(ri metrics.RunInfo) plan.Cluster {
	hosts := UniqueHosts(ri.Hosts)
	c := plan.Cluster{Hosts: max(1, ri.WorldSize), PerHost: 1, LinkGbps: ri.LinkGbps, CoresPerHost: ri.CPUs,
		ThreadsPerRank: ri.Threads, Transport: "auto", GPU: strings.HasPrefix(ri.Device, "cuda")}
	if ri.WorldSize > 0 && len(ri.Hosts) == ri.WorldSize && ri.WorldSize%len(hosts) == 0 {
		per := map[string]int{}
		for _, h := range ri.Hosts {
			per[h]++
		}
		same := true
		for _, h := range hosts {
			same = same && per[h] == ri.WorldSize/len(hosts)
		}
		if same {
			c.Hosts, c.PerHost = len(hosts), ri.WorldSize/len(hosts)
		}
	}
	if !(c.LinkGbps > 0) {
		c.LinkGbps = LabLinkGbps
	}
	return c
}

// WhatIf is the report's closing predictions: the run as the planner
// models it, beside what it measured, then twice the hosts, then a link
// ten times faster. Each line says it is a prediction.
func WhatIf(ri metrics.RunInfo, st StepTimes) []string {
	if why := st.WhyNotEnough(); why != "" {
		return []string{"Predictions: **not enough data**: " + why + "."}
	}
	w, err := RunWorkload(ri, st)
	if err != nil {
		return []string{fmt.Sprintf("Predictions: none (%v).", err)}
	}
	c := RunCluster(ri)
	var out []string
	if p, err := plan.Predict(c, w); err == nil {
		measured := fmtNum(st.Step, "%.3f") + " s"
		if w.PowerSGD != nil && st.PowerSGDSteps > 0 && st.PowerSGDSteps < st.Steps {
			measured += fmt.Sprintf(", %s s over the %s PowerSGD compressed (the plan is of those)", fmtNum(st.PowerSGDStep, "%.3f"), words.Plural(int(st.PowerSGDSteps), "step"))
		}
		out = append(out, fmt.Sprintf("*Prediction* for this run's own configuration (%s): **%.3f s** per step; it measured %s.",
			layout(c), p.StepS, measured))
	}
	twice := c
	twice.Hosts *= 2
	tenth := c
	if c.Hosts == 1 { // no link to speed up: the hosts doubled, on it
		tenth = twice
	}
	tenth.LinkGbps *= 10
	for _, k := range []struct {
		what string
		c    plan.Cluster
	}{{fmt.Sprintf("twice the hosts (%s, the same %.3g Gbit/s link)", layout(twice), c.LinkGbps), twice},
		{fmt.Sprintf("a link ten times faster (%s, %.3g Gbit/s)", layout(tenth), tenth.LinkGbps), tenth}} {
		p, err := plan.Predict(k.c, w)
		if err != nil {
			out = append(out, fmt.Sprintf("*Prediction* for %s: none (%v).", k.what, err))
			continue
		}
		line := fmt.Sprintf("*Prediction* for %s: **%.3f s** per step, %s target tokens/s, %.0f %% scaling efficiency against one device; %s",
			k.what, p.StepS, Commas(int64(math.Round(p.TokensPerSec))), 100*p.Efficiency, p.Verdict)
		if h := how(p); h != "" {
			line += " (the largest bucket: " + h + ")"
		}
		out = append(out, line+".")
	}
	return out
}

// how says how the largest gradient allreduce of p runs: "ring over
// TLS/TCP at 0.125 GB/s each way, the link limits"; "" when nothing is
// exchanged.
func how(p plan.Prediction) string {
	if len(p.Buckets) == 0 {
		return ""
	}
	big := p.Buckets[0]
	for _, b := range p.Buckets {
		if b.WireBytes > big.WireBytes {
			big = b
		}
	}
	if p.Transport == "" {
		return big.Algorithm + " on one host"
	}
	limit := "the transport's CPU limits"
	if p.LinkBound {
		limit = "the link limits"
	}
	return fmt.Sprintf("%s over %s at %.3f GB/s each way, %s", big.Algorithm, plan.TransportLabel(p.Transport), p.RateGBs, limit)
}

// layout names a cluster's shape: "2 hosts x 2 ranks".
func layout(c plan.Cluster) string {
	return fmt.Sprintf("%s x %s", words.Plural(c.Hosts, "host"), words.Plural(c.PerHost, "rank"))
}
