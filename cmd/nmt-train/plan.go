package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/cmd/nmt-train/internal/train"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/fusion"
	"github.com/gorun/gorun/internal/words"
	"github.com/gorun/gorun/kernels"
	"github.com/gorun/gorun/kernels/cpu"
	"github.com/gorun/gorun/metrics"
	"github.com/gorun/gorun/plan"
	"github.com/gorun/gorun/report"
	"github.com/gorun/gorun/transformer"
)

func planCommand() *cli.Command {
	return &cli.Command{
		Name:      "plan",
		Usage:     "predict the step time of H hosts x G devices on a link, before renting them (package plan, docs/plan.md)",
		ArgsUsage: " ",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "preset", Value: "base", Usage: "model size: tiny | small | base | big"},
			&cli.IntFlag{Name: "vocab", Value: 32768, Usage: "vocabulary size (the embedding's rows) without --from-run"},
			&cli.IntFlag{Name: "hosts", Value: 2, Usage: "`H` hosts (with --from-run: the run's unless given)"},
			&cli.IntFlag{Name: "per-host", Value: 1, Usage: "`G` ranks (devices) per host (with --from-run: the run's unless given)"},
			&cli.StringFlag{Name: "link", Value: "1gbit", Usage: "each host's link: a rate in " + linkForms},
			&cli.Float64Flag{Name: "latency-us", Usage: "the link's one-way latency in µs, added to every ring step and tree hop (0: the namespace test hosts)"},
			&cli.StringFlag{Name: "transport", Value: "auto", Usage: "between hosts: auto (as gorun's start-up probe picks: TLS/TCP where it moves more than 1.1x QUIC on this link, else QUIC) | quic | tcp"},
			&cli.Float64Flag{Name: "transport-cap-gbs", Usage: "GB/s one connection carries each way when the CPU limits (0: as measured on this project's 2-core machine, plan/transport.go)"},
			&cli.Float64Flag{Name: "transport-step-us", Usage: "µs of one ring step or tree hop in the transport's software (0: as measured here)"},
			&cli.StringFlag{Name: "device", Value: "cpu", Usage: "cpu (compute measured on this machine, from --from-run, or --compute-s) | a GPU name (h100, a100, ...: needs --compute-s)"},
			&cli.Float64Flag{Name: "compute-s", Usage: "`S`: forward+backward+optimizer seconds of one rank's step, measured (on a GPU: required)"},
			&cli.Float64Flag{Name: "compute-sd-s", Usage: "its standard deviation from step to step (the ranks' batches differ; the step waits for the slowest)"},
			&cli.IntFlag{Name: "cores-per-host", Usage: "CPU cores of a host; ranks whose threads outnumber them share them (0: the run's with --from-run, this machine's when plan measures the compute, and with --compute-s as many as the ranks' threads)"},
			&cli.IntFlag{Name: "threads", Usage: "compute threads per rank on the CPU (with --compute-s: those its measurement used; 0: the run's with --from-run, cores per host / ranks per host when plan measures the compute)"},
			&cli.StringFlag{Name: "compression", Value: "fp16", Usage: "gradient wire format: fp16 | bf16 | none | powersgd (P and Q of every large matrix in float32, the other tensors in fp16)"},
			&cli.IntFlag{Name: "powersgd-rank", Value: fusion.DefaultPowerSGDRank, Usage: "`R`: PowerSGD's rank, the columns of P and Q (with --from-run of a PowerSGD run: the run's unless given)"},
			&cli.IntFlag{Name: "powersgd-start-step", Value: fusion.DefaultPowerSGDStartStep, Usage: "`S`: the first step PowerSGD compresses (the plan is of the steps from it on; before it, as --compression fp16; with --from-run of a PowerSGD run: the run's unless given)"},
			&cli.Float64Flag{Name: "powersgd-compute-s", Usage: "the compressor's extra compute per step per rank, measured (0: measured now with the compute on this CPU, the run's own with --from-run of a PowerSGD run, else from FLOPs)"},
			&cli.BoolFlag{Name: "overlap", Value: true, Usage: "buckets all-reduced while backward runs (false: one allreduce after backward)"},
			&cli.IntFlag{Name: "batch-tokens", Value: 4096, Usage: "padded tokens per batch per rank (compute scales with it from the measurement's)"},
			&cli.Float64Flag{Name: "bucket-cap-mb", Value: fusion.DefaultBucketCap >> 20, Usage: "fusion bucket cap in MiB without --from-run"},
			&cli.Float64Flag{Name: "first-bucket-mb", Value: fusion.DefaultFirstBucketCap >> 20, Usage: "first bucket's cap in MiB without --from-run"},
			&cli.BoolFlag{Name: "flat", Usage: "no hierarchical allreduce (GORUN_HIERARCHICAL=0)"},
			&cli.StringFlag{Name: "from-run", Usage: "`DIR`: a finished run directory: its compute per step, ranks, hosts, link, compression, buckets (flags given override them)"},
			&cli.IntFlag{Name: "measure-steps", Value: 12, Usage: "steps timed when measuring the preset's compute on this machine (after 3 untimed)"},
			&cli.BoolFlag{Name: "sweep", Usage: "a table over H = 1, 2, 4, ..., 512 hosts"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usage(fmt.Errorf("plan: unexpected argument %q (options start with --)", c.Args().First()))
			}
			in, err := planInputs(c)
			if err != nil {
				return err
			}
			if c.Bool("sweep") {
				return printSweep(os.Stdout, in)
			}
			p, err := plan.Predict(in.c, in.w)
			if err != nil {
				return err
			}
			var fp16 *plan.Prediction
			if in.w.PowerSGD != nil { // fp16's for comparison
				w := in.w
				w.PowerSGD, w.Wire = nil, dtype.Float16
				p16, err := plan.Predict(in.c, w)
				if err != nil {
					return err
				}
				fp16 = &p16
			}
			printPlan(os.Stdout, in, p, fp16)
			return nil
		},
	}
}

// planIn is what plan predicts from, and where each part came from.
type planIn struct {
	c       plan.Cluster
	w       plan.Workload
	preset  string
	source  string // where the compute comes from
	tokens  string // what TokensPerRank counts
	measure string // "" or how the run measured (its step time, for comparison)
	runStep float64
	// for PowerSGD: the parameters' shapes (the preset's), the run (with
	// --from-run) and what it measured, whether plan measured the
	// compute on this CPU now (and with how many threads), and where
	// the compressor's compute comes from
	shapes   [][]int
	run      *metrics.RunInfo
	st       report.StepTimes
	measured int
	psgdHow  string
}

// linkRate is a rate with its unit: a number, a decimal (k, M, G, T) or
// binary (Ki, Mi, Gi, Ti) prefix, a unit of bits (b, bit, bits) or bytes
// (B, byte, bytes), and "ps" or "/s" optionally.
var linkRate = regexp.MustCompile(`^([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?) ?([kKmMgGtT]i?)?((?i:bits?|bytes?)|b|B)(ps|/s)?$`)

// linkForms is what --link accepts, for its help and its error.
const linkForms = "bits per second with a lower-case b or bit (1gbit, 10Gbit/s, 10Gbps, 10Gb/s, 100mbit), or bytes per second with a capital B (1GB/s = 8 Gbit/s, 125MB/s = 1 Gbit/s, 1GBps, 1GB, 100MiB/s)"

// parseLink reads a link's rate in Gbit/s: a number with its unit, bits
// per second with a lower-case b or "bit" (1gbit, 2.5Gbit/s, 400Mbps,
// 10Gb/s), bytes per second with a capital B (1GB/s, 125MB/s, 1GBps,
// 100MiB/s); a bare number or an unknown unit is refused.
func parseLink(s string) (float64, error) {
	m := linkRate.FindStringSubmatch(strings.TrimSpace(s))
	if m != nil {
		v, err := strconv.ParseFloat(m[1], 64)
		prefix := map[string]float64{"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40}[strings.ToLower(m[2])]
		bits := 1.0
		if m[3] == "B" || strings.HasPrefix(strings.ToLower(m[3]), "byte") {
			bits = 8
		}
		if g := v * prefix * bits / 1e9; err == nil && g > 0 && !math.IsInf(g, 0) {
			return g, nil
		}
	}
	return 0, fmt.Errorf("--link %q: want a positive rate in %s", s, linkForms)
}

// planInputs gathers the cluster and the workload from the flags, a run
// directory, or a measurement on this machine.
func planInputs(c *cli.Context) (planIn, error) {
	var in planIn
	gpu := strings.ToLower(c.String("device"))
	if gpu == "cpu" {
		gpu = ""
	}
	if c.Int("hosts") < 1 || c.Int("per-host") < 1 {
		return in, usage(fmt.Errorf("plan: --hosts %d --per-host %d: want at least 1 each", c.Int("hosts"), c.Int("per-host")))
	}
	for _, f := range []string{"compute-s", "compute-sd-s", "latency-us", "transport-cap-gbs", "transport-step-us"} {
		if c.Float64(f) < 0 {
			return in, usage(fmt.Errorf("plan: --%s %g: must not be negative", f, c.Float64(f)))
		}
	}
	if c.Int("threads") < 0 || c.Int("cores-per-host") < 0 {
		return in, usage(fmt.Errorf("plan: --threads %d --cores-per-host %d: must not be negative", c.Int("threads"), c.Int("cores-per-host")))
	}
	switch c.String("compression") {
	case "fp16", "bf16", "none", "powersgd":
	default:
		return in, usage(fmt.Errorf("plan: --compression %q: want fp16, bf16, none or powersgd", c.String("compression")))
	}
	if c.String("compression") == "powersgd" && !c.Bool("overlap") {
		return in, usage(fmt.Errorf("plan: --compression powersgd needs --overlap (the Bucketer compresses the buckets), as nmt-train train"))
	}
	if r := c.Int("powersgd-rank"); r < 1 || r > kernels.OrthoMaxCols || c.Int("powersgd-start-step") < 0 || c.Float64("powersgd-compute-s") < 0 {
		return in, usage(fmt.Errorf("plan: --powersgd-rank %d --powersgd-start-step %d --powersgd-compute-s %g: want a rank of 1 to %d (the compressor's), and neither negative",
			r, c.Int("powersgd-start-step"), c.Float64("powersgd-compute-s"), kernels.OrthoMaxCols))
	}
	tr, err := plan.ParseTransport(c.String("transport"))
	if err != nil {
		return in, usage(fmt.Errorf("plan: --transport: %w", err))
	}
	if d := c.String("from-run"); d != "" {
		if in, err = fromRun(c, d); err != nil {
			return in, err
		}
	} else if in, err = fromPreset(c, gpu); err != nil {
		return in, err
	}
	in.c.Transport, in.c.GPU, in.c.Flat = tr, gpu != "", c.Bool("flat")
	in.c.CapGBs, in.c.StepUs = c.Float64("transport-cap-gbs"), c.Float64("transport-step-us")
	overrideCluster(c, &in)
	if err := applyPowerSGD(c, &in); err != nil {
		return in, err
	}
	return in, nil
}

// applyPowerSGD gives the workload PowerSGD when --compression powersgd
// asks for it (or the run of --from-run compressed with it and no other
// --compression is given), at --powersgd-rank (or the run's), with the
// compressor's compute from, in this order: --powersgd-compute-s; the
// run's own measurement (at its rank); a measurement now on this CPU
// where plan measured the compute now; the compressor's FLOPs at the
// rate of the step's FLOPs (on a GPU, and with --compute-s).
func applyPowerSGD(c *cli.Context, in *planIn) error {
	comp := c.String("compression")
	if in.run != nil && !c.IsSet("compression") {
		comp = in.run.Compression
	}
	in.w.PowerSGD = nil
	if comp != "powersgd" {
		return nil
	}
	r := c.Int("powersgd-rank")
	if in.run != nil && !c.IsSet("powersgd-rank") && in.run.PowerSGDRank > 0 {
		r = in.run.PowerSGDRank
	}
	var ps *plan.PowerSGD
	var err error
	if in.run != nil {
		ri := *in.run
		if c.IsSet("batch-tokens") {
			ri.BatchTokens = c.Int("batch-tokens") // the compute was scaled to it
		}
		ps, in.psgdHow, err = report.RunPowerSGD(ri, in.w, in.st, r)
	} else {
		ps, err = plan.NewPowerSGD(in.shapes, in.w.Buckets, r)
	}
	if err != nil {
		return fmt.Errorf("plan: --compression powersgd: %w", err)
	}
	switch tokens := float64(c.Int("batch-tokens")); {
	case c.Float64("powersgd-compute-s") > 0:
		ps.ComputeS, in.psgdHow = c.Float64("powersgd-compute-s"), "given with --powersgd-compute-s"
	case in.run != nil:
	case in.measured > 0:
		fmt.Fprintf(os.Stderr, "nmt-train plan: measuring PowerSGD's compute (rank %d) on this machine's CPU...\n", r)
		if ps.ComputeS, _, err = measurePowerSGD(in.shapes, r, in.measured, 3); err != nil {
			return fmt.Errorf("plan: %w", err)
		}
		in.psgdHow = fmt.Sprintf("measured now on this machine's CPU: its products, orthonormalisation and error feedback on the preset's shapes, %s", words.Plural(in.measured, "thread"))
	default:
		step := plan.StepFLOPs(in.w.Params, tokens)
		ps.ComputeS = plan.ComputeFromFLOPs(in.w.ComputeS, ps.FLOPs(), step)
		on := "on the CPU"
		if in.c.GPU {
			on = "on the GPU, where nothing was measured"
		}
		in.psgdHow = fmt.Sprintf("from FLOPs and --compute-s (%s): %.3g GFLOP of the compressor at the rate of the step's 6 x %s parameters x %.0f padded batch tokens = %.4g TFLOP in %.4f s; a lower bound, its thin products (%d columns) are bound by memory, not FLOPs",
			on, ps.FLOPs()/1e9, report.Commas(in.w.Params), tokens, step/1e12, in.w.ComputeS, r)
	}
	ps.StartStep = c.Int("powersgd-start-step")
	if in.run != nil && !c.IsSet("powersgd-start-step") {
		ps.StartStep = in.run.PowerSGDStartStep
	}
	in.w.PowerSGD, in.w.Wire = ps, dtype.Float16
	return nil
}

// overrideCluster applies the flags given (over a run's values).
func overrideCluster(c *cli.Context, in *planIn) {
	if c.IsSet("hosts") || in.c.Hosts == 0 {
		in.c.Hosts = c.Int("hosts")
	}
	if c.IsSet("per-host") || in.c.PerHost == 0 {
		in.c.PerHost = c.Int("per-host")
	}
	if c.IsSet("latency-us") {
		in.c.LatencyUs = c.Float64("latency-us")
	}
	if c.IsSet("cores-per-host") {
		in.c.CoresPerHost = c.Int("cores-per-host")
	}
	if c.IsSet("threads") {
		in.c.ThreadsPerRank = c.Int("threads")
	}
	if in.c.GPU {
		in.c.CoresPerHost, in.c.ThreadsPerRank = 0, 0
	}
	if c.IsSet("compression") {
		in.w.Wire = report.WireType(c.String("compression"))
	}
	if c.IsSet("overlap") {
		in.w.Overlap = c.Bool("overlap")
	}
}

// fromPreset: the preset's parameters and buckets as nmt-train cuts them,
// and its compute: --compute-s, or measured on this machine's CPU.
func fromPreset(c *cli.Context, gpu string) (planIn, error) {
	in := planIn{preset: c.String("preset")}
	link, err := parseLink(c.String("link"))
	if err != nil {
		return in, usage(fmt.Errorf("plan: %w", err))
	}
	cfg, err := transformer.Preset(in.preset, c.Int("vocab"))
	if err != nil {
		return in, usage(fmt.Errorf("plan: %w", err))
	}
	ps, err := transformer.ParamList(cfg)
	if err != nil {
		return in, usage(fmt.Errorf("plan: --preset %s --vocab %d: %w", in.preset, c.Int("vocab"), err))
	}
	var params int64
	for _, p := range ps {
		params += int64(p.Len)
		in.shapes = append(in.shapes, p.Shape)
	}
	buckets, err := train.BucketBytes(ps, c.Float64("bucket-cap-mb"), c.Float64("first-bucket-mb"))
	if err != nil {
		return in, fmt.Errorf("plan: %w", err)
	}
	in.w = plan.Workload{Params: params, HeadBytes: 4 * cfg.Vocab * cfg.DModel, Wire: report.WireType(c.String("compression")), Overlap: c.Bool("overlap"),
		Buckets: buckets}
	in.c = plan.Cluster{Hosts: c.Int("hosts"), PerHost: c.Int("per-host"), LinkGbps: link, CoresPerHost: c.Int("cores-per-host")}
	batch := c.Int("batch-tokens")
	if s := c.Float64("compute-s"); s > 0 {
		in.w.ComputeS, in.w.ComputeSD, in.w.Threads = s, c.Float64("compute-sd-s"), c.Int("threads")
		in.w.TokensPerRank, in.tokens = float64(batch), "padded batch tokens"
		in.source = fmt.Sprintf("--compute-s %g", s)
		return in, nil
	}
	if gpu != "" {
		return in, usage(fmt.Errorf("plan: --device %s: no compute time measured on a GPU in this project (nothing has run on one yet): give --compute-s, the seconds of one step measured on that GPU", gpu))
	}
	if in.c.CoresPerHost == 0 {
		in.c.CoresPerHost = runtime.NumCPU()
	}
	threads := c.Int("threads")
	if threads == 0 {
		threads = max(1, in.c.CoresPerHost/in.c.PerHost)
	}
	fmt.Fprintf(os.Stderr, "nmt-train plan: measuring preset %s on this machine's CPU (%s, %d steps after 3 untimed)...\n", in.preset, words.Plural(threads, "thread"), c.Int("measure-steps"))
	m, err := train.MeasureCompute(in.preset, cfg.Vocab, threads, batch, 3, c.Int("measure-steps"))
	if err != nil {
		return in, fmt.Errorf("plan: %w", err)
	}
	in.w.ComputeS, in.w.ComputeSD, in.w.BackwardS, in.w.Threads = m.ComputeS, m.ComputeSD, m.Backward, threads
	in.w.TokensPerRank, in.tokens = m.TargetTokens, "target tokens"
	in.measured = threads
	in.source = fmt.Sprintf("measured now on this machine's CPU: %d steps of the synthetic corpus with %d ids, %s, %d batch tokens", m.Steps, m.Vocab, words.Plural(threads, "thread"), batch)
	return in, nil
}

// fromRun: a run directory's measured compute and its layout.
func fromRun(c *cli.Context, dir string) (planIn, error) {
	var in planIn
	ri, err := metrics.ReadRunInfo(dir)
	if err != nil {
		return in, fmt.Errorf("plan: --from-run %s is not a run directory: %w", dir, err)
	}
	recs, err := metrics.ReadJSONL(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		return in, fmt.Errorf("plan: --from-run %s: %w", dir, err)
	}
	// the report's predictions take the run's steps so, by the same rule
	st := report.MeasureRun(recs, ri.WorldSize)
	if st.Intervals == 0 || !(st.Own() > 0) {
		return in, fmt.Errorf("plan: --from-run %s: no compute time in metrics.jsonl (a run that logged no step)", dir)
	}
	if why := st.WhyNotEnough(); why != "" && !(c.Float64("compute-s") > 0) {
		return in, fmt.Errorf("plan: --from-run %s: not enough data: %s; or give --compute-s", dir, why)
	}
	in.preset, in.c = ri.Preset, report.RunCluster(ri)
	if in.w, err = report.RunWorkload(ri, st); err != nil {
		return in, fmt.Errorf("plan: --from-run %s: %w", dir, err)
	}
	in.run, in.st = &ri, st
	if len(ri.Buckets) == 0 {
		if err := presetBuckets(c, ri, &in.w); err != nil {
			return in, err
		}
	}
	if s := c.Float64("compute-s"); s > 0 {
		in.w.ComputeS, in.w.ComputeSD, in.w.BackwardS = s, c.Float64("compute-sd-s"), 0
	}
	if c.IsSet("batch-tokens") && ri.BatchTokens > 0 && c.Int("batch-tokens") != ri.BatchTokens {
		f := float64(c.Int("batch-tokens")) / float64(ri.BatchTokens)
		in.w.ComputeS, in.w.ComputeSD, in.w.BackwardS, in.w.TokensPerRank = f*in.w.ComputeS, f*in.w.ComputeSD, f*in.w.BackwardS, f*in.w.TokensPerRank
	}
	if c.IsSet("link") {
		if in.c.LinkGbps, err = parseLink(c.String("link")); err != nil {
			return in, usage(fmt.Errorf("plan: %w", err))
		}
	}
	in.tokens = "target tokens"
	in.source = fmt.Sprintf("measured by the run in %s: %s, %s%s, compute less the token-count wait", dir, words.Plural(ri.WorldSize, "rank"), words.Plural(st.Intervals, "logged interval"), map[bool]string{true: " after the first"}[st.Skipped == 1])
	in.runStep = st.Step
	in.measure = fmt.Sprintf("%s on %s", words.Plural(ri.WorldSize, "rank"), words.Plural(len(report.UniqueHosts(ri.Hosts)), "host"))
	return in, nil
}

// presetBuckets cuts the buckets of a run from before run.json recorded
// them: the preset's parameters with the vocabulary that gives the run's
// count, and the default caps.
func presetBuckets(c *cli.Context, ri metrics.RunInfo, w *plan.Workload) error {
	probe, err := transformer.Preset(ri.Preset, 1000)
	if err != nil {
		return fmt.Errorf("plan: --from-run: run.json names preset %q, which this nmt-train does not know", ri.Preset)
	}
	ps, err := transformer.ParamList(probe)
	if err != nil {
		return fmt.Errorf("plan: --from-run: %w", err)
	}
	rest := int64(0)
	for _, p := range ps {
		rest += int64(p.Len)
	}
	rest -= int64(1000 * probe.DModel)
	vocab := int((ri.Params - rest) / int64(probe.DModel))
	cfg, err := transformer.Preset(ri.Preset, vocab)
	if err != nil {
		return fmt.Errorf("plan: --from-run: %d parameters do not fit preset %s: %w", ri.Params, ri.Preset, err)
	}
	if ps, err = transformer.ParamList(cfg); err != nil {
		return fmt.Errorf("plan: --from-run: %d parameters do not fit preset %s: %w", ri.Params, ri.Preset, err)
	}
	if w.Buckets, err = train.BucketBytes(ps, c.Float64("bucket-cap-mb"), c.Float64("first-bucket-mb")); err != nil {
		return fmt.Errorf("plan: --from-run: %w", err)
	}
	w.HeadBytes = 4 * vocab * cfg.DModel
	return nil
}

// printPlan writes one prediction with its parts and the numbers behind
// the verdict; with PowerSGD, its bytes and compute, and fp16's
// prediction beside it.
func printPlan(out io.Writer, in planIn, p plan.Prediction, fp16 *plan.Prediction) {
	c, w := in.c, in.w
	fmt.Fprintf(out, "plan: preset %s (%s parameters), %s x %s = %s", in.preset, report.Commas(w.Params), words.Plural(c.Hosts, "host"), words.Plural(c.PerHost, "rank"), words.Plural(p.Ranks, "rank"))
	if c.Hosts > 1 {
		fmt.Fprintf(out, ", link %.3g Gbit/s, %s (%.3f GB/s each way: %s)", c.LinkGbps, plan.TransportLabel(p.Transport), p.RateGBs, limitNote(p))
	}
	fmt.Fprintf(out, "\ncompute: %.4f s per step per rank (sd %.4f s), %s\n", w.ComputeS, w.ComputeSD, in.source)
	if ps := w.PowerSGD; ps != nil {
		mats, elems, tensors, rest := ps.Totals()
		from := ""
		if ps.StartStep > 0 {
			from = fmt.Sprintf(", from step %d (before it: as fp16 below)", ps.StartStep)
		}
		pq := 0
		for _, b := range ps.Buckets {
			pq += b.PBytes + b.QBytes
		}
		fmt.Fprintf(out, "compression: powersgd, rank %d%s: %d matrices compressed (%s parameters; P and Q %s in float32), %s left in fp16 (%s parameters, %s): %s a step on the wire",
			ps.Rank, from, mats, report.Commas(elems), mb(pq), words.Plural(tensors, "tensor"), report.Commas(rest), mb(2*rest), mb(p.WireBytes))
		if fp16 != nil && p.WireBytes > 0 {
			fmt.Fprintf(out, " against %s with fp16 (%.1fx less)", mb(fp16.WireBytes), float64(fp16.WireBytes)/float64(p.WireBytes))
		}
		fmt.Fprintf(out, "\npowersgd compute: %.4f s per step per rank (%.2f GFLOP), %s\n", ps.ComputeS, ps.FLOPs()/1e9, in.psgdHow)
	}
	fmt.Fprintf(out, "predicted step time: %.4f s\n", p.StepS)
	fmt.Fprintf(out, "  compute                 %.4f s", p.ComputeS)
	if p.Oversubscribed > 1 {
		fmt.Fprintf(out, "  (%.2g compute threads per core: %s x %s on %s)", p.Oversubscribed, words.Plural(c.PerHost, "rank"), words.Plural(c.ThreadsPerRank, "thread"), words.Plural(c.CoresPerHost, "core"))
	}
	fmt.Fprintf(out, "\n  wait for the slowest     %.4f s  (the ranks' batches differ)\n", p.WaitS)
	fmt.Fprintf(out, "  token-count allreduce   %.4f s\n", p.SyncS)
	if w.PowerSGD != nil {
		fmt.Fprintf(out, "  exposed communication   %.4f s  (%.0f %% of %.4f s of gradient allreduces and %.4f s of compression hidden behind backward)\n", p.ExposedS, 100*p.Hidden, p.CommS, p.CompressS)
		fmt.Fprintf(out, "  powersgd compute in backward %.4f s  (the compression that runs while backward does, on its cores or device; the rest of its %.4f s is in the exposed time)\n", p.CompressUnderS, p.CompressS)
	} else {
		fmt.Fprintf(out, "  exposed communication   %.4f s  (%.0f %% of %.4f s of gradient allreduces hidden behind backward)\n", p.ExposedS, 100*p.Hidden, p.CommS)
	}
	if p.StolenS > 0 {
		fmt.Fprintf(out, "  transport CPU in backward %.4f s  (the hidden allreduces' CPU on busy cores)\n", p.StolenS)
	}
	fmt.Fprintf(out, "  data                    %.4f s  (nmt-train's batches are read inside the measured compute)\n", p.DataS)
	fmt.Fprintf(out, "throughput: %s %s/s (%s ranks x %.0f per step); scaling efficiency against one device: %.0f %%\n",
		report.Commas(int64(math.Round(p.TokensPerSec))), in.tokens, report.Commas(int64(p.Ranks)), w.TokensPerRank, 100*p.Efficiency)
	fmt.Fprintf(out, "verdict: %s: the gradients' allreduces take %.4f s, %.0f %% of the %.4f s a step computes\n", p.Verdict, p.CommS, 100*p.CommS/math.Max(p.ComputeS, 1e-12), p.ComputeS)
	for i, b := range p.Buckets {
		if w.PowerSGD == nil {
			fmt.Fprintf(out, "  bucket %d: %s on the wire, %s, %.2f ms (ready %.1f ms into backward, done %.1f ms)\n",
				i, mb(b.WireBytes), b.Algorithm, 1e3*b.Seconds, 1e3*b.Ready, 1e3*b.End)
			continue
		}
		var calls []string
		for _, cl := range b.Calls {
			what := map[string]string{"rest": "the rest in fp16", "P": "P in float32", "Q": "Q in float32"}[cl.What]
			calls = append(calls, fmt.Sprintf("%s %s, %.2f ms", what, mb(cl.WireBytes), 1e3*cl.Seconds))
		}
		fmt.Fprintf(out, "  bucket %d: %s on the wire (%s), %s, %.2f ms of allreduces and %.2f ms of compression (ready %.1f ms into backward, done %.1f ms)\n",
			i, mb(b.WireBytes), strings.Join(calls, "; "), b.Algorithm, 1e3*b.Seconds, 1e3*b.CompressS, 1e3*b.Ready, 1e3*b.End)
	}
	if fp16 != nil {
		fmt.Fprintf(out, "fp16 for comparison: predicted step time %.4f s (exposed communication %.4f s); the gradients' allreduces take %.4f s, %s on the wire; %s\n",
			fp16.StepS, fp16.ExposedS, fp16.CommS, mb(fp16.WireBytes), fp16.Verdict)
	}
	if in.runStep > 0 {
		fmt.Fprintf(out, "the run itself measured %.4f s per step (%s)\n", in.runStep, in.measure)
	}
}

func limitNote(p plan.Prediction) string {
	if p.LinkBound {
		return "the link limits"
	}
	return "the transport's CPU limits"
}

func mb(b int) string { return fmt.Sprintf("%.2f MB", float64(b)/1e6) }

// printSweep writes a table over 1, 2, 4, ..., 512 hosts.
func printSweep(out io.Writer, in planIn) error {
	fmt.Fprintf(out, "plan: preset %s, %s per host, link %.3g Gbit/s; compute %.4f s per step per rank (%s)", in.preset, words.Plural(in.c.PerHost, "rank"), in.c.LinkGbps, in.w.ComputeS, in.source)
	if ps := in.w.PowerSGD; ps != nil {
		fmt.Fprintf(out, "; powersgd, rank %d, its compute %.4f s a step (%s)", ps.Rank, ps.ComputeS, in.psgdHow)
	}
	fmt.Fprintf(out, "\n\n")
	fmt.Fprintln(out, "| hosts | ranks | step s | compute | wait | sync | exposed | hidden | tokens/s | efficiency | verdict | largest bucket |")
	fmt.Fprintln(out, "|---|---|---|---|---|---|---|---|---|---|---|---|")
	for h := 1; h <= 512; h *= 2 {
		c := in.c
		c.Hosts = h
		p, err := plan.Predict(c, in.w)
		if err != nil {
			return err
		}
		big := "-"
		for _, b := range p.Buckets {
			if b.WireBytes == maxWire(p.Buckets) {
				big = fmt.Sprintf("%s %s, %.1f ms", mb(b.WireBytes), b.Algorithm, 1e3*b.Seconds)
				break
			}
		}
		fmt.Fprintf(out, "| %d | %d | %.4f | %.4f | %.4f | %.4f | %.4f | %.0f %% | %s | %.0f %% | %s | %s |\n", h, p.Ranks, p.StepS, p.ComputeS, p.WaitS, p.SyncS,
			p.ExposedS, 100*p.Hidden, report.Commas(int64(math.Round(p.TokensPerSec))), 100*p.Efficiency, p.Verdict, big)
	}
	return nil
}

func maxWire(bs []plan.Bucket) int {
	m := 0
	for _, b := range bs {
		m = max(m, b.WireBytes)
	}
	return m
}

// measurePowerSGD times, on this machine's CPU with threads compute
// threads, the work PowerSGD of rank r adds to a step on parameters of
// the given shapes, as fusion's compressor does it with the CPU backend:
// for each matrix it compresses, M += E, Q orthonormalised, P = M Q, P
// orthonormalised, Q = Mᵀ P, E = M − P Qᵀ and the gradient M = P Qᵀ
// written back (the allreduces left out). Each distinct shape is timed on as many copies
// as fill 64 MB (no fewer than one, no more than the model has), so that
// they come from memory, not cache, as the gradients of a step do; reps
// passes after one untimed, their mean. It returns the seconds a step
// and the number of matrices they stand for.
func measurePowerSGD(shapes [][]int, r, threads, reps int) (float64, int, error) {
	if threads < 1 || reps < 1 {
		return 0, 0, fmt.Errorf("measuring PowerSGD: %d threads, %d passes", threads, reps)
	}
	defer cpu.SetThreads(cpu.SetThreads(threads))
	be := cpu.New()
	be.Threads = threads
	type shape struct{ n, m int }
	count := map[shape]int{}
	var order []shape
	for _, s := range shapes {
		if n, m, ok := plan.AsMatrix(s); ok && plan.PowerSGDCompresses(n, m, r) {
			if count[shape{n, m}] == 0 {
				order = append(order, shape{n, m})
			}
			count[shape{n, m}]++
		}
	}
	total, mats := 0.0, 0
	for _, sh := range order {
		n, m := sh.n, sh.m
		copies := min(count[sh], max(1, (64<<20)/(4*n*m)))
		type mat struct{ M, E, P, Q kernels.Tensor }
		ms := make([]mat, copies)
		for i := range ms {
			ms[i] = mat{be.Alloc(dtype.Float32, n, m), be.Alloc(dtype.Float32, n, m), be.Alloc(dtype.Float32, n, r), be.Alloc(dtype.Float32, m, r)}
			for j := range ms[i].M.F32 {
				ms[i].M.F32[j] = float32((j*7+i)%13-6) * 1e-3
			}
			for j := range ms[i].Q.F32 {
				ms[i].Q.F32[j] = float32((j*5+i)%11-5) * 1e-2
			}
		}
		var sec float64
		for pass := 0; pass <= reps; pass++ {
			t0 := time.Now()
			for _, x := range ms {
				be.Axpy(x.M, 1, x.E)
				be.Orthonormalize(x.Q, 1e-8)
				be.Gemm(false, false, 1, x.M, x.Q, 0, x.P)
				be.Orthonormalize(x.P, 1e-8)
				be.Gemm(true, false, 1, x.M, x.P, 0, x.Q)
				copy(x.E.F32, x.M.F32)
				be.Gemm(false, true, -1, x.P, x.Q, 1, x.E)
				be.Axpy(x.M, -1, x.E)
			}
			if pass > 0 {
				sec += time.Since(t0).Seconds()
			}
		}
		for i := range ms {
			be.Free(ms[i].M)
			be.Free(ms[i].E)
		}
		total += sec / float64(reps) * float64(count[sh]) / float64(copies)
		mats += count[sh]
	}
	return total, mats, nil
}
