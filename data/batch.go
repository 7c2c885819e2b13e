package data

import (
	"encoding/json"
	"fmt"
	"math/bits"
	"math/rand/v2"
)

// Batch is one padded batch in the layout transformer.Batch takes: Src is
// [B][S] and Tgt is [B][T] row-major, every sentence followed by EOS and
// right-padded with PAD.
type Batch struct {
	B, S, T  int
	Src, Tgt []int32
	// Lines are the corpus line numbers (0-based) of the rows.
	Lines []int
	// SrcTokens and TgtTokens count the non-pad ids (EOS included).
	SrcTokens, TgtTokens int
}

// Padded is the batch's size against the token budget: B * max(S, T), the
// padded length of the longer side times the rows (as tensor2tensor and
// fairseq count max tokens).
func (b *Batch) Padded() int { return b.B * max(b.S, b.T) }

// Share is rank's part of b when size ranks split it by rows: rows rank,
// rank+size, rank+2*size, ..., padded to b's S and T (no rows when rank >=
// b.B). Every row of b is in exactly one rank's part; with size 1 the part
// is b itself.
func (b *Batch) Share(rank, size int) *Batch {
	if size <= 1 {
		return b
	}
	part := &Batch{S: b.S, T: b.T}
	for i := rank; i < b.B; i += size {
		src, tgt := b.Src[i*b.S:(i+1)*b.S], b.Tgt[i*b.T:(i+1)*b.T]
		part.B++
		part.Src = append(part.Src, src...)
		part.Tgt = append(part.Tgt, tgt...)
		part.Lines = append(part.Lines, b.Lines[i])
		part.SrcTokens += nonPad(src)
		part.TgtTokens += nonPad(tgt)
	}
	return part
}

func nonPad(ids []int32) int {
	n := 0
	for _, id := range ids {
		if id != PAD {
			n++
		}
	}
	return n
}

// BatchConfig configures a Batcher.
type BatchConfig struct {
	// TokensPerBatch bounds Padded() of every batch (when Rows is 0).
	TokensPerBatch int
	// Rows, when > 0, makes every batch hold Rows sentence pairs (the last
	// of a length bucket fewer), whatever their length: OpenSeq2Seq's
	// batch_size_per_gpu. TokensPerBatch is then not used.
	Rows int
	// MaxLen skips pairs whose longer side, with EOS, is longer (0: only
	// the token budget limits it).
	MaxLen int
	// Seed of the per-epoch shuffles; every rank must use the same one.
	Seed int64
	// VocabSize, when > 0, makes Next check every id against it.
	VocabSize int
}

// Position is where a Batcher is in its order of batches. The order
// depends on the seed, the corpus and the token budget only, not on the
// number of ranks that share the batches out, so a position saved by a job
// of N ranks continues a job of any number.
type Position struct {
	Epoch int   `json:"epoch"`
	Index int   `json:"index"`
	Seed  int64 `json:"seed"`
	// Tokens is the budget of the batches (BatchConfig.TokensPerBatch),
	// 0 when they hold Rows pairs.
	Tokens int `json:"batch_tokens"`
	// Rows is BatchConfig.Rows (0: a token budget).
	Rows  int `json:"batch_rows,omitempty"`
	Lines int `json:"lines"`
	// Steps is the number of batches per epoch.
	Steps int `json:"steps_per_epoch"`
}

// Batcher cuts a Source into one seeded order of length-bucketed batches
// of at most TokensPerBatch padded tokens, or of Rows sentence pairs.
//
// Lines are bucketed by the length of their longer side with EOS, with
// bucket bounds growing by 10% from 8 (tensor2tensor's scheme); a bucket
// with bound L holds batches of TokensPerBatch/L rows (or of Rows rows),
// padded to the longest row. Every epoch the lines are shuffled within buckets and then
// the order of the batches, from (Seed, epoch): every line is seen exactly
// once per epoch. Every rank of a job runs the same Batcher and takes its
// batches of the order (Next), passing over the others' (Skip), so the
// order does not depend on the number of ranks.
type Batcher struct {
	src      Source
	cfg      BatchConfig
	maxLen   int
	bounds   []int // bucket upper bounds
	rows     []int // rows per batch of each bucket
	bucketOf []int32
	eligible int // lines used
	skipped  int // lines too long
	steps    int // batches per epoch
	pos      Position
	plan     [][]int32
}

// NewBatcher plans the batches. Its error: a budget smaller than the
// shortest possible pair (or a corpus file that changed under it).
func NewBatcher(s Source, cfg BatchConfig) (*Batcher, error) {
	return readSource(s, func() (*Batcher, error) { return newBatcher(s, cfg) })
}

func newBatcher(s Source, cfg BatchConfig) (*Batcher, error) {
	var maxLen int
	switch {
	case cfg.Rows < 0:
		return nil, fmt.Errorf("data: a batch of %d sentence pairs", cfg.Rows)
	case cfg.Rows > 0:
		cfg.TokensPerBatch = 0
		maxLen = cfg.MaxLen
		if maxLen <= 0 { // no limit: the longest pair bounds the buckets
			maxLen = 2
			for i := 0; i < s.Len(); i++ {
				ls, lt := s.Lens(i)
				maxLen = max(maxLen, max(ls, lt)+1)
			}
		}
	case cfg.TokensPerBatch < 2:
		return nil, fmt.Errorf("data: a batch of %d tokens cannot hold a sentence and its EOS", cfg.TokensPerBatch)
	default:
		maxLen = cfg.TokensPerBatch
		if cfg.MaxLen > 0 {
			maxLen = min(maxLen, cfg.MaxLen)
		}
	}
	b := &Batcher{src: s, cfg: cfg, maxLen: maxLen}
	for l := 8; ; l = max(l+1, l*11/10) {
		if l >= maxLen {
			b.bounds = append(b.bounds, maxLen)
			break
		}
		b.bounds = append(b.bounds, l)
	}
	b.rows = make([]int, len(b.bounds))
	for i, l := range b.bounds {
		b.rows[i] = cfg.TokensPerBatch / l
		if cfg.Rows > 0 {
			b.rows[i] = cfg.Rows
		}
	}
	n := s.Len()
	// bucket of every line; -1 when too long
	b.bucketOf = make([]int32, n)
	lenBucket := make([]int32, maxLen+1)
	k := 0
	for l := 1; l <= maxLen; l++ {
		for b.bounds[k] < l {
			k++
		}
		lenBucket[l] = int32(k)
	}
	hist := make([]int, len(b.bounds))
	for i := 0; i < n; i++ {
		ls, lt := s.Lens(i)
		l := max(ls, lt) + 1
		if l > maxLen {
			b.bucketOf[i] = -1
			b.skipped++
		} else {
			b.bucketOf[i] = lenBucket[l]
			hist[lenBucket[l]]++
			b.eligible++
		}
	}
	for k, c := range hist {
		b.steps += (c + b.rows[k] - 1) / b.rows[k]
	}
	b.pos = Position{Seed: cfg.Seed, Tokens: cfg.TokensPerBatch, Rows: cfg.Rows, Lines: n, Steps: b.steps}
	b.plan = b.makePlan(0)
	return b, nil
}

// StepsPerEpoch is the number of batches per epoch.
func (b *Batcher) StepsPerEpoch() int { return b.steps }

// Epoch is the epoch of the next batch (0-based).
func (b *Batcher) Epoch() int { return b.pos.Epoch }

// Lines is the number of lines in use.
func (b *Batcher) Lines() int { return b.eligible }

// Skipped is the number of lines skipped as longer than MaxLen or the
// token budget.
func (b *Batcher) Skipped() int { return b.skipped }

// Pos returns the position (a checkpoint stores it as JSON).
func (b *Batcher) Pos() Position { return b.pos }

// Restore continues from a position (Pos as JSON; other fields are
// ignored) saved with the same seed and corpus, by a job of any number of
// ranks.
//
// Positions written before the order was global have no batch_tokens but
// the number of shards ("size"): one of a single shard is the order of
// this Batcher's budget (its step count is checked); one of several
// shards is refused (that order cannot be continued).
func (b *Batcher) Restore(j json.RawMessage) error {
	var p struct {
		Position
		Size int `json:"size"`
	}
	if err := json.Unmarshal(j, &p); err != nil {
		return fmt.Errorf("data: batcher position %s: %w", j, err)
	}
	if p.Tokens == 0 && p.Rows == 0 {
		if p.Size > 1 {
			return fmt.Errorf("data: the data position is one of %d per-rank shards, written by a version before the data order was global: this version cannot continue it; start a new run, or finish this one with the version that wrote it", p.Size)
		}
		p.Tokens, p.Rows = b.cfg.TokensPerBatch, b.cfg.Rows
		if err := b.SetPos(p.Position); err != nil {
			return fmt.Errorf("%w (a position written before the data order was global does not record its batch size: resume with the settings of the run that wrote it)", err)
		}
		return nil
	}
	return b.SetPos(p.Position)
}

// SetPos continues from p. When p's batch size (token budget or rows)
// differs from this Batcher's, the batches are planned again with p's: a
// job continues its own order of batches.
func (b *Batcher) SetPos(p Position) error {
	if p.Seed != b.pos.Seed || p.Lines != b.pos.Lines {
		return fmt.Errorf("data: cannot resume the data position: it was saved with seed %d and %d lines; this run has seed %d and %d lines",
			p.Seed, p.Lines, b.pos.Seed, b.pos.Lines)
	}
	// Checked on a copy: a position that is refused leaves b as it was.
	nb := *b
	if p.Tokens != b.cfg.TokensPerBatch || p.Rows != b.cfg.Rows {
		cfg := b.cfg
		cfg.TokensPerBatch, cfg.Rows = p.Tokens, p.Rows
		re, err := NewBatcher(b.src, cfg)
		if err != nil {
			return fmt.Errorf("data: cannot resume the data position: %w", err)
		}
		nb = *re
	}
	if p.Steps != nb.steps {
		return fmt.Errorf("data: cannot resume the data position: it was saved with %d batches of %s per epoch; this corpus gives %d (another --max-length or corpus?)",
			p.Steps, p.BatchSize(), nb.steps)
	}
	if p.Epoch < 0 || p.Index < 0 || p.Index > p.Steps {
		return fmt.Errorf("data: invalid data position epoch %d index %d", p.Epoch, p.Index)
	}
	if p.Epoch != nb.pos.Epoch {
		nb.plan = nb.makePlan(p.Epoch)
	}
	nb.pos = p
	*b = nb
	return nil
}

// BatchSize says what a batch of the position holds: "4096 tokens" or
// "128 sentence pairs".
func (p Position) BatchSize() string {
	if p.Rows > 0 {
		return fmt.Sprintf("%d sentence pairs", p.Rows)
	}
	return fmt.Sprintf("%d tokens", p.Tokens)
}

// Next returns the next batch, starting a new epoch when one ends. Its
// errors: an id outside cfg.VocabSize, and a corpus file that changed
// under it (a *ChangedError naming the file; see readSource).
func (b *Batcher) Next() (*Batch, error) {
	lines := b.advance()
	return readSource(b.src, func() (*Batch, error) { return padBatch(b.src, lines, b.cfg.VocabSize, b.maxLen) })
}

// Skip passes over the next batch without reading its tokens (a batch
// another rank takes).
func (b *Batcher) Skip() { b.advance() }

// advance returns the next batch's lines and moves past it.
func (b *Batcher) advance() []int32 {
	if b.pos.Index >= len(b.plan) {
		b.pos.Epoch++
		b.pos.Index = 0
		b.plan = b.makePlan(b.pos.Epoch)
	}
	lines := b.plan[b.pos.Index]
	b.pos.Index++
	return lines
}

// makePlan returns the batches of epoch e (line numbers). The stream is
// (Seed, epoch<<20): shard 0's of the versions that sharded the corpus, so
// their single-shard positions continue exactly.
func (b *Batcher) makePlan(e int) [][]int32 {
	rng := rand.New(rand.NewPCG(uint64(b.cfg.Seed), uint64(e)<<20))
	buckets := make([][]int32, len(b.bounds))
	for i := range b.bucketOf {
		if k := b.bucketOf[i]; k >= 0 {
			buckets[k] = append(buckets[k], int32(i))
		}
	}
	var plan [][]int32
	for k, ls := range buckets {
		shuffle(rng, ls)
		for len(ls) > 0 {
			n := min(len(ls), b.rows[k])
			plan = append(plan, ls[:n:n])
			ls = ls[n:]
		}
	}
	shuffle(rng, plan)
	return plan
}

// shuffle is Fisher-Yates with our own bounded draw, so the order depends
// only on the PCG stream, not on a library's shuffle algorithm.
func shuffle[T any](rng *rand.Rand, s []T) {
	for i := len(s) - 1; i > 0; i-- {
		hi, _ := bits.Mul64(rng.Uint64(), uint64(i+1))
		j := int(hi)
		s[i], s[j] = s[j], s[i]
	}
}

// padBatch gathers lines of s into a padded batch with EOS appended. The
// lines were planned at most maxLen long: one longer now is a corpus that
// changed since (its offsets rewritten), refused before it sizes a batch.
func padBatch(s Source, lines []int32, vocab, maxLen int) (*Batch, error) {
	bt := &Batch{B: len(lines), S: 1, T: 1, Lines: make([]int, len(lines))}
	for i, l := range lines {
		ls, lt := s.Lens(int(l))
		if max(ls, lt)+1 > maxLen {
			return nil, fmt.Errorf("data: line %d is %d tokens long, planned at most %d: the corpus changed since the batches were planned", l+1, max(ls, lt)+1, maxLen)
		}
		bt.S, bt.T = max(bt.S, ls+1), max(bt.T, lt+1)
		bt.Lines[i] = int(l)
	}
	bt.Src = make([]int32, bt.B*bt.S)
	bt.Tgt = make([]int32, bt.B*bt.T)
	for i, l := range lines {
		src, tgt := s.Pair(int(l))
		if vocab > 0 {
			for _, side := range [][]int32{src, tgt} {
				for _, id := range side {
					if id < 0 || int(id) >= vocab {
						return nil, fmt.Errorf("data: line %d has id %d outside the vocabulary of %d (corpus and vocabulary do not match)", l+1, id, vocab)
					}
				}
			}
		}
		copy(bt.Src[i*bt.S:], src)
		bt.Src[i*bt.S+len(src)] = EOS
		copy(bt.Tgt[i*bt.T:], tgt)
		bt.Tgt[i*bt.T+len(tgt)] = EOS
		bt.SrcTokens += len(src) + 1
		bt.TgtTokens += len(tgt) + 1
	}
	return bt, nil
}
