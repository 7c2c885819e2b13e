package plan

import (
	"math"

	"github.com/gorun/gorun/collective"
)

// gradients plans the step's gradient allreduces on the slowest rank's
// timeline, from the start of its backward pass: with overlap, bucket k
// leaves when its last gradient is ready and the bucket before it is done
// (the Bucketer launches them in order, one at a time); without, one
// allreduce of every gradient after backward (the trainer's plain
// reducer). What ends after backward is exposed.
func (p *planner) gradients(pr *Prediction) {
	w, c := p.w, p.c
	if pr.Ranks <= 1 {
		return
	}
	back := w.BackwardS
	if back == 0 {
		back = w.ComputeS * 2 / 3
	}
	back *= pr.ComputeS / w.ComputeS // threads and shared cores, as the compute
	if pr.ComputeS > 0 {
		back *= (pr.ComputeS + pr.WaitS) / pr.ComputeS // the slowest rank's
	}
	ws := w.Wire.Size()
	var sizes []int
	var ready []float64
	if w.Overlap {
		total := 0
		for _, b := range w.Buckets {
			total += b
		}
		work := float64(max(total, 1))
		cum := w.HeadBytes
		for _, b := range w.Buckets {
			cum += b
			sizes = append(sizes, b/4*ws)
			ready = append(ready, back*math.Min(1, float64(cum)/work))
		}
	} else {
		all := 0
		for _, b := range w.Buckets {
			all += b / 4 * ws
		}
		sizes, ready = []int{all}, []float64{back}
	}
	var end, cpuHidden, wallHidden float64
	for i, b := range sizes {
		cl := p.route(b, collective.Auto)
		start := math.Max(ready[i], end)
		end = start + cl.sec
		pr.CommS += cl.sec
		pr.Buckets = append(pr.Buckets, Bucket{WireBytes: b, Algorithm: cl.name(c.Hosts), Algo: cl.algo, Hierarchical: cl.hier,
			Seconds: cl.sec, Ready: ready[i], Start: start, End: end})
		if under := math.Min(end, back) - start; under > 0 {
			wallHidden += under
			cpuHidden += cl.cpu * under / cl.sec
		}
	}
	pr.ExposedS = math.Max(0, end-back)
	if pr.CommS > 0 {
		pr.Hidden = math.Max(0, math.Min(1, 1-pr.ExposedS/pr.CommS))
	}
	// The transport's CPU under backward: free cores absorb it; on cores
	// the compute threads fill, it lengthens the step.
	if !c.GPU && c.CoresPerHost > 0 && c.ThreadsPerRank > 0 {
		free := math.Max(0, float64(c.CoresPerHost-c.PerHost*c.ThreadsPerRank))
		pr.StolenS = math.Max(0, float64(c.PerHost)*cpuHidden-free*wallHidden) / float64(c.CoresPerHost)
	}
}

// ExpectedMax is the expected largest of n independent standard normal
// values (0 for n <= 1; 0.564 for 2, 1.029 for 4, 3.04 for 512), by
// integrating x·n·φ(x)·Φ(x)^(n-1).
func ExpectedMax(n int) float64 {
	if n <= 1 {
		return 0
	}
	const h = 1e-2
	s := 0.0
	for x := -9.0; x <= 9; x += h {
		pdf := math.Exp(-x*x/2) / math.Sqrt(2*math.Pi)
		cdf := 0.5 * math.Erfc(-x/math.Sqrt2)
		s += x * float64(n) * pdf * math.Pow(cdf, float64(n-1)) * h
	}
	return s
}
