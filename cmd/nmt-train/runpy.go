package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/cmd/nmt-train/internal/openseq2seq"
	"github.com/gorun/gorun/cmd/nmt-train/internal/train"
	"github.com/gorun/gorun/transformer"
)

// runPyArgs says whether nmt-train was started as OpenSeq2Seq's run.py
// is: no subcommand, and --config_file among the flags before the first
// argument that is not one.
func runPyArgs(args []string) bool {
	for _, a := range args[1:] {
		if !strings.HasPrefix(a, "-") {
			return false // a subcommand
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name == "config_file" {
			return true
		}
	}
	return false
}

// gorunExtras are nmt-train's own flags that run.py's command line may
// carry too (they are not OpenSeq2Seq's): where to compute, the gradients'
// wire format, the threads, the progress bar, the collective timeout.
var gorunExtras = map[string]bool{"device": true, "compression": true, "powersgd-rank": true, "powersgd-start-step": true,
	"threads": true, "quiet": true, "timeout": true}

// runPyExtras is the help of gorunExtras.
const runPyExtras = `
nmt-train's own flags, accepted on run.py's command line too:
  --device=auto|cpu|cuda    where to compute (default auto: a GPU when one is usable)
  --compression=none|fp16|bf16|powersgd
                            the gradients' wire format (default none: float32, as Horovod's
                            allreduce in the lab); powersgd: low-rank compression (docs/fusion.md)
  --powersgd-rank=R, --powersgd-start-step=S
                            PowerSGD's rank and the step it starts at
  --threads=N               CPU threads per rank (default: cores / ranks on the host)
  --timeout=DURATION        a collective waiting longer on a peer is an error naming it
  --quiet                   no progress bar
The corpus cache: GORUN_DATA_CACHE (default ~/.cache/gorun/corpus), docs/data.md.
`

// runPyOptions turns run.py's command line into the trainer's options:
// the config file read as OpenSeq2Seq reads it, the mode, and the extras.
// cacheDir is GORUN_DATA_CACHE ("" : the default).
func runPyOptions(args []string, cacheDir string) (o train.Options, err error) {
	var rest []string
	extras := map[string]string{}
	for _, a := range args {
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "--") && gorunExtras[name] {
			if !hasVal && name != "quiet" {
				return o, fmt.Errorf("--%s: give it as --%s=VALUE", name, name)
			}
			if !hasVal {
				val = "true"
			}
			extras[name] = val
			continue
		}
		rest = append(rest, a)
	}
	a, err := openseq2seq.ParseArgs(rest)
	if err != nil {
		return o, err // ErrHelp too: runPy prints the help
	}
	if a.Benchmark {
		return o, fmt.Errorf("--benchmark: gorun has no benchmark mode; run a short training instead (--max_steps=20 --print_loss_steps=1), or bin/allreduce-perf for the network")
	}
	cfg, err := openseq2seq.Load(a.ConfigFile, a.Overrides)
	if err != nil {
		return o, err
	}
	if err := cfg.ModeCheck(a.Mode); err != nil {
		return o, err
	}
	if o, err = defaultOptions(extras); err != nil {
		return o, err
	}
	if err := fromConfig(&o, cfg, a, cacheDir, extras["compression"] != ""); err != nil {
		return o, err
	}
	var ignored []string
	for _, n := range cfg.Ignored {
		ignored = append(ignored, n.Key)
	}
	if len(ignored) > 0 {
		o.Notes = append(o.Notes, fmt.Sprintf("%s: accepted without effect (docs/openseq2seq.md says why): %s", a.ConfigFile, strings.Join(ignored, ", ")))
	}
	o.Notes = append(o.Notes, a.Notes...)
	if a.NoDirCheck {
		o.Notes = append(o.Notes, "--no_dir_check: no effect; a logdir that holds a run is continued with --continue_learning, never overwritten")
	}
	if a.EnableLogs {
		o.Notes = append(o.Notes, "--enable_logs: no effect; the logdir gets run.json, metrics.jsonl and report.md, and the checkpoints, in any case")
	}
	return o, o.Validate()
}

// defaultOptions is `nmt-train train`'s defaults, with the extras given.
func defaultOptions(extras map[string]string) (train.Options, error) {
	set := flag.NewFlagSet("train", flag.ContinueOnError)
	set.SetOutput(io.Discard)
	for _, f := range train.Flags() {
		if err := f.Apply(set); err != nil {
			return train.Options{}, err
		}
	}
	for k, v := range extras {
		if err := set.Set(k, v); err != nil {
			return train.Options{}, fmt.Errorf("--%s=%s: %w", k, v, err)
		}
	}
	c := cli.NewContext(nil, set, nil)
	return train.OptionsFromCLI(c)
}

// fromConfig sets the options an OpenSeq2Seq config and run.py's flags
// decide, with OpenSeq2Seq's meaning (docs/openseq2seq.md).
func fromConfig(o *train.Options, cfg *openseq2seq.Config, a openseq2seq.Args, cacheDir string, compressionGiven bool) error {
	switch a.Mode {
	case "train_eval":
		o.Mode = train.ModeTrain
	case "train":
		o.Mode, o.NoEval = train.ModeTrain, true // run.py's train mode never evaluates
	case "eval":
		o.Mode = train.ModeEval
	case "infer":
		o.Mode = train.ModeInfer
		if a.InferOutputFile == "" {
			return fmt.Errorf("--mode=infer needs --infer_output_file=FILE (where the translations go)")
		}
		o.InferInput, o.InferOutput = cfg.Infer.SourceFile, a.InferOutputFile
	default:
		return fmt.Errorf("--mode=%s: want train, eval, train_eval or infer", a.Mode)
	}
	o.RunDir = cfg.Logdir
	o.Resume = a.ContinueLearning
	o.Data = ""
	o.Text = &train.TextData{
		TrainSrc: cfg.Train.SourceFile, TrainTgt: cfg.Train.TargetFile,
		EvalSrc: cfg.Eval.SourceFile, EvalTgt: cfg.Eval.TargetFile,
		Vocab: cfg.Train.VocabFile, CacheDir: cacheDir,
	}
	if o.Text.Vocab == "" {
		o.Text.Vocab = cfg.Eval.VocabFile
	}
	o.BatchPairs = cfg.Train.BatchSizePerGPU
	if cfg.Train.MaxLength > 0 {
		o.MaxLength = cfg.Train.MaxLength
	} else {
		o.MaxLength = 256 // OpenSeq2Seq keeps every pair; a bound keeps memory finite
	}
	o.EvalMaxLength = cfg.Eval.MaxLength
	o.EvalBatchPairs = cfg.Eval.BatchSizePerGPU
	if o.Mode == train.ModeInfer { // infer's own max_length bounds the lines it translates
		o.EvalMaxLength = cfg.Infer.MaxLength
	}
	o.EvalSentences = 1 << 30 // BLEU on every evaluation pair, as OpenSeq2Seq
	if cfg.MaxSteps == 0 {
		return fmt.Errorf("%s: num_epochs: gorun counts training in steps; give max_steps instead", cfg.Positions["num_epochs"])
	}
	o.MaxSteps = cfg.MaxSteps
	o.KeepCkpts = cfg.NumCheckpoints
	switch {
	case cfg.PrintLossSteps > 0:
		o.LogEvery = cfg.PrintLossSteps
	case cfg.SaveSummariesSteps > 0:
		o.LogEvery = cfg.SaveSummariesSteps
	}
	o.EvalEvery = cfg.EvalSteps
	o.CkptEvery = cfg.SaveCheckpointSteps
	o.PassesPerStep = max(1, cfg.IterSize)
	switch cfg.Dtype {
	case "float32":
		o.Precision = "fp32"
	case "mixed": // float16 products, float32 weights, Backoff loss scaling
		o.Precision = "fp16"
	}
	if !compressionGiven {
		// Horovod's allreduce in the lab moves the gradients as float32
		o.Compression = "none"
	}
	m := transformer.Config{
		DModel: cfg.Encoder.Hidden, Heads: cfg.Encoder.Heads, FFN: cfg.Encoder.Filter,
		EncLayers: cfg.Encoder.Layers, DecLayers: cfg.Decoder.Layers,
		AttnDropout: float32(cfg.Encoder.AttentionDropout), ReLUDropout: float32(cfg.Encoder.ReluDropout),
		PostDropout: float32(cfg.Encoder.PostprocessDropout), LabelSmoothing: float32(cfg.LabelSmoothing),
		LNEps: float32(cfg.LayerNormEpsilon),
	}
	m.Preset = presetOf(m)
	o.Model, o.Preset = &m, m.Preset
	if cfg.LRPolicy == "" {
		return fmt.Errorf("%s: base_params has no lr_policy: gorun runs transformer_policy or fixed_lr (with lr_policy_params)", cfg.Path)
	}
	o.LRPolicy = cfg.LRPolicy // transformer or constant
	o.LearningRate, o.Warmup = cfg.LearningRate, cfg.WarmupSteps
	o.Adam = &train.AdamConfig{Lazy: cfg.Optimizer == "LazyAdam", Beta1: cfg.Beta1, Beta2: cfg.Beta2, Eps: cfg.Epsilon}
	o.Beam, o.Alpha, o.DecodeExtra = max(1, cfg.BeamSize), cfg.Alpha, cfg.ExtraDecodeLength
	if cfg.RandomSeedSet {
		o.Seed = uint64(cfg.RandomSeed)
	}
	return nil
}

// presetOf names the preset m is (the vocabulary aside), or "custom".
func presetOf(m transformer.Config) string {
	for _, name := range transformer.Presets() {
		p, err := transformer.Preset(name, 4)
		if err != nil {
			continue
		}
		p.Preset, p.Vocab = "", 0
		if p == m {
			return name
		}
	}
	return "custom"
}

// runPy runs nmt-train as run.py: the options from the config, then the
// mode. It returns the error to print, as the subcommands do: a mistake
// in the command line or the config file is a usage error.
func runPy(ctx context.Context, args []string, stop <-chan os.Signal, training func()) error {
	o, err := runPyOptions(args, os.Getenv(train.EnvDataCache))
	if errors.Is(err, openseq2seq.ErrHelp) {
		fmt.Print(openseq2seq.Usage + runPyExtras)
		return nil
	}
	if err != nil {
		return usage(err)
	}
	o.Stop = stop
	training()
	return train.Run(ctx, o, os.Stdout)
}
