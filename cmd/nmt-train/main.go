// Command nmt-train trains a Transformer translation model with data
// parallelism over gorun's collectives: `train`, `prepare`, `translate`,
// `bleu` and `report`.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/cmd/nmt-train/internal/train"
	"github.com/gorun/gorun/internal/envconf"
	"github.com/gorun/gorun/internal/version"
	"github.com/gorun/gorun/kernels/cuda"
	"github.com/gorun/gorun/mpirun"
)

func main() {
	// SIGINT, SIGTERM and SIGHUP: `train` stops after the current step with
	// a checkpoint (a preemption, a scheduler's time limit, Ctrl-C, a closed
	// terminal or ssh session); the other commands stop at once. Under
	// nohup SIGHUP stays ignored. A second signal exits at once, but a
	// signal gorun sent is never that second one: when Slurm, systemd or
	// Kubernetes send SIGTERM to every process of the job, a rank gets it
	// directly and again from gorun, and that is one stop
	// (mpirun.StopSignals: gorun's signal notices; docs/nmt-train.md).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := make(chan os.Signal, 1)
	var training atomic.Bool
	sigs := make(chan os.Signal, 8)
	stopSigs := []os.Signal{syscall.SIGINT, syscall.SIGTERM}
	if !signal.Ignored(syscall.SIGHUP) {
		stopSigs = append(stopSigs, syscall.SIGHUP)
	}
	signal.Notify(sigs, stopSigs...)
	counted := mpirun.CountStopSignals(mpirun.OpenSignalNotices(os.Getenv(mpirun.EnvSignalNotices)))
	go func() {
		s := <-sigs
		counted.Again() // the first is never a second
		if training.Load() {
			stop <- s
		} else {
			cancel()
		}
		for s := range sigs {
			if counted.Again() {
				fmt.Fprintf(os.Stderr, "nmt-train: %v again: exiting now\n", s)
				os.Exit(128 + int(s.(syscall.Signal)))
			}
		}
	}()
	app := &cli.App{
		Name:  "nmt-train",
		Usage: "distributed training of a Transformer translation model (run it under gorun)",
		Description: "As OpenSeq2Seq's run.py, with its config file:\n" +
			"     nmt-train --config_file=transformer-base.py --mode=train_eval|train|eval|infer [--infer_output_file=F] [--continue_learning]\n" +
			"   (nmt-train --config_file=x --help lists run.py's flags; docs/openseq2seq.md)",
		Commands: []*cli.Command{
			trainCommand(stop, &training),
			prepareCommand(),
			translateCommand(),
			bleuCommand(),
			reportCommand(),
			planCommand(),
		},
		Flags: []cli.Flag{&cli.BoolFlag{Name: "version", Usage: "print the version, commit, Go version, CPU features and GPUs found"}},
		Action: func(c *cli.Context) error {
			if c.Bool("version") {
				fmt.Fprint(os.Stdout, version.String("nmt-train", gpus()))
				return nil
			}
			if c.NArg() > 0 {
				name := c.Args().First()
				return usage(fmt.Errorf("unknown command '%s'%s (see nmt-train --help)", name, suggest(name, c.App.Commands)))
			}
			return cli.ShowAppHelp(c)
		},
		// One line on stderr for every error; no usage dump after it.
		ExitErrHandler: func(*cli.Context, error) {},
		Writer:         os.Stdout,
		ErrWriter:      os.Stderr,
	}
	// One bad flag: one line and where the help is, not the usage dump.
	for _, cmd := range app.Commands {
		cmd.OnUsageError = func(c *cli.Context, err error, _ bool) error {
			return usage(fmt.Errorf("%w (see nmt-train %s --help)", err, c.Command.Name))
		}
	}
	app.OnUsageError = func(_ *cli.Context, err error, _ bool) error {
		return usage(fmt.Errorf("%w (see nmt-train --help)", err))
	}
	var err error
	if runPyArgs(os.Args) { // started as OpenSeq2Seq's run.py: --config_file=FILE --mode=...
		err = runPy(ctx, os.Args[1:], stop, func() { training.Store(true) })
	} else {
		err = app.RunContext(ctx, bleuFlagsFirst(os.Args))
	}
	if err != nil {
		var stopped *train.StoppedError
		if errors.As(err, &stopped) {
			os.Exit(128 + int(stopped.Sig.(syscall.Signal)))
		}
		if !errors.Is(err, train.ErrReported) {
			fmt.Fprintf(os.Stderr, "nmt-train: %v\n", err)
		}
		os.Exit(exitStatus(err))
	}
}

// exitUsage is the status of a mistake in the command line, as gorun's
// (mpirun.ExitUsage); a failure exits 1.
const exitUsage = 2

// usageError is a mistake in the command line: an unknown command or
// flag, a missing or extra argument, a flag value the flag does not take.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// usage marks err (nil stays nil) as a mistake in the command line.
func usage(err error) error {
	if err == nil {
		return nil
	}
	return usageError{err}
}

// exitStatus is exitUsage for a mistake in the command line (ours, or the
// CLI's "No help topic" of `help X` and `--help X`), else 1.
func exitStatus(err error) int {
	var ue usageError
	var help cli.ExitCoder
	if errors.As(err, &ue) || errors.As(err, &help) {
		return exitUsage
	}
	return 1
}

func trainCommand(stop <-chan os.Signal, training *atomic.Bool) *cli.Command {
	return &cli.Command{
		Name:      "train",
		Usage:     "train (every rank of a gorun job runs this)",
		ArgsUsage: " ",
		Flags:     train.Flags(),
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usage(fmt.Errorf("train: unexpected argument %q (options start with --)", c.Args().First()))
			}
			if f := c.String("config"); f != "" {
				if err := train.ApplyConfigFile(c, f); err != nil {
					return usage(err)
				}
			}
			o, err := train.OptionsFromCLI(c)
			if err != nil {
				return usage(err)
			}
			o.Stop = stop
			training.Store(true)
			return train.Run(c.Context, o, os.Stdout)
		},
	}
}

func reportCommand() *cli.Command {
	return &cli.Command{
		Name:      "report",
		Usage:     "write RUN_DIR/report.md answering the lab's questions from the run's own numbers",
		ArgsUsage: "RUN_DIR",
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usage(fmt.Errorf("report: want one run directory, got %d arguments (nmt-train report RUN_DIR)", c.NArg()))
			}
			p, err := train.WriteReport(c.Args().First())
			if err != nil {
				return err
			}
			fmt.Println(p)
			return nil
		},
	}
}

// gpus says what GPUs --device cuda would find: their names, or why none.
func gpus() string {
	set, err := envconf.CUDA(os.LookupEnv)
	if err != nil {
		return "none usable: " + err.Error()
	}
	n, err := cuda.Count(set)
	if err != nil {
		return "none usable: " + err.Error()
	}
	if n == 0 {
		return "none: the driver sees no GPU"
	}
	b, err := cuda.Open(0, set)
	if err != nil {
		return fmt.Sprintf("%d, but opening the first failed: %v", n, err)
	}
	return fmt.Sprintf("%d; the first: %s", n, b.Describe())
}

// suggest is " (did you mean X?)" for the command nearest to name (at most
// two edits away), else "".
func suggest(name string, cmds []*cli.Command) string {
	best, bestD := "", 3
	for _, c := range cmds {
		if d := editDistance(name, c.Name); d < bestD {
			best, bestD = c.Name, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %s?)", best)
}

// editDistance is the Damerau-Levenshtein distance (adjacent swaps count
// one), enough for typed command names.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// bleuFlagsFirst lets `bleu` take its flags after its arguments, as
// sacrebleu does (`bleu -r REF HYP --tokenized`): the flags move before the
// hypothesis file (the CLI stops reading flags at the first argument).
func bleuFlagsFirst(args []string) []string {
	if len(args) < 3 || args[1] != "bleu" {
		return args
	}
	flags, rest := []string{}, []string{}
	for i := 2; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			rest = append(rest, args[i:]...)
			i = len(args)
		case a == "-r" || a == "--ref" || a == "-ref":
			flags = append(flags, a)
			if i+1 < len(args) {
				i++
				flags = append(flags, args[i])
			}
		case strings.HasPrefix(a, "-") && a != "-":
			flags = append(flags, a)
		default:
			rest = append(rest, a)
		}
	}
	return append(append(append([]string{}, args[:2]...), flags...), rest...)
}
