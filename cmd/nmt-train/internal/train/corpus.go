package train

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gorun/gorun/data"
	"github.com/gorun/gorun/metrics"
	"github.com/gorun/gorun/transformer"
)

// Files of a prepared data directory (`nmt-train prepare --out DIR`).
const (
	TrainFile = "train.bin"
	ValidFile = "valid.bin"
	VocabFile = "vocab.txt"
	BPEFile   = "bpe.codes"
)

func loadCorpus(o Options, r, n int) (*corpus, error) {
	var (
		v          *data.Vocab
		train      data.Source
		valid      data.Source
		c          = &corpus{}
		closers    []func() error
		err        error
		validRefsF func(i int) string
	)
	if o.Data == "" {
		v = data.SyntheticVocab()
		src, tgt := data.Synthetic(data.SyntheticTrainSeed, o.SyntheticLines)
		p := &data.Pairs{Src: data.EncodeLines(src, data.WordPieces, v), Tgt: data.EncodeLines(tgt, data.WordPieces, v)}
		vs, vt := data.Synthetic(data.SyntheticValidSeed, data.SyntheticValidLines)
		valid = &data.Pairs{Src: data.EncodeLines(vs, data.WordPieces, v), Tgt: data.EncodeLines(vt, data.WordPieces, v)}
		train = p
		c.Name = fmt.Sprintf("built-in synthetic corpus (%s pairs)", metrics.Commas(int64(o.SyntheticLines)))
		var bytes, st, tt int64
		for i := range src {
			bytes += int64(len(src[i]) + len(tgt[i]) + 2)
			st += int64(len(p.Src[i]))
			tt += int64(len(p.Tgt[i]))
		}
		c.Stats = metrics.Dataset{Name: c.Name, MB: float64(bytes) / 1e6, Lines: int64(len(src)), SrcTokens: st, TgtTokens: tt}
		validRefsF = func(i int) string { return vt[i] }
	} else {
		if fi, err := os.Stat(o.Data); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("--data %s: not a directory (make one with `nmt-train prepare --out %s ...`)", o.Data, o.Data)
		}
		vf := filepath.Join(o.Data, VocabFile)
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
		c.Name = fmt.Sprintf("%s (%s pairs)", o.Data, metrics.Commas(int64(tc.Len())))
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
	for i := 0; i < valid.Len(); i++ {
		s, t := valid.Pair(i)
		if len(s)+1 > o.MaxLength || len(t)+1 > o.MaxLength { // EOS counts, as in prepare
			continue // as the lab: evaluate on what the model was trained for
		}
		c.Valid = append(c.Valid, [2][]int32{append(append([]int32{}, s...), data.EOS), append(append([]int32{}, t...), data.EOS)})
		c.ValidRefs = append(c.ValidRefs, validRefsF(i))
	}
	bs := &batchSource{rank: r, size: n}
	cfg := data.BatchConfig{TokensPerBatch: o.BatchTokens, MaxLen: o.MaxLength, Seed: int64(o.Seed), Rank: r, Size: n, VocabSize: v.Size()}
	if o.BatchSplit {
		cfg.TokensPerBatch, cfg.Rank, cfg.Size = o.BatchTokens*n, 0, 1
		bs.split = true
	}
	if bs.b, err = data.NewBatcher(train, cfg); err != nil {
		return fail(fmt.Errorf("%s: %v", c.Name, err))
	}
	if bs.b.StepsPerEpoch() == 0 {
		return fail(fmt.Errorf("%s: no sentence pair fits --max-length %d", c.Name, o.MaxLength))
	}
	c.Stats.Dropped += int64(bs.b.Skipped())
	c.Train = bs
	return c, nil
}

// batchSource adapts a data.Batcher to the trainer; with split, every rank
// builds the same global batch and keeps rows rank, rank+size, ...
type batchSource struct {
	b          *data.Batcher
	split      bool
	rank, size int
}

func (s *batchSource) Next() (*transformer.Batch, error) {
	b, err := s.b.Next()
	if err != nil {
		return nil, err
	}
	if !s.split || s.size == 1 {
		return &transformer.Batch{B: b.B, S: b.S, T: b.T, Src: b.Src, Tgt: b.Tgt}, nil
	}
	out := &transformer.Batch{S: b.S, T: b.T}
	for i := s.rank; i < b.B; i += s.size {
		out.B++
		out.Src = append(out.Src, b.Src[i*b.S:(i+1)*b.S]...)
		out.Tgt = append(out.Tgt, b.Tgt[i*b.T:(i+1)*b.T]...)
	}
	return out, nil // may have B == 0: the trainer contributes a zero gradient
}

func (s *batchSource) Position() json.RawMessage       { return s.b.Position() }
func (s *batchSource) Restore(j json.RawMessage) error { return s.b.Restore(j) }
func (s *batchSource) Epoch() int                      { return s.b.Epoch() }
