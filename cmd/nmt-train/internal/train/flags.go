package train

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/fusion"
	"github.com/gorun/gorun/kernels"
	"github.com/gorun/gorun/transformer"
)

// Options is everything `nmt-train train` can be told.
type Options struct {
	// Collective is what the environment asks of the collectives
	// (GORUN_ALLREDUCE, GORUN_RINGS, ...: envconf.Collective, read by Run).
	Collective collective.Config
	// Mode is ModeTrain (""), ModeEval or ModeInfer (OpenSeq2Seq's
	// --mode); infer translates InferInput into InferOutput.
	Mode                    string
	InferInput, InferOutput string
	Data                    string // directory written by `nmt-train prepare`; "" = built-in corpus
	SyntheticLines          int
	Preset                  string
	BatchTokens             int // per rank, source+target tokens including padding
	BatchPairs              int // per rank, sentence pairs (OpenSeq2Seq's batch_size_per_gpu); 0: BatchTokens
	MaxLength               int
	LRPolicy                string
	LearningRate            float64
	Warmup                  int
	MaxSteps                int
	LogEvery                int
	EvalEvery               int
	EvalSentences           int
	EvalMaxLength           int // 0: MaxLength
	EvalBatchPairs          int // sentence pairs per eval batch; 0: BatchTokens/2 tokens
	NoEval                  bool
	Beam                    int
	Alpha                   float64 // length penalty of beam search
	DecodeExtra             int     // a translation has at most len(source)+DecodeExtra tokens
	CkptEvery               int
	KeepCkpts               int
	Seed                    uint64
	RunDir                  string
	Resume                  bool
	Compression             string
	PowerSGDRank            int // --compression powersgd: the approximation's rank
	PowerSGDStart           int // --compression powersgd: plain fp16 before this step
	BucketCapMB             float64
	FirstBucketMB           float64
	CycleTime               time.Duration
	Overlap                 bool
	PassesPerStep           int
	Timeline                string
	LinkGbps                float64
	Threads                 int
	Device                  string // auto, cpu or cuda (kernels/device)
	Precision               string // auto, fp32, fp16 or bf16: the inputs of matrix products
	NoDropout               bool
	Timeout                 time.Duration
	// Text names the corpus as text files (OpenSeq2Seq configs), prepared
	// into a cache; nil: Data or the built-in corpus.
	Text *TextData
	// Model is the architecture an OpenSeq2Seq config gives (its Vocab is
	// the corpus's); nil: Preset's.
	Model *transformer.Config
	// Adam is the optimizer's beta1, beta2 and epsilon, and Lazy whether it
	// is LazyAdam (the lab's); nil: LazyAdam 0.9, 0.997, 1e-9.
	Adam *AdamConfig
	// Notes are lines rank 0 prints at the start (what a config file set
	// without effect).
	Notes []string
	Quiet bool
	// Stop, when a signal arrives on it (SIGTERM, SIGINT: a scheduler's
	// time limit, a preemption, Ctrl-C), makes the job stop after the
	// step every rank is in, rank 0 writing a checkpoint first; Run then
	// returns a *StoppedError. Not a flag: the command wires its signals.
	Stop <-chan os.Signal
}

// AdamConfig is an OpenSeq2Seq config's optimizer.
type AdamConfig struct {
	Lazy              bool
	Beta1, Beta2, Eps float64
}

// Flags are the `train` command's flags. Names follow the lab
// (OpenSeq2Seq's transformer-base config) where it has one.
func Flags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "config", Usage: "YAML or JSON file with any of these options (the command line wins)"},
		&cli.StringFlag{Name: "data", Usage: "`DIR` written by nmt-train prepare (train.bin, valid.bin, vocab.txt); empty: the built-in synthetic corpus"},
		&cli.IntFlag{Name: "synthetic-lines", Value: 40000, Usage: "sentence pairs of the built-in corpus (when --data is empty)"},
		&cli.StringFlag{Name: "preset", Value: "base", Usage: "model size: tiny | small | base | big"},
		&cli.IntFlag{Name: "batch-tokens", Value: 4096, Usage: "padded tokens per batch per rank: rows x the longer side's padded length (tensor2tensor's count); a step takes this x ranks x --backward-passes-per-step (the global batch, kept by --resume on any number of ranks)"},
		&cli.IntFlag{Name: "batch-pairs", Usage: "sentence pairs per batch per rank (OpenSeq2Seq's batch_size_per_gpu), in place of --batch-tokens; 0: --batch-tokens"},
		&cli.IntFlag{Name: "max-length", Value: 56, Usage: "skip sentence pairs with a side longer than this many tokens (EOS included)"},
		&cli.StringFlag{Name: "lr-policy", Value: "transformer", Usage: "transformer | inverse_sqrt | constant"},
		&cli.Float64Flag{Name: "learning-rate", Value: 2.0, Usage: "lab's learning_rate (transformer_policy multiplies it by d_model^-0.5)"},
		&cli.IntFlag{Name: "warmup-steps", Value: 8000, Usage: "learning-rate warm-up steps"},
		&cli.IntFlag{Name: "max-steps", Value: 300000, Usage: "stop after this many optimizer steps"},
		&cli.IntFlag{Name: "log-every", Value: 100, Usage: "print and record a log line every K steps"},
		&cli.IntFlag{Name: "eval-every", Value: 1000, Usage: "evaluate (loss and BLEU) every E steps; 0: only at the end"},
		&cli.IntFlag{Name: "eval-sentences", Value: 500, Usage: "validation sentences translated for BLEU (the eval loss uses all of them)"},
		&cli.IntFlag{Name: "eval-max-length", Usage: "evaluate on the validation pairs of at most this many tokens a side (EOS included); 0: --max-length"},
		&cli.IntFlag{Name: "beam", Value: 1, Usage: "beam width for the BLEU translations (1: greedy)"},
		&cli.Float64Flag{Name: "alpha", Value: 0.6, Usage: "length penalty exponent of beam search (OpenSeq2Seq's alpha)"},
		&cli.IntFlag{Name: "decode-extra", Value: 20, Usage: "a translation has at most the source's length plus this many tokens (OpenSeq2Seq's extra_decode_length is 50)"},
		&cli.IntFlag{Name: "checkpoint-every", Value: 1000, Usage: "write a checkpoint every C steps; 0: only at the end"},
		&cli.IntFlag{Name: "keep-checkpoints", Value: 5, Usage: "keep the newest N checkpoints"},
		&cli.Uint64Flag{Name: "seed", Value: 1, Usage: "seed of the weights, the data order and dropout"},
		&cli.StringFlag{Name: "run-dir", Value: "runs/nmt", Usage: "where metrics, plots, checkpoints and the report go"},
		&cli.BoolFlag{Name: "resume", Usage: "continue from the latest checkpoint in --run-dir"},
		&cli.StringFlag{Name: "compression", Value: "fp16", Usage: "gradient wire format: fp16 | bf16 | none | powersgd (weight matrices as rank-R factors, the rest fp16)"},
		&cli.IntFlag{Name: "powersgd-rank", Value: fusion.DefaultPowerSGDRank, Usage: "--compression powersgd: rank R of each matrix's approximation (1 to 64)"},
		&cli.IntFlag{Name: "powersgd-start-step", Value: fusion.DefaultPowerSGDStartStep, Usage: "--compression powersgd: plain fp16 before this step (DDP's start_powerSGD_iter)"},
		&cli.Float64Flag{Name: "bucket-cap-mb", Value: fusion.DefaultBucketCap >> 20, Usage: "fusion bucket size cap in MiB (fp32 bytes)"},
		&cli.Float64Flag{Name: "first-bucket-mb", Value: fusion.DefaultFirstBucketCap >> 20, Usage: "size cap of the first (last layers') bucket, so communication starts early"},
		&cli.DurationFlag{Name: "cycle-time", Usage: "flush a partly filled bucket after this long (0: off)"},
		&cli.BoolFlag{Name: "overlap", Value: true, Usage: "allreduce buckets while backward runs (false: one allreduce after backward)"},
		&cli.IntFlag{Name: "backward-passes-per-step", Value: 1, Usage: "gradient accumulation: batches per optimizer step"},
		&cli.StringFlag{Name: "timeline", Usage: "write a Chrome trace (Perfetto, chrome://tracing) of every layer and bucket to this file"},
		&cli.Float64Flag{Name: "link-gbps", Usage: "network link capacity in `GBIT/S` for the bottleneck analysis (0, the default: probed between rank 0 and a rank on another host; unknown on one host)"},
		&cli.StringFlag{Name: "device", Value: "auto", Usage: "compute device: auto (a GPU when one is usable, else the CPU) | cpu | cuda"},
		&cli.StringFlag{Name: "precision", Value: "auto", Usage: "inputs of matrix products: auto (fp16 on a GPU, fp32 on the CPU) | fp32 | fp16 (with dynamic loss scaling) | bf16"},
		&cli.IntFlag{Name: "threads", Usage: "compute threads per rank on the CPU (0: cores / ranks on this host)"},
		&cli.BoolFlag{Name: "no-dropout", Usage: "turn dropout off (for parity checks)"},
		&cli.DurationFlag{Name: "timeout", Value: 120 * time.Second, Usage: "a collective waiting longer than this on a peer is an error naming it"},
		&cli.BoolFlag{Name: "quiet", Usage: "no progress bar"},
	}
}

// OptionsFromCLI reads the flags (after the config file was applied).
func OptionsFromCLI(c *cli.Context) (Options, error) {
	o := Options{
		Data: c.String("data"), SyntheticLines: c.Int("synthetic-lines"), Preset: c.String("preset"),
		BatchTokens: c.Int("batch-tokens"), MaxLength: c.Int("max-length"),
		LRPolicy: c.String("lr-policy"), LearningRate: c.Float64("learning-rate"), Warmup: c.Int("warmup-steps"),
		MaxSteps: c.Int("max-steps"), LogEvery: c.Int("log-every"), EvalEvery: c.Int("eval-every"),
		EvalSentences: c.Int("eval-sentences"), EvalMaxLength: c.Int("eval-max-length"), Beam: c.Int("beam"),
		Alpha: c.Float64("alpha"), DecodeExtra: c.Int("decode-extra"), CkptEvery: c.Int("checkpoint-every"), BatchPairs: c.Int("batch-pairs"),
		KeepCkpts: c.Int("keep-checkpoints"), Seed: c.Uint64("seed"), RunDir: c.String("run-dir"),
		Resume: c.Bool("resume"), Compression: c.String("compression"), BucketCapMB: c.Float64("bucket-cap-mb"),
		PowerSGDRank: c.Int("powersgd-rank"), PowerSGDStart: c.Int("powersgd-start-step"),
		FirstBucketMB: c.Float64("first-bucket-mb"), CycleTime: c.Duration("cycle-time"), Overlap: c.Bool("overlap"),
		PassesPerStep: c.Int("backward-passes-per-step"), Timeline: c.String("timeline"), LinkGbps: c.Float64("link-gbps"),
		Threads: c.Int("threads"), Device: c.String("device"), Precision: c.String("precision"), NoDropout: c.Bool("no-dropout"),
		Timeout: c.Duration("timeout"), Quiet: c.Bool("quiet"),
	}
	return o, o.Validate()
}

// Validate checks the options that need no files.
func (o Options) Validate() error {
	pos := func(name string, v int) error {
		if v <= 0 {
			return fmt.Errorf("--%s %d: must be positive", name, v)
		}
		return nil
	}
	for _, c := range []struct {
		n string
		v int
	}{{"batch-tokens", o.BatchTokens}, {"max-length", o.MaxLength}, {"max-steps", o.MaxSteps}, {"log-every", o.LogEvery},
		{"backward-passes-per-step", o.PassesPerStep}, {"beam", o.Beam}, {"keep-checkpoints", o.KeepCkpts}} {
		if err := pos(c.n, c.v); err != nil {
			return err
		}
	}
	// NaN passes every comparison with false, so "v <= 0" lets it through:
	// every number is checked to be finite first.
	for _, c := range []struct {
		n string
		v float64
	}{{"learning-rate", o.LearningRate}, {"alpha", o.Alpha}, {"bucket-cap-mb", o.BucketCapMB},
		{"first-bucket-mb", o.FirstBucketMB}, {"link-gbps", o.LinkGbps}} {
		if math.IsNaN(c.v) || math.IsInf(c.v, 0) {
			return fmt.Errorf("--%s %v: must be a finite number", c.n, c.v)
		}
	}
	if a := o.Adam; a != nil {
		for _, c := range []struct {
			n string
			v float64
		}{{"beta1", a.Beta1}, {"beta2", a.Beta2}, {"epsilon", a.Eps}} {
			if math.IsNaN(c.v) || math.IsInf(c.v, 0) {
				return fmt.Errorf("the optimizer's %s %v: must be a finite number", c.n, c.v)
			}
		}
	}
	if o.LinkGbps < 0 {
		return fmt.Errorf("--link-gbps %g: must not be negative (0: probe the link)", o.LinkGbps)
	}
	if o.Data == "" && o.SyntheticLines < 100 {
		return fmt.Errorf("--synthetic-lines %d: want at least 100", o.SyntheticLines)
	}
	if o.EvalEvery < 0 || o.CkptEvery < 0 || o.EvalSentences < 0 || o.Threads < 0 || o.Warmup < 0 || o.BatchPairs < 0 ||
		o.EvalMaxLength < 0 || o.EvalBatchPairs < 0 || o.DecodeExtra < 0 {
		return fmt.Errorf("--eval-every, --checkpoint-every, --eval-sentences, --threads, --warmup-steps, --batch-pairs, --eval-max-length and --decode-extra must not be negative")
	}
	if o.Alpha < 0 {
		return fmt.Errorf("--alpha %g: must not be negative", o.Alpha)
	}
	if o.LearningRate <= 0 {
		return fmt.Errorf("--learning-rate %g: must be positive", o.LearningRate)
	}
	if o.Model == nil {
		if _, err := transformer.Preset(o.Preset, 1000); err != nil {
			return err
		}
	}
	if _, err := transformer.ParsePolicy(o.LRPolicy, o.LearningRate, 512, o.Warmup); err != nil {
		return fmt.Errorf("--lr-policy: %w", err)
	}
	switch o.Precision {
	case "auto", "fp32", "fp16", "bf16":
	default:
		return fmt.Errorf("--precision %q: want auto, fp32, fp16 or bf16", o.Precision)
	}
	if o.Compression == compressPowerSGD {
		if o.PowerSGDRank < 1 || o.PowerSGDRank > kernels.OrthoMaxCols {
			return fmt.Errorf("--powersgd-rank %d: want 1 to %d", o.PowerSGDRank, kernels.OrthoMaxCols)
		}
		if o.PowerSGDStart < 0 {
			return fmt.Errorf("--powersgd-start-step %d: must not be negative", o.PowerSGDStart)
		}
		if !o.Overlap {
			return fmt.Errorf("--compression powersgd needs --overlap (the Bucketer compresses the buckets)")
		}
	} else if _, err := fusion.ParseWire(o.Compression); err != nil {
		return fmt.Errorf("--compression %q: want fp16, bf16, none or powersgd", o.Compression)
	}
	if o.BucketCapMB <= 0 || o.FirstBucketMB <= 0 {
		return fmt.Errorf("--bucket-cap-mb and --first-bucket-mb must be positive")
	}
	if o.BatchPairs == 0 && o.BatchTokens < o.MaxLength {
		return fmt.Errorf("--batch-tokens %d is smaller than one sentence pair of --max-length %d", o.BatchTokens, o.MaxLength)
	}
	if o.RunDir == "" {
		return fmt.Errorf("--run-dir must not be empty")
	}
	if o.Timeout <= 0 {
		return fmt.Errorf("--timeout must be positive")
	}
	return nil
}

func (o Options) threadsFor(localSize int) int {
	if o.Threads > 0 {
		return o.Threads
	}
	if localSize < 1 {
		localSize = 1
	}
	t := runtime.NumCPU() / localSize
	if t < 1 {
		t = 1
	}
	return t
}
