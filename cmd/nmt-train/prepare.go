package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/data"
)

// Files `prepare --out DIR` writes (the trainer's --data DIR reads them).
const (
	prepTrainFile  = "train.bin"
	prepValidFile  = "valid.bin"
	prepVocabFile  = "vocab.txt"
	prepBPEFile    = "bpe.codes"
	prepReportFile = "prepare.md"
)

func prepareCommand() *cli.Command {
	return &cli.Command{
		Name:  "prepare",
		Usage: "turn parallel text into DIR/{train.bin,valid.bin,vocab.txt} (+ bpe.codes) and a statistics report DIR/prepare.md",
		Description: `Tokenized input (the lab's *.BPE_common.32K.tok files, pieces separated by spaces):
     prepare --src train.en.tok --tgt train.de.tok --vocab m_common.vocab --valid-src V.en --valid-tgt V.de --out DIR
   or build the vocabulary from the data: --vocab-size 32000 instead of --vocab.
   Raw text: learn a joint BPE of N merges on both sides (--bpe-merges N) or apply a merges file (--bpe FILE);
   the vocabulary is the pieces seen (the --vocab-size most frequent, if given).
   The built-in synthetic corpus: prepare --synthetic --out DIR.
   Pairs with a side longer than --max-length tokens (counting the EOS the model adds) or an empty side are
   dropped and counted. Without --valid-src/--valid-tgt the last --valid-lines pairs of the training data are held out.`,
		ArgsUsage: " ",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "src", Usage: "training source `FILE`, one sentence per line"},
			&cli.StringFlag{Name: "tgt", Usage: "training target `FILE`, line-aligned with --src"},
			&cli.StringFlag{Name: "valid-src", Usage: "validation source `FILE`"},
			&cli.StringFlag{Name: "valid-tgt", Usage: "validation target `FILE`"},
			&cli.StringFlag{Name: "vocab", Usage: "SentencePiece vocabulary `FILE` (piece<TAB>score; <pad> </s> <s> <unk> first)"},
			&cli.IntFlag{Name: "vocab-size", Usage: "build a vocabulary of at most `N` pieces (specials included) from the training data"},
			&cli.IntFlag{Name: "bpe-merges", Usage: "raw text: learn a joint BPE of `N` merges on both sides"},
			&cli.StringFlag{Name: "bpe", Usage: "raw text: apply this BPE merges `FILE` (from an earlier prepare)"},
			&cli.IntFlag{Name: "max-length", Value: 56, Usage: "drop pairs with a side longer than `N` tokens including EOS (0: no limit)"},
			&cli.IntFlag{Name: "valid-lines", Value: 1000, Usage: "without --valid-src: hold out the last `N` kept training pairs (at most half of them)"},
			&cli.BoolFlag{Name: "synthetic", Usage: "write the built-in synthetic corpus"},
			&cli.IntFlag{Name: "synthetic-lines", Value: 40000, Usage: "training pairs of the synthetic corpus (train's built-in corpus has as many)"},
			&cli.StringFlag{Name: "out", Usage: "output `DIR` (created)", Required: true},
		},
		Action: runPrepare,
	}
}

func runPrepare(c *cli.Context) error {
	t0 := time.Now()
	if c.NArg() > 0 {
		return fmt.Errorf("prepare: unexpected argument %q (options start with --)", c.Args().First())
	}
	out := c.String("out")
	if err := os.MkdirAll(out, 0o755); err != nil {
		return fmt.Errorf("prepare: --out: %v", err)
	}
	maxLen := c.Int("max-length")
	if maxLen < 0 || maxLen == 1 {
		return fmt.Errorf("prepare: --max-length %d: want 0 (no limit) or at least 2", maxLen)
	}
	var rep bytes.Buffer
	fmt.Fprintf(&rep, "# nmt-train prepare\n\n`%s`\n\n", strings.Join(os.Args, " "))
	trainSrc, trainTgt := c.String("src"), c.String("tgt")
	validSrc, validTgt := c.String("valid-src"), c.String("valid-tgt")
	split := data.SplitPieces
	var (
		v       *data.Vocab
		err     error
		vocabOf string
	)
	if c.Bool("synthetic") {
		for _, f := range []string{"src", "tgt", "valid-src", "valid-tgt", "vocab", "vocab-size", "bpe-merges", "bpe"} {
			if c.IsSet(f) {
				return fmt.Errorf("prepare: --synthetic makes its own data; --%s does not apply", f)
			}
		}
		n := c.Int("synthetic-lines")
		if n < 1 {
			return fmt.Errorf("prepare: --synthetic-lines %d: want at least 1", n)
		}
		// The text goes to DIR too, so that the corpus can be read.
		s, t := data.Synthetic(data.SyntheticTrainSeed, n)
		vs, vt := data.Synthetic(data.SyntheticValidSeed, data.SyntheticValidLines)
		trainSrc, trainTgt = filepath.Join(out, "train.src.txt"), filepath.Join(out, "train.tgt.txt")
		validSrc, validTgt = filepath.Join(out, "valid.src.txt"), filepath.Join(out, "valid.tgt.txt")
		for p, lines := range map[string][]string{trainSrc: s, trainTgt: t, validSrc: vs, validTgt: vt} {
			if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
				return fmt.Errorf("prepare: %v", err)
			}
		}
		v, split = data.SyntheticVocab(), data.WordPieces
		vocabOf = fmt.Sprintf("the synthetic languages' words (%d training pairs from seed %d, %d validation pairs from seed %d)", n, data.SyntheticTrainSeed, data.SyntheticValidLines, data.SyntheticValidSeed)
	} else {
		if trainSrc == "" || trainTgt == "" {
			return fmt.Errorf("prepare: want --src and --tgt (or --synthetic)")
		}
		if (validSrc == "") != (validTgt == "") {
			return fmt.Errorf("prepare: --valid-src and --valid-tgt go together")
		}
		modes := 0
		for _, f := range []string{"vocab", "bpe-merges", "bpe"} {
			if c.IsSet(f) {
				modes++
			}
		}
		if modes > 1 {
			return fmt.Errorf("prepare: --vocab, --bpe-merges and --bpe exclude each other")
		}
		if modes == 0 && !c.IsSet("vocab-size") {
			return fmt.Errorf("prepare: want --vocab FILE or --vocab-size N (tokenized text), or --bpe-merges N / --bpe FILE (raw text)")
		}
		if c.IsSet("vocab") && c.IsSet("vocab-size") {
			return fmt.Errorf("prepare: --vocab and --vocab-size exclude each other")
		}
		if c.IsSet("vocab-size") && c.Int("vocab-size") < 5 {
			return fmt.Errorf("prepare: --vocab-size %d: want at least 5 (4 specials and a piece)", c.Int("vocab-size"))
		}
		switch {
		case c.IsSet("vocab"):
			if v, err = data.LoadVocab(c.String("vocab")); err != nil {
				return err
			}
			vocabOf = "`" + c.String("vocab") + "`"
		case c.IsSet("bpe-merges"), c.IsSet("bpe"):
			var b *data.BPE
			if c.IsSet("bpe") {
				if b, err = data.LoadBPE(c.String("bpe")); err != nil {
					return err
				}
				fmt.Fprintf(&rep, "BPE: %d merges from `%s`.\n\n", b.NumMerges(), c.String("bpe"))
			} else {
				m := c.Int("bpe-merges")
				if m < 1 {
					return fmt.Errorf("prepare: --bpe-merges %d: want at least 1", m)
				}
				tl := time.Now()
				counts, err := data.CountPieces(strings.Fields, trainSrc, trainTgt)
				if err != nil {
					return err
				}
				b = data.LearnBPECounts(counts, m)
				fmt.Fprintf(&rep, "BPE: learned %d merges (asked for %d) jointly on both sides from %d distinct words in %.1f s.\n\n", b.NumMerges(), m, len(counts), time.Since(tl).Seconds())
			}
			if err := b.WriteFile(filepath.Join(out, prepBPEFile)); err != nil {
				return fmt.Errorf("prepare: %v", err)
			}
			split = b.Apply
			counts, err := data.CountPieces(split, trainSrc, trainTgt)
			if err != nil {
				return err
			}
			v = data.BuildVocab(counts, c.Int("vocab-size"))
			vocabOf = fmt.Sprintf("the %d most frequent of %d BPE pieces of the training data", v.Size()-4, len(counts))
		default:
			counts, err := data.CountPieces(split, trainSrc, trainTgt)
			if err != nil {
				return err
			}
			v = data.BuildVocab(counts, c.Int("vocab-size"))
			vocabOf = fmt.Sprintf("the %d most frequent of %d pieces of the training data", v.Size()-4, len(counts))
		}
	}
	if err := v.WriteFile(filepath.Join(out, prepVocabFile)); err != nil {
		return fmt.Errorf("prepare: %v", err)
	}
	fmt.Fprintf(&rep, "Vocabulary: %d pieces (4 specials + %s), hash `%.16s`.\n\n", v.Size(), vocabOf, v.Hash())

	// Stream the training pairs into train.bin; without validation files
	// the last --valid-lines kept pairs wait in a ring and become valid.bin.
	tw, err := data.NewCorpusWriter(filepath.Join(out, prepTrainFile), v.Hash(), v.Size())
	if err != nil {
		return err
	}
	hold := 0
	if validSrc == "" {
		if hold = c.Int("valid-lines"); hold < 1 {
			tw.Abort()
			return fmt.Errorf("prepare: --valid-lines %d: want at least 1 (or give --valid-src/--valid-tgt)", hold)
		}
	}
	ring := make([][2][]int32, 0, hold)
	next := 0
	st, err := data.ReadParallelEach(trainSrc, trainTgt, split, v, maxLen, func(s, t []int32) error {
		if hold == 0 {
			return tw.Add(s, t)
		}
		if len(ring) < hold {
			ring = append(ring, [2][]int32{s, t})
			return nil
		}
		old := ring[next]
		ring[next] = [2][]int32{s, t}
		next = (next + 1) % hold
		return tw.Add(old[0], old[1])
	})
	if err != nil {
		tw.Abort()
		return err
	}
	var vsrc, vtgt [][]int32
	var vst data.Stats
	if validSrc != "" {
		// validation pairs are all kept (the trainer decides what to score)
		if vsrc, vtgt, vst, err = data.ReadParallelFunc(validSrc, validTgt, split, v, 0); err != nil {
			tw.Abort()
			return err
		}
	} else {
		if tw.Len() < hold {
			tw.Abort()
			return fmt.Errorf("prepare: %s has %d usable pairs, too few to hold out --valid-lines %d and train on the rest: give --valid-src/--valid-tgt or a smaller --valid-lines", trainSrc, tw.Len()+len(ring), hold)
		}
		for i := range ring {
			p := ring[(next+i)%len(ring)]
			vsrc, vtgt = append(vsrc, p[0]), append(vtgt, p[1])
		}
		fmt.Fprintf(&rep, "Validation: the last %d kept training pairs, held out (no --valid-src/--valid-tgt).\n\n", len(ring))
	}
	nTrain := tw.Len()
	if nTrain == 0 {
		tw.Abort()
		return fmt.Errorf("prepare: no pair of %s / %s is kept (%s)", trainSrc, trainTgt, st.String())
	}
	if err := tw.Close(st.Dropped()); err != nil {
		return err
	}
	if err := data.WriteCorpus(filepath.Join(out, prepValidFile), vsrc, vtgt, v.Hash(), v.Size(), vst.Dropped()); err != nil {
		return err
	}
	st.Markdown(&rep, "Training data")
	if validSrc != "" {
		vst.Markdown(&rep, "Validation data")
	}
	fmt.Fprintf(&rep, "## Output\n\n| file | size | pairs |\n|---|---:|---:|\n")
	for _, f := range []struct {
		name  string
		pairs int
	}{{prepTrainFile, nTrain}, {prepValidFile, len(vsrc)}, {prepVocabFile, v.Size()}, {prepBPEFile, -1}} {
		fi, err := os.Stat(filepath.Join(out, f.name))
		if err != nil {
			continue
		}
		pairs := fmt.Sprint(f.pairs)
		if f.name == prepVocabFile {
			pairs = fmt.Sprintf("%d pieces", f.pairs)
		} else if f.pairs < 0 {
			pairs = ""
		}
		fmt.Fprintf(&rep, "| `%s` | %.2f MB | %s |\n", f.name, float64(fi.Size())/1e6, pairs)
	}
	fmt.Fprintf(&rep, "\nPrepared in %.1f s.\n", time.Since(t0).Seconds())
	if err := os.WriteFile(filepath.Join(out, prepReportFile), rep.Bytes(), 0o644); err != nil {
		return fmt.Errorf("prepare: %v", err)
	}
	w := c.App.Writer
	if w == nil {
		w = os.Stdout
	}
	w.Write(rep.Bytes())
	fmt.Fprintf(w, "\nwrote %s\n", filepath.Join(out, prepReportFile))
	return nil
}
