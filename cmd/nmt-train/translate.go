package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/cmd/nmt-train/internal/train"
	"github.com/gorun/gorun/data"
	"github.com/gorun/gorun/internal/envconf"
	"github.com/gorun/gorun/kernels/cuda"
	"github.com/gorun/gorun/kernels/device"
	"github.com/gorun/gorun/transformer"
)

func translateCommand() *cli.Command {
	return &cli.Command{
		Name:      "translate",
		Usage:     "translate sentences from stdin with a checkpoint, one per line, to stdout (detokenized unless --pieces)",
		ArgsUsage: "< SOURCE.txt > TRANSLATION.txt",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "run-dir", Value: "runs/nmt", Usage: "run directory (its vocab.txt, bpe.codes and latest checkpoint)"},
			&cli.StringFlag{Name: "checkpoint", Usage: "checkpoint directory (default: the run's latest)"},
			&cli.IntFlag{Name: "beam", Value: 4, Usage: "beam width (1: greedy); the lab uses 4"},
			&cli.Float64Flag{Name: "alpha", Value: 0.6, Usage: "length penalty exponent of beam search"},
			&cli.StringFlag{Name: "input", Value: "auto", Usage: "auto (text when the run has bpe.codes; else pieces for a line that starts with " + data.WordBoundary + ", words for one that does not) | text (apply the run's BPE) | pieces (the lab's tokenized lines) | words (one piece per word)"},
			&cli.BoolFlag{Name: "pieces", Usage: "print vocabulary pieces instead of detokenized text"},
			&cli.IntFlag{Name: "batch", Value: 32, Usage: "sentences per decoding batch"},
			&cli.IntFlag{Name: "max-length", Value: 256, Usage: "refuse an input line longer than `N` tokens, counting the EOS (as train's --max-length): one line on stderr names it, and its output line is left empty (0: no limit)"},
			&cli.StringFlag{Name: "device", Value: "auto", Usage: "compute device: auto (a GPU when one is usable, else the CPU) | cpu | cuda"},
		},
		Action: func(c *cli.Context) (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = cuda.Failure(r)
				}
			}()
			if err := translateArgs(c); err != nil {
				return usage(err)
			}
			dev, err := envconf.Device(os.LookupEnv)
			if err != nil {
				return err
			}
			be, _, err := device.Open(c.String("device"), dev)
			if err != nil {
				return err
			}
			dir := c.String("run-dir")
			if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
				return fmt.Errorf("translate: no run directory %s (give the one you trained into with --run-dir)", dir)
			}
			v, err := data.LoadVocab(filepath.Join(dir, train.VocabFile))
			if err != nil {
				return fmt.Errorf("translate: %s is not a run directory: %w", dir, err)
			}
			var bpe *data.BPE
			if _, err := os.Stat(filepath.Join(dir, train.BPEFile)); err == nil {
				if bpe, err = data.LoadBPE(filepath.Join(dir, train.BPEFile)); err != nil {
					return err
				}
			}
			ck := c.String("checkpoint")
			if ck == "" {
				if ck, err = checkpoint.Latest(dir); err != nil {
					return err
				}
			}
			st, err := checkpoint.ReadState(ck)
			if err != nil {
				return err
			}
			m, err := transformer.New(st.Config, be, st.Seed)
			if err != nil {
				return err
			}
			if _, err := checkpoint.Load(ck, m, transformer.NewLazyAdam(m), v.Hash()); err != nil {
				return err
			}
			split, err := splitter(c.String("input"), bpe)
			if err != nil {
				return err
			}
			opt := transformer.DecodeOptions{Beam: c.Int("beam"), Alpha: c.Float64("alpha"), MaxExtra: 50}
			w := bufio.NewWriter(os.Stdout)
			defer w.Flush()
			// lines are answered in order; an empty input line, or one
			// refused as too long, gets an empty output line (real[i] false)
			maxLen := c.Int("max-length")
			errw := c.App.ErrWriter
			if errw == nil {
				errw = os.Stderr
			}
			var batch [][]int32
			var real []bool
			flush := func() error {
				var out [][]int32
				if len(batch) > 0 {
					if out, err = m.Translate(batch, opt); err != nil {
						return err
					}
				}
				for _, r := range real {
					if !r {
						fmt.Fprintln(w)
						continue
					}
					p := v.Decode(out[0])
					out = out[1:]
					if c.Bool("pieces") {
						fmt.Fprintln(w, strings.Join(p, " "))
					} else {
						fmt.Fprintln(w, data.Detokenize(p))
					}
				}
				batch, real = batch[:0], real[:0]
				return w.Flush()
			}
			in := bufio.NewReaderSize(os.Stdin, 64<<10)
			for n := 1; ; n++ {
				line, size, err := readLine(in, maxLineBytes)
				if err == io.EOF {
					break
				}
				if err != nil {
					return fmt.Errorf("stdin:%d: %w", n, err)
				}
				var ids []int32
				switch {
				case size > maxLineBytes:
					fmt.Fprintf(errw, "nmt-train: translate: stdin:%d: a line of %d bytes (more than %d): not translated, its output line left empty\n", n, size, maxLineBytes)
				default:
					ids = v.Encode(split(line))
					if maxLen > 0 && len(ids)+1 > maxLen {
						fmt.Fprintf(errw, "nmt-train: translate: stdin:%d: %d tokens with EOS, more than --max-length %d: not translated, its output line left empty\n", n, len(ids)+1, maxLen)
						ids = nil
					}
				}
				real = append(real, len(ids) > 0)
				if len(ids) == 0 {
					continue
				}
				batch = append(batch, append(ids, data.EOS))
				if len(batch) == c.Int("batch") {
					if err := flush(); err != nil {
						return err
					}
				}
			}
			return flush()
		},
	}
}

// translateArgs checks the command line before anything is loaded.
func translateArgs(c *cli.Context) error {
	switch {
	case c.NArg() > 0:
		return fmt.Errorf("translate: unexpected argument %q (it reads the sentences from stdin; options start with --)", c.Args().First())
	case c.Int("beam") < 1:
		return fmt.Errorf("translate: --beam %d: want at least 1 (1: greedy)", c.Int("beam"))
	case c.Int("batch") < 1:
		return fmt.Errorf("translate: --batch %d: want at least 1 sentence", c.Int("batch"))
	case c.Int("max-length") < 0 || c.Int("max-length") == 1:
		return fmt.Errorf("translate: --max-length %d: want 0 (no limit) or at least 2 (a token and the EOS)", c.Int("max-length"))
	case c.Float64("alpha") < 0:
		return fmt.Errorf("translate: --alpha %g: must not be negative", c.Float64("alpha"))
	}
	switch c.String("input") {
	case "auto", "text", "pieces", "words":
	default:
		return fmt.Errorf("translate: --input %q: want auto, text, pieces or words", c.String("input"))
	}
	switch strings.ToLower(strings.TrimSpace(c.String("device"))) {
	case "", "auto", "cpu", "cuda", "gpu":
	default:
		return fmt.Errorf("translate: unknown --device %q (want %s)", c.String("device"), device.Names)
	}
	return nil
}

// maxLineBytes is the longest input line translate reads whole; a longer
// one is refused without being split or kept in memory (a line of the
// default 256 tokens is a few KB).
const maxLineBytes = 1 << 20

// readLine reads one line of r: its text without the "\n" (or "\r\n"),
// or "" when it has more than max bytes; n is its length either way (the
// "\r" included). err is io.EOF after the last line.
func readLine(r *bufio.Reader, max int) (line string, n int, err error) {
	var buf []byte
	read, nl := 0, 0
	for {
		frag, err := r.ReadSlice('\n')
		read += len(frag)
		if len(buf) <= max { // a longer line is refused: stop keeping it
			buf = append(buf, frag...)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err == io.EOF && read > 0 {
			break // the last line, without its "\n"
		}
		if err != nil {
			return "", 0, err
		}
		nl = 1
		break
	}
	n = read - nl
	if n > max {
		return "", n, nil
	}
	return strings.TrimSuffix(string(buf[:n]), "\r"), n, nil
}

func splitter(mode string, bpe *data.BPE) (func(string) []string, error) {
	switch mode {
	case "auto":
		if bpe != nil {
			return bpe.Apply, nil
		}
		return func(line string) []string {
			if strings.HasPrefix(strings.TrimSpace(line), data.WordBoundary) {
				return data.SplitPieces(line)
			}
			return data.WordPieces(line)
		}, nil
	case "text":
		if bpe == nil {
			return nil, fmt.Errorf("--input text: the run has no %s (it was trained on tokenized data: use --input pieces)", train.BPEFile)
		}
		return bpe.Apply, nil
	case "pieces":
		return data.SplitPieces, nil
	case "words":
		return data.WordPieces, nil
	}
	return nil, fmt.Errorf("--input %q: want auto, text, pieces or words", mode)
}
