package metrics

import (
	"fmt"
	"strings"
)

// Bottleneck is the answer to the lab's question "was the network the
// bottleneck?" for one configuration: the least time a ring allreduce of the
// gradients can take on the link, against the measured compute time.
type Bottleneck struct {
	Params      int64   // trainable parameters (gradient elements)
	WorldSize   int     // ranks
	LinkGbps    float64 // link capacity per rank, Gbit/s
	ComputeSec  float64 // measured forward+backward+optimizer time per step
	MinCommFP32 float64 // seconds: 2(n-1)/n * 4 bytes * params / bandwidth
	MinCommFP16 float64 // the same with fp16 on the wire
	Verdict     string  // "network-bound" or "compute-bound" (for fp16, gorun's default)
}

// AnalyzeBottleneck computes the lower bound on communication per step:
// each rank of a ring allreduce sends and receives 2(n-1)/n of the gradient
// bytes, so no algorithm on a link of that rate can be faster.
func AnalyzeBottleneck(params int64, world int, linkGbps, computeSec float64) Bottleneck {
	b := Bottleneck{Params: params, WorldSize: world, LinkGbps: linkGbps, ComputeSec: computeSec}
	if world > 1 && linkGbps > 0 {
		bytesPerSec := linkGbps * 1e9 / 8
		f := 2 * float64(world-1) / float64(world)
		b.MinCommFP32 = f * 4 * float64(params) / bytesPerSec
		b.MinCommFP16 = f * 2 * float64(params) / bytesPerSec
	}
	switch {
	case world <= 1:
		b.Verdict = "compute-bound (one rank: no gradient exchange)"
	case b.MinCommFP16 > computeSec:
		b.Verdict = "network-bound"
	default:
		b.Verdict = "compute-bound"
	}
	return b
}

// String prints the analysis in a few lines a student can read.
func (b Bottleneck) String() string {
	var s strings.Builder
	fmt.Fprintf(&s, "bottleneck analysis: %.1f M parameters, %d ranks, %.3g Gbit/s link\n", float64(b.Params)/1e6, b.WorldSize, b.LinkGbps)
	if b.WorldSize > 1 && b.LinkGbps > 0 {
		fmt.Fprintf(&s, "  least allreduce time per step: %.3f s with fp32 gradients, %.3f s with fp16 (2(n-1)/n x bytes / bandwidth)\n", b.MinCommFP32, b.MinCommFP16)
	}
	fmt.Fprintf(&s, "  measured compute per step:     %.3f s\n", b.ComputeSec)
	fmt.Fprintf(&s, "  verdict: %s", b.Verdict)
	if b.WorldSize > 1 && b.LinkGbps > 0 && b.ComputeSec > 0 {
		fmt.Fprintf(&s, " (communication needs at least %.0f %% of the compute time with fp16, %.0f %% with fp32)", 100*b.MinCommFP16/b.ComputeSec, 100*b.MinCommFP32/b.ComputeSec)
	}
	return s.String()
}
