package metrics

import (
	"fmt"
	"strings"
)

// LabLinkGbps is the link between the lab's two VMs, assumed for the
// bottleneck analysis when a run's link is unknown (no --link-gbps, and
// no rank on a second host to probe).
const LabLinkGbps = 1.0

// Bottleneck is the answer to the lab's question "was the network the
// bottleneck?" for one configuration: the least time a ring allreduce of the
// gradients can take on the link, against the measured compute time.
type Bottleneck struct {
	Params     int64   // trainable parameters (gradient elements)
	WorldSize  int     // ranks
	LinkGbps   float64 // link capacity per rank, Gbit/s
	LinkSource string  // "flag" (--link-gbps), "probe", or "" (LabLinkGbps assumed)
	// Compression is the gradients' type on the wire ("fp16", "bf16" or
	// "none": fp32); the verdict is for it.
	Compression string
	ComputeSec  float64 // measured forward+backward+optimizer time per step
	MinCommFP32 float64 // seconds: 2(n-1)/n * 4 bytes * params / bandwidth
	MinCommFP16 float64 // the same with fp16 (or bf16) on the wire
	Verdict     string  // "network-bound" or "compute-bound"
}

// AnalyzeBottleneck computes the lower bound on communication per step:
// each rank of a ring allreduce sends and receives 2(n-1)/n of the gradient
// bytes, so no algorithm on a link of that rate can be faster. A link of 0
// Gbit/s is unknown: LabLinkGbps is assumed (LinkSource "").
func AnalyzeBottleneck(params int64, world int, linkGbps float64, linkSource, compression string, computeSec float64) Bottleneck {
	if linkGbps <= 0 {
		linkGbps, linkSource = LabLinkGbps, ""
	}
	b := Bottleneck{Params: params, WorldSize: world, LinkGbps: linkGbps, LinkSource: linkSource, Compression: compression, ComputeSec: computeSec}
	if world > 1 {
		bytesPerSec := linkGbps * 1e9 / 8
		f := 2 * float64(world-1) / float64(world)
		b.MinCommFP32 = f * 4 * float64(params) / bytesPerSec
		b.MinCommFP16 = f * 2 * float64(params) / bytesPerSec
	}
	switch {
	case world <= 1:
		b.Verdict = "compute-bound (one rank: no gradient exchange)"
	case b.MinComm() > computeSec:
		b.Verdict = "network-bound"
	default:
		b.Verdict = "compute-bound"
	}
	return b
}

// MinComm is the least allreduce time with the run's wire type.
func (b Bottleneck) MinComm() float64 {
	if b.Compression == "none" {
		return b.MinCommFP32
	}
	return b.MinCommFP16
}

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
		fmt.Fprintf(&s, "  least allreduce time per step: %.3f s with fp32 gradients, %.3f s with fp16 (2(n-1)/n x bytes / bandwidth)\n", b.MinCommFP32, b.MinCommFP16)
	}
	fmt.Fprintf(&s, "  measured compute per step:     %.3f s\n", b.ComputeSec)
	fmt.Fprintf(&s, "  verdict: %s", b.Verdict)
	if b.WorldSize > 1 && b.ComputeSec > 0 {
		fmt.Fprintf(&s, " (communication needs at least %.0f %% of the compute time with fp16, %.0f %% with fp32; this run sent %s)",
			100*b.MinCommFP16/b.ComputeSec, 100*b.MinCommFP32/b.ComputeSec, b.wireName())
	}
	return s.String()
}
