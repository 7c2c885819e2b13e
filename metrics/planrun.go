package metrics

import (
	"fmt"
	"math"
	"strings"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/plan"
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
}

// Own is one rank's own work per step: compute less the token-count wait.
func (s StepTimes) Own() float64 { return s.Compute - s.Sync }

// MeasureSteps averages the train records of a run of world ranks from
// the from-th on (1 leaves the first interval, the warm-up, out).
func MeasureSteps(recs []Record, world, from int) StepTimes {
	st := StepTimes{Skipped: from}
	var owns, sds []float64
	var tokens float64
	i := 0
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
func MeasureRun(recs []Record, world int) StepTimes {
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
// run from before they were recorded), its wire type and overlap.
func RunWorkload(ri RunInfo, st StepTimes) plan.Workload {
	w := plan.Workload{Params: ri.Params, Buckets: ri.Buckets, HeadBytes: 4 * ri.Vocab * ri.DModel,
		ComputeS: st.Own(), ComputeSD: st.OwnSD, BackwardS: st.Backward, Threads: ri.Threads,
		TokensPerRank: st.Tokens, Wire: WireType(ri.Compression), Overlap: ri.Overlap == nil || *ri.Overlap}
	if len(w.Buckets) == 0 {
		w.Buckets = []int{int(4 * ri.Params)}
	}
	if w.BackwardS > w.ComputeS {
		w.BackwardS = 0
	}
	return w
}

// WireType is the gradients' type on the wire for --compression.
func WireType(compression string) collective.DType {
	switch compression {
	case "none":
		return collective.Float32
	case "bf16":
		return collective.BFloat16
	}
	return collective.Float16
}

// RunCluster is the cluster a run ran on: its hosts and ranks per host
// (flat, a host per rank, when the hosts hold different numbers), its
// link (LabLinkGbps when unknown), the cores of rank 0's host and the
// threads per rank, a GPU when it trained on one.
func RunCluster(ri RunInfo) plan.Cluster {
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
func WhatIf(ri RunInfo, st StepTimes) []string {
	if why := st.WhyNotEnough(); why != "" {
		return []string{"Predictions: **not enough data**: " + why + "."}
	}
	w := RunWorkload(ri, st)
	c := RunCluster(ri)
	var out []string
	if p, err := plan.Predict(c, w); err == nil {
		out = append(out, fmt.Sprintf("*Prediction* for this run's own configuration (%s): **%.3f s** per step; it measured %s s.",
			layout(c), p.StepS, fmtNum(st.Step, "%.3f")))
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
	return fmt.Sprintf("%s x %s", plural(c.Hosts, "host"), plural(c.PerHost, "rank"))
}
