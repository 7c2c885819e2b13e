package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/data"
	"github.com/gorun/gorun/internal/atomicfile"
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
	maxLen := c.Int("max-length")
	if maxLen < 0 || maxLen == 1 {
		return fmt.Errorf("prepare: --max-length %d: want 0 (no limit) or at least 2", maxLen)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return fmt.Errorf("prepare: --out: %v", err)
	}
	// Everything is written into a staging directory inside out and moved
	// into out only when all of it is written: a prepare that fails leaves
	// an earlier one's files in out as they were, all of one run.
	stage, err := prepStage(out)
	if err != nil {
		return err
	}
	defer os.RemoveAll(stage)
	var rep bytes.Buffer
	fmt.Fprintf(&rep, "# nmt-train prepare\n\n`%s`\n\n", strings.Join(os.Args, " "))
	var in prepInput
	if c.Bool("synthetic") {
		in, err = prepSynthetic(c, stage)
	} else {
		in, err = prepVocab(c, stage, &rep)
	}
	if err != nil {
		return err
	}
	if err := in.v.WriteFile(filepath.Join(stage, prepVocabFile)); err != nil {
		return fmt.Errorf("prepare: %v", err)
	}
	fmt.Fprintf(&rep, "Vocabulary: %d pieces (4 specials + %s), hash `%.16s`.\n\n", in.v.Size(), in.vocabOf, in.v.Hash())
	nTrain, nValid, err := prepCorpora(c, stage, in, maxLen, &rep)
	if err != nil {
		return err
	}
	fmt.Fprintf(&rep, "## Output\n\n| file | size | pairs |\n|---|---:|---:|\n")
	for _, f := range []struct {
		name  string
		pairs int
	}{{prepTrainFile, nTrain}, {prepValidFile, nValid}, {prepVocabFile, in.v.Size()}, {prepBPEFile, -1}} {
		fi, err := os.Stat(filepath.Join(stage, f.name))
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
	if err := os.WriteFile(filepath.Join(stage, prepReportFile), rep.Bytes(), 0o644); err != nil {
		return fmt.Errorf("prepare: %v", err)
	}
	if err := prepPublish(stage, out); err != nil {
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

// prepStagePattern names prepare's staging directories inside --out.
const prepStagePattern = ".prepare.tmp*"

// prepStage makes a new staging directory in out, after removing those a
// killed prepare left there.
func prepStage(out string) (string, error) {
	old, _ := filepath.Glob(filepath.Join(out, prepStagePattern))
	for _, d := range old {
		os.RemoveAll(d)
	}
	stage, err := atomicfile.MkdirTemp(out, prepStagePattern)
	if err != nil {
		return "", fmt.Errorf("prepare: --out: %v", err)
	}
	return stage, nil
}

// prepPublish moves the files of the staging directory into out (the
// report last) and removes an earlier run's bpe.codes that this run did
// not make, so that out holds one run's files.
func prepPublish(stage, out string) error {
	ents, err := os.ReadDir(stage)
	if err != nil {
		return err
	}
	names := []string{}
	for _, e := range ents {
		if e.Name() != prepReportFile {
			names = append(names, e.Name())
		}
	}
	for _, n := range append(names, prepReportFile) {
		if err := os.Rename(filepath.Join(stage, n), filepath.Join(out, n)); err != nil {
			return err
		}
	}
	if _, err := os.Stat(filepath.Join(out, prepBPEFile)); err == nil && !slices.Contains(names, prepBPEFile) {
		if err := os.Remove(filepath.Join(out, prepBPEFile)); err != nil {
			return err
		}
	}
	return atomicfile.SyncDir(out)
}

// prepInput is what prepare reads and with which vocabulary: the text
// files, how a line splits into pieces, and where the vocabulary came
// from (for the report).
type prepInput struct {
	trainSrc, trainTgt string
	validSrc, validTgt string // empty: hold out the last --valid-lines pairs
	v                  *data.Vocab
	split              func(string) []string
	vocabOf            string
}

// prepSynthetic writes the built-in synthetic corpus's text to out and
// returns it with the synthetic vocabulary.
func prepSynthetic(c *cli.Context, out string) (prepInput, error) {
	for _, f := range []string{"src", "tgt", "valid-src", "valid-tgt", "vocab", "vocab-size", "bpe-merges", "bpe"} {
		if c.IsSet(f) {
			return prepInput{}, fmt.Errorf("prepare: --synthetic makes its own data; --%s does not apply", f)
		}
	}
	n := c.Int("synthetic-lines")
	if n < 1 {
		return prepInput{}, fmt.Errorf("prepare: --synthetic-lines %d: want at least 1", n)
	}
	// The text goes to DIR too, so that the corpus can be read.
	s, t := data.Synthetic(data.SyntheticTrainSeed, n)
	vs, vt := data.Synthetic(data.SyntheticValidSeed, data.SyntheticValidLines)
	in := prepInput{
		trainSrc: filepath.Join(out, "train.src.txt"), trainTgt: filepath.Join(out, "train.tgt.txt"),
		validSrc: filepath.Join(out, "valid.src.txt"), validTgt: filepath.Join(out, "valid.tgt.txt"),
		v: data.SyntheticVocab(), split: data.WordPieces,
		vocabOf: fmt.Sprintf("the synthetic languages' words (%d training pairs from seed %d, %d validation pairs from seed %d)", n, data.SyntheticTrainSeed, data.SyntheticValidLines, data.SyntheticValidSeed),
	}
	for p, lines := range map[string][]string{in.trainSrc: s, in.trainTgt: t, in.validSrc: vs, in.validTgt: vt} {
		if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			return prepInput{}, fmt.Errorf("prepare: %v", err)
		}
	}
	return in, nil
}

// prepVocab checks the flags for the user's text and returns it with its
// vocabulary: given (--vocab), or built from the training data's pieces
// (--vocab-size), after a BPE learned (--bpe-merges, written to out) or
// given (--bpe).
func prepVocab(c *cli.Context, out string, rep *bytes.Buffer) (prepInput, error) {
	in := prepInput{trainSrc: c.String("src"), trainTgt: c.String("tgt"),
		validSrc: c.String("valid-src"), validTgt: c.String("valid-tgt"), split: data.SplitPieces}
	if in.trainSrc == "" || in.trainTgt == "" {
		return in, fmt.Errorf("prepare: want --src and --tgt (or --synthetic)")
	}
	if (in.validSrc == "") != (in.validTgt == "") {
		return in, fmt.Errorf("prepare: --valid-src and --valid-tgt go together")
	}
	modes := 0
	for _, f := range []string{"vocab", "bpe-merges", "bpe"} {
		if c.IsSet(f) {
			modes++
		}
	}
	if modes > 1 {
		return in, fmt.Errorf("prepare: --vocab, --bpe-merges and --bpe exclude each other")
	}
	if modes == 0 && !c.IsSet("vocab-size") {
		return in, fmt.Errorf("prepare: want --vocab FILE or --vocab-size N (tokenized text), or --bpe-merges N / --bpe FILE (raw text)")
	}
	if c.IsSet("vocab") && c.IsSet("vocab-size") {
		return in, fmt.Errorf("prepare: --vocab and --vocab-size exclude each other")
	}
	if c.IsSet("vocab-size") && c.Int("vocab-size") < 5 {
		return in, fmt.Errorf("prepare: --vocab-size %d: want at least 5 (4 specials and a piece)", c.Int("vocab-size"))
	}
	var err error
	if c.IsSet("vocab") {
		if in.v, err = data.LoadVocab(c.String("vocab")); err != nil {
			return in, err
		}
		in.vocabOf = "`" + c.String("vocab") + "`"
		return in, nil
	}
	what := "pieces"
	if c.IsSet("bpe-merges") || c.IsSet("bpe") {
		var b *data.BPE
		if c.IsSet("bpe") {
			if b, err = data.LoadBPE(c.String("bpe")); err != nil {
				return in, err
			}
			fmt.Fprintf(rep, "BPE: %d merges from `%s`.\n\n", b.NumMerges(), c.String("bpe"))
		} else {
			m := c.Int("bpe-merges")
			if m < 1 {
				return in, fmt.Errorf("prepare: --bpe-merges %d: want at least 1", m)
			}
			tl := time.Now()
			counts, err := data.CountPieces(strings.Fields, in.trainSrc, in.trainTgt)
			if err != nil {
				return in, err
			}
			b = data.LearnBPECounts(counts, m)
			fmt.Fprintf(rep, "BPE: learned %d merges (asked for %d) jointly on both sides from %d distinct words in %.1f s.\n\n", b.NumMerges(), m, len(counts), time.Since(tl).Seconds())
		}
		if err := b.WriteFile(filepath.Join(out, prepBPEFile)); err != nil {
			return in, fmt.Errorf("prepare: %v", err)
		}
		in.split, what = b.Apply, "BPE pieces"
	}
	counts, err := data.CountPieces(in.split, in.trainSrc, in.trainTgt)
	if err != nil {
		return in, err
	}
	in.v = data.BuildVocab(counts, c.Int("vocab-size"))
	in.vocabOf = fmt.Sprintf("the %d most frequent of %d %s of the training data", in.v.Size()-4, len(counts), what)
	return in, nil
}

// prepCorpora streams the training pairs into train.bin and writes
// valid.bin: the validation files' pairs, or (without them) the last
// --valid-lines kept training pairs, held back in a ring. It adds the
// statistics to the report and returns the pairs written to each.
func prepCorpora(c *cli.Context, out string, in prepInput, maxLen int, rep *bytes.Buffer) (nTrain, nValid int, err error) {
	v := in.v
	tw, err := data.NewCorpusWriter(filepath.Join(out, prepTrainFile), v.Hash(), v.Size())
	if err != nil {
		return 0, 0, err
	}
	hold := 0
	if in.validSrc == "" {
		if hold = c.Int("valid-lines"); hold < 1 {
			tw.Abort()
			return 0, 0, fmt.Errorf("prepare: --valid-lines %d: want at least 1 (or give --valid-src/--valid-tgt)", hold)
		}
	}
	ring := make([][2][]int32, 0, hold)
	next := 0
	st, err := data.ReadParallelEach(in.trainSrc, in.trainTgt, in.split, v, maxLen, func(s, t []int32) error {
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
		return 0, 0, err
	}
	var vsrc, vtgt [][]int32
	var vst data.Stats
	if in.validSrc != "" {
		// validation pairs are all kept (the trainer decides what to score)
		if vsrc, vtgt, vst, err = data.ReadParallelFunc(in.validSrc, in.validTgt, in.split, v, 0); err != nil {
			tw.Abort()
			return 0, 0, err
		}
	} else {
		if tw.Len() < hold {
			tw.Abort()
			return 0, 0, fmt.Errorf("prepare: %s has %d usable pairs, too few to hold out --valid-lines %d and train on the rest: give --valid-src/--valid-tgt or a smaller --valid-lines", in.trainSrc, tw.Len()+len(ring), hold)
		}
		for i := range ring {
			p := ring[(next+i)%len(ring)]
			vsrc, vtgt = append(vsrc, p[0]), append(vtgt, p[1])
		}
		fmt.Fprintf(rep, "Validation: the last %d kept training pairs, held out (no --valid-src/--valid-tgt).\n\n", len(ring))
	}
	nTrain = tw.Len()
	if nTrain == 0 {
		tw.Abort()
		return 0, 0, fmt.Errorf("prepare: no pair of %s / %s is kept (%s)", in.trainSrc, in.trainTgt, st.String())
	}
	if err := tw.Close(st.Dropped()); err != nil {
		return 0, 0, err
	}
	if err := data.WriteCorpus(filepath.Join(out, prepValidFile), vsrc, vtgt, v.Hash(), v.Size(), vst.Dropped()); err != nil {
		return 0, 0, err
	}
	st.Markdown(rep, "Training data")
	if in.validSrc != "" {
		vst.Markdown(rep, "Validation data")
	}
	return nTrain, len(vsrc), nil
}
