// Package plan predicts the step time of gorun's data-parallel training on
// H hosts x G devices on a link, before anything runs: compute from a
// measurement, the gradient allreduces as gorun runs them (the algorithm
// the communicator's Auto picks for each fusion bucket, timed with
// collective/algo's cost model for the link), the share of them the backward
// pass hides, and the wait for the slowest rank. Pure functions: no I/O.
// docs/plan.md has the model, its inputs and its validation.
package plan

import (
	"errors"
	"fmt"
	"math"

	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/dtype"
)

// Cluster is where the job would run.
type Cluster struct {
	Hosts, PerHost int // H hosts, G ranks (devices) on each
	// LinkGbps is each host's link to the others, Gbit/s each way.
	LinkGbps float64
	// LatencyUs is the link's one-way latency, added to every ring step
	// and tree hop (µs; 0 between the namespace test hosts).
	LatencyUs float64
	// CoresPerHost: CPU cores of a host (0: enough for every rank's
	// threads and transport). Ranks whose compute threads outnumber them
	// share them; ranks that cross the link at once share them for the
	// transport.
	CoresPerHost int
	// ThreadsPerRank: compute threads per rank on the CPU (0: the
	// workload's).
	ThreadsPerRank int
	// Transport between hosts: "auto" (as gorun's start-up probe picks:
	// TLS/TCP where it moves more than 1.1x QUIC on this link), "quic" or
	// "tcp".
	Transport string
	// CapGBs and StepUs replace the transport's measured constants (0:
	// keep them): on hosts whose cores move more bytes per second than
	// this project's 2-core machine, or where a transport's per-message
	// cost is known.
	CapGBs, StepUs float64
	// GPU: the ranks compute on devices; the CPU only communicates.
	GPU bool
	// Flat: GORUN_HIERARCHICAL=0, no two-level allreduce.
	Flat bool
}

// Workload is one training step of one rank.
type Workload struct {
	Params int64
	// Buckets are the fusion buckets' sizes in float32 bytes, in the
	// order they leave (bucket 0, the last layers, first).
	Buckets []int
	// HeadBytes: float32 bytes of parameters whose backward work comes
	// first although their gradient is ready last (the tied embedding:
	// the output projection is backward's first matrix product). Backward
	// work is taken to be in proportion to the bytes.
	HeadBytes int
	// ComputeS: forward, backward and optimizer of one step, one rank
	// alone with Threads compute threads and as many cores; ComputeSD its
	// standard deviation from step to step (batches differ).
	ComputeS, ComputeSD float64
	// BackwardS: the backward pass's part of ComputeS (0: two thirds, the
	// share of its matrix products).
	BackwardS float64
	Threads   int
	// DataS: reading a step's batches, when not in ComputeS.
	DataS float64
	// TokensPerRank: tokens of one rank's step (target tokens, or
	// whatever the caller counts).
	TokensPerRank float64
	// Wire: the gradients' type on the wire (Float32, Float16, BFloat16);
	// with PowerSGD, the type of the tensors it leaves uncompressed.
	Wire    dtype.DType
	Overlap bool // buckets all-reduced while backward runs (else one allreduce after it)
	// PowerSGD, when not nil, compresses the buckets' matrices (powersgd.go).
	PowerSGD *PowerSGD
}

// Bucket is what the plan does with one gradient allreduce.
type Bucket struct {
	WireBytes int
	Algorithm string // as gorun runs it, e.g. "ring", "hierarchical (shm group, tree across 4 hosts)"
	// Algo is what the communicator's AlgorithmFor(Auto, WireBytes)
	// returns (of the phase across hosts, when Hierarchical).
	Algo         algo.Algorithm
	Hierarchical bool
	Seconds      float64 // predicted time of the allreduce (with PowerSGD: of its allreduces)
	// Ready, Start, End: seconds after backward started on the slowest
	// rank (Ready: its last gradient; Start: the previous one done).
	Ready, Start, End float64
	// With PowerSGD: the bucket's allreduces in order (the uncompressed
	// tensors, P, Q; WireBytes, Algorithm, Algo and Hierarchical above
	// are their sum and the largest's) and the compressor's compute
	// among them.
	Calls     []Call
	CompressS float64
}

// Call is one allreduce of a PowerSGD bucket.
type Call struct {
	What      string // "rest" (the tensors left uncompressed), "P" or "Q"
	WireBytes int
	Algorithm string
	Seconds   float64
}

// Prediction is one step of the job.
type Prediction struct {
	Ranks int
	StepS float64
	// The parts of StepS: ComputeS (one rank's own compute, slowed when
	// its host's cores are shared), WaitS (for the slowest rank),
	// SyncS (the trainer's token-count allreduce), ExposedS (gradient
	// communication after backward), StolenS (transport CPU that the
	// hidden communication takes from compute on busy cores), DataS.
	ComputeS, WaitS, SyncS, ExposedS, StolenS, DataS float64
	// CommS is every gradient allreduce's time, one after another;
	// Hidden the share of it (and of the compressor's compute) under
	// backward.
	CommS, Hidden float64
	// WireBytes: the bytes of a step's gradient allreduces (their
	// buffers, as the buckets' WireBytes).
	WireBytes int
	// With PowerSGD: CompressS is the compressor's compute per step
	// (ComputeS of PowerSGD, slowed as the compute is), which runs
	// between each bucket's allreduces; CompressUnderS the part of it
	// that runs while backward does and takes the same cores or device,
	// a part of StepS (the rest is in ExposedS).
	CompressS, CompressUnderS float64
	TokensPerSec              float64
	// SingleS is a step of one device alone; Efficiency = SingleS/StepS
	// (tokens/s against N times one device's).
	SingleS, Efficiency float64
	// Oversubscribed: compute threads per core on a host (1: none).
	Oversubscribed float64
	Transport      string // between hosts ("" on one host)
	RateGBs        float64
	LinkBound      bool // the link, not the transport's cap, sets the rate
	Verdict        string
	Buckets        []Bucket
}

// Errors for input that cannot describe a job.
var errInput = errors.New("plan")

// planner holds one prediction's settings.
type planner struct {
	c  Cluster
	w  Workload
	tr Transport
}

func check(c Cluster, w Workload) error {
	switch {
	case c.Hosts < 1 || c.PerHost < 1:
		return fmt.Errorf("%w: %d hosts x %d per host: want at least 1 each", errInput, c.Hosts, c.PerHost)
	case c.Hosts > 1 && !(c.LinkGbps > 0):
		return fmt.Errorf("%w: a link of %g Gbit/s between %d hosts: want a positive rate", errInput, c.LinkGbps, c.Hosts)
	case c.LatencyUs < 0 || c.CoresPerHost < 0 || c.ThreadsPerRank < 0 || c.CapGBs < 0 || c.StepUs < 0:
		return fmt.Errorf("%w: negative latency, cores, threads or transport constants", errInput)
	case !(w.ComputeS > 0) || w.ComputeSD < 0 || w.BackwardS < 0 || w.BackwardS > w.ComputeS || w.DataS < 0:
		return fmt.Errorf("%w: compute %g s per step (backward %g s, spread %g s): want compute > 0 and 0 <= backward <= compute",
			errInput, w.ComputeS, w.BackwardS, w.ComputeSD)
	case w.Params < 0 || w.HeadBytes < 0 || w.Threads < 0 || w.TokensPerRank < 0:
		return fmt.Errorf("%w: negative parameters, bytes, threads or tokens", errInput)
	case w.Wire != dtype.Float32 && w.Wire != dtype.Float16 && w.Wire != dtype.BFloat16:
		return fmt.Errorf("%w: wire type %v: want float32, float16 or bfloat16", errInput, w.Wire)
	}
	for i, b := range w.Buckets {
		if b < 0 {
			return fmt.Errorf("%w: bucket %d has %d bytes", errInput, i, b)
		}
	}
	if ps := w.PowerSGD; ps != nil {
		if len(ps.Buckets) != len(w.Buckets) || ps.Rank < 1 || ps.ComputeS < 0 {
			return fmt.Errorf("%w: PowerSGD of rank %d, %g s, with %d buckets for %d: want rank >= 1, compute >= 0 and a bucket for each",
				errInput, ps.Rank, ps.ComputeS, len(ps.Buckets), len(w.Buckets))
		}
		for i, b := range ps.Buckets {
			if b.RestBytes+4*b.Elems != w.Buckets[i] || b.RestBytes < 0 || b.PBytes < 0 || b.QBytes < 0 {
				return fmt.Errorf("%w: PowerSGD's bucket %d holds %d bytes, the workload's %d", errInput, i, b.RestBytes+4*b.Elems, w.Buckets[i])
			}
		}
	}
	if _, err := ParseTransport(c.Transport); err != nil {
		return fmt.Errorf("%w: %w", errInput, err)
	}
	return nil
}

// Predict is the step time of w on c.
func Predict(c Cluster, w Workload) (Prediction, error) {
	if err := check(c, w); err != nil {
		return Prediction{}, err
	}
	c.Transport, _ = ParseTransport(c.Transport)
	if c.ThreadsPerRank == 0 {
		c.ThreadsPerRank = w.Threads
	}
	p := &planner{c: c, w: w}
	n := c.Hosts * c.PerHost
	pr := Prediction{Ranks: n, DataS: w.DataS}
	if c.Hosts > 1 {
		p.tr = between(c.Transport, c.LinkGbps/8)
		if c.CapGBs > 0 {
			p.tr.CapGBs = c.CapGBs
		}
		if c.StepUs > 0 {
			p.tr.StepUs = c.StepUs
		}
		pr.Transport = p.tr.Name
		l := p.link(1)
		pr.RateGBs, pr.LinkBound = l.GBs(), l.Gbps/8 <= l.CapGBs
	}
	perThread := 1.0 // compute scales with threads when the plan has other than the measurement
	if w.Threads > 0 && c.ThreadsPerRank > 0 && !c.GPU {
		perThread = float64(w.Threads) / float64(c.ThreadsPerRank)
	}
	pr.SingleS = w.ComputeS*perThread + w.DataS
	pr.Oversubscribed = 1
	if !c.GPU && c.CoresPerHost > 0 && c.ThreadsPerRank > 0 {
		pr.Oversubscribed = max(1, float64(c.PerHost*c.ThreadsPerRank)/float64(c.CoresPerHost))
	}
	pr.ComputeS = w.ComputeS * perThread * pr.Oversubscribed
	pr.WaitS = p.wait(w.ComputeSD*perThread, pr.Oversubscribed)
	pr.SyncS = p.route(16, algo.Ring).sec // 4 float32 sums, ring forced (nmt-train's step.go allreduceSums)
	p.gradients(&pr)
	pr.StepS = pr.ComputeS + pr.WaitS + pr.SyncS + pr.ExposedS + pr.StolenS + pr.CompressUnderS + pr.DataS
	if pr.StepS > 0 {
		pr.Efficiency = pr.SingleS / pr.StepS
		pr.TokensPerSec = float64(n) * w.TokensPerRank / pr.StepS
	}
	pr.Verdict = "compute-bound"
	switch {
	case n == 1:
		pr.Verdict = "compute-bound (one rank: no gradient exchange)"
	case pr.CommS > pr.ComputeS:
		pr.Verdict = "network-bound"
	}
	return pr, nil
}

// wait is how much longer the slowest rank computes than the mean one:
// the expected maximum of the ranks' step times, normal with the
// measured spread sd. Ranks sharing a host's cores (oversubscribed k > 1)
// finish together, after the host's summed work (spread sd·k/sqrt(G)), and
// the step waits for the slowest host.
func (p *planner) wait(sd, k float64) float64 {
	c := p.c
	if k > 1 {
		return ExpectedMax(c.Hosts) * sd * k / math.Sqrt(float64(c.PerHost))
	}
	return ExpectedMax(c.Hosts*c.PerHost) * sd
}
