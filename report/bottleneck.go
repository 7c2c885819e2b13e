package report

import (
	"fmt"
	"math"
	"strings"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/internal/words"
	"github.com/gorun/gorun/metrics"
	"github.com/gorun/gorun/plan"
)

// LabLinkGbps is the link between the lab's two VMs, assumed for the
// bottleneck analysis when a run's link is unknown (no --link-gbps, and
// no rank on a second host to probe).
const LabLinkGbps = 1.0

// Bottleneck is the answer to the lab's question "was the network the
// bottleneck?" for one run: the time the step's gradient allreduces take
// on the link, as gorun's planner predicts it (package plan: the
// algorithm Auto picks for each bucket, collective's cost model for the
// link), against the measured compute; beside it the least time any
// allreduce can take at the link's rate.
type Bottleneck struct {
	Params     int64   // trainable parameters (gradient elements)
	WorldSize  int     // ranks
	LinkGbps   float64 // link capacity per host, Gbit/s
	LinkSource string  // "flag" (--link-gbps), "probe", or "" (LabLinkGbps assumed)
	// Compression is the gradients' type on the wire ("fp16", "bf16" or
	// "none": fp32); the verdict is for it.
	Compression string
	ComputeSec  float64 // measured forward+backward+optimizer time per step
	MinCommFP32 float64 // seconds: 2(H-1)/H * 4 bytes * params / bandwidth across H hosts, the least any allreduce takes
	MinCommFP16 float64 // the same with fp16 (or bf16) on the wire
	// CommFP32, CommFP16: the planner's time of the step's gradient
	// allreduces, one after another, with fp32 and 16-bit gradients.
	CommFP32, CommFP16 float64
	// Pred is the planner's prediction of the run with its own wire type;
	// the verdict is its verdict.
	Pred    plan.Prediction
	Verdict string // "network-bound" or "compute-bound"
	// FP16Bytes: a step's gradient allreduces' bytes with fp16 on the
	// wire (the buffers: 2 bytes a parameter).
	FP16Bytes int
	// PowerSGD is the planner's prediction with PowerSGD: of the run
	// itself when it compressed with it (then Pred too), else, for a
	// network-bound run, what PowerSGD at plan.DefaultPowerSGDRank would
	// have given it (a what-if); nil when neither, PowerSGDNone then
	// saying why where a what-if was due (not enough data, ...).
	// PowerSGDHow says where its compute came from; MinCommPowerSGD is
	// its least allreduce time at the link's rate.
	PowerSGD                  *plan.Prediction
	PowerSGDHow, PowerSGDNone string
	MinCommPowerSGD           float64
	// PowerSGDPlan is the compression PowerSGD stands for (its matrices,
	// P's and Q's bytes).
	PowerSGDPlan *plan.PowerSGD
	// St is what the run measured (PowerSGD's logged bytes and compute).
	St StepTimes
	// ri is the run (its PowerSGD rank and start step).
	ri metrics.RunInfo
}

// AnalyzeBottleneck asks the planner how long the run's gradients take on
// its link (ri: the run's hosts, link, buckets, wire type; st: what it
// measured) and compares that with the measured compute. A run on one
// host is asked what a link between hosts would have done: a host per
// rank. An unknown link (0 Gbit/s) is the lab's, said to be assumed
// (LinkSource "").
func AnalyzeBottleneck(ri metrics.RunInfo, st StepTimes) Bottleneck {
	if ri.LinkGbps <= 0 {
		ri.LinkGbps, ri.LinkSource = LabLinkGbps, ""
	}
	b := Bottleneck{Params: ri.Params, WorldSize: ri.WorldSize, LinkGbps: ri.LinkGbps, LinkSource: ri.LinkSource,
		Compression: ri.Compression, ComputeSec: st.Compute, St: st, ri: ri, FP16Bytes: int(2 * ri.Params)}
	c := RunCluster(ri)
	if c.Hosts == 1 {
		c.Hosts, c.PerHost = c.PerHost, 1
	}
	c.CoresPerHost = 0 // the compute is taken as measured, the cores as they were
	b.Verdict = "compute-bound"
	if ri.WorldSize <= 1 {
		b.Verdict = "compute-bound (one rank: no gradient exchange)"
		return b
	}
	w, err := RunWorkload(ri, st)
	if err != nil {
		b.Verdict = "unknown (" + err.Error() + ")"
		return b
	}
	w.ComputeS = st.Compute // the verdict weighs the compute as measured (and printed)
	if w.BackwardS > w.ComputeS {
		w.BackwardS = 0
	}
	// every host's share of the sum leaves through its link and the
	// result comes back: 2(H-1)/H of the bytes, whatever the algorithm
	bytesPerSec := ri.LinkGbps * 1e9 / 8
	f := 2 * float64(c.Hosts-1) / float64(c.Hosts)
	b.MinCommFP32 = f * 4 * float64(ri.Params) / bytesPerSec
	b.MinCommFP16 = f * 2 * float64(ri.Params) / bytesPerSec
	if !(w.ComputeS > 0) {
		return b
	}
	own := w.PowerSGD
	w.PowerSGD = nil
	for _, wire := range []string{"none", "fp16", ri.Compression} {
		w.Wire = WireType(wire)
		if wire == "powersgd" {
			w.PowerSGD = own
		}
		p, err := plan.Predict(c, w)
		if err != nil {
			b.Verdict = "unknown (" + err.Error() + ")"
			return b
		}
		switch wire {
		case "none":
			b.CommFP32 = p.CommS
		case "fp16":
			b.CommFP16 = p.CommS
		}
		b.Pred = p
	}
	b.Verdict = b.Pred.Verdict
	if own != nil {
		b.PowerSGD, b.PowerSGDPlan = &b.Pred, own
		b.MinCommPowerSGD = f * float64(own.WireBytes(dtype.Float16)) / bytesPerSec
		return b
	}
	if b.Verdict != "network-bound" {
		return b
	}
	// What PowerSGD at the default rank would give: a prediction, from
	// enough measured steps by the rule of the report's other predictions
	// (a caller that counted none, the trainer's own totals, is taken as
	// it is).
	if st.Steps > 0 || st.Intervals > 0 {
		if why := st.WhyNotEnough(); why != "" {
			b.PowerSGDNone = "not enough data: " + why
			return b
		}
	}
	ps, how, err := RunPowerSGD(ri, w, st, plan.DefaultPowerSGDRank)
	if err != nil {
		b.PowerSGDNone = "none (" + err.Error() + ")"
		return b
	}
	w.PowerSGD, w.Wire = ps, dtype.Float16
	p, err := plan.Predict(c, w)
	if err != nil {
		b.PowerSGDNone = "none (" + err.Error() + ")"
		return b
	}
	b.PowerSGD, b.PowerSGDHow, b.PowerSGDPlan = &p, how, ps
	b.MinCommPowerSGD = f * float64(ps.WireBytes(dtype.Float16)) / bytesPerSec
	return b
}

// MinComm is the least allreduce time with the run's wire type.
func (b Bottleneck) MinComm() float64 {
	switch b.Compression {
	case "none":
		return b.MinCommFP32
	case "powersgd":
		return b.MinCommPowerSGD
	}
	return b.MinCommFP16
}

// powerSGDRank is the rank of b.PowerSGD: the run's own, or the
// default for a what-if.
func (b Bottleneck) powerSGDRank() int {
	if b.Compression == "powersgd" && b.ri.PowerSGDRank > 0 {
		return b.ri.PowerSGDRank
	}
	return plan.DefaultPowerSGDRank
}

// Comm is the planner's allreduce time with the run's wire type.
func (b Bottleneck) Comm() float64 { return b.Pred.CommS }

// wireName names the gradients' wire type.
func (b Bottleneck) wireName() string {
	switch b.Compression {
	case "none":
		return "fp32"
	case "":
		return "fp16"
	}
	return b.Compression
}

// linkNote says where the link's rate came from.
func (b Bottleneck) linkNote() string {
	switch b.LinkSource {
	case "flag":
		return "given with --link-gbps"
	case "probe":
		return "probed at start between rank 0 and a rank on another host"
	}
	return "unknown: the lab's link assumed; set --link-gbps"
}

// String prints the analysis in a few lines a student can read, the
// PowerSGD lines last (the trainer's final log line).
func (b Bottleneck) String() string {
	s := b.analysis()
	if l := b.PowerSGDMeasured(false); l != "" {
		s += "\n  " + l
	}
	if l := b.PowerSGDWhatIf(false); l != "" {
		s += "\n  " + l
	}
	return s
}

// analysis is String without the PowerSGD lines.
func (b Bottleneck) analysis() string {
	var s strings.Builder
	fmt.Fprintf(&s, "bottleneck analysis: %.1f M parameters, %d ranks, %.3g Gbit/s link (%s)\n", float64(b.Params)/1e6, b.WorldSize, b.LinkGbps, b.linkNote())
	ps := ""
	if b.Compression == "powersgd" && b.PowerSGD != nil {
		ps = fmt.Sprintf(", %.3f s with powersgd", b.MinCommPowerSGD)
	}
	if b.WorldSize > 1 {
		fmt.Fprintf(&s, "  least allreduce time per step: %.3f s with fp32 gradients, %.3f s with fp16%s (2(n-1)/n x bytes / bandwidth, n hosts)\n", b.MinCommFP32, b.MinCommFP16, ps)
		if b.Comm() > 0 {
			if ps != "" {
				ps = fmt.Sprintf(", %.3f s with powersgd (rank %d: %s a step on the wire)", b.Comm(), b.powerSGDRank(), mbs(b.PowerSGD.WireBytes))
			}
			fmt.Fprintf(&s, "  predicted allreduce time per step: %.3f s with fp32, %.3f s with fp16%s (gorun's cost model: %d bucket(s), the largest by %s)\n",
				b.CommFP32, b.CommFP16, ps, len(b.Pred.Buckets), how(b.Pred))
		}
	}
	fmt.Fprintf(&s, "  measured compute per step:     %.3f s\n", b.ComputeSec)
	fmt.Fprintf(&s, "  verdict: %s", b.Verdict)
	if b.WorldSize > 1 && b.ComputeSec > 0 {
		fmt.Fprintf(&s, " (communication needs at least %.0f %% of the compute time with fp16, %.0f %% with fp32; this run sent %s",
			100*b.MinCommFP16/b.ComputeSec, 100*b.MinCommFP32/b.ComputeSec, b.wireName())
		if b.Comm() > 0 {
			fmt.Fprintf(&s, ", predicted to take %.0f %% of the compute time", 100*b.Comm()/b.ComputeSec)
		}
		s.WriteString(")")
	}
	return s.String()
}

// matrices is "1 matrix", "97 matrices".
func matrices(n int) string {
	if n == 1 {
		return "1 matrix"
	}
	return fmt.Sprintf("%d matrices", n)
}

// mbs is bytes in MB.
func mbs(b int) string { return fmt.Sprintf("%.3f MB", float64(b)/1e6) }

// PowerSGDMeasured says, for a run that compressed with PowerSGD, the
// bytes it saved against fp16 and what its compute cost, from the values
// it logged, or that they are too few to say (the report's rule: at
// least 8 steps); "" for other runs, and for a caller that counted no
// steps (the trainer's totals without PowerSGD's). md: Markdown, as in
// report.md.
func (b Bottleneck) PowerSGDMeasured(md bool) string {
	if b.Compression != "powersgd" || b.WorldSize <= 1 {
		return ""
	}
	st := b.St
	if st.Steps == 0 && st.Intervals == 0 && st.PowerSGDSteps == 0 {
		return ""
	}
	what := fmt.Sprintf("PowerSGD (rank %d", b.powerSGDRank())
	if b.ri.PowerSGDStartStep > 0 {
		what += fmt.Sprintf(", from step %s", Commas(b.ri.PowerSGDStartStep))
	}
	what += ")"
	if md {
		what = "**" + what + "**"
	}
	if why := notEnough(int(st.PowerSGDSteps), "step(s) timed with PowerSGD on", "a measure of what it saved",
		"a longer run: --max-steps, or an earlier --powersgd-start-step"); why != "" {
		if md {
			return what + ": **not enough data**: " + why + "."
		}
		return what + ": not enough data: " + why
	}
	var planPQ, planElems, mats int
	if ps := b.PowerSGDPlan; ps != nil {
		for _, bk := range ps.Buckets {
			planPQ += bk.PBytes + bk.QBytes
			planElems += bk.Elems
			mats += bk.Matrices
		}
	}
	fp16, whence := st.PowerSGDFP16Bytes, MetricPowerSGDFP16Bytes
	if !(fp16 > 0) {
		fp16, whence = float64(2*planElems), "the planner's count of them"
	}
	line := fmt.Sprintf("%s all-reduced P and Q of %s, %s a step (%s, the mean of %s), where fp16 sends %s for them (%s): %s a step saved (%.1fx less)",
		what, matrices(mats), mbs(int(math.Round(st.PowerSGDBytes))), MetricPowerSGDBytes, words.Plural(int(st.PowerSGDSteps), "step"),
		mbs(int(math.Round(fp16))), whence, mbs(int(math.Round(fp16-st.PowerSGDBytes))), fp16/st.PowerSGDBytes)
	if planPQ > 0 {
		line += fmt.Sprintf("; the planner gives P and Q %s, and with the tensors left in fp16 a step's allreduces %s against %s with fp16 alone",
			mbs(planPQ), mbs(b.PowerSGD.WireBytes), mbs(b.FP16Bytes))
	}
	if st.PowerSGDCompute > 0 {
		line += fmt.Sprintf("; its compute held the buckets up %.1f ms a step (%s)", 1e3*st.PowerSGDCompute, MetricPowerSGDComputeMS)
		if b.ComputeSec > 0 {
			line += fmt.Sprintf(", %.1f %% of the %.3f s a step computed", 100*st.PowerSGDCompute/b.ComputeSec, b.ComputeSec)
		}
	} else {
		line += fmt.Sprintf("; its compute was not logged (%s)", MetricPowerSGDComputeMS)
	}
	return line + "."
}

// PowerSGDWhatIf is, for a network-bound run without PowerSGD, the
// planner's prediction of PowerSGD at the default rank, marked as a
// prediction, or why there is none; "" for other runs. md: Markdown.
func (b Bottleneck) PowerSGDWhatIf(md bool) string {
	if b.Compression == "powersgd" || b.Verdict != "network-bound" || (b.PowerSGD == nil && b.PowerSGDNone == "") {
		return ""
	}
	head := fmt.Sprintf("prediction, not a measurement: with --compression powersgd at the default rank %d", plan.DefaultPowerSGDRank)
	if md {
		head = fmt.Sprintf("*Prediction* with `--compression powersgd` at the default rank %d", plan.DefaultPowerSGDRank)
	}
	if b.PowerSGD == nil {
		if why, ok := strings.CutPrefix(b.PowerSGDNone, "not enough data: "); ok && md {
			return head + ": **not enough data**: " + why + "."
		}
		return head + ": " + b.PowerSGDNone + map[bool]string{true: "."}[md]
	}
	p := b.PowerSGD
	return fmt.Sprintf("%s: the gradients would be %s a step on the wire instead of %s with %s (%.0fx less), their allreduces %.3f s and the compressor's compute %.4f s (%s); the step %.3f s against %.3f s predicted for this run: %s.",
		head, mbs(p.WireBytes), mbs(b.Pred.WireBytes), b.wireName(), float64(b.Pred.WireBytes)/math.Max(1, float64(p.WireBytes)),
		p.CommS, p.CompressS, b.PowerSGDHow, p.StepS, b.Pred.StepS, p.Verdict)
}
