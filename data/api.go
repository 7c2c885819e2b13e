// Package data turns parallel text into what the trainer feeds a model:
// a SentencePiece-format vocabulary, a joint BPE (learn/apply), a compact
// memory-mapped binary corpus, length-bucketed token batches sharded over
// ranks with equal step counts, a built-in synthetic corpus, and
// sacreBLEU-compatible BLEU; Prepare is the whole pipeline from text files
// to a prepared directory (`nmt-train prepare`, the trainer's corpus cache).
//
// It knows nothing of the model: a Batch is plain padded int32 matrices in
// the layout transformer.Batch takes (B, S, T, Src, Tgt).
package data

// Special token ids, as in the lab's m_common.vocab (SentencePiece trained
// with --pad_id=0 --eos_id=1 --bos_id=2 --unk_id=3).
const (
	PAD int32 = 0
	EOS int32 = 1
	BOS int32 = 2
	UNK int32 = 3
)

// Special pieces, SentencePiece's default names for the ids above.
const (
	PadPiece = "<pad>"
	EOSPiece = "</s>"
	BOSPiece = "<s>"
	UNKPiece = "<unk>"
)

// WordBoundary is SentencePiece's word-boundary marker (U+2581), the first
// rune of every piece that starts a word.
const WordBoundary = "▁"

// Source is a random-access parallel corpus of token ids (without EOS):
// a *Corpus (memory-mapped file) or Pairs (in memory).
type Source interface {
	Len() int
	// Pair returns line i; the slices must not be modified.
	Pair(i int) (src, tgt []int32)
	// Lens returns the lengths of line i without reading its tokens.
	Lens(i int) (srcLen, tgtLen int)
}

// Pairs is an in-memory Source.
type Pairs struct {
	Src, Tgt [][]int32
}

// Len implements Source.
func (p *Pairs) Len() int { return len(p.Src) }

// Pair implements Source.
func (p *Pairs) Pair(i int) (src, tgt []int32) { return p.Src[i], p.Tgt[i] }

// Lens implements Source.
func (p *Pairs) Lens(i int) (int, int) { return len(p.Src[i]), len(p.Tgt[i]) }
