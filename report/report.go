// Package report analyses a run directory that package metrics recorded:
// report.md and the PNG plots it shows, the bottleneck verdict, and the
// run as the planner's input (its what-if predictions).
package report

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/gorun/gorun/metrics"
)

// Schedule is a run's learning-rate policy: the rate of the step with
// 0-based index step (the step the log calls step+1).
type Schedule func(step int) float64

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
