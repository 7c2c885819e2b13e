package train

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gorun/gorun/data"
	"github.com/gorun/gorun/metrics"
	"github.com/gorun/gorun/report"
	"github.com/gorun/gorun/transformer"
)

// Files of a prepared data directory (`nmt-train prepare --out DIR`).
const (
	TrainFile = "train.bin"
	ValidFile = "valid.bin"
	VocabFile = "vocab.txt"
	BPEFile   = "bpe.codes"
)

// source hands out this rank's batches of each step (the micro-batches of
// one backward pass each).
type source interface {
	Next() ([]*transformer.Batch, error)
	// Position is the data position to store in a checkpoint: a global
	// position, the same on every rank and for any number of ranks.
	Position() json.RawMessage
	Restore(json.RawMessage) error
	Epoch() int
	// GlobalBatch is the batches per step, over all ranks, and the
	// position, whose Tokens or Rows say their size: the run's, kept
	// across resumes.
	GlobalBatch() (batches int, size data.Position)
}

// corpus is what the trainer needs from the data side.
type corpus struct {
	Name      string
	VocabSize int
	VocabHash string
	Vocab     *data.Vocab // written into the run directory for `translate`
	Extra     []string
	Decode    func(ids []int32) string   // detokenized text
	Pieces    func(ids []int32) []string // vocabulary pieces
	Train     source
	Valid     [][2][]int32 // source ids, target ids ending with EOS
	ValidRefs []string     // detokenized references
	Stats     metrics.Dataset
	Close     func()
	text      *Cached // the cache entry of a corpus of text files (Options.Text)
}

func loadCorpus(ctx context.Context, o Options, r, n int) (*corpus, error) {
	var (
		v          *data.Vocab
		train      data.Source
		valid      data.Source
		c          = &corpus{}
		closers    []func() error
		err        error
		validRefsF func(i int) string
	)
	// Text files (an OpenSeq2Seq config's): their entry in the corpus
	// cache, prepared now if need be, read as --data.
	var text *Cached
	if o.Text != nil {
		if text, err = o.Text.Open(ctx); err != nil {
			return nil, err
		}
		o.Data = text.Dir
	}
	if o.Data == "" {
		v = data.SyntheticVocab()
		src, tgt := data.Synthetic(data.SyntheticTrainSeed, o.SyntheticLines)
		p := &data.Pairs{Src: data.EncodeLines(src, data.WordPieces, v), Tgt: data.EncodeLines(tgt, data.WordPieces, v)}
		vs, vt := data.Synthetic(data.SyntheticValidSeed, data.SyntheticValidLines)
		valid = &data.Pairs{Src: data.EncodeLines(vs, data.WordPieces, v), Tgt: data.EncodeLines(vt, data.WordPieces, v)}
		train = p
		c.Name = fmt.Sprintf("built-in synthetic corpus (%s pairs)", report.Commas(int64(o.SyntheticLines)))
		var bytes, st, tt int64
		for i := range src {
			bytes += int64(len(src[i]) + len(tgt[i]) + 2)
			st += int64(len(p.Src[i]))
			tt += int64(len(p.Tgt[i]))
		}
		c.Stats = metrics.Dataset{Name: c.Name, MB: float64(bytes) / 1e6, InMemory: true, Lines: int64(len(src)), SrcTokens: st, TgtTokens: tt}
		validRefsF = func(i int) string { return vt[i] }
	} else {
		if fi, err := os.Stat(o.Data); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("--data %s: not a directory (make one with `nmt-train prepare --out %s ...`)", o.Data, o.Data)
		}
		vf := filepath.Join(o.Data, VocabFile)
		if _, err := os.Stat(vf); err != nil {
			return nil, fmt.Errorf("--data %s is not a prepared corpus (no %s, %s, %s): make one with `nmt-train prepare --out %s ...`", o.Data, VocabFile, TrainFile, ValidFile, o.Data)
		}
		if v, err = data.LoadVocab(vf); err != nil {
			return nil, err
		}
		tc, err := data.OpenCorpus(filepath.Join(o.Data, TrainFile))
		if err != nil {
			return nil, err
		}
		closers = append(closers, tc.Close)
		if err := tc.CheckVocab(v); err != nil {
			return nil, err
		}
		vc, err := data.OpenCorpus(filepath.Join(o.Data, ValidFile))
		if err != nil {
			tc.Close()
			return nil, err
		}
		closers = append(closers, vc.Close)
		if err := vc.CheckVocab(v); err != nil {
			return nil, err
		}
		train, valid = tc, vc
		if _, err := os.Stat(filepath.Join(o.Data, BPEFile)); err == nil {
			c.Extra = append(c.Extra, filepath.Join(o.Data, BPEFile))
		}
		s, t := tc.Tokens()
		c.Name = fmt.Sprintf("%s (%s pairs)", o.Data, report.Commas(int64(tc.Len())))
		c.Stats = metrics.Dataset{Name: o.Data, MB: float64(tc.Bytes()) / 1e6, Lines: int64(tc.Len()), SrcTokens: s, TgtTokens: t, Dropped: tc.Dropped()}
		validRefsF = func(i int) string {
			_, tgt := vc.Pair(i)
			return data.Detokenize(v.Decode(tgt))
		}
	}
	c.Close = func() {
		for _, f := range closers {
			f()
		}
	}
	fail := func(err error) (*corpus, error) {
		c.Close()
		return nil, err
	}
	c.Vocab, c.VocabSize, c.VocabHash = v, v.Size(), v.Hash()
	c.Decode = func(ids []int32) string { return data.Detokenize(v.Decode(ids)) }
	c.Pieces = func(ids []int32) []string { return v.Decode(ids) }
	evalMax := o.MaxLength
	if o.EvalMaxLength > 0 {
		evalMax = o.EvalMaxLength
	}
	for i := 0; i < valid.Len(); i++ {
		s, t := valid.Pair(i)
		if len(s)+1 > evalMax || len(t)+1 > evalMax { // EOS counts, as in prepare
			continue // as the lab: evaluate on what the model was trained for
		}
		c.Valid = append(c.Valid, [2][]int32{append(append([]int32{}, s...), data.EOS), append(append([]int32{}, t...), data.EOS)})
		c.ValidRefs = append(c.ValidRefs, validRefsF(i))
	}
	// One seeded order of batches of --batch-tokens, of which each step
	// takes --backward-passes-per-step x ranks: the order, and so a
	// checkpoint's position, does not depend on the number of ranks.
	bs := &batchSource{rank: r, size: n, passes: o.PassesPerStep, perStep: o.PassesPerStep * n}
	cfg := data.BatchConfig{TokensPerBatch: o.BatchTokens, Rows: o.BatchPairs, MaxLen: o.MaxLength, Seed: int64(o.Seed), VocabSize: v.Size()}
	if bs.b, err = data.NewBatcher(train, cfg); err != nil {
		return fail(fmt.Errorf("%s: %w", c.Name, err))
	}
	if bs.b.StepsPerEpoch() == 0 {
		return fail(fmt.Errorf("%s: no sentence pair fits --max-length %d", c.Name, o.MaxLength))
	}
	c.Stats.Dropped += int64(bs.b.Skipped())
	if text != nil {
		text.attach(c, bs.b, train)
	}
	c.Train = bs
	return c, nil
}

// batchSource adapts a data.Batcher to the trainer. An optimizer step
// takes the next perStep batches of the one order (the global batch);
// rank r of size takes batches r, r+size, r+2*size, ... of them, one
// micro-batch each, whose gradients the trainer accumulates. A fresh run
// has perStep = --backward-passes-per-step x ranks, so a rank takes one
// batch per pass; a run resumed on another number of ranks keeps the
// checkpoint's perStep: on fewer ranks each takes more batches, on more
// ranks than batches the ranks that have the same batch split it by rows.
type batchSource struct {
	b          *data.Batcher
	rank, size int
	passes     int // --backward-passes-per-step
	perStep    int
}

// share says whether this rank takes batch u of a step, and which share
// of its rows: part of of (of 1: the whole batch).
func (s *batchSource) share(u int) (take bool, part, of int) {
	if s.size <= s.perStep {
		return u%s.size == s.rank, 0, 1
	}
	if u != s.rank%s.perStep {
		return false, 0, 0
	}
	return true, s.rank / s.perStep, (s.size - u + s.perStep - 1) / s.perStep
}

// Next returns this rank's micro-batches of the next step (one or more;
// one may have B == 0, a share with no rows: the trainer contributes a
// zero gradient).
func (s *batchSource) Next() ([]*transformer.Batch, error) {
	var out []*transformer.Batch
	for u := 0; u < s.perStep; u++ {
		take, part, of := s.share(u)
		if !take {
			s.b.Skip()
			continue
		}
		b, err := s.b.Next()
		if err != nil {
			return nil, err
		}
		b = b.Share(part, of)
		out = append(out, &transformer.Batch{B: b.B, S: b.S, T: b.T, Src: b.Src, Tgt: b.Tgt})
	}
	return out, nil
}

// position is the data position in a checkpoint: the Batcher's and the
// batches per step.
type position struct {
	data.Position
	PerStep int `json:"batches_per_step"`
}

func (s *batchSource) Position() json.RawMessage {
	j, _ := json.Marshal(position{s.b.Pos(), s.perStep})
	return j
}

// Restore continues the checkpoint's order with its global batch: its
// batch budget (the Batcher plans again if --batch-tokens differs) and
// its batches per step.
func (s *batchSource) Restore(j json.RawMessage) error {
	var p position
	if err := json.Unmarshal(j, &p); err != nil {
		return fmt.Errorf("data position %s: %w", j, err)
	}
	if err := s.b.Restore(j); err != nil {
		return err
	}
	s.perStep = p.PerStep
	if s.perStep == 0 {
		// written before the order was global, by one rank (a position
		// of several is refused above): a batch per pass
		s.perStep = s.passes
	}
	return nil
}

func (s *batchSource) Epoch() int { return s.b.Epoch() }

func (s *batchSource) GlobalBatch() (batches int, size data.Position) { return s.perStep, s.b.Pos() }

// shareNote says how size ranks take a step of batches batches.
func shareNote(batches, size int) string {
	switch {
	case batches == size:
		return "every rank takes one"
	case batches > size && batches%size == 0:
		return fmt.Sprintf("every rank takes %d, accumulating their gradients", batches/size)
	case batches > size:
		return fmt.Sprintf("every rank takes %d or %d, accumulating their gradients", batches/size, batches/size+1)
	case size%batches == 0:
		return fmt.Sprintf("%d ranks split each by rows", size/batches)
	default:
		return fmt.Sprintf("%d or %d ranks split each by rows", size/batches, size/batches+1)
	}
}
