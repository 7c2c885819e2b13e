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

// BatchConfig configures a Batcher.
type BatchConfig struct {
	// TokensPerBatch bounds Padded() of every batch.
	TokensPerBatch int
	// MaxLen skips pairs whose longer side, with EOS, is longer (0: only
	// the token budget limits it).
	MaxLen int
	// Seed of the per-epoch shuffles; every rank must use the same one.
	Seed int64
	// Rank of Size reads shard Rank of the corpus (Size 0 means 1).
	Rank, Size int
	// VocabSize, when > 0, makes Next check every id against it.
	VocabSize int
}

// Position is where a Batcher is: the same on every rank at the same step,
// so rank 0's can be restored everywhere.
type Position struct {
	Epoch int   `json:"epoch"`
	Index int   `json:"index"`
	Seed  int64 `json:"seed"`
	Size  int   `json:"size"`
	Lines int   `json:"lines"`
	Steps int   `json:"steps_per_epoch"`
}

// Batcher cuts a Source into length-bucketed batches of at most
// TokensPerBatch padded tokens, shard Rank of Size.
//
// Lines are bucketed by the length of their longer side with EOS, with
// bucket bounds growing by 10% from 8 (tensor2tensor's scheme); a bucket
// with bound L holds batches of TokensPerBatch/L rows, padded to the
// longest row. Every epoch each rank shuffles its shard's lines within
// buckets and then the order of its batches, from (Seed, epoch, rank).
//
// Shards are contiguous ranges of lines. Because shards give different
// batch counts, every rank computes, from the lengths alone (a Corpus's
// offsets, not its tokens), the count of every shard; ranks with fewer
// batches split their largest batches in two until all ranks have the same
// number. So every line is seen exactly once per epoch across the ranks,
// no batch exceeds the budget, and every rank takes the same number of
// steps.
type Batcher struct {
	src      Source
	cfg      BatchConfig
	maxLen   int
	bounds   []int // bucket upper bounds
	rows     []int // rows per batch of each bucket
	bucketOf []int32
	lo, hi   int // this rank's shard
	eligible int // lines of this shard used
	skipped  int // lines of this shard too long
	steps    int // batches per epoch, every rank
	pos      Position
	plan     [][]int32
}

// NewBatcher plans the batches of cfg.Rank's shard. Errors: a budget
// smaller than the shortest possible pair, a rank out of range, or a
// shard with fewer lines than the steps the other ranks need.
func NewBatcher(s Source, cfg BatchConfig) (*Batcher, error) {
	if cfg.Size <= 0 {
		cfg.Size = 1
	}
	if cfg.Rank < 0 || cfg.Rank >= cfg.Size {
		return nil, fmt.Errorf("data: rank %d outside 0..%d", cfg.Rank, cfg.Size-1)
	}
	if cfg.TokensPerBatch < 2 {
		return nil, fmt.Errorf("data: a batch of %d tokens cannot hold a sentence and its EOS", cfg.TokensPerBatch)
	}
	maxLen := cfg.TokensPerBatch
	if cfg.MaxLen > 0 {
		maxLen = min(maxLen, cfg.MaxLen)
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
	for i := 0; i < n; i++ {
		ls, lt := s.Lens(i)
		l := max(ls, lt) + 1
		if l > maxLen {
			b.bucketOf[i] = -1
		} else {
			b.bucketOf[i] = lenBucket[l]
		}
	}
	counts := make([]int, cfg.Size)
	lines := make([]int, cfg.Size)
	hist := make([]int, len(b.bounds))
	for r := 0; r < cfg.Size; r++ {
		lo, hi := r*n/cfg.Size, (r+1)*n/cfg.Size
		clear(hist)
		for i := lo; i < hi; i++ {
			if k := b.bucketOf[i]; k >= 0 {
				hist[k]++
				lines[r]++
			} else if r == cfg.Rank {
				b.skipped++
			}
		}
		for k, c := range hist {
			counts[r] += (c + b.rows[k] - 1) / b.rows[k]
		}
		if r == cfg.Rank {
			b.lo, b.hi = lo, hi
		}
	}
	for _, c := range counts {
		b.steps = max(b.steps, c)
	}
	b.eligible = lines[cfg.Rank]
	for r := range lines {
		if lines[r] < b.steps || lines[r] == 0 {
			return nil, fmt.Errorf("data: shard %d of %d has %d usable lines but each rank must take %d steps per epoch: use fewer ranks or more data", r, cfg.Size, lines[r], b.steps)
		}
	}
	b.pos = Position{Seed: cfg.Seed, Size: cfg.Size, Lines: n, Steps: b.steps}
	b.plan = b.makePlan(0)
	return b, nil
}

// StepsPerEpoch is the number of batches every rank takes per epoch.
func (b *Batcher) StepsPerEpoch() int { return b.steps }

// Epoch is the epoch of the next batch (0-based).
func (b *Batcher) Epoch() int { return b.pos.Epoch }

// Lines is the number of lines of this rank's shard in use.
func (b *Batcher) Lines() int { return b.eligible }

// Skipped is the number of lines of this rank's shard skipped as longer
// than MaxLen or the token budget.
func (b *Batcher) Skipped() int { return b.skipped }

// Position returns the position as JSON (for a checkpoint).
func (b *Batcher) Position() json.RawMessage {
	j, _ := json.Marshal(b.pos)
	return j
}

// Pos returns the position.
func (b *Batcher) Pos() Position { return b.pos }

// Restore continues from a position saved by Position on any rank of a
// job with the same seed, world size and corpus.
func (b *Batcher) Restore(j json.RawMessage) error {
	var p Position
	if err := json.Unmarshal(j, &p); err != nil {
		return fmt.Errorf("data: batcher position %s: %v", j, err)
	}
	return b.SetPos(p)
}

// SetPos continues from p; see Restore.
func (b *Batcher) SetPos(p Position) error {
	if p.Seed != b.pos.Seed || p.Size != b.pos.Size || p.Lines != b.pos.Lines || p.Steps != b.pos.Steps {
		return fmt.Errorf("data: cannot resume the data position: it was saved with seed %d, %d ranks, %d lines, %d steps per epoch; this run has seed %d, %d ranks, %d lines, %d steps per epoch",
			p.Seed, p.Size, p.Lines, p.Steps, b.pos.Seed, b.pos.Size, b.pos.Lines, b.pos.Steps)
	}
	if p.Epoch < 0 || p.Index < 0 || p.Index > p.Steps {
		return fmt.Errorf("data: invalid data position epoch %d index %d", p.Epoch, p.Index)
	}
	if p.Epoch != b.pos.Epoch {
		b.plan = b.makePlan(p.Epoch)
	}
	b.pos = p
	return nil
}

// Next returns the next batch, starting a new epoch when one ends. Its only
// error is an id outside cfg.VocabSize.
func (b *Batcher) Next() (*Batch, error) {
	if b.pos.Index >= len(b.plan) {
		b.pos.Epoch++
		b.pos.Index = 0
		b.plan = b.makePlan(b.pos.Epoch)
	}
	lines := b.plan[b.pos.Index]
	b.pos.Index++
	return padBatch(b.src, lines, b.cfg.VocabSize)
}

// makePlan returns this rank's batches of epoch e (line numbers).
func (b *Batcher) makePlan(e int) [][]int32 {
	rng := rand.New(rand.NewPCG(uint64(b.cfg.Seed), uint64(e)<<20|uint64(b.cfg.Rank)))
	buckets := make([][]int32, len(b.bounds))
	for i := b.lo; i < b.hi; i++ {
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
	for len(plan) < b.steps {
		big := 0
		for i := range plan {
			if len(plan[i]) > len(plan[big]) {
				big = i
			}
		}
		ls := plan[big]
		h := len(ls) / 2
		plan[big] = ls[:h:h]
		plan = append(plan, ls[h:])
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

// padBatch gathers lines of s into a padded batch with EOS appended.
func padBatch(s Source, lines []int32, vocab int) (*Batch, error) {
	bt := &Batch{B: len(lines), S: 1, T: 1, Lines: make([]int, len(lines))}
	for i, l := range lines {
		ls, lt := s.Lens(int(l))
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

// EvalBatches cuts s, in order and unshuffled, into batches of at most
// tokensPerBatch padded tokens (for validation loss). Pairs longer than the
// budget get a batch of their own.
func EvalBatches(s Source, tokensPerBatch, vocab int) ([]*Batch, error) {
	var out []*Batch
	var cur []int32
	longest := 0
	flush := func() error {
		if len(cur) == 0 {
			return nil
		}
		b, err := padBatch(s, cur, vocab)
		if err != nil {
			return err
		}
		out = append(out, b)
		cur, longest = nil, 0
		return nil
	}
	for i := 0; i < s.Len(); i++ {
		ls, lt := s.Lens(i)
		l := max(ls, lt) + 1
		if len(cur) > 0 && (len(cur)+1)*max(longest, l) > tokensPerBatch {
			if err := flush(); err != nil {
				return nil, err
			}
		}
		cur = append(cur, int32(i))
		longest = max(longest, l)
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}
