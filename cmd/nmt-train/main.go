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
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/cmd/nmt-train/internal/train"
	"github.com/gorun/gorun/metrics"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	app := &cli.App{
		Name:  "nmt-train",
		Usage: "distributed training of a Transformer translation model (run it under gorun)",
		Commands: []*cli.Command{
			trainCommand(),
			prepareCommand(),
			translateCommand(),
			bleuCommand(),
			reportCommand(),
		},
		// One line on stderr for every error; no usage dump after it.
		ExitErrHandler: func(*cli.Context, error) {},
		Writer:         os.Stdout,
		ErrWriter:      os.Stderr,
	}
	if err := app.RunContext(ctx, os.Args); err != nil {
		if !errors.Is(err, train.ErrReported) {
			fmt.Fprintf(os.Stderr, "nmt-train: %v\n", err)
		}
		os.Exit(1)
	}
}

func trainCommand() *cli.Command {
	return &cli.Command{
		Name:      "train",
		Usage:     "train (every rank of a gorun job runs this)",
		ArgsUsage: " ",
		Flags:     train.Flags(),
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return fmt.Errorf("train: unexpected argument %q (options start with --)", c.Args().First())
			}
			if f := c.String("config"); f != "" {
				if err := train.ApplyConfigFile(c, f); err != nil {
					return err
				}
			}
			o, err := train.OptionsFromCLI(c)
			if err != nil {
				return err
			}
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
				return fmt.Errorf("report: want one run directory")
			}
			p, err := metrics.WriteReport(c.Args().First())
			if err != nil {
				return err
			}
			fmt.Println(p)
			return nil
		},
	}
}
