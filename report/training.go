package report

import (
	"fmt"
	"math"
	"slices"
	"sort"
)

func (r *report) lrSection() {
	ri := r.ri
	r.w("## What does the learning-rate schedule do?\n\n")
	if ri.LRPolicy == "transformer" && ri.Warmup > 0 && ri.DModel > 0 {
		peak := ri.LearningRate / math.Sqrt(float64(ri.DModel)) / math.Sqrt(float64(ri.Warmup))
		r.w("`transformer_policy`: lr = %g x d_model^-0.5 x min(s x warmup^-1.5, s^-0.5) for step s (counted from 1, as in the log) with d_model %d and warmup %d. ",
			ri.LearningRate, ri.DModel, ri.Warmup)
		r.w("It rises linearly for the first %s steps to its peak **%.3e** at step %s, then decays as 1/sqrt(s): half the peak at step %s, a quarter at step %s.\n",
			Commas(ri.Warmup), peak, Commas(ri.Warmup), Commas(4*ri.Warmup), Commas(16*ri.Warmup))
	} else {
		r.w("Policy `%s`, learning rate %g, warmup %d.\n", ri.LRPolicy, ri.LearningRate, ri.Warmup)
	}
	lines := []Line{{"logged", r.lrLog}}
	if r.lr != nil && r.lastStep > 0 {
		r.w("In this run the rate went from %.3e (step 1) to %.3e (step %d).\n", r.lr(0), r.lr(int(r.lastStep-1)), r.lastStep)
		end := max(int64(ri.MaxSteps), r.lastStep)
		lines = []Line{{fmt.Sprintf("policy, steps 1-%s", Commas(end)), r.policy(end)}, {"logged", r.lrLog}}
	} else if len(r.lrLog) > 0 {
		r.w("In this run the logged rate went from %.3e (step %d) to %.3e (step %d).\n", r.lrLog[0].V, r.lrLog[0].Step, r.lrLog[len(r.lrLog)-1].V, r.lrLog[len(r.lrLog)-1].Step)
	}
	r.w("\n%s\n\n", r.plot("lr.png", "learning rate", "lr", lines...))
}

// policy samples the learning-rate policy over steps 1..end: every step up
// to 2000, else 1000 steps evenly spread, with the end of the warmup.
func (r *report) policy(end int64) []Point {
	steps := map[int64]bool{end: true}
	if w := int64(r.ri.Warmup); w >= 1 && w <= end {
		steps[w] = true
	}
	n := min(end, 2000)
	if end > 2000 {
		n = 1000
	}
	for i := int64(0); i < n; i++ {
		steps[1+i*(end-1)/max(1, n-1)] = true
	}
	var out []Point
	for s := range steps {
		out = append(out, Point{Step: s, V: r.lr(int(s - 1))})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Step < out[j].Step })
	return out
}

// evalEvidence says how much a trend of n evaluations rests on.
func evalEvidence(n int) string {
	if n == 2 {
		return "Two evaluations are one interval: enough to see which way the eval loss moved, not whether it is levelling off."
	}
	return fmt.Sprintf("This rests on %d evaluations.", n)
}

// evalTrend is the eval loss' change at the end of the run: the slope over
// the last evaluations (nats per 1000 steps), the same as a share of the
// raw eval loss, and whether that is flat, falling or rising.
type evalTrend struct {
	tail                  []Point
	per1000, rel          float64
	flat, falling, rising bool
}

func (r *report) trend() evalTrend {
	if len(r.evalLoss) < 2 || len(r.evalRaw) == 0 {
		return evalTrend{per1000: math.NaN(), rel: math.NaN()}
	}
	t := evalTrend{tail: tail(r.evalLoss)}
	t.per1000 = slope(t.tail) * 1000
	t.rel = t.per1000 / math.Abs(r.evalRaw[len(r.evalRaw)-1].V)
	t.flat = math.Abs(t.rel) <= flatPer1000
	t.falling, t.rising = !t.flat && t.per1000 < 0, !t.flat && t.per1000 > 0
	return t
}

func (r *report) trainedSection() {
	r.w("## Is the model fully trained?\n\n")
	if l := r.divergingLine(); l != "" {
		r.w("%s\n", l)
	}
	ev := r.evalLoss
	switch {
	case len(ev) == 0 || len(r.evalRaw) != len(ev):
		r.w("- No evaluation in this run: not enough data to say (--eval-every sets how often it evaluates).\n")
	case len(ev) == 1:
		r.w("- One evaluation (eval loss %.4f at step %s): a single point shows no trend; not enough data to say.\n", ev[0].V, Commas(ev[0].Step))
	default:
		t := r.trend()
		first, last := ev[0], ev[len(ev)-1]
		r.w("- Eval loss (%d evaluations): %.4f at step %s, %.4f at step %s.\n", len(ev), first.V, Commas(first.Step), last.V, Commas(last.Step))
		r.w("- Slope over the last %d evaluations (steps %s-%s): **%s nats per 1000 steps**, %s %% of the raw eval loss (%.3f) per 1000 steps; within ±%.0f %% would count as flat.\n",
			len(t.tail), Commas(t.tail[0].Step), Commas(last.Step), fmtNum(t.per1000, "%+.4f"), fmtNum(100*t.rel, "%+.1f"), r.evalRaw[len(r.evalRaw)-1].V, 100*flatPer1000)
		overall := (last.V - first.V) / float64(last.Step-first.Step) * 1000
		share := t.per1000 / overall
		switch {
		case t.falling && len(ev) >= 3 && overall < 0 && share < slowShare:
			r.w("- **Nearly**: the eval loss still falls, but at %.0f %% of its average rate since step %s (%+.4f per 1000 steps): it is levelling off, and more steps at this learning rate gain little. %s\n",
				100*share, Commas(first.Step), overall, evalEvidence(len(ev)))
		case t.falling:
			r.w("- **No**: the eval loss is still falling; more steps would help. %s\n", evalEvidence(len(ev)))
		case t.flat:
			r.w("- **Yes, as far as this learning rate takes it**: the eval loss has stopped falling. %s\n", evalEvidence(len(ev)))
		default:
			lo := slices.MinFunc(ev, func(a, b Point) int { return cmpF(a.V, b.V) })
			r.w("- **Past its best**: the eval loss is rising; its lowest was %.4f at step %s (see overfitting). %s\n", lo.V, Commas(lo.Step), evalEvidence(len(ev)))
		}
	}
	if n := len(r.bleu); n == 1 {
		r.w("- BLEU: **%s** at step %s (one evaluation).\n", fmtNum(r.bleu[0].V, "%.2f"), Commas(r.bleu[0].Step))
	} else if n >= 2 {
		r.w("- BLEU (%d evaluations): %s at step %s, **%s** at step %s", n, fmtNum(r.bleu[0].V, "%.2f"), Commas(r.bleu[0].Step), fmtNum(r.bleu[n-1].V, "%.2f"), Commas(r.bleu[n-1].Step))
		if n >= 3 {
			r.w(" (slope over the last %d evaluations %s per 1000 steps)", len(tail(r.bleu)), fmtNum(slope(tail(r.bleu))*1000, "%+.2f"))
		}
		r.w(".\n")
	}
	r.w("\n%s\n\n%s\n\n", r.plot("loss.png", "loss (lab convention: smoothed-target entropy subtracted)", "nats", Line{"train", r.trainLoss}, Line{"eval", r.evalLoss}),
		r.plot("bleu.png", "BLEU (sacreBLEU-compatible, 0-100)", "BLEU", Line{"bleu", r.bleu}))
}

// divergingLine is the "is it trained" section's line on a loss that grew
// by orders of magnitude ("" if it did not): LossDiverging at a logged
// step, the lowest so far being the trainer's (loss_raw_smoothed_lowest,
// over every step) or, in records without it, the lowest logged.
func (r *report) divergingLine() string {
	lowest, last := math.Inf(1), Point{}
	var at *Point
	var atLowest float64
	for _, rec := range r.recs {
		v, ok := rec.Values["loss_raw_smoothed"]
		if rec.Kind != "train" || !ok || math.IsNaN(v) {
			continue
		}
		lowest = min(lowest, v)
		if lo, ok := rec.Values["loss_raw_smoothed_lowest"]; ok && lo < lowest {
			lowest = lo
		}
		last = Point{Step: rec.Step, V: v}
		if at == nil && LossDiverging(v, lowest, r.ri.Vocab) {
			at, atLowest = &Point{Step: rec.Step, V: v}, lowest
		}
	}
	if at == nil {
		return ""
	}
	return fmt.Sprintf("- **No: the training loss diverged.** At step %s the smoothed raw loss was %s, %s times its lowest before (%.2f) and above ln(%d) = %.2f, the loss of a uniform guess among the vocabulary's pieces; at step %s it was %s. The model got worse, not better: train again with a smaller --learning-rate or more --warmup-steps (a loss %d times its lowest and above a uniform guess's is the rule; a healthy run, warm-up included, does not meet it).",
		Commas(at.Step), lossNum(at.V), Commas(int64(at.V/atLowest)), atLowest, r.ri.Vocab, math.Log(float64(r.ri.Vocab)), Commas(last.Step), lossNum(last.V), DivergeFactor)
}

func (r *report) overfitSection() {
	r.w("## Is it overfitting?\n\n")
	ev := r.evalRaw
	switch {
	case len(ev) == 0 || len(r.trainRaw) == 0:
		r.w("- No evaluation to compare with the train loss: not enough data to say.\n\n")
	default:
		gap := func(at Point) float64 { return at.V - nearest(r.trainRaw, at.Step) }
		first, last := ev[0], ev[len(ev)-1]
		g0, g1 := gap(first), gap(last)
		level := nearest(r.trainRaw, last.Step)
		r.w("- Eval − train loss (raw cross entropy; train: the logged interval's mean, with dropout; eval: without): ")
		if len(ev) == 1 {
			r.w("%s at step %s.\n", fmtNum(g1, "%+.3f"), Commas(last.Step))
		} else {
			r.w("%s at step %s, %s at step %s.\n", fmtNum(g0, "%+.3f"), Commas(first.Step), fmtNum(g1, "%+.3f"), Commas(last.Step))
		}
		where := "above"
		switch {
		case math.Abs(g1) <= closeGap*level:
			where = fmt.Sprintf("close to (within %.0f %% of)", 100*closeGap)
		case g1 < 0:
			where = "below"
		}
		if len(ev) == 1 {
			r.w("- The eval loss is %s the train loss, but one evaluation shows no trend: not enough data to say.\n\n", where)
			break
		}
		t := r.trend()
		// beyond close, and further than that from where it was
		growing := g1 > closeGap*level && g1-g0 > closeGap*level
		switch {
		case t.rising && growing:
			r.w("- **Yes**: the eval loss rises while the gap to the train loss grows (by %.3f). %s\n\n", g1-g0, evalEvidence(len(ev)))
		case t.rising:
			r.w("- The eval loss rises, but the gap to the train loss does not grow: the train loss rises too, which is not overfitting but training going wrong (a learning rate too high?). %s\n\n", evalEvidence(len(ev)))
		case growing:
			r.w("- **Not yet**: the eval loss is %s the train loss and the gap grew by %.3f, but the eval loss is not rising: the first sign of overfitting, to watch. %s\n\n", where, g1-g0, evalEvidence(len(ev)))
		default:
			r.w("- **No**: the eval loss is %s the train loss and not rising. %s\n\n", where, evalEvidence(len(ev)))
		}
	}
	r.w("%s\n\n", r.plot("loss_raw.png", "raw label-smoothed cross entropy", "nats", Line{"train", r.trainRaw}, Line{"eval", r.evalRaw}))
}
