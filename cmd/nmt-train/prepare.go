package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/data"
)

// prepare is the command line over data.Prepare (data/prepare.go), which
// the trainer's corpus cache calls too.
func prepareCommand() *cli.Command {
	return &cli.Command{
		Name:  "prepare",
		Usage: "turn parallel text into DIR/{train.bin,valid.bin,vocab.txt} (+ bpe.codes) and a statistics report DIR/prepare.md",
		Description: `Tokenized input (the lab's *.BPE_common.32K.tok files, pieces separated by spaces):
     prepare --src train.en.tok --tgt train.de.tok --vocab m_common.vocab --valid-src V.en --valid-tgt V.de --out DIR
   or build the vocabulary from the data: --vocab-size 32000 instead of --vocab.
   Raw text (words separated by white space): learn a joint BPE of at most N merges on both sides
   (--bpe-merges N) or apply a merges file (--bpe FILE); the merges are written to DIR/bpe.codes and the
   vocabulary is the pieces seen (the --vocab-size most frequent, if given). A word (a run without white space)
   longer than --max-word-bytes is refused naming file:line: such a line is almost surely not text.
   The built-in synthetic corpus: prepare --synthetic --out DIR (its text goes to DIR/*.txt too).
   Training pairs with an empty side, or a side longer than --max-length tokens (counting the EOS the model
   adds), are dropped and counted. Without --valid-src/--valid-tgt the last --valid-lines kept training pairs
   are held out as valid.bin; validation files are kept whole (only pairs with an empty side are dropped).
   The files are written into a staging directory and moved into DIR only when all are written: a prepare
   that fails, or is stopped by SIGINT or SIGTERM (the first one; it says "interrupted"), leaves an earlier
   one's files in DIR as they were.
   train --data DIR reads them. (train can also read the text files themselves: see docs/data.md, the cache.)`,
		ArgsUsage: " ",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "src", Usage: "training source `FILE`, one sentence per line"},
			&cli.StringFlag{Name: "tgt", Usage: "training target `FILE`, line-aligned with --src"},
			&cli.StringFlag{Name: "valid-src", Usage: "validation source `FILE` (kept whole: --max-length does not apply; only pairs with an empty side are dropped)"},
			&cli.StringFlag{Name: "valid-tgt", Usage: "validation target `FILE`, line-aligned with --valid-src"},
			&cli.StringFlag{Name: "vocab", Usage: "tokenized text: SentencePiece vocabulary `FILE` (piece<TAB>score, one a line; the first four <pad> </s> <s> <unk>)"},
			&cli.IntFlag{Name: "vocab-size", Usage: "build the vocabulary from the training data: its `N`-4 most frequent pieces after the 4 specials (with --bpe-merges/--bpe: optional, default every piece seen)"},
			&cli.IntFlag{Name: "bpe-merges", Usage: "raw text: learn a joint BPE of at most `N` merges on both sides' training files (fewer when no pair occurs twice)"},
			&cli.StringFlag{Name: "bpe", Usage: "raw text: apply this BPE merges `FILE` (an earlier prepare's bpe.codes)"},
			&cli.IntFlag{Name: "max-length", Value: 56, Usage: "drop training pairs with a side longer than `N` tokens including EOS (0: no limit)"},
			&cli.IntFlag{Name: "max-word-bytes", Value: data.DefaultMaxWordBytes, Usage: "raw text (--bpe-merges, --bpe): refuse a word (a run without white space) longer than `N` bytes in any of the files, naming file:line (0: no limit)"},
			&cli.IntFlag{Name: "valid-lines", Value: 1000, Usage: "without --valid-src: hold out the last `N` kept training pairs as valid.bin (at most half of them)"},
			&cli.BoolFlag{Name: "synthetic", Usage: "write the built-in synthetic corpus (and its text) instead of reading files"},
			&cli.IntFlag{Name: "synthetic-lines", Value: 40000, Usage: "`N` training pairs of the synthetic corpus (as many as train's built-in corpus by default); its validation pairs are always " + fmt.Sprint(data.SyntheticValidLines)},
			&cli.StringFlag{Name: "out", Usage: "output `DIR` (created; an earlier prepare's files in it are replaced, only once all of this one's are written)", Required: true},
		},
		Action: runPrepare,
	}
}

func runPrepare(c *cli.Context) error {
	if c.NArg() > 0 {
		return fmt.Errorf("prepare: unexpected argument %q (options start with --)", c.Args().First())
	}
	synthetic := c.Bool("synthetic")
	if synthetic {
		for _, f := range []string{"src", "tgt", "valid-src", "valid-tgt", "vocab", "vocab-size", "bpe-merges", "bpe", "max-word-bytes"} {
			if c.IsSet(f) {
				return fmt.Errorf("prepare: --synthetic makes its own data; --%s does not apply", f)
			}
		}
	}
	// Flags given with a value that data.PrepareConfig reads as "not
	// given" are refused here, as given.
	for _, f := range []struct {
		name  string
		check bool
		want  string
	}{
		{"vocab-size", c.Int("vocab-size") < 5, "want at least 5 (4 specials and a piece)"},
		{"bpe-merges", c.Int("bpe-merges") < 1, "want at least 1"},
		{"synthetic-lines", synthetic && c.Int("synthetic-lines") < 1, "want at least 1"},
		{"valid-lines", !synthetic && c.String("valid-src") == "" && c.Int("valid-lines") < 1, "want at least 1 (or give --valid-src/--valid-tgt)"},
		{"max-word-bytes", c.Int("max-word-bytes") < 0, "want at least 1 (0: no limit)"},
	} {
		if f.check && (c.IsSet(f.name) || f.name == "valid-lines") {
			return fmt.Errorf("prepare: --%s %d: %s", f.name, c.Int(f.name), f.want)
		}
	}
	for _, f := range []string{"src", "tgt", "valid-src", "valid-tgt", "vocab", "bpe"} {
		if c.IsSet(f) && c.String(f) == "" {
			return fmt.Errorf("prepare: --%s: want a file name", f)
		}
	}
	maxWord := c.Int("max-word-bytes")
	if maxWord == 0 {
		maxWord = -1 // PrepareConfig's "no limit"
	}
	// c.Context is cancelled by the first SIGINT or SIGTERM (main.go):
	// prepare stops, says "interrupted", and leaves --out as it was.
	p, err := data.Prepare(c.Context, data.PrepareConfig{
		Out: c.String("out"),
		Src: c.String("src"), Tgt: c.String("tgt"), ValidSrc: c.String("valid-src"), ValidTgt: c.String("valid-tgt"),
		ValidLines: c.Int("valid-lines"),
		Vocab:      c.String("vocab"), VocabSize: c.Int("vocab-size"), BPEMerges: c.Int("bpe-merges"), BPE: c.String("bpe"),
		MaxLen: c.Int("max-length"), MaxWordBytes: maxWord,
		Synthetic: synthetic, SyntheticLines: c.Int("synthetic-lines"),
		Command: strings.Join(os.Args, " "),
	})
	if err != nil {
		return err
	}
	w := c.App.Writer
	if w == nil {
		w = os.Stdout
	}
	w.Write(p.Report)
	fmt.Fprintf(w, "\nwrote %s\n", filepath.Join(p.Dir, data.ReportFile))
	return nil
}
