package plan

import (
	"math"

	"github.com/gorun/gorun/collective/algo"
)

// gradients plans the step's gradient allreduces on the slowest rank's
// timeline, from the start of its backward pass: with overlap, bucket k
// leaves when its last gradient is ready and the bucket before it is done
// (the Bucketer launches them in order, one at a time); without, one
// allreduce of every gradient after backward (the trainer's plain
// reducer). What ends after backward is exposed.
//
// With PowerSGD a bucket is a sequence: the allreduce of its uncompressed
// tensors, the compressor's first phase (M += E, P = M Q), P's allreduce,
// the second (orthonormalise P, Q = Mᵀ P), Q's allreduce, the third (P Qᵀ,
// E and the gradient written back); the next bucket starts after it. The
// compressor's compute that runs while backward does takes backward's
// cores or device (CompressUnderS, added to the step); the rest is in the
// exposed time.
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
	var jobs [][]item
	var ready []float64
	if w.Overlap {
		total := 0
		for _, b := range w.Buckets {
			total += b
		}
		work := float64(max(total, 1))
		cum := w.HeadBytes
		for k, b := range w.Buckets {
			cum += b
			jobs = append(jobs, p.bucketItems(pr, []int{k}))
			ready = append(ready, back*math.Min(1, float64(cum)/work))
		}
	} else {
		all := make([]int, len(w.Buckets))
		for k := range all {
			all[k] = k
		}
		jobs, ready = [][]item{p.bucketItems(pr, all)}, []float64{back}
	}
	var end, cpuHidden, wallHidden float64
	for i, items := range jobs {
		start := math.Max(ready[i], end)
		bk := Bucket{Ready: ready[i], Start: start}
		t, big := start, -1.0
		for _, it := range items {
			t0 := t
			if !it.call {
				t += it.sec
				bk.CompressS += it.sec
				pr.CompressS += it.sec
				pr.CompressUnderS += math.Max(0, math.Min(t, back)-t0)
				continue
			}
			cl := p.route(it.bytes, algo.Auto)
			t += cl.sec
			pr.CommS += cl.sec
			bk.WireBytes += it.bytes
			bk.Seconds += cl.sec
			if cl.sec > big { // the bucket's algorithm is its longest call's
				big, bk.Algorithm, bk.Algo, bk.Hierarchical = cl.sec, cl.name(c.Hosts), cl.algo, cl.hier
			}
			if w.PowerSGD != nil {
				bk.Calls = append(bk.Calls, Call{What: it.what, WireBytes: it.bytes, Algorithm: cl.name(c.Hosts), Seconds: cl.sec})
			}
			if under := math.Min(t, back) - t0; under > 0 {
				wallHidden += under
				cpuHidden += cl.cpu * under / cl.sec
			}
		}
		end, bk.End = t, t
		pr.WireBytes += bk.WireBytes
		pr.Buckets = append(pr.Buckets, bk)
	}
	pr.ExposedS = math.Max(0, end-back)
	if chain := pr.CommS + pr.CompressS; chain > 0 {
		pr.Hidden = math.Max(0, math.Min(1, 1-pr.ExposedS/chain))
	}
	// The transport's CPU under backward: free cores absorb it; on cores
	// the compute threads fill, it lengthens the step.
	if !c.GPU && c.CoresPerHost > 0 && c.ThreadsPerRank > 0 {
		free := math.Max(0, float64(c.CoresPerHost-c.PerHost*c.ThreadsPerRank))
		pr.StolenS = math.Max(0, float64(c.PerHost)*cpuHidden-free*wallHidden) / float64(c.CoresPerHost)
	}
}

// item is one part of a bucket's sequence: an allreduce of bytes on the
// wire (call), or sec of the compressor's compute.
type item struct {
	call  bool
	what  string
	bytes int
	sec   float64
}

// bucketItems is the sequence that sends the buckets ks (one, or all of
// them after backward without overlap): one allreduce of their bytes in
// the wire type, or with PowerSGD the uncompressed tensors', the
// compressor's three phases and P's and Q's allreduces between them, the
// compute spread by FLOPs and slowed as the step's compute is.
func (p *planner) bucketItems(pr *Prediction, ks []int) []item {
	w := p.w
	ws := w.Wire.Size()
	ps := w.PowerSGD
	if ps == nil {
		bytes := 0
		for _, k := range ks {
			bytes += w.Buckets[k] / 4 * ws
		}
		return []item{{call: true, bytes: bytes}}
	}
	var rest, pb, qb int
	var ph [3]float64
	for _, k := range ks {
		b := ps.Buckets[k]
		rest, pb, qb = rest+b.RestBytes/4*ws, pb+b.PBytes, qb+b.QBytes
		for j := range ph {
			ph[j] += b.Phases[j]
		}
	}
	perFLOP := 0.0
	if f := ps.FLOPs(); f > 0 {
		perFLOP = ps.ComputeS * (pr.ComputeS / w.ComputeS) / f
	}
	var out []item
	if rest > 0 {
		out = append(out, item{call: true, what: "rest", bytes: rest})
	}
	if pb+qb > 0 {
		out = append(out, item{sec: ph[0] * perFLOP}, item{call: true, what: "P", bytes: pb},
			item{sec: ph[1] * perFLOP}, item{call: true, what: "Q", bytes: qb}, item{sec: ph[2] * perFLOP})
	}
	return out
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
