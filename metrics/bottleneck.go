package metrics

import (
	"fmt"
	"strings"

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
}

// AnalyzeBottleneck asks the planner how long the run's gradients take on
// its link (ri: the run's hosts, link, buckets, wire type; st: what it
// measured) and compares that with the measured compute. A run on one
// host is asked what a link between hosts would have done: a host per
// rank. An unknown link (0 Gbit/s) is the lab's, said to be assumed
// (LinkSource "").
func AnalyzeBottleneck(ri RunInfo, st StepTimes) Bottleneck {
	if ri.LinkGbps <= 0 {
		ri.LinkGbps, ri.LinkSource = LabLinkGbps, ""
	}
	b := Bottleneck{Params: ri.Params, WorldSize: ri.WorldSize, LinkGbps: ri.LinkGbps, LinkSource: ri.LinkSource,
		Compression: ri.Compression, ComputeSec: st.Compute}
	c := RunCluster(ri)
	if c.Hosts == 1 {
		c.Hosts, c.PerHost = c.PerHost, 1
	}
	c.CoresPerHost = 0 // the compute is taken as measured, the cores as they were
	w := RunWorkload(ri, st)
	w.ComputeS = st.Compute // the verdict weighs the compute as measured (and printed)
	if w.BackwardS > w.ComputeS {
		w.BackwardS = 0
	}
	if ri.WorldSize > 1 {
		// every host's share of the sum leaves through its link and the
		// result comes back: 2(H-1)/H of the bytes, whatever the algorithm
		bytesPerSec := ri.LinkGbps * 1e9 / 8
		f := 2 * float64(c.Hosts-1) / float64(c.Hosts)
		b.MinCommFP32 = f * 4 * float64(ri.Params) / bytesPerSec
		b.MinCommFP16 = f * 2 * float64(ri.Params) / bytesPerSec
	}
	b.Verdict = "compute-bound"
	if !(w.ComputeS > 0) || ri.WorldSize <= 1 {
		if ri.WorldSize <= 1 {
			b.Verdict = "compute-bound (one rank: no gradient exchange)"
		}
		return b
	}
	for _, wire := range []string{"none", "fp16", ri.Compression} {
		w.Wire = WireType(wire)
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
	return b
}

// MinComm is the least allreduce time with the run's wire type.
func (b Bottleneck) MinComm() float64 {
	if b.Compression == "none" {
		return b.MinCommFP32
	}
	return b.MinCommFP16
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

// String prints the analysis in a few lines a student can read.
func (b Bottleneck) String() string {
	var s strings.Builder
	fmt.Fprintf(&s, "bottleneck analysis: %.1f M parameters, %d ranks, %.3g Gbit/s link (%s)\n", float64(b.Params)/1e6, b.WorldSize, b.LinkGbps, b.linkNote())
	if b.WorldSize > 1 {
		fmt.Fprintf(&s, "  least allreduce time per step: %.3f s with fp32 gradients, %.3f s with fp16 (2(n-1)/n x bytes / bandwidth, n hosts)\n", b.MinCommFP32, b.MinCommFP16)
		if b.Comm() > 0 {
			fmt.Fprintf(&s, "  predicted allreduce time per step: %.3f s with fp32, %.3f s with fp16 (gorun's cost model: %d bucket(s), the largest by %s)\n",
				b.CommFP32, b.CommFP16, len(b.Pred.Buckets), how(b.Pred))
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
