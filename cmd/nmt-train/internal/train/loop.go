package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/gorun/gorun/metrics"
	"github.com/gorun/gorun/report"
)

// The training loop: the steps, the log lines and their figures
// (averaged over a window of steps), evaluations and checkpoints on
// schedule, and the end of the run (the ranks' timelines merged, the
// bottleneck analysis, the report).

func (t *Trainer) loop(ctx context.Context) error {
	o := t.o
	var (
		win        window
		lastBytes  = meshTraffic(t.mesh)
		lastLog    = time.Now()
		cpuLast    = cpuSeconds()
		smoothRaw  = math.NaN()
		trainStart = time.Now()
		// lowest: the lowest smoothed raw loss of any step so far; warned:
		// the loss growth warning was given (once a run)
		lowest = math.Inf(1)
		warned bool
	)
	t.bar = newProgress(t.out, t.leader() && !o.Quiet, t.step, o.MaxSteps)
	for t.step < o.MaxSteps {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("interrupted at step %d: %w", t.step, err)
		}
		r, err := t.trainStep(ctx)
		var diverged *divergedError
		if errors.As(err, &diverged) {
			return err
		}
		if err != nil {
			return fmt.Errorf("step %d: %w", t.step, err)
		}
		lr := t.lr.LR(t.step)
		t.step++
		win.add(r)
		t.computeTotal += r.compute.Seconds()
		t.syncTotal += r.sync.Seconds()
		t.backTotal += r.backward.Seconds()
		t.computeSteps++
		if p := r.comm.PowerSGD; p.Compressed {
			t.psgd.PowerSGDSteps++
			t.psgd.PowerSGDBytes += float64(p.Bytes)
			t.psgd.PowerSGDFP16Bytes += float64(p.FP16Bytes)
			t.psgd.PowerSGDCompute += p.Compute.Seconds()
			t.psgd.PowerSGDStep += r.dur.Seconds()
		}
		if math.IsNaN(smoothRaw) {
			smoothRaw = r.lossRaw
		} else {
			smoothRaw = 0.98*smoothRaw + 0.02*r.lossRaw
		}
		lowest = min(lowest, smoothRaw)
		t.bar.update(t.step, r.lossLab, r.tokens, r.dur)
		if t.step%o.LogEvery == 0 || t.step == o.MaxSteps {
			now := time.Now()
			moved := meshTraffic(t.mesh)
			secs := now.Sub(lastLog).Seconds()
			cpuNow := cpuSeconds()
			own := figuresOf(moved, lastBytes, secs, 100*(cpuNow-cpuLast)/secs/float64(max(1, runtime.NumCPU()/max(1, t.id.LocalSize))))
			lastBytes, lastLog, cpuLast = moved, now, cpuNow
			a := win.avg()
			win = window{}
			vals := map[string]float64{
				"loss": a.lossLab, "loss_raw": a.lossRaw, "loss_raw_smoothed": smoothRaw, "loss_raw_smoothed_lowest": lowest, "lr": lr,
				"step_time_s": a.dur, "tokens_per_s": a.tokensPerSec, "comm_exposed_ms": a.exposed * 1e3,
				"comm_ms": a.comm * 1e3, "comm_hidden_pct": a.hiddenPct, "compute_s": a.compute,
				"backward_s": a.backward, "sync_s": a.sync, "compute_sd_s": a.ownSD,
				"skipped_steps": float64(a.skipped), "epoch": float64(t.data.Train.Epoch()),
			}
			gpuNote, err := t.gatherFigures(ctx, own, vals)
			if err != nil {
				return fmt.Errorf("step %d: gathering the ranks' figures: %w", t.step, err)
			}
			outMB, inMB := vals["net_out_MBps"], vals["net_in_MBps"] // the ranks' mean, as logged
			if t.lossScaling {
				vals["loss_scale"] = float64(t.scaler.Scale)
			}
			psgd := "" // the compressed matrices' bytes and the compressor's time (docs/fusion.md)
			if t.powerSGD() != nil {
				vals["powersgd_bytes"], vals["powersgd_fp16_bytes"], vals["powersgd_compute_ms"] = a.psgdBytes, a.psgdFP16, a.psgdSec*1e3
				if a.psgdFP16 > 0 {
					psgd = fmt.Sprintf(" | powersgd %.2f MB for fp16's %.1f MB, %.0f ms", a.psgdBytes/1e6, a.psgdFP16/1e6, a.psgdSec*1e3)
				}
			}
			comm := "" // one rank communicates nothing
			if t.id.Size > 1 {
				traffic := fmt.Sprintf("net %.0f MB/s out %.0f MB/s in", outMB, inMB)
				if shmOut, shmIn := vals["shm_out_MBps"], vals["shm_in_MBps"]; shmOut+shmIn > 0 {
					if outMB+inMB == 0 { // one host: shared memory carried everything
						traffic = fmt.Sprintf("shm %.0f MB/s out %.0f MB/s in", shmOut, shmIn)
					} else {
						traffic += fmt.Sprintf(", shm %.0f/%.0f", shmOut, shmIn)
					}
				}
				comm = fmt.Sprintf(" | %s | comm exposed %.0f ms (%.0f %% hidden)%s", traffic, a.exposed*1e3, a.hiddenPct, psgd)
			}
			t.logf("step %s/%s | loss %.4f (smoothed raw %.2f) | lr %.3e | %.3f s/step | %s tok/s%s%s | ETA %s",
				report.Commas(int64(t.step)), report.Commas(int64(o.MaxSteps)), a.lossLab, smoothRaw, lr, a.dur, report.Commas(int64(a.tokensPerSec)), comm, gpuNote, t.bar.eta(t.step))
			if !warned && report.LossDiverging(smoothRaw, lowest, t.data.VocabSize) {
				warned = true
				t.logf("nmt-train: warning: %s", report.DescribeDiverging(int64(t.step), smoothRaw, lowest, t.data.VocabSize))
			}
			if t.run != nil {
				if err := t.run.Log("train", int64(t.step), vals, nil); err != nil {
					return err
				}
			}
		}
		evalNow := !o.NoEval && ((o.EvalEvery > 0 && t.step%o.EvalEvery == 0) || t.step == o.MaxSteps)
		if evalNow {
			t.bar.clear()
			if err := t.evaluate(ctx); err != nil {
				return fmt.Errorf("eval at step %d: %w", t.step, err)
			}
		}
		if (o.CkptEvery > 0 && t.step%o.CkptEvery == 0) || t.step == o.MaxSteps {
			if err := t.checkpoint(ctx); err != nil {
				return err
			}
		}
		if r.stop {
			t.bar.clear()
			return t.stop(ctx)
		}
	}
	t.bar.clear()
	if err := t.comm.Barrier(ctx); err != nil {
		return err
	}
	if t.tl != nil {
		t.tl.Close()
		t.tl = nil
		// Every rank's part is complete; rank 0 merges those it can see.
		if err := t.comm.Barrier(ctx); err != nil {
			return err
		}
	}
	if t.leader() {
		if o.Timeline != "" {
			if err := t.mergeTimeline(); err != nil {
				return err
			}
		}
		t.run.Close()
		t.run = nil
		if t.computeSteps > 0 && t.id.Size > 1 {
			n := float64(t.computeSteps)
			st := report.StepTimes{Steps: int64(t.computeSteps), Compute: t.computeTotal / n, Sync: t.syncTotal / n, Backward: t.backTotal / n}
			if k := float64(t.psgd.PowerSGDSteps); k > 0 { // means over the compressed steps
				st.PowerSGDSteps = t.psgd.PowerSGDSteps
				st.PowerSGDBytes, st.PowerSGDFP16Bytes = t.psgd.PowerSGDBytes/k, t.psgd.PowerSGDFP16Bytes/k
				st.PowerSGDCompute, st.PowerSGDStep = t.psgd.PowerSGDCompute/k, t.psgd.PowerSGDStep/k
			}
			t.logf("%s", report.AnalyzeBottleneck(t.info, st))
		}
		if err := t.writeGPUProfile(); err != nil {
			return err
		}
		rep, err := WriteReport(o.RunDir)
		if err != nil {
			return fmt.Errorf("report: %w", err)
		}
		done := fmt.Sprintf("%d steps in %s", t.step, time.Since(trainStart).Round(time.Second))
		if t.resumedFrom > 0 { // this process made only the steps after the checkpoint; the report sums every segment
			done = fmt.Sprintf("steps %d-%d in %s (the whole run: report.md)", t.resumedFrom+1, t.step, time.Since(trainStart).Round(time.Second))
		}
		t.logf("nmt-train: done, %s. Report: %s; plots: %s/*.png; TensorBoard: tensorboard --logdir %s; checkpoints: %s/ckpt-*",
			done, rep, o.RunDir, o.RunDir, o.RunDir)
	}
	return nil
}

// window averages the steps between two log lines.
type window struct {
	n                         int
	raw, lab, dur, comm, expo float64
	compute, tokens           float64 // tokens: target tokens of all ranks
	backward, sync            float64
	own, own2                 float64 // compute less sync (this rank's own work), and its squares
	skipped                   int
	// PowerSGD: the bytes of P and Q all-reduced, what the compressed
	// matrices would have been in fp16, the compressor's time
	psgdBytes, psgdFP16, psgdSec float64
}

type windowAvg struct {
	lossRaw, lossLab, dur, comm, exposed, compute, tokensPerSec, hiddenPct float64
	// backward and sync: parts of compute; ownSD: the standard deviation
	// from step to step of compute less sync (the planner's spread)
	backward, sync, ownSD float64
	skipped               int
	// per step: PowerSGD's bytes, fp16's for the same matrices, its
	// compute (0 before --powersgd-start-step)
	psgdBytes, psgdFP16, psgdSec float64
}

func (w *window) add(r stepResult) {
	w.n++
	w.raw += r.lossRaw
	w.lab += r.lossLab
	w.dur += r.dur.Seconds()
	w.comm += r.comm.Comm.Seconds()
	w.expo += r.comm.Exposed.Seconds()
	w.compute += r.compute.Seconds()
	w.backward += r.backward.Seconds()
	w.sync += r.sync.Seconds()
	own := (r.compute - r.sync).Seconds()
	w.own += own
	w.own2 += own * own
	w.tokens += float64(r.tokens)
	if r.skipped {
		w.skipped++
	}
	if p := r.comm.PowerSGD; p.Compressed {
		w.psgdBytes += float64(p.Bytes)
		w.psgdFP16 += float64(p.FP16Bytes)
		w.psgdSec += p.Compute.Seconds()
	}
}

func (w *window) avg() windowAvg {
	n := float64(max(w.n, 1))
	a := windowAvg{lossRaw: w.raw / n, lossLab: w.lab / n, dur: w.dur / n, comm: w.comm / n, exposed: w.expo / n,
		compute: w.compute / n, backward: w.backward / n, sync: w.sync / n, skipped: w.skipped,
		psgdBytes: w.psgdBytes / n, psgdFP16: w.psgdFP16 / n, psgdSec: w.psgdSec / n}
	if w.n > 1 {
		m := w.own / n
		a.ownSD = math.Sqrt(math.Max(0, (w.own2-n*m*m)/(n-1)))
	}
	if w.dur > 0 {
		a.tokensPerSec = w.tokens / w.dur
	}
	if w.comm > 0 {
		a.hiddenPct = 100 * (1 - w.expo/w.comm)
		if a.hiddenPct < 0 {
			a.hiddenPct = 0
		}
	} else {
		a.hiddenPct = 100
	}
	return a
}

// cpuSeconds is this process's user+system CPU time.
func cpuSeconds() float64 {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		s = s[i+1:]
	}
	f := strings.Fields(s)
	if len(f) < 13 {
		return 0
	}
	var u, sy float64
	fmt.Sscan(f[11], &u)
	fmt.Sscan(f[12], &sy)
	return (u + sy) / 100 // USER_HZ is 100 on Linux
}

func timelinePart(path string, r int) string { return fmt.Sprintf("%s.rank%d", path, r) }

// mergeTimeline joins the ranks' parts into one trace. Ranks on other hosts
// wrote their part on their own host; those parts are named, not merged.
func (t *Trainer) mergeTimeline() error {
	var parts, missing []string
	for r := 0; r < t.id.Size; r++ {
		p := timelinePart(t.o.Timeline, r)
		if _, err := os.Stat(p); err == nil {
			parts = append(parts, p)
		} else {
			missing = append(missing, p)
		}
	}
	if err := metrics.MergeTimelineFiles(t.o.Timeline, parts...); err != nil {
		return fmt.Errorf("timeline: %w", err)
	}
	for _, p := range parts {
		os.Remove(p)
	}
	t.logf("nmt-train: timeline of %d rank(s) written to %s (open it in https://ui.perfetto.dev or chrome://tracing)", len(parts), t.o.Timeline)
	if len(missing) > 0 {
		t.logf("nmt-train: the other ranks' timelines are on their hosts: %s", strings.Join(missing, ", "))
	}
	return nil
}
