// Package report analyses a run directory that package metrics recorded:
// report.md and the PNG plots it shows, the bottleneck verdict, and the
// run as the planner's input (its what-if predictions).
package report

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gorun/gorun/internal/words"
	"github.com/gorun/gorun/metrics"
)

// Schedule is a run's learning-rate policy: the rate of the step with
// 0-based index step (the step the log calls step+1).
type Schedule func(step int) float64

// Point is one sample of a series.
type Point struct {
	Step int64
	Time float64
	V    float64
}

func series(recs []metrics.Record, kind, name string) []Point {
	var out []Point
	for _, r := range recs {
		if r.Kind != kind {
			continue
		}
		if v, ok := r.Values[name]; ok && !math.IsNaN(v) && !math.IsInf(v, 0) { // non-finite values are recorded, not plotted
			out = append(out, Point{Step: r.Step, Time: r.Time, V: v})
		}
	}
	return out
}

// perRank returns the series name_rankR of every rank R that has one, by
// rank.
func perRank(recs []metrics.Record, kind, name string) [][]Point {
	n := 0
	for _, r := range recs {
		if r.Kind != kind {
			continue
		}
		for k := range r.Values {
			if rs, ok := strings.CutPrefix(k, name+"_rank"); ok {
				if i, err := strconv.Atoi(rs); err == nil && i >= 0 {
					n = max(n, i+1)
				}
			}
		}
	}
	out := make([][]Point, n)
	for i := range out {
		out[i] = series(recs, kind, fmt.Sprintf("%s_rank%d", name, i))
	}
	return out
}

// sumSeries adds series sampled at the same steps (a step missing from
// one is left out).
func sumSeries(a, b []Point) []Point {
	bm := map[int64]float64{}
	for _, q := range b {
		bm[q.Step] = q.V
	}
	var out []Point
	for _, q := range a {
		if v, ok := bm[q.Step]; ok {
			out = append(out, Point{Step: q.Step, Time: q.Time, V: q.V + v})
		}
	}
	return out
}

func mean(p []Point) float64 {
	if len(p) == 0 {
		return math.NaN()
	}
	s := 0.0
	for _, x := range p {
		s += x.V
	}
	return s / float64(len(p))
}

// cv is the coefficient of variation of p: its standard deviation over
// its mean's magnitude (NaN for fewer than 2 points or a zero mean).
func cv(p []Point) float64 {
	m := mean(p)
	if len(p) < 2 || m == 0 {
		return math.NaN()
	}
	var ss float64
	for _, q := range p {
		ss += (q.V - m) * (q.V - m)
	}
	return math.Sqrt(ss/float64(len(p)-1)) / math.Abs(m)
}

// slope fits v = a + b*step by least squares and returns b.
func slope(p []Point) float64 {
	if len(p) < 2 {
		return math.NaN()
	}
	var sx, sy, sxx, sxy float64
	n := float64(len(p))
	for _, q := range p {
		x := float64(q.Step)
		sx += x
		sy += q.V
		sxx += x * x
		sxy += x * q.V
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return math.NaN()
	}
	return (n*sxy - sx*sy) / d
}

// pearson correlates two series sampled at the same steps.
func pearson(a, b []Point) (float64, int) {
	bm := map[int64]float64{}
	for _, q := range b {
		bm[q.Step] = q.V
	}
	var xs, ys []float64
	for _, q := range a {
		if v, ok := bm[q.Step]; ok {
			xs = append(xs, q.V)
			ys = append(ys, v)
		}
	}
	n := len(xs)
	if n < 3 {
		return math.NaN(), n
	}
	var mx, my float64
	for i := range xs {
		mx += xs[i]
		my += ys[i]
	}
	mx /= float64(n)
	my /= float64(n)
	var sxy, sxx, syy float64
	for i := range xs {
		sxy += (xs[i] - mx) * (ys[i] - my)
		sxx += (xs[i] - mx) * (xs[i] - mx)
		syy += (ys[i] - my) * (ys[i] - my)
	}
	if sxx == 0 || syy == 0 {
		return math.NaN(), n
	}
	return sxy / math.Sqrt(sxx*syy), n
}

// chanceR is the largest |r| that n pairs of unrelated numbers give 19
// times in 20 (Fisher's z: tanh(1.96/sqrt(n-3))).
func chanceR(n int) float64 {
	return math.Tanh(1.96 / math.Sqrt(float64(n-3)))
}

// tail is the last evaluations a trend at the end is fitted to: 30 % of
// them, at least 3 (all of them when there are fewer).
func tail(p []Point) []Point {
	k := max(3, int(math.Ceil(float64(len(p))*0.3)))
	return p[len(p)-min(k, len(p)):]
}

func fmtNum(v float64, f string) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "n/a"
	}
	return fmt.Sprintf(f, v)
}

// fmtDur prints seconds as a duration to the second (to the millisecond
// below 10 s).
func fmtDur(sec float64) string {
	d := time.Duration(sec * 1e9)
	if d < 10*time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// The thresholds of the report's verdicts, stated in its sentences.
const (
	// flatPer1000 is a change of the eval loss per 1000 steps, as a share
	// of the raw eval loss, below which it counts as flat.
	flatPer1000 = 0.01
	// slowShare is the share of the run's average rate of fall below which
	// a still falling eval loss counts as levelling off.
	slowShare = 0.25
	// closeGap is an eval - train gap, as a share of the train loss, that
	// counts as close; a gap that grew by more (and is more) counts as
	// growing.
	closeGap = 0.05
	// minSamples is the fewest samples the report draws a conclusion
	// from (notEnough): logged intervals for a correlation, timed steps
	// for a prediction; flatCV the coefficient of variation below which a
	// series counts as flat (nothing to correlate).
	minSamples = 8
	flatCV     = 0.01
)

// notEnough is the report's one rule for "not enough data": "" when n
// samples (counted as unit says) are at least minSamples, else why not,
// what needs more and how to get them: "3 logged interval(s); a
// correlation needs at least 8 (--log-every logs more often)".
func notEnough(n int, unit, use, remedy string) string {
	if n >= minSamples {
		return ""
	}
	return fmt.Sprintf("%d %s; %s needs at least %d (%s)", n, unit, use, minSamples, remedy)
}

// report is one report being written: the run's records and run.json.
type report struct {
	dir  string
	ri   metrics.RunInfo
	recs []metrics.Record
	lr   Schedule
	b    strings.Builder
	// the train records' series
	trainLoss, trainRaw, lrLog, stepTime, toks, compute []Point
	exposed, hidden, netOut, netIn, shmOut, shmIn       []Point
	cpu, gpu                                            []Point
	// the eval records'
	evalLoss, evalRaw, bleu []Point
	lastStep                int64
}

func (r *report) w(f string, a ...any) { fmt.Fprintf(&r.b, f, a...) }

// plot draws lines into name and returns the Markdown that shows it.
func (r *report) plot(name, title, y string, lines ...Line) string {
	ok, err := PlotPNG(filepath.Join(r.dir, name), title, y, lines...)
	if err != nil || !ok {
		return "(no data to plot)"
	}
	return fmt.Sprintf("![%s](%s)", title, name)
}

// Write reads a run directory and writes report.md and the PNG plots
// it refers to, answering the lab's questions from the run's own numbers,
// each answer with the evidence it rests on. lr is the run's learning-rate
// policy (nil: only the logged rates are shown). It returns the report's
// path.
func Write(dir string, lr Schedule) (string, error) {
	ri, err := metrics.ReadRunInfo(dir)
	if err != nil {
		return "", fmt.Errorf("%s is not a run directory: %w", dir, err)
	}
	recs, torn, err := metrics.ReadJSONLTorn(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		return "", err
	}
	r := &report{dir: dir, ri: ri, recs: recs, lr: lr}
	tr := func(name string) []Point { return series(recs, "train", name) }
	r.trainLoss, r.trainRaw, r.lrLog, r.stepTime, r.toks, r.compute = tr("loss"), tr("loss_raw"), tr("lr"), tr("step_time_s"), tr("tokens_per_s"), tr("compute_s")
	r.exposed, r.hidden, r.netOut, r.netIn, r.shmOut, r.shmIn = tr("comm_exposed_ms"), tr("comm_hidden_pct"), tr("net_out_MBps"), tr("net_in_MBps"), tr("shm_out_MBps"), tr("shm_in_MBps")
	r.cpu, r.gpu = tr("cpu_util_pct"), tr("gpu_util_pct")
	r.evalLoss, r.evalRaw, r.bleu = series(recs, "eval", "loss"), series(recs, "eval", "loss_raw"), series(recs, "eval", "bleu")
	for _, rec := range recs {
		r.lastStep = max(r.lastStep, rec.Step)
	}

	r.w("# Training report\n\n")
	r.w("Run directory `%s`: preset `%s` (%s parameters), %d rank(s) on %s, %s, %d tokens per rank per batch.\n\n",
		dir, ri.Preset, Commas(ri.Params), ri.WorldSize, strings.Join(UniqueHosts(ri.Hosts), ", "), r.deviceName(), ri.BatchTokens)
	if torn > 0 {
		r.w("Note: line %d of `metrics.jsonl`, its last, was cut short (its writer was killed mid-line) and is left out; this report is of the %d records before it.\n\n", torn, len(recs))
	}
	r.timeSection()
	r.lrSection()
	r.trainedSection()
	r.overfitSection()
	r.devicesSection()
	r.networkSection()
	r.correlationSection()
	r.datasetSection()
	r.w("## Which files make a checkpoint, and how big?\n\n")
	ckdir := ri.CheckpointDir
	if ckdir == "" {
		ckdir = dir
	}
	r.w("%s\n", describeCheckpoints(ckdir))
	r.w("## What if? (predictions, not measurements)\n\n")
	r.w("From this run's measured compute by `nmt-train plan --from-run %s` (docs/plan.md: the model and how well it matched real runs).\n\n", dir)
	for _, l := range WhatIf(ri, MeasureRun(recs, ri.WorldSize)) {
		r.w("- %s\n", l)
	}

	out := filepath.Join(dir, "report.md")
	return out, os.WriteFile(out, []byte(r.b.String()), 0o644)
}

// onGPU says whether the run trained on GPUs.
func (r *report) onGPU() bool { return strings.HasPrefix(r.ri.Device, "cuda") || len(r.gpu) > 0 }

// deviceName is the device for the report's first line.
func (r *report) deviceName() string {
	if r.onGPU() {
		return orStr(r.ri.Device, "cuda")
	}
	if r.ri.CPUModel != "" {
		return "the CPU (" + r.ri.CPUModel + ")"
	}
	return "the CPU"
}

// segment is one part of a run, from a start (fresh, --resume, or a
// restart) to its last record.
type segment struct {
	from, to   int64   // the step it started after, the last step it made
	start, end float64 // unix seconds: its start, its last record
	logged     bool    // it made a training step: logged one, or stopped with a checkpoint after it
}

// segmentsOf cuts the records into segments at the "start" records. The
// records before the first (a run directory from before start records)
// form a segment that began at started, when known. A segment ends with
// its last record: a stop on a signal (its checkpoint holds the steps
// made since the last log line, and their time) or its last log line.
func segmentsOf(recs []metrics.Record, started float64) []segment {
	var segs []segment
	for _, rec := range recs {
		if rec.Kind == "start" {
			segs = append(segs, segment{from: rec.Step, to: rec.Step, start: rec.Time, end: rec.Time})
			continue
		}
		if len(segs) == 0 {
			s := rec.Time
			if started > 0 && started < s {
				s = started
			}
			segs = append(segs, segment{start: s, end: s})
		}
		sg := &segs[len(segs)-1]
		sg.end = max(sg.end, rec.Time)
		if rec.Kind == "train" || rec.Kind == "stop" && rec.Step > sg.from {
			sg.to, sg.logged = max(sg.to, rec.Step), true
		}
	}
	// a start that kept no step (its records were cut back on a resume)
	// took no time that the run shows
	return slices.DeleteFunc(segs, func(s segment) bool { return !s.logged })
}

func (r *report) timeSection() {
	r.w("## How long did it take, and how many steps?\n\n")
	segs := segmentsOf(r.recs, r.ri.Started)
	var total float64
	for _, s := range segs {
		total += s.end - s.start
	}
	switch {
	case len(segs) == 0:
		r.w("- No training step was logged.\n")
	case total <= 0:
		r.w("- **%s steps**; how long they took is unknown (the records hold a single time and run.json no start).\n", Commas(r.lastStep))
	case len(segs) == 1:
		r.w("- Training time: **%s** for **%s steps** (from the start to the last record, in one go).\n", fmtDur(total), Commas(r.lastStep))
	default:
		parts := make([]string, len(segs))
		for i, s := range segs {
			how := "started fresh"
			if s.from > 0 {
				how = fmt.Sprintf("resumed from the checkpoint of step %s", Commas(s.from))
			}
			parts[i] = fmt.Sprintf("steps %s-%s in %s (%s)", Commas(s.from+1), Commas(s.to), fmtDur(s.end-s.start), how)
		}
		r.w("- Training time: **%s** for **%s steps**, the sum of %d segments: %s.\n", fmtDur(total), Commas(r.lastStep), len(segs), strings.Join(parts, "; "))
		span := segs[len(segs)-1].end - segs[0].start
		r.w("- From the first start to the last record: %s, of which %s passed between the segments, while nothing trained.\n", fmtDur(span), fmtDur(span-total))
	}
	every := ""
	if len(segs) > 1 {
		every = ", from every segment"
	}
	if len(r.stepTime) == 0 {
		if len(segs) > 0 { // it stopped before its first log line
			r.w("- Step time and throughput: **not enough data**: no log line was written (--log-every logs more often).\n")
		}
	} else {
		r.w("- Average step time: **%s s** (median %s s) over %d logged intervals%s.\n", fmtNum(mean(r.stepTime), "%.3f"), fmtNum(median(r.stepTime), "%.3f"), len(r.stepTime), every)
		toks := "n/a"
		if m := mean(r.toks); !math.IsNaN(m) && !math.IsInf(m, 0) {
			toks = Commas(int64(math.Round(m)))
		}
		r.w("- Throughput: **%s target tokens/s** on average across the job.\n", toks)
	}
	r.w("%s\n", describeInterruptions(r.recs))
	r.w("%s\n\n", r.plot("step_time.png", "step time", "seconds", Line{"step time", r.stepTime}))
}

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

// DivergeFactor is how many times its lowest so far the smoothed loss must
// be, besides above ln(V), for LossDiverging.
const DivergeFactor = 10

// LossDiverging is the rule of the loss growth warning (the trainer's log
// line, the report): the smoothed raw loss (cross entropy, an exponential
// moving average over steps) is more than DivergeFactor times the lowest
// it was so far and above ln(vocab), the loss of a uniform guess among
// vocab pieces. A healthy run cannot meet it, warm-up included: it starts
// near ln(vocab) (its lowest so far is then its current value) and falls,
// and its noise is far from a factor 10; a run whose loss grows by orders
// of magnitude (a learning rate too high) meets it at the log line where
// the growth passes the factor. Either condition alone could fire
// wrongly: ln(vocab) on a freshly initialized model (a little above it),
// the factor on a model near zero loss. False for an unknown vocab (0).
func LossDiverging(smoothed, lowest float64, vocab int) bool {
	if vocab < 2 || !(lowest > 0) || math.IsNaN(smoothed) {
		return false
	}
	return smoothed > DivergeFactor*lowest && smoothed > math.Log(float64(vocab))
}

// DescribeDiverging is the trainer's warning when LossDiverging holds at
// a log line.
func DescribeDiverging(step int64, smoothed, lowest float64, vocab int) string {
	return fmt.Sprintf("step %s: the loss is growing: smoothed raw loss %s is %s times its lowest so far (%.2f) and above ln(%d) = %.2f, the loss of a uniform guess: the run is diverging (a smaller --learning-rate or more --warmup-steps)",
		Commas(step), lossNum(smoothed), Commas(int64(smoothed/lowest)), lowest, vocab, math.Log(float64(vocab)))
}

// lossNum writes a loss: 2 decimals, or a whole number with commas from
// 1000 up.
func lossNum(v float64) string {
	if math.Abs(v) >= 1000 && !math.IsInf(v, 0) {
		return Commas(int64(math.Round(v)))
	}
	return fmt.Sprintf("%.2f", v)
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

func cmpF(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
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

// byRank prints per-rank means: "rank 0 89 %, rank 1 87 %".
func byRank(s [][]Point, unit string) string {
	parts := make([]string, 0, len(s))
	for i, p := range s {
		if len(p) > 0 {
			parts = append(parts, fmt.Sprintf("rank %d %s%s", i, fmtNum(mean(p), "%.0f"), unit))
		}
	}
	return strings.Join(parts, ", ")
}

func (r *report) devicesSection() {
	ri := r.ri
	r.w("## Were the devices busy?\n\n")
	hosts := UniqueHosts(ri.Hosts)
	cpuRanks, gpuRanks := perRank(r.recs, "train", "cpu_util_pct"), perRank(r.recs, "train", "gpu_util_pct")
	if r.onGPU() {
		r.w("- Trained on GPUs: rank 0's is %s.\n", orStr(ri.Device, "cuda"))
		if len(r.gpu) > 0 {
			r.w("- GPU utilization (NVML, the share of time a kernel ran): **%s %%** on average", fmtNum(mean(r.gpu), "%.0f"))
			if len(gpuRanks) > 1 {
				r.w(" (%s)", byRank(gpuRanks, " %"))
			}
			r.w(".\n")
		}
		if used, peak := series(r.recs, "train", "gpu_mem_used_MiB"), series(r.recs, "train", "gpu_mem_peak_MiB"); len(used) > 0 {
			r.w("- GPU memory: %s MiB in use on the device at the last log line (every process, as nvidia-smi counts), gorun's own allocations peaked at %s MiB.\n",
				fmtNum(used[len(used)-1].V, "%.0f"), fmtNum(maxOf(peak), "%.0f"))
		}
	} else {
		cpu := orStr(ri.CPUModel, "CPU model unknown")
		if ri.CPUs > 0 {
			cpu += fmt.Sprintf(", %d logical CPUs", ri.CPUs)
		}
		onHost0 := 0
		for _, h := range ri.Hosts {
			if h == hosts[0] {
				onHost0++
			}
		}
		where := fmt.Sprintf("rank 0's host (%s: %s)", hosts[0], cpu)
		if len(hosts) == 1 {
			where = fmt.Sprintf("one host (%s: %s)", hosts[0], cpu)
		}
		r.w("- Trained on the CPU of %s; %s there, %s each. No GPU was used.\n", where, words.Plural(max(onHost0, 1), "rank"), words.Plural(ri.Threads, "compute thread"))
	}
	if len(r.cpu) == 0 {
		r.w("- CPU use: **not enough data**: no log line recorded it (--log-every logs more often).\n")
	} else {
		r.w("- CPU use: **%s %%** of the cores given to each rank on average", fmtNum(mean(r.cpu), "%.0f"))
		if len(cpuRanks) > 1 {
			r.w(" (%s)", byRank(cpuRanks, " %"))
		}
		r.w(".\n")
	}
	if len(r.compute) > 0 && len(r.stepTime) > 0 {
		r.w("- Compute (forward, backward, optimizer) is **%s %%** of the step time; the rest is exposed communication, data and logging.\n", fmtNum(100*mean(r.compute)/mean(r.stepTime), "%.0f"))
	}
	lines := []Line{{"cpu", r.cpu}, {"gpu", r.gpu}}
	if k := len(cpuRanks) + len(gpuRanks); k > 1 && k <= len(palette) {
		lines = nil
		for i, p := range cpuRanks {
			lines = append(lines, Line{fmt.Sprintf("cpu rank %d", i), p})
		}
		for i, p := range gpuRanks {
			lines = append(lines, Line{fmt.Sprintf("gpu rank %d", i), p})
		}
	}
	r.w("\n%s\n\n", r.plot("utilization.png", "utilization", "%", lines...))
}

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

func (r *report) datasetSection() {
	d := r.ri.Dataset
	r.w("## How big was the training set?\n\n")
	size := fmt.Sprintf("**%.1f MB** on disk", d.MB)
	if d.InMemory {
		size = fmt.Sprintf("made in memory at start (no file; %.1f MB of text)", d.MB)
	}
	r.w("- `%s`: %s, **%s lines** (sentence pairs), %s source and %s target tokens; %s lines dropped (too long or empty).\n\n",
		orStr(d.Name, "corpus"), size, Commas(d.Lines), Commas(d.SrcTokens), Commas(d.TgtTokens), Commas(d.Dropped))
}

// describeInterruptions lists the stops on a signal ("stop" records) and
// the restarts after a failure ("restart" records) of a run, one bullet
// each; "" when it ran in one go.
func describeInterruptions(recs []metrics.Record) string {
	var b strings.Builder
	for _, r := range recs {
		switch r.Kind {
		case "stop":
			fmt.Fprintf(&b, "- Stopped by %s after step %s (checkpoint %s written).\n",
				orStr(r.Text["signal"], "a signal"), Commas(r.Step), orStr(r.Text["checkpoint"], "?"))
		case "restart":
			fmt.Fprintf(&b, "- Restart %.0f (gorun --max-restarts) after %s: resumed from step %s; %s logged steps of the failed start lost.\n",
				r.Values["restart"], orStr(r.Text["cause"], "a failure"), Commas(r.Step), Commas(int64(r.Values["steps_lost"])))
		}
	}
	return b.String()
}

func describeCheckpoints(dir string) string {
	entries, _ := filepath.Glob(filepath.Join(dir, "ckpt-*"))
	sort.Strings(entries)
	if len(entries) == 0 {
		return "- No checkpoint was written in this run.\n"
	}
	var b strings.Builder
	latestB, _ := os.ReadFile(filepath.Join(dir, "latest"))
	latest := strings.TrimSpace(string(latestB))
	fmt.Fprintf(&b, "- %d checkpoint(s) kept; `latest` points to `%s`.\n", len(entries), latest)
	// the one latest names; without it the newest (by step: ckpt-12 sorts
	// before ckpt-6)
	last := filepath.Join(dir, latest)
	if st, err := os.Stat(last); latest == "" || err != nil || !st.IsDir() {
		step := func(p string) int {
			n, _ := strconv.Atoi(strings.TrimPrefix(filepath.Base(p), "ckpt-"))
			return n
		}
		last = slices.MaxFunc(entries, func(a, b string) int { return step(a) - step(b) })
	}
	files, _ := os.ReadDir(last)
	var total int64
	fmt.Fprintf(&b, "- `%s` holds:\n\n| file | bytes |\n|---|---|\n", filepath.Base(last))
	for _, f := range files {
		info, err := f.Info()
		if err != nil {
			continue
		}
		total += info.Size()
		fmt.Fprintf(&b, "| %s | %s |\n", f.Name(), Commas(info.Size()))
	}
	fmt.Fprintf(&b, "| **total** | **%s** (%.1f MB) |\n", Commas(total), float64(total)/1e6)
	return b.String()
}

func nearest(p []Point, step int64) float64 {
	best, bd := math.NaN(), int64(math.MaxInt64)
	for _, q := range p {
		d := q.Step - step
		if d < 0 {
			d = -d
		}
		if d < bd {
			best, bd = q.V, d
		}
	}
	return best
}

func median(p []Point) float64 {
	if len(p) == 0 {
		return math.NaN()
	}
	v := make([]float64, len(p))
	for i, q := range p {
		v[i] = q.V
	}
	sort.Float64s(v)
	return v[len(v)/2]
}

// UniqueHosts returns the distinct names of s in first-seen order
// ("localhost" for none).
func UniqueHosts(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	if len(out) == 0 {
		return []string{"localhost"}
	}
	return out
}

func orStr(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// Commas formats n with thousands separators (1,234,567).
func Commas[T int64 | int](n T) string {
	s := fmt.Sprint(int64(n))
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

func maxOf(p []Point) float64 {
	m := math.NaN()
	for _, x := range p {
		if math.IsNaN(m) || x.V > m {
			m = x.V
		}
	}
	return m
}
