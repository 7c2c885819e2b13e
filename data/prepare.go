package data

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gorun/gorun/internal/atomicfile"
)

// Files Prepare writes into its output directory (the trainer's --data DIR
// reads the first three).
const (
	TrainFile  = "train.bin"
	ValidFile  = "valid.bin"
	VocabFile  = "vocab.txt"
	BPEFile    = "bpe.codes"  // raw text only: the merges learned or applied
	ReportFile = "prepare.md" // the statistics, written last
)

// PrepareConfig says what Prepare reads and how; each field is one of
// `nmt-train prepare`'s flags, named in Prepare's errors. The text is read
// one of four ways:
//
//   - tokenized text (pieces separated by spaces, the lab's
//     *.BPE_common.32K.tok files) with a given vocabulary: Vocab;
//   - tokenized text, the vocabulary built from it: VocabSize alone;
//   - raw text, a joint BPE learned on both sides: BPEMerges (VocabSize
//     optional: 0 keeps every piece seen);
//   - raw text, a merges file applied: BPE (VocabSize as above);
//
// or, with Synthetic, the built-in synthetic corpus is written instead.
type PrepareConfig struct {
	Out string // the output directory, created (--out)

	Src, Tgt           string // training pairs, line-aligned (--src, --tgt)
	ValidSrc, ValidTgt string // validation pairs ("": hold out ValidLines training pairs)
	// ValidLines: without ValidSrc, the last ValidLines kept training
	// pairs are held out as valid.bin (at most half of the kept pairs);
	// 0: valid.bin holds no pair (the CLI refuses 0; the trainer's text
	// cache uses it when a config names no evaluation files).
	ValidLines int

	Vocab     string // SentencePiece vocabulary file (--vocab)
	VocabSize int    // build a vocabulary of at most this many pieces, specials included (--vocab-size; 0: all seen)
	BPEMerges int    // raw text: learn a joint BPE of at most this many merges (--bpe-merges)
	BPE       string // raw text: apply this merges file (--bpe)

	// MaxLen drops training pairs with a side longer than MaxLen tokens,
	// the EOS included (0: no limit). Validation files are not filtered;
	// held-out pairs are kept training pairs, so they are.
	MaxLen int

	// MaxWordBytes: raw text (BPEMerges, BPE): a word (a run without
	// white space) longer than this many bytes, in any of the four files,
	// is refused naming file:line (0: DefaultMaxWordBytes; negative: no
	// limit) (--max-word-bytes).
	MaxWordBytes int

	Synthetic      bool // write the built-in synthetic corpus (--synthetic)
	SyntheticLines int  // its training pairs (--synthetic-lines)

	// Command is the report's second line: what prepared the data ("":
	// none).
	Command string
}

// Prepared is what Prepare wrote.
type Prepared struct {
	Dir          string
	Vocab        *Vocab
	Train, Valid int   // pairs in train.bin and valid.bin
	TrainStats   Stats // the training files as read (held-out pairs included)
	ValidStats   Stats // the validation files as read (zero without ValidSrc)
	Report       []byte
	Took         time.Duration
}

// prepStagePattern names Prepare's staging directories inside Out.
const prepStagePattern = ".prepare.tmp*"

// Prepare turns parallel text into cfg.Out/{train.bin, valid.bin,
// vocab.txt, prepare.md} (+ bpe.codes for raw text): the text split into
// pieces, the pieces into ids, pairs with an empty side or (training pairs)
// longer than MaxLen dropped and counted, the statistics in prepare.md.
//
// Everything is written into a staging directory inside Out and moved into
// Out only when all of it is written: a Prepare that fails (or is killed)
// leaves the files of an earlier one in Out as they were, all of one run,
// and nothing of its own but, when killed, the staging directory, which
// the next Prepare into Out removes. Errors name the file (and line).
//
// Prepare stops soon after ctx is cancelled (it looks between lines, and
// between merges while learning a BPE), with an error wrapping
// ErrInterrupted and nothing of its own left in Out: the staging directory
// is removed and nothing is published (TestPrepareInterrupted).
func Prepare(ctx context.Context, cfg PrepareConfig) (*Prepared, error) {
	p, err := prepare(ctx, cfg)
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("prepare: %w: nothing written to %s", ErrInterrupted, cfg.Out)
	}
	return p, err
}

// ErrInterrupted is (wrapped in) Prepare's error when its context was
// cancelled.
var ErrInterrupted = errors.New("interrupted")

func prepare(ctx context.Context, cfg PrepareConfig) (*Prepared, error) {
	t0 := time.Now()
	if err := cfg.check(); err != nil {
		return nil, err
	}
	out := cfg.Out
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, fmt.Errorf("prepare: --out: %w", err)
	}
	stage, err := prepStage(out)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(stage)
	var rep bytes.Buffer
	fmt.Fprintf(&rep, "# nmt-train prepare\n\n")
	if cfg.Command != "" {
		fmt.Fprintf(&rep, "`%s`\n\n", cfg.Command)
	}
	var in prepInput
	if cfg.Synthetic {
		in, err = prepSynthetic(cfg, stage)
	} else {
		in, err = prepVocab(ctx, cfg, stage, &rep)
	}
	if err != nil {
		return nil, err
	}
	if err := in.v.WriteFile(filepath.Join(stage, VocabFile)); err != nil {
		return nil, fmt.Errorf("prepare: %w", err)
	}
	fmt.Fprintf(&rep, "Vocabulary: %d pieces (4 specials + %s), hash `%.16s`.\n\n", in.v.Size(), in.vocabOf, in.v.Hash())
	p, err := prepCorpora(ctx, cfg, stage, in, &rep)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(&rep, "## Output\n\n| file | size | pairs |\n|---|---:|---:|\n")
	for _, f := range []struct {
		name  string
		pairs int
	}{{TrainFile, p.Train}, {ValidFile, p.Valid}, {VocabFile, in.v.Size()}, {BPEFile, -1}} {
		fi, err := os.Stat(filepath.Join(stage, f.name))
		if err != nil {
			continue
		}
		pairs := fmt.Sprint(f.pairs)
		if f.name == VocabFile {
			pairs = fmt.Sprintf("%d pieces", f.pairs)
		} else if f.pairs < 0 {
			pairs = ""
		}
		fmt.Fprintf(&rep, "| `%s` | %.2f MB | %s |\n", f.name, float64(fi.Size())/1e6, pairs)
	}
	fmt.Fprintf(&rep, "\nPrepared in %.1f s.\n", time.Since(t0).Seconds())
	if err := os.WriteFile(filepath.Join(stage, ReportFile), rep.Bytes(), 0o644); err != nil {
		return nil, fmt.Errorf("prepare: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := prepPublish(stage, out); err != nil {
		return nil, fmt.Errorf("prepare: %w", err)
	}
	p.Dir, p.Vocab, p.Report, p.Took = out, in.v, rep.Bytes(), time.Since(t0)
	return p, nil
}

// check refuses configurations Prepare cannot carry out, before anything
// is read or written.
func (cfg *PrepareConfig) check() error {
	if cfg.Out == "" {
		return fmt.Errorf("prepare: want --out DIR")
	}
	if cfg.MaxLen < 0 || cfg.MaxLen == 1 {
		return fmt.Errorf("prepare: --max-length %d: want 0 (no limit) or at least 2", cfg.MaxLen)
	}
	if cfg.Synthetic {
		for _, f := range []struct {
			name string
			set  bool
		}{{"src", cfg.Src != ""}, {"tgt", cfg.Tgt != ""}, {"valid-src", cfg.ValidSrc != ""}, {"valid-tgt", cfg.ValidTgt != ""},
			{"vocab", cfg.Vocab != ""}, {"vocab-size", cfg.VocabSize != 0}, {"bpe-merges", cfg.BPEMerges != 0}, {"bpe", cfg.BPE != ""}} {
			if f.set {
				return fmt.Errorf("prepare: --synthetic makes its own data; --%s does not apply", f.name)
			}
		}
		if cfg.SyntheticLines < 1 {
			return fmt.Errorf("prepare: --synthetic-lines %d: want at least 1", cfg.SyntheticLines)
		}
		return nil
	}
	if cfg.Src == "" || cfg.Tgt == "" {
		return fmt.Errorf("prepare: want --src and --tgt (or --synthetic)")
	}
	if (cfg.ValidSrc == "") != (cfg.ValidTgt == "") {
		return fmt.Errorf("prepare: --valid-src and --valid-tgt go together")
	}
	modes := 0
	for _, set := range []bool{cfg.Vocab != "", cfg.BPEMerges != 0, cfg.BPE != ""} {
		if set {
			modes++
		}
	}
	if modes > 1 {
		return fmt.Errorf("prepare: --vocab, --bpe-merges and --bpe exclude each other")
	}
	if modes == 0 && cfg.VocabSize == 0 {
		return fmt.Errorf("prepare: want --vocab FILE or --vocab-size N (tokenized text), or --bpe-merges N / --bpe FILE (raw text)")
	}
	if cfg.Vocab != "" && cfg.VocabSize != 0 {
		return fmt.Errorf("prepare: --vocab and --vocab-size exclude each other")
	}
	if cfg.VocabSize != 0 && cfg.VocabSize < 5 {
		return fmt.Errorf("prepare: --vocab-size %d: want at least 5 (4 specials and a piece)", cfg.VocabSize)
	}
	if cfg.BPEMerges < 0 {
		return fmt.Errorf("prepare: --bpe-merges %d: want at least 1", cfg.BPEMerges)
	}
	if cfg.ValidSrc == "" && cfg.ValidLines < 0 {
		return fmt.Errorf("prepare: --valid-lines %d: want at least 1 (or give --valid-src/--valid-tgt)", cfg.ValidLines)
	}
	return nil
}

// prepStage makes a new staging directory in out, after removing those a
// killed Prepare left there.
func prepStage(out string) (string, error) {
	old, _ := filepath.Glob(filepath.Join(out, prepStagePattern))
	for _, d := range old {
		os.RemoveAll(d)
	}
	stage, err := atomicfile.MkdirTemp(out, prepStagePattern)
	if err != nil {
		return "", fmt.Errorf("prepare: --out: %w", err)
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
		if e.Name() != ReportFile {
			names = append(names, e.Name())
		}
	}
	for _, n := range append(names, ReportFile) {
		if err := os.Rename(filepath.Join(stage, n), filepath.Join(out, n)); err != nil {
			return err
		}
	}
	if _, err := os.Stat(filepath.Join(out, BPEFile)); err == nil && !slices.Contains(names, BPEFile) {
		if err := os.Remove(filepath.Join(out, BPEFile)); err != nil {
			return err
		}
	}
	return atomicfile.SyncDir(out)
}

// prepInput is what Prepare reads and with which vocabulary: the text
// files, how a line splits into pieces, and where the vocabulary came
// from (for the report).
type prepInput struct {
	trainSrc, trainTgt string
	validSrc, validTgt string // empty: hold out the last ValidLines pairs
	v                  *Vocab
	split              func(string) []string
	check              func(line string) error // nil, or a BPE's word limit
	vocabOf            string
}

// prepSynthetic writes the built-in synthetic corpus's text to out and
// returns it with the synthetic vocabulary.
func prepSynthetic(cfg PrepareConfig, out string) (prepInput, error) {
	n := cfg.SyntheticLines
	// The text goes to the output too, so that the corpus can be read.
	s, t := Synthetic(SyntheticTrainSeed, n)
	vs, vt := Synthetic(SyntheticValidSeed, SyntheticValidLines)
	in := prepInput{
		trainSrc: filepath.Join(out, "train.src.txt"), trainTgt: filepath.Join(out, "train.tgt.txt"),
		validSrc: filepath.Join(out, "valid.src.txt"), validTgt: filepath.Join(out, "valid.tgt.txt"),
		v: SyntheticVocab(), split: WordPieces,
		vocabOf: fmt.Sprintf("the synthetic languages' words (%d training pairs from seed %d, %d validation pairs from seed %d)", n, SyntheticTrainSeed, SyntheticValidLines, SyntheticValidSeed),
	}
	for p, lines := range map[string][]string{in.trainSrc: s, in.trainTgt: t, in.validSrc: vs, in.validTgt: vt} {
		if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			return prepInput{}, fmt.Errorf("prepare: %w", err)
		}
	}
	return in, nil
}

// prepVocab returns the user's text with its vocabulary: given (Vocab), or
// built from the training data's pieces (VocabSize), after a BPE learned
// (BPEMerges, written to out) or given (BPE).
func prepVocab(ctx context.Context, cfg PrepareConfig, out string, rep *bytes.Buffer) (prepInput, error) {
	in := prepInput{trainSrc: cfg.Src, trainTgt: cfg.Tgt, validSrc: cfg.ValidSrc, validTgt: cfg.ValidTgt, split: SplitPieces}
	var err error
	if cfg.Vocab != "" {
		if in.v, err = LoadVocab(cfg.Vocab); err != nil {
			return in, err
		}
		in.vocabOf = "`" + cfg.Vocab + "`"
		return in, nil
	}
	what := "pieces"
	if cfg.BPEMerges != 0 || cfg.BPE != "" {
		var b *BPE
		in.check = wordLimit(cfg.MaxWordBytes)
		if cfg.BPE != "" {
			if b, err = LoadBPE(cfg.BPE); err != nil {
				return in, err
			}
			fmt.Fprintf(rep, "BPE: %d merges from `%s`.\n\n", b.NumMerges(), cfg.BPE)
		} else {
			m := cfg.BPEMerges
			tl := time.Now()
			counts, err := prepCount(ctx, strings.Fields, in.check, in.trainSrc, in.trainTgt)
			if err != nil {
				return in, err
			}
			if b = learnBPEUntil(counts, m, ctx.Done()); b == nil {
				return in, ctx.Err()
			}
			fmt.Fprintf(rep, "BPE: learned %d merges (asked for %d) jointly on both sides from %d distinct words in %.1f s.\n\n", b.NumMerges(), m, len(counts), time.Since(tl).Seconds())
		}
		if err := b.WriteFile(filepath.Join(out, BPEFile)); err != nil {
			return in, fmt.Errorf("prepare: %w", err)
		}
		in.split, what = b.Apply, "BPE pieces"
	}
	counts, err := prepCount(ctx, in.split, in.check, in.trainSrc, in.trainTgt)
	if err != nil {
		return in, err
	}
	in.v = BuildVocab(counts, cfg.VocabSize)
	in.vocabOf = fmt.Sprintf("the %d most frequent of %d %s of the training data", in.v.Size()-4, len(counts), what)
	return in, nil
}

// prepCorpora streams the training pairs into train.bin and writes
// valid.bin: the validation files' pairs, or (without them) the last
// ValidLines kept training pairs, held back in a ring. It adds the
// statistics to the report and returns the pairs written to each.
func prepCorpora(ctx context.Context, cfg PrepareConfig, out string, in prepInput, rep *bytes.Buffer) (*Prepared, error) {
	v := in.v
	p := &Prepared{}
	tw, err := NewCorpusWriter(filepath.Join(out, TrainFile), v.Hash(), v.Size())
	if err != nil {
		return nil, err
	}
	hold := 0
	if in.validSrc == "" {
		hold = cfg.ValidLines
	}
	ring := make([][2][]int32, 0, hold)
	next := 0
	ro := readOptions{ctx: ctx, check: in.check}
	st, err := readParallel(in.trainSrc, in.trainTgt, in.split, v, cfg.MaxLen, ro, func(s, t []int32) error {
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
		return nil, err
	}
	var vsrc, vtgt [][]int32
	var vst Stats
	switch {
	case in.validSrc != "":
		// validation pairs are all kept (the trainer decides what to score)
		vst, err = readParallel(in.validSrc, in.validTgt, in.split, v, 0, ro, func(s, t []int32) error {
			vsrc, vtgt = append(vsrc, s), append(vtgt, t)
			return nil
		})
		if err != nil {
			tw.Abort()
			return nil, err
		}
	case hold > 0:
		if tw.Len() < hold {
			tw.Abort()
			return nil, fmt.Errorf("prepare: %s has %d usable pairs, too few to hold out --valid-lines %d and train on the rest: give --valid-src/--valid-tgt or a smaller --valid-lines", in.trainSrc, tw.Len()+len(ring), hold)
		}
		for i := range ring {
			p := ring[(next+i)%len(ring)]
			vsrc, vtgt = append(vsrc, p[0]), append(vtgt, p[1])
		}
		fmt.Fprintf(rep, "Validation: the last %d kept training pairs, held out (no --valid-src/--valid-tgt).\n\n", len(ring))
	default:
		fmt.Fprintf(rep, "Validation: none (no validation files given).\n\n")
	}
	p.Train = tw.Len()
	if p.Train == 0 {
		tw.Abort()
		return nil, fmt.Errorf("prepare: no pair of %s / %s is kept (%s)", in.trainSrc, in.trainTgt, st.String())
	}
	if err := tw.Close(st.Dropped()); err != nil {
		return nil, err
	}
	if err := WriteCorpus(filepath.Join(out, ValidFile), vsrc, vtgt, v.Hash(), v.Size(), vst.Dropped()); err != nil {
		return nil, err
	}
	st.Markdown(rep, "Training data")
	if in.validSrc != "" {
		vst.Markdown(rep, "Validation data")
	}
	p.Valid, p.TrainStats, p.ValidStats = len(vsrc), st, vst
	return p, nil
}

// prepCount is CountPieces stopping when ctx is cancelled, and calling
// check (when set) on every line before split; errors name file:line.
func prepCount(ctx context.Context, split func(string) []string, check func(string) error, paths ...string) (map[string]int64, error) {
	counts := map[string]int64{}
	done := ctx.Done()
	for _, p := range paths {
		err := eachLine(p, func(_ int, line string) error {
			select {
			case <-done:
				return ctx.Err()
			default:
			}
			if check != nil {
				if err := check(line); err != nil {
					return err
				}
			}
			for _, w := range split(line) {
				counts[w]++
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return counts, nil
}

// wordLimit is the line check of PrepareConfig.MaxWordBytes: an error for
// a line with a word longer than the limit (nil: no limit).
func wordLimit(maxBytes int) func(string) error {
	if maxBytes == 0 {
		maxBytes = DefaultMaxWordBytes
	}
	if maxBytes < 0 {
		return nil
	}
	return func(line string) error {
		at, n := longWord(line, maxBytes)
		if n == 0 {
			return nil
		}
		w := line[at : at+n]
		head := fmt.Sprintf("%q", w)
		for i := range w {
			if i >= 20 {
				head = fmt.Sprintf("%q...", w[:i])
				break
			}
		}
		return fmt.Errorf("a word of %d bytes without white space at byte %d (%s) is longer than --max-word-bytes %d: not text? remove or split the line, or raise --max-word-bytes", n, at+1, head, maxBytes)
	}
}
