package data

import (
	"encoding/json"
	"errors"
)

var errTODO = errors.New("data: not implemented yet")

// BPE is a learned list of merges.
type BPE struct{}

// LearnBPE learns merges joint over lines.
func LearnBPE(lines []string, merges int) *BPE { return &BPE{} }

// LoadBPE reads a merges file.
func LoadBPE(path string) (*BPE, error) { return nil, errTODO }

// WriteFile writes the merges.
func (b *BPE) WriteFile(path string) error { return errTODO }

// Apply splits a raw line into pieces.
func (b *BPE) Apply(line string) []string { return nil }

// Detokenize joins pieces.
func Detokenize(pieces []string) string { return "" }

// Corpus is a memory-mapped binary corpus.
type Corpus struct{}

// WriteCorpus writes a binary corpus.
func WriteCorpus(path string, src, tgt [][]int32, vocabHash string, vocabSize int, dropped int64) error {
	return errTODO
}

// OpenCorpus maps a binary corpus.
func OpenCorpus(path string) (*Corpus, error)   { return nil, errTODO }
func (c *Corpus) Len() int                      { return 0 }
func (c *Corpus) Pair(i int) (src, tgt []int32) { return nil, nil }
func (c *Corpus) Lens(i int) (int, int)         { return 0, 0 }
func (c *Corpus) VocabHash() string             { return "" }
func (c *Corpus) CheckVocab(v *Vocab) error     { return errTODO }
func (c *Corpus) Close() error                  { return nil }

// Stats describes a corpus as read.
type Stats struct{}

func (s *Stats) String() string { return "" }

// ReadParallel reads tokenized parallel files.
func ReadParallel(srcPath, tgtPath string, split func(string) []string, v *Vocab, maxLen int) (src, tgt [][]int32, st Stats, err error) {
	return nil, nil, st, errTODO
}

// Batch is a padded batch.
type Batch struct {
	B, S, T  int
	Src, Tgt []int32
}

// BatchConfig configures a Batcher.
type BatchConfig struct {
	TokensPerBatch, MaxLen int
	Seed                   int64
	Rank, Size             int
}

// Batcher yields batches.
type Batcher struct{}

func NewBatcher(s Source, cfg BatchConfig) (*Batcher, error) { return nil, errTODO }
func (b *Batcher) Next() (*Batch, error)                     { return nil, errTODO }
func (b *Batcher) Epoch() int                                { return 0 }
func (b *Batcher) StepsPerEpoch() int                        { return 0 }
func (b *Batcher) Position() json.RawMessage                 { return nil }
func (b *Batcher) Restore(p json.RawMessage) error           { return errTODO }

// Synthetic generates the built-in corpus.
func Synthetic(seed int64, n int) (src, tgt []string) { return nil, nil }

// BLEUResult is a corpus BLEU score.
type BLEUResult struct {
	Score          float64
	Counts, Totals [4]int
	Precisions     [4]float64
	BP, Ratio      float64
	SysLen, RefLen int
}

func CorpusBLEU(hyps []string, refs ...[]string) BLEUResult { return BLEUResult{} }
func (r BLEUResult) Signature() string                      { return "" }
func TokenizedBLEU(hyps, refs [][]string) float64           { return 0 }
