package openseq2seq

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Args is OpenSeq2Seq run.py's command line.
type Args struct {
	ConfigFile      string // --config_file (required)
	Mode            string // --mode: train (the default), eval, train_eval or infer
	InferOutputFile string // --infer_output_file, "infer-out.txt" by default

	ContinueLearning bool // --continue_learning
	NoDirCheck       bool // --no_dir_check
	Benchmark        bool // --benchmark (nmt-train refuses it)
	EnableLogs       bool // --enable_logs: run.py keeps checkpoints under logdir/logs
	UseXLAJit        bool // --use_xla_jit: no effect in gorun (a Note)

	BenchSteps int // --bench_steps, 20 by default
	BenchStart int // --bench_start, 0 if unset (run.py then uses bench_start from the config, or 10)

	// Overrides are the arguments run.py does not know, normalized to
	// "--KEY=VALUE" ("--KEY" alone when no value follows); Load checks them
	// against base_params.
	Overrides []string

	// Notes are flags accepted without effect, one line each.
	Notes []string
}

// ErrHelp is ParseArgs' answer to -h or --help: print Usage.
var ErrHelp = errors.New("help requested")

// Usage is the help text of run.py's command line.
const Usage = `OpenSeq2Seq run.py's command line (docs/openseq2seq.md):

  --config_file FILE        the OpenSeq2Seq config, a Python file (required)
  --mode MODE               train (default), eval, train_eval or infer
                            (interactive_infer: refused, as run.py does)
  --infer_output_file FILE  where --mode=infer writes translations (default infer-out.txt)
  --continue_learning       continue from the checkpoints in logdir
  --no_dir_check            do not check that logdir is empty (or holds a checkpoint)
  --benchmark               train bench_steps steps, without checkpoints, summaries or samples
  --bench_steps N           steps of --benchmark (default 20)
  --bench_start N           first step --benchmark times (default 10)
  --enable_logs             keep checkpoints and logs under logdir/logs
  --use_xla_jit             accepted; no effect (XLA is TensorFlow's)
  --precision P             accepted (fp32, fp16, int8); TensorRT's, no effect without --use_trt
  --use_trt, --debug_port N refused: gorun has no TensorRT and no TensorFlow debugger
  --KEY=VALUE               set an entry of base_params that holds an int, a float, a string
                            or True/False, typed as the config's value; nested keys are
                            joined with '/': --lr_policy_params/learning_rate=1.0,
                            --use_horovod=True, --logdir=runs/base
  -h, --help                this help

A flag takes --flag=value or --flag value; a unique prefix of a flag stands for it, as in
run.py's argparse.
`

type flagKind int

const (
	fBool flagKind = iota
	fStr
	fInt
)

var runFlags = []struct {
	name string
	kind flagKind
}{
	{"config_file", fStr}, {"mode", fStr}, {"infer_output_file", fStr},
	{"continue_learning", fBool}, {"no_dir_check", fBool}, {"benchmark", fBool},
	{"bench_steps", fInt}, {"bench_start", fInt}, {"debug_port", fInt},
	{"enable_logs", fBool}, {"use_xla_jit", fBool}, {"use_trt", fBool}, {"precision", fStr},
}

func argErr(format string, a ...any) error {
	return &Error{Pos: "command line", Msg: fmt.Sprintf(format, a...)}
}

// isValue reports whether a command-line word is a value rather than an
// option, as argparse decides (a negative number is a value).
func isValue(s string) bool { return !strings.HasPrefix(s, "-") || isNegNumber(s) }

// ParseArgs parses run.py's command line (without the program name). Its
// own flags are checked here; unknown --KEY=VALUE arguments are returned
// as Overrides for Load.
func ParseArgs(args []string) (Args, error) {
	a := Args{Mode: "train", InferOutputFile: "infer-out.txt", BenchSteps: 20}
	for _, s := range args {
		if s == "-h" || s == "--help" {
			return a, ErrHelp
		}
	}
	for i := 0; i < len(args); i++ {
		s := args[i]
		if s == "--" || !strings.HasPrefix(s, "--") || strings.HasPrefix(s, "--=") {
			return a, argErr("unrecognized argument %q (run.py takes --flag=value and --KEY=VALUE; see --help)", s)
		}
		name, val, hasVal := strings.Cut(s[2:], "=")
		var matches []int
		for k, f := range runFlags {
			if f.name == name {
				matches = []int{k}
				break
			}
			if name != "" && strings.HasPrefix(f.name, name) {
				matches = append(matches, k)
			}
		}
		if len(matches) > 1 {
			var names []string
			for _, k := range matches {
				names = append(names, "--"+runFlags[k].name)
			}
			return a, argErr("ambiguous option: --%s could match %s", name, strings.Join(names, ", "))
		}
		if len(matches) == 0 { // an override of the config
			switch {
			case hasVal:
			case i+1 < len(args) && isValue(args[i+1]):
				i++
				s += "=" + args[i]
			}
			a.Overrides = append(a.Overrides, s)
			continue
		}
		f := runFlags[matches[0]]
		if f.kind == fBool {
			if hasVal {
				return a, argErr("argument --%s: ignored explicit argument %q (it takes no value)", f.name, val)
			}
		} else if !hasVal {
			if i+1 >= len(args) || !isValue(args[i+1]) {
				return a, argErr("argument --%s: expected one argument", f.name)
			}
			i++
			val = args[i]
		}
		var n int
		if f.kind == fInt {
			v, err := strconv.Atoi(strings.TrimSpace(val))
			if err != nil {
				return a, argErr("argument --%s: invalid int value: %q", f.name, val)
			}
			n = v
		}
		switch f.name {
		case "config_file":
			a.ConfigFile = val
		case "mode":
			a.Mode = val
		case "infer_output_file":
			a.InferOutputFile = val
		case "continue_learning":
			a.ContinueLearning = true
		case "no_dir_check":
			a.NoDirCheck = true
		case "benchmark":
			a.Benchmark = true
		case "bench_steps":
			a.BenchSteps = n
		case "bench_start":
			a.BenchStart = n
		case "enable_logs":
			a.EnableLogs = true
		case "use_xla_jit":
			a.UseXLAJit = true
			a.Notes = append(a.Notes, "--use_xla_jit: no effect (XLA is TensorFlow's compiler; gorun runs its own kernels)")
		case "debug_port":
			return a, argErr("--debug_port: gorun has no TensorFlow debugger (remove it to run)")
		case "use_trt":
			return a, argErr("--use_trt: gorun has no TensorRT (remove it to run)")
		case "precision":
			switch val {
			case "fp32", "fp16", "int8":
			default:
				return a, argErr("argument --precision: invalid choice: %q (choose from 'fp32', 'fp16', 'int8')", val)
			}
			a.Notes = append(a.Notes, "--precision="+val+": no effect (run.py's TensorRT precision, used only with --use_trt; gorun's precision follows the config's dtype)")
		}
	}
	if a.ConfigFile == "" {
		return a, argErr("the following arguments are required: --config_file")
	}
	switch a.Mode {
	case "train", "eval", "train_eval", "infer":
	case "interactive_infer":
		return a, argErr("--mode=interactive_infer: gorun has no interactive inference (run.py refuses it too: it is meant for a notebook)")
	default:
		return a, argErr("--mode=%s: want train, eval, train_eval or infer", a.Mode)
	}
	if a.Benchmark && a.BenchSteps < 1 {
		return a, argErr("--bench_steps=%d: want at least 1", a.BenchSteps)
	}
	return a, nil
}
