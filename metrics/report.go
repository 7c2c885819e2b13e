package metrics

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// RunInfo is run.json: what a run was asked to do and on what data. The
// trainer writes it at start; the report reads it.
type RunInfo struct {
	Preset        string   `json:"preset"`
	Params        int64    `json:"params"`
	DModel        int      `json:"d_model"`
	WorldSize     int      `json:"world_size"`
	Hosts         []string `json:"hosts"`
	Device        string   `json:"device"`
	Threads       int      `json:"threads_per_rank"`
	BatchTokens   int      `json:"batch_tokens_per_rank"`
	LRPolicy      string   `json:"lr_policy"`
	LearningRate  float64  `json:"learning_rate"`
	Warmup        int      `json:"warmup_steps"`
	MaxSteps      int      `json:"max_steps"`
	LinkGbps      float64  `json:"link_gbps"`
	LinkSource    string   `json:"link_source"` // "flag", "probe", "" (unknown)
	Compression   string   `json:"compression"`
	Dataset       Dataset  `json:"dataset"`
	Started       float64  `json:"started"`
	CheckpointDir string   `json:"checkpoint_dir"`
}

// Dataset describes the training set.
type Dataset struct {
	Name      string  `json:"name"`
	MB        float64 `json:"mb"`
	Lines     int64   `json:"lines"`
	SrcTokens int64   `json:"src_tokens"`
	TgtTokens int64   `json:"tgt_tokens"`
	Dropped   int64   `json:"dropped"`
}

// WriteRunInfo writes dir/run.json.
func WriteRunInfo(dir string, ri RunInfo) error {
	b, err := json.MarshalIndent(ri, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "run.json"), append(b, '\n'), 0o644)
}

// ReadRunInfo reads dir/run.json.
func ReadRunInfo(dir string) (RunInfo, error) {
	var ri RunInfo
	b, err := os.ReadFile(filepath.Join(dir, "run.json"))
	if err != nil {
		return ri, err
	}
	if err := json.Unmarshal(b, &ri); err != nil {
		return ri, fmt.Errorf("%s: %v", filepath.Join(dir, "run.json"), err)
	}
	return ri, nil
}

func series(recs []Record, kind, name string) []Point {
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

func tail(p []Point, frac float64) []Point {
	k := int(math.Ceil(float64(len(p)) * frac))
	if k < 2 {
		k = min(2, len(p))
	}
	return p[len(p)-k:]
}

func fmtNum(v float64, f string) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "n/a"
	}
	return fmt.Sprintf(f, v)
}

// WriteReport reads a run directory and writes report.md and the PNG plots
// it refers to, answering the lab's questions from the run's own numbers.
// It returns the report's path.
func WriteReport(dir string) (string, error) {
	ri, err := ReadRunInfo(dir)
	if err != nil {
		return "", fmt.Errorf("%s is not a run directory: %v", dir, err)
	}
	recs, err := ReadJSONL(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		return "", err
	}
	trainLoss := series(recs, "train", "loss")
	trainRaw := series(recs, "train", "loss_raw")
	evalLoss := series(recs, "eval", "loss")
	evalRaw := series(recs, "eval", "loss_raw")
	bleu := series(recs, "eval", "bleu")
	lr := series(recs, "train", "lr")
	stepTime := series(recs, "train", "step_time_s")
	toks := series(recs, "train", "tokens_per_s")
	netOut := series(recs, "train", "net_out_MBps")
	netIn := series(recs, "train", "net_in_MBps")
	exposed := series(recs, "train", "comm_exposed_ms")
	hidden := series(recs, "train", "comm_hidden_pct")
	compute := series(recs, "train", "compute_s")
	cpu := series(recs, "train", "cpu_util_pct")
	gpu := series(recs, "train", "gpu_util_pct")

	plot := func(name, title, y string, lines ...Line) string {
		ok, err := PlotPNG(filepath.Join(dir, name), title, y, lines...)
		if err != nil || !ok {
			return "(no data to plot)"
		}
		return fmt.Sprintf("![%s](%s)", title, name)
	}
	var b strings.Builder
	w := func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }

	var first, last float64
	var lastStep int64
	for _, r := range recs {
		if first == 0 || r.Time < first {
			first = r.Time
		}
		if r.Time > last {
			last = r.Time
		}
		if r.Step > lastStep {
			lastStep = r.Step
		}
	}
	if ri.Started > 0 {
		first = ri.Started
	}
	w("# Training report\n\n")
	w("Run directory `%s`: preset `%s` (%s parameters), %d rank(s) on %s, %s, %d tokens per rank per batch.\n\n",
		dir, ri.Preset, Commas(ri.Params), ri.WorldSize, strings.Join(UniqueHosts(ri.Hosts), ", "), orStr(ri.Device, "cpu"), ri.BatchTokens)

	w("## How long did it take, and how many steps?\n\n")
	w("- Total wall time: **%s** for **%s steps** (the last logged step).\n", (time.Duration((last - first) * 1e9)).Round(time.Second), Commas(lastStep))
	w("- Average step time: **%s s** (median %s s) over %d logged intervals.\n", fmtNum(mean(stepTime), "%.3f"), fmtNum(median(stepTime), "%.3f"), len(stepTime))
	w("- Throughput: **%s target tokens/s** on average across the job.\n", fmtNum(mean(toks), "%.0f"))
	w("%s\n", describeInterruptions(recs))
	w("%s\n\n", plot("step_time.png", "step time", "seconds", Line{"step time", stepTime}))

	w("## What does the learning-rate schedule do?\n\n")
	if ri.LRPolicy == "transformer" && ri.Warmup > 0 && ri.DModel > 0 {
		peak := ri.LearningRate / math.Sqrt(float64(ri.DModel)) / math.Sqrt(float64(ri.Warmup))
		w("`transformer_policy`: lr = %g x d_model^-0.5 x min((step+1) x warmup^-1.5, (step+1)^-0.5) with d_model %d and warmup %d. ",
			ri.LearningRate, ri.DModel, ri.Warmup)
		w("It rises linearly for the first %d steps to its peak **%.3e** at step %d, then decays as 1/sqrt(step): half the peak at step %d, a quarter at step %d.\n",
			ri.Warmup, peak, ri.Warmup-1, 4*ri.Warmup-1, 16*ri.Warmup-1)
	} else {
		w("Policy `%s`, learning rate %g, warmup %d.\n", ri.LRPolicy, ri.LearningRate, ri.Warmup)
	}
	if len(lr) > 0 {
		w("In this run the rate went from %.3e (step %d) to %.3e (step %d).\n", lr[0].V, lr[0].Step, lr[len(lr)-1].V, lr[len(lr)-1].Step)
	}
	w("\n%s\n\n", plot("lr.png", "learning rate", "lr", Line{"lr", lr}))

	w("## Is the model fully trained?\n\n")
	if len(evalLoss) >= 2 {
		tl := tail(evalLoss, 0.3)
		s := slope(tl) * 1000
		rel := s / math.Abs(mean(tl))
		verdict := "the eval loss has flattened: more steps at this learning rate would gain little"
		if rel < -0.01 {
			verdict = "**no** — the eval loss is still falling; more steps would help"
		} else if rel > 0.01 {
			verdict = "the eval loss is rising at the end: training longer would not help (see overfitting)"
		}
		w("- Eval loss slope over the last %d evaluations: **%s nats per 1000 steps** (%s %% of its level): %s.\n",
			len(tl), fmtNum(s, "%+.4f"), fmtNum(100*rel, "%+.1f"), verdict)
	} else {
		w("- Not enough evaluations (%d) to fit a slope.\n", len(evalLoss))
	}
	if len(bleu) >= 1 {
		w("- BLEU: %s at step %d, **%s** at step %d", fmtNum(bleu[0].V, "%.2f"), bleu[0].Step, fmtNum(bleu[len(bleu)-1].V, "%.2f"), bleu[len(bleu)-1].Step)
		if len(bleu) >= 3 {
			w(" (slope over the last evaluations %s per 1000 steps)", fmtNum(slope(tail(bleu, 0.3))*1000, "%+.2f"))
		}
		w(".\n")
	}
	w("\n%s\n\n%s\n\n", plot("loss.png", "loss (lab convention: smoothed-target entropy subtracted)", "nats", Line{"train", trainLoss}, Line{"eval", evalLoss}),
		plot("bleu.png", "BLEU (sacreBLEU-compatible, 0-100)", "BLEU", Line{"bleu", bleu}))

	w("## Is it overfitting?\n\n")
	if len(evalRaw) >= 2 && len(trainRaw) >= 2 {
		gap := func(at Point) float64 { return at.V - nearest(trainRaw, at.Step) }
		g0, g1 := gap(evalRaw[0]), gap(evalRaw[len(evalRaw)-1])
		verdict := "no sign of overfitting: the gap between eval and train loss is not growing"
		if g1 > g0+0.1 && slope(tail(evalRaw, 0.3)) > 0 {
			verdict = "**yes**: eval loss rises while the gap to train loss grows"
		} else if g1 > g0+0.1 {
			verdict = "the gap is growing, but eval loss is not rising yet: watch it"
		}
		w("- Eval − train loss (raw cross entropy): %s at step %d, %s at step %d: %s.\n\n", fmtNum(g0, "%+.3f"), evalRaw[0].Step, fmtNum(g1, "%+.3f"), evalRaw[len(evalRaw)-1].Step, verdict)
	} else {
		w("- Not enough evaluations to compare train and eval loss.\n\n")
	}
	w("%s\n\n", plot("loss_raw.png", "raw label-smoothed cross entropy", "nats", Line{"train", trainRaw}, Line{"eval", evalRaw}))

	w("## Were the devices busy?\n\n")
	if len(gpu) > 0 {
		w("- GPU utilization (NVML): **%s %%** on average (rank 0's GPU; %s).\n", fmtNum(mean(gpu), "%.0f"), orStr(ri.Device, "cuda"))
		if used, peak := series(recs, "train", "gpu_mem_used_MiB"), series(recs, "train", "gpu_mem_peak_MiB"); len(used) > 0 {
			w("- GPU memory: %s MiB in use on the device at the last log line (every process, as nvidia-smi counts), gorun's own allocations peaked at %s MiB.\n",
				fmtNum(used[len(used)-1].V, "%.0f"), fmtNum(maxOf(peak), "%.0f"))
		}
	} else if !strings.HasPrefix(ri.Device, "cuda") {
		w("- Trained on the CPU (%s): no GPU was used.\n", orStr(ri.Device, "cpu"))
	}
	w("- CPU use: **%s %%** of the cores given to each rank on average.\n", fmtNum(mean(cpu), "%.0f"))
	if len(compute) > 0 && len(stepTime) > 0 {
		w("- Compute (forward, backward, optimizer) is **%s %%** of the step time; the rest is exposed communication, data and logging.\n", fmtNum(100*mean(compute)/mean(stepTime), "%.0f"))
	}
	w("\n%s\n\n", plot("utilization.png", "utilization", "%", Line{"cpu", cpu}, Line{"gpu", gpu}))

	w("## Was the network the bottleneck?\n\n")
	if ri.WorldSize <= 1 {
		w("- One rank: no gradients crossed the network.\n\n")
	} else {
		w("- Exposed communication (after backward finished): **%s ms** per step on average; **%s %%** of the allreduce time was hidden behind backward.\n",
			fmtNum(mean(exposed), "%.1f"), fmtNum(mean(hidden), "%.0f"))
		if len(stepTime) > 0 {
			w("- Exposed communication is **%s %%** of the step time.\n", fmtNum(100*mean(exposed)/1000/mean(stepTime), "%.1f"))
		}
		w("- Network per rank: %s MB/s out, %s MB/s in on average", fmtNum(mean(netOut), "%.1f"), fmtNum(mean(netIn), "%.1f"))
		if ri.LinkGbps > 0 {
			w(" against a link of %.3g Gbit/s = %.0f MB/s (%s): **%s %%** of capacity", ri.LinkGbps, ri.LinkGbps*125, orStr(ri.LinkSource, "given"), fmtNum(100*mean(netOut)/(ri.LinkGbps*125), "%.1f"))
		}
		w(".\n")
		if ri.LinkGbps > 0 && len(compute) > 0 {
			an := AnalyzeBottleneck(ri.Params, ri.WorldSize, ri.LinkGbps, mean(compute))
			w("- %s\n", strings.ReplaceAll(an.String(), "\n", "\n  "))
		}
		w("\n%s\n\n", plot("network.png", "network per rank", "MB/s", Line{"out", netOut}, Line{"in", netIn}))
	}

	w("## How does step time relate to network throughput?\n\n")
	if r, n := pearson(stepTime, netOut); n >= 3 && !math.IsNaN(r) {
		w("- Pearson correlation of step time with outgoing MB/s over %d intervals: **%+.2f**. ", n, r)
		switch {
		case r < -0.5:
			w("Slower steps move fewer MB/s: the transfer volume per step is fixed, so the network rate follows the step time, not the other way round unless exposed communication is large.\n\n")
		case r > 0.5:
			w("Slower steps coincide with more traffic: communication is stretching the steps.\n\n")
		default:
			w("Weak: step time is not driven by network throughput.\n\n")
		}
	} else {
		w("- Not enough intervals with network numbers to correlate.\n\n")
	}

	w("## How big was the training set?\n\n")
	d := ri.Dataset
	w("- `%s`: **%.1f MB** on disk, **%s lines** (sentence pairs), %s source and %s target tokens; %s lines dropped (too long or empty).\n\n",
		orStr(d.Name, "corpus"), d.MB, Commas(d.Lines), Commas(d.SrcTokens), Commas(d.TgtTokens), Commas(d.Dropped))

	w("## Which files make a checkpoint, and how big?\n\n")
	ckdir := ri.CheckpointDir
	if ckdir == "" {
		ckdir = dir
	}
	w("%s\n", describeCheckpoints(ckdir))

	out := filepath.Join(dir, "report.md")
	return out, os.WriteFile(out, []byte(b.String()), 0o644)
}

// describeInterruptions lists the stops on a signal ("stop" records) and
// the restarts after a failure ("restart" records) of a run, one bullet
// each; "" when it ran in one go.
func describeInterruptions(recs []Record) string {
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
