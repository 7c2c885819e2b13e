package report

import (
	"fmt"
	"strings"

	"github.com/gorun/gorun/internal/words"
)

func (r *report) networkSection() {
	ri := r.ri
	r.w("## Was the network the bottleneck?\n\n")
	if ri.WorldSize <= 1 {
		r.w("- One rank: no gradients were exchanged, over a network or otherwise.\n\n")
		return
	}
	if len(r.stepTime) == 0 {
		r.w("- Communication and traffic: **not enough data**: no log line was written (--log-every logs more often).\n\n")
		return
	}
	hosts := UniqueHosts(ri.Hosts)
	oneHost := len(hosts) == 1
	// a PowerSGD run's intervals before its start step sent fp16: the
	// communication and traffic below are of those it compressed
	exposed, hidden, stepTime, netOut, netIn, shmOut, shmIn, only := r.exposed, r.hidden, r.stepTime, r.netOut, r.netIn, r.shmOut, r.shmIn, ""
	if ri.Compression == "powersgd" {
		on := map[int64]bool{}
		full := powerSGDFull(r.recs)
		for _, rec := range r.recs {
			if rec.Kind == "train" {
				on[rec.Step] = compressed(rec.Values, full)
			}
		}
		keep := func(ps []Point) []Point {
			var out []Point
			for _, p := range ps {
				if on[p.Step] {
					out = append(out, p)
				}
			}
			return out
		}
		if k := len(keep(r.stepTime)); k > 0 && k < len(r.stepTime) {
			exposed, hidden, stepTime, netOut, netIn, shmOut, shmIn = keep(exposed), keep(hidden), keep(stepTime), keep(netOut), keep(netIn), keep(shmOut), keep(shmIn)
			only = fmt.Sprintf("; over the %s PowerSGD compressed throughout, not the %d before", words.Plural(k, "logged interval"), len(r.stepTime)-k)
		}
	}
	exposedShare := mean(exposed) / 1000 / mean(stepTime)
	r.w("- Exposed communication (after backward finished%s): **%s ms** per step on average; **%s %%** of the allreduce time was hidden behind backward.\n",
		only, fmtNum(mean(exposed), "%.1f"), fmtNum(mean(hidden), "%.0f"))
	r.w("- Exposed communication is **%s %%** of the step time.\n", fmtNum(100*exposedShare, "%.1f"))
	r.w("- Traffic per rank (mean over the ranks and the logged intervals): network %s MB/s out, %s MB/s in", fmtNum(mean(netOut), "%.1f"), fmtNum(mean(netIn), "%.1f"))
	if !oneHost && ri.LinkGbps > 0 {
		r.w(" against a link of %.3g Gbit/s = %.0f MB/s (%s): **%s %%** of capacity", ri.LinkGbps, ri.LinkGbps*125, orStr(ri.LinkSource, "given"), fmtNum(100*mean(netOut)/(ri.LinkGbps*125), "%.1f"))
	}
	if len(shmOut) > 0 {
		r.w("; shared memory %s MB/s out, %s MB/s in (the pair rings and the host's group segment)", fmtNum(mean(shmOut), "%.1f"), fmtNum(mean(shmIn), "%.1f"))
	} else {
		r.w("; shared-memory traffic not recorded (a run from before it was counted)")
	}
	r.w(".\n")
	if oneHost {
		via := "shared memory"
		switch {
		case len(r.shmOut) == 0:
			via = "shared memory (its bytes were not counted in this run)"
		case !(mean(r.shmOut) > 0):
			via = "the loopback interface (shared memory was off)"
		}
		r.w("- All ranks ran on one host (%s): no gradient crossed a network; %s carried them. The analysis below asks what a link between hosts would have done.\n", hosts[0], via)
	}
	if len(r.compute) == 0 {
		r.w("- No compute time was logged: no bottleneck analysis.\n")
	} else {
		an := AnalyzeBottleneck(ri, MeasureSteps(r.recs, ri.WorldSize, 0))
		r.w("- %s\n", strings.ReplaceAll(an.analysis(), "\n", "\n  "))
		r.w("- %s\n", measuredVerdict(an, mean(exposed)/1000, mean(stepTime), oneHost))
		for _, l := range []string{an.PowerSGDMeasured(true), an.PowerSGDWhatIf(true)} {
			if l != "" {
				r.w("- %s\n", l)
			}
		}
	}
	r.w("\n%s\n\n", r.plot("network.png", "traffic per rank", "MB/s",
		Line{"network out", r.netOut}, Line{"network in", r.netIn}, Line{"shared memory out", r.shmOut}, Line{"shared memory in", r.shmIn}))
}

// measuredVerdict puts the bottleneck analysis (a bound from the link's
// rate) beside what the run measured: the communication the ranks waited
// for after backward, exposedSec of a step of stepSec.
func measuredVerdict(an Bottleneck, exposedSec, stepSec float64, oneHost bool) string {
	link := fmt.Sprintf("%.3g Gbit/s link", an.LinkGbps)
	if an.LinkSource == "" {
		link = fmt.Sprintf("assumed %.3g Gbit/s link", an.LinkGbps)
	}
	need := 100 * an.Comm() / an.ComputeSec
	model := fmt.Sprintf("%.3f s by gorun's cost model (at least %.3f s at the link's rate)", an.Comm(), an.MinComm())
	waited := fmt.Sprintf("%s %% of the step (%s ms)", fmtNum(100*exposedSec/stepSec, "%.1f"), fmtNum(1000*exposedSec, "%.1f"))
	switch {
	case oneHost && an.Verdict == "network-bound":
		return fmt.Sprintf("**Not here, but it would be across hosts**: on one host the ranks waited for communication %s; on the %s the %s gradients would take %s, longer than the %.3f s a step computes, which no overlap can hide.",
			waited, link, an.wireName(), model, an.ComputeSec)
	case oneHost:
		return fmt.Sprintf("**No**: no network was used, and the ranks waited for communication %s; on the %s the %s gradients would take %.0f %% of the compute time by gorun's cost model: compute-bound across hosts too.",
			waited, link, an.wireName(), need)
	case an.Verdict == "network-bound":
		return fmt.Sprintf("**Yes**: on the %s the %s gradients take %s, longer than the %.3f s a step computes, so no overlap can hide them; the ranks waited for communication %s.",
			link, an.wireName(), model, an.ComputeSec, waited)
	case exposedSec < 0.1*stepSec:
		return fmt.Sprintf("**No** (compute-bound): the %s carries the %s gradients in %.0f %% of the compute time by gorun's cost model, and the ranks waited for communication only %s.",
			link, an.wireName(), need, waited)
	case exposedSec > 1.5*an.Comm():
		return fmt.Sprintf("**Not the network's speed** (compute-bound), yet the ranks waited for communication %s, more than the %.1f ms gorun's cost model gives the %s gradients on the %s (%.0f %% of the compute time): the rest is latency, synchronization or waiting for the slowest rank.",
			waited, 1000*an.Comm(), an.wireName(), link, need)
	default:
		return fmt.Sprintf("**Not the network's speed** (compute-bound), but little of the transfer was hidden: the ranks waited for communication %s, about the %.1f ms gorun's cost model gives the %s gradients on the %s; overlapping it with backward would hide it.",
			waited, 1000*an.Comm(), an.wireName(), link)
	}
}

func (r *report) correlationSection() {
	r.w("## How does step time relate to network throughput?\n\n")
	traffic, what := r.netOut, "outgoing network MB/s"
	if len(r.shmOut) > 0 {
		traffic, what = sumSeries(r.netOut, r.shmOut), "outgoing MB/s (network and shared memory)"
	}
	r.correlate(what, traffic, func(rr, chance float64) string {
		switch {
		case rr < -chance:
			return "Slower steps move fewer MB/s: every step moves the same gradient bytes, so the rate follows the step time; this alone does not say the traffic slowed the steps."
		case rr > chance:
			return "Slower steps coincide with more traffic: traffic is stretching the steps."
		}
		return "No clear relation."
	})
	r.correlate("exposed communication (ms per step)", r.exposed, func(rr, chance float64) string {
		switch {
		case rr > chance:
			return "Steps are slower when more communication is exposed: waiting for the allreduce stretches them."
		case rr < -chance:
			return "Slower steps have less exposed communication: a longer backward pass hides more of it."
		}
		return "No clear relation: exposed communication does not explain how the step time varies."
	})
	r.w("\n")
}

// correlate writes the correlation of the step time with x, or why there
// is not enough data for one; meaning interprets r beyond chance.
func (r *report) correlate(what string, x []Point, meaning func(r, chance float64) string) {
	rr, n := pearson(r.stepTime, x)
	cs, cx := cv(r.stepTime), cv(x)
	few := notEnough(n, "logged interval(s)", "a correlation", "--log-every logs more often")
	switch {
	case few != "":
		r.w("- Step time and %s: **not enough data**: %s.\n", what, few)
	case !(mean(x) > 0):
		r.w("- Step time and %s: **not enough data**: it was zero throughout.\n", what)
	case !(cx >= flatCV) || !(cs >= flatCV):
		flat, c := what, cx
		if !(cs >= flatCV) {
			flat, c = "the step time", cs
		}
		r.w("- Step time and %s: **not enough data**: %s hardly varied (coefficient of variation %s %%), and the correlation of a flat series measures noise.\n", what, flat, fmtNum(100*c, "%.1f"))
	default:
		chance := chanceR(n)
		r.w("- Step time and %s over %d intervals: Pearson r = **%+.2f** (unrelated numbers give |r| up to %.2f, 19 times in 20). %s\n", what, n, rr, chance, meaning(rr, chance))
	}
}
