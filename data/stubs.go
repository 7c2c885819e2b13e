package data

import (
	"encoding/json"
	"errors"
)

var errTODO = errors.New("data: not implemented yet")

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
