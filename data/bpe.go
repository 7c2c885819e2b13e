package data

import (
	"bufio"
	"container/heap"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/gorun/gorun/internal/atomicfile"
)

// BPE is a list of merges learned jointly on both languages. Words are
// whitespace-separated; each gets the word-boundary marker "▁" in front, as
// SentencePiece does, so a piece that starts a word starts with "▁". Apply
// is safe for concurrent use.
type BPE struct {
	merges [][2]string
	sym    map[string]int32 // symbol string -> id (base runes and merge results)
	rank   map[uint64]int32 // pair of ids -> merge index
	result []int32          // merge index -> id of the merged symbol
	mu     sync.RWMutex
	cache  map[string][]string // word -> pieces
}

// bpeCacheMax bounds the number of words Apply remembers.
const bpeCacheMax = 1 << 21

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

type bpeWord struct {
	syms  []int32
	count int64
}

type pairCount struct {
	key   uint64
	count int64
}

type pairHeap []pairCount

func (h pairHeap) Len() int { return len(h) }
func (h pairHeap) Less(i, j int) bool {
	if h[i].count != h[j].count {
		return h[i].count > h[j].count
	}
	return h[i].key < h[j].key
}
func (h pairHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *pairHeap) Push(x any)   { *h = append(*h, x.(pairCount)) }
func (h *pairHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// LearnBPECounts learns up to merges merges from word counts (words
// without the "▁" marker, which it adds). The most frequent pair is merged
// first, ties going to the pair of older symbols (base runes in byte
// order, then merges in order), so the result is deterministic. Learning
// stops early when no pair occurs twice.
func LearnBPECounts(counts map[string]int64, merges int) *BPE {
	return learnBPEUntil(counts, merges, nil)
}

// learnBPEUntil is LearnBPECounts, returning nil as soon as done is
// closed (a nil done never is).
func learnBPEUntil(counts map[string]int64, merges int, done <-chan struct{}) *BPE {
	words := make([]string, 0, len(counts))
	for w := range counts {
		if w != "" {
			words = append(words, w)
		}
	}
	sort.Strings(words)
	runeSet := map[string]bool{}
	for _, w := range words {
		runeSet[WordBoundary] = true
		for _, r := range w {
			runeSet[string(r)] = true
		}
	}
	base := make([]string, 0, len(runeSet))
	for r := range runeSet {
		base = append(base, r)
	}
	sort.Strings(base)
	strs := append([]string(nil), base...)
	id := make(map[string]int32, len(base))
	for i, s := range base {
		id[s] = int32(i)
	}
	ws := make([]bpeWord, len(words))
	pairs := map[uint64]int64{}
	where := map[uint64][]int32{}
	for wi, w := range words {
		syms := []int32{id[WordBoundary]}
		for _, r := range w {
			syms = append(syms, id[string(r)])
		}
		ws[wi] = bpeWord{syms, counts[w]}
		for i := 0; i+1 < len(syms); i++ {
			k := pairKey(syms[i], syms[i+1])
			pairs[k] += counts[w]
			where[k] = append(where[k], int32(wi))
		}
	}
	h := make(pairHeap, 0, len(pairs))
	for k, c := range pairs {
		h = append(h, pairCount{k, c})
	}
	heap.Init(&h)
	b := &BPE{}
	seen := make([]int32, len(ws))
	for i := range seen {
		seen[i] = -1
	}
	delta := map[uint64]int64{}
	for m := 0; m < merges && h.Len() > 0; {
		select {
		case <-done:
			return nil
		default:
		}
		top := heap.Pop(&h).(pairCount)
		if pairs[top.key] != top.count {
			continue // stale entry
		}
		if top.count < 2 {
			break
		}
		a, c := int32(top.key>>32), int32(uint32(top.key))
		nid := int32(len(strs))
		strs = append(strs, strs[a]+strs[c])
		b.merges = append(b.merges, [2]string{strs[a], strs[c]})
		clear(delta)
		for _, wi := range where[top.key] {
			if seen[wi] == int32(m) {
				continue
			}
			seen[wi] = int32(m)
			w := &ws[wi]
			if !hasPair(w.syms, a, c) {
				continue
			}
			for i := 0; i+1 < len(w.syms); i++ {
				delta[pairKey(w.syms[i], w.syms[i+1])] -= w.count
			}
			out := w.syms[:0]
			for i := 0; i < len(w.syms); i++ {
				if i+1 < len(w.syms) && w.syms[i] == a && w.syms[i+1] == c {
					out = append(out, nid)
					i++
				} else {
					out = append(out, w.syms[i])
				}
			}
			w.syms = out
			for i := 0; i+1 < len(w.syms); i++ {
				k := pairKey(w.syms[i], w.syms[i+1])
				delta[k] += w.count
				if w.syms[i] == nid || w.syms[i+1] == nid {
					where[k] = append(where[k], wi)
				}
			}
		}
		delete(where, top.key)
		for k, d := range delta {
			if d == 0 {
				continue
			}
			n := pairs[k] + d
			if n <= 0 {
				delete(pairs, k)
				continue
			}
			pairs[k] = n
			heap.Push(&h, pairCount{k, n})
		}
		m++
	}
	b.build()
	return b
}

func hasPair(s []int32, a, c int32) bool {
	for i := 0; i+1 < len(s); i++ {
		if s[i] == a && s[i+1] == c {
			return true
		}
	}
	return false
}

// build derives the lookup tables from the merge list.
func (b *BPE) build() {
	b.sym = map[string]int32{}
	b.cache = map[string][]string{}
	b.rank = make(map[uint64]int32, len(b.merges))
	b.result = make([]int32, len(b.merges))
	get := func(s string) int32 {
		if id, ok := b.sym[s]; ok {
			return id
		}
		id := int32(len(b.sym))
		b.sym[s] = id
		return id
	}
	for i, m := range b.merges {
		k := pairKey(get(m[0]), get(m[1]))
		if _, dup := b.rank[k]; !dup {
			b.rank[k] = int32(i)
		}
		b.result[i] = get(m[0] + m[1])
	}
}

// NumMerges is the number of merges.
func (b *BPE) NumMerges() int { return len(b.merges) }

// Apply splits a line of raw text into pieces: words are separated by
// white space (as strings.Fields does), each word is "▁" + word, split by
// the merges in the order they were learned.
func (b *BPE) Apply(line string) []string {
	out := make([]string, 0, len(line)/3+1)
	start := -1
	for i := 0; i < len(line); {
		c := line[i]
		var space bool
		n := 1
		if c < utf8.RuneSelf {
			space = asciiSpace[c]
		} else {
			var r rune
			r, n = utf8.DecodeRuneInString(line[i:])
			space = unicode.IsSpace(r)
		}
		if space {
			if start >= 0 {
				out = append(out, b.applyWord(line[start:i])...)
				start = -1
			}
		} else if start < 0 {
			start = i
		}
		i += n
	}
	if start >= 0 {
		out = append(out, b.applyWord(line[start:])...)
	}
	return out
}

var asciiSpace = [utf8.RuneSelf]bool{'\t': true, '\n': true, '\v': true, '\f': true, '\r': true, ' ': true}

// applyWord returns the pieces of one word (no white space in it),
// remembered in the word cache.
func (b *BPE) applyWord(w string) []string {
	b.mu.RLock()
	v, ok := b.cache[w]
	b.mu.RUnlock()
	if ok {
		return v
	}
	pieces := b.segment(w)
	b.mu.Lock()
	if len(b.cache) < bpeCacheMax {
		b.cache[strings.Clone(w)] = pieces
	}
	b.mu.Unlock()
	return pieces
}

// bpeNode is one symbol of a word being segmented: its id (-1: a rune no
// merge knows), its bytes word[start:end], and its neighbours in the list
// of live symbols (-1: none). A node that merged into its left neighbour
// is dead.
type bpeNode struct {
	id         int32
	start, end int32
	prev, next int32
	dead       bool
}

// bpeSmall is the word length (in runes, "▁" included) up to which
// segment's work arrays live on the stack.
const bpeSmall = 32

// segment splits "▁"+w into pieces by the merges: while two adjacent
// symbols make a pair some merge knows, it merges the pair of the lowest
// merge index, the leftmost of them on a tie, one pair at a time. That is
// the rule of the plain loop (find the best pair, merge it, look again,
// O(n²) for n runes); here the candidate pairs are kept in a binary heap
// ordered by (merge index, position), over a linked list of the symbols:
// a merge removes one node and pushes at most two new pairs (its new
// left and right pairs), and entries whose pair has since changed are
// skipped when popped, so a word takes O(n log n). The pieces are the
// same as the plain loop's for every word and merge list
// (TestBPESegmentSameAsReference).
func (b *BPE) segment(w string) []string {
	word := WordBoundary + w
	var nodeBuf [bpeSmall]bpeNode
	var heapBuf [bpeSmall]uint64
	nodes, h := nodeBuf[:0], heapBuf[:0]
	if n := len(word); n > bpeSmall { // at most one node per byte
		n = min(n, utf8.RuneCountInString(word))
		if n > bpeSmall {
			nodes, h = make([]bpeNode, 0, n), make([]uint64, 0, n)
		}
	}
	for i, r := range word {
		n := utf8.RuneLen(r)
		if r == utf8.RuneError {
			n = 1
			if i+3 <= len(word) && word[i:i+3] == "\uFFFD" {
				n = 3
			}
		}
		id, ok := b.sym[word[i:i+n]]
		if !ok {
			id = -1
		}
		k := int32(len(nodes))
		nodes = append(nodes, bpeNode{id: id, start: int32(i), end: int32(i + n), prev: k - 1, next: k + 1})
	}
	nodes[len(nodes)-1].next = -1
	// rankAt is the merge index of the pair starting at node i, or -1.
	rankAt := func(i int32) int32 {
		j := nodes[i].next
		if j < 0 || nodes[i].id < 0 || nodes[j].id < 0 {
			return -1
		}
		if r, ok := b.rank[pairKey(nodes[i].id, nodes[j].id)]; ok {
			return r
		}
		return -1
	}
	// An entry is rank<<32 | node: ordered by merge index, then by
	// position (nodes are numbered left to right and a merged node keeps
	// its left half's number).
	for i := range nodes {
		if r := rankAt(int32(i)); r >= 0 {
			h = append(h, uint64(r)<<32|uint64(i))
		}
	}
	for i := len(h)/2 - 1; i >= 0; i-- {
		bpeDown(h, i)
	}
	for len(h) > 0 {
		top := h[0]
		last := len(h) - 1
		h[0] = h[last]
		h = h[:last]
		if last > 0 {
			bpeDown(h, 0)
		}
		i, r := int32(uint32(top)), int32(top>>32)
		if nodes[i].dead || rankAt(i) != r {
			continue // stale: the pair changed since it was pushed
		}
		j := nodes[i].next
		nodes[i].id = b.result[r]
		nodes[i].end = nodes[j].end
		nodes[i].next = nodes[j].next
		if k := nodes[j].next; k >= 0 {
			nodes[k].prev = i
		}
		nodes[j].dead = true
		if p := nodes[i].prev; p >= 0 {
			if r := rankAt(p); r >= 0 {
				h = bpePush(h, uint64(r)<<32|uint64(p))
			}
		}
		if r := rankAt(i); r >= 0 {
			h = bpePush(h, uint64(r)<<32|uint64(i))
		}
	}
	n := 0
	for i := int32(0); i >= 0; i = nodes[i].next {
		n++
	}
	pieces := make([]string, 0, n)
	for i := int32(0); i >= 0; i = nodes[i].next {
		pieces = append(pieces, word[nodes[i].start:nodes[i].end])
	}
	return pieces
}

// bpePush adds x to the min-heap h.
func bpePush(h []uint64, x uint64) []uint64 {
	h = append(h, x)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if h[p] <= x {
			break
		}
		h[i] = h[p]
		i = p
	}
	h[i] = x
	return h
}

// bpeDown restores the min-heap order of h below i.
func bpeDown(h []uint64, i int) {
	n := len(h)
	x := h[i]
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if c+1 < n && h[c+1] < h[c] {
			c++
		}
		if x <= h[c] {
			break
		}
		h[i] = h[c]
		i = c
	}
	h[i] = x
}

// DefaultMaxWordBytes is the longest word (a run of bytes without white
// space) that Prepare learns or applies a BPE on unless told otherwise
// (PrepareConfig.MaxWordBytes, prepare's --max-word-bytes): a longer one
// is refused naming file:line. SentencePiece's trainer skips sentences
// over 4192 bytes (its max_sentence_length); a single word over that is
// almost surely not text (a base64 blob, a URL list, a table without
// spaces), and it would cost the BPE's learning time in proportion to its
// length for every merge that touches it.
const DefaultMaxWordBytes = 4192

// longWord finds the first word of line (white space separates words, as
// in Apply) longer than limit bytes: its byte offset and its length; n is
// 0 when every word fits.
func longWord(line string, limit int) (at, n int) {
	if len(line) <= limit {
		return 0, 0
	}
	start := -1
	for i := 0; i < len(line); {
		c := line[i]
		var space bool
		w := 1
		if c < utf8.RuneSelf {
			space = asciiSpace[c]
		} else {
			var r rune
			r, w = utf8.DecodeRuneInString(line[i:])
			space = unicode.IsSpace(r)
		}
		if space {
			if start >= 0 && i-start > limit {
				return start, i - start
			}
			start = -1
		} else if start < 0 {
			start = i
		}
		i += w
	}
	if start >= 0 && len(line)-start > limit {
		return start, len(line) - start
	}
	return 0, 0
}

// bpeHeader is the first line of a merges file.
const bpeHeader = "#version: gorun-bpe 1"

// WriteFile writes the merges, one "left right" pair per line in merge
// order, after a version line.
func (b *BPE) WriteFile(path string) error {
	var sb strings.Builder
	sb.WriteString(bpeHeader + "\n")
	for _, m := range b.merges {
		sb.WriteString(m[0])
		sb.WriteByte(' ')
		sb.WriteString(m[1])
		sb.WriteByte('\n')
	}
	return atomicfile.WriteFile(path, "."+filepath.Base(path)+".tmp*", []byte(sb.String()))
}

// LoadBPE reads a merges file written by WriteFile; errors name file:line.
func LoadBPE(path string) (*BPE, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	b := &BPE{}
	n := 0
	for sc.Scan() {
		n++
		l := sc.Text()
		if n == 1 {
			if l != bpeHeader {
				return nil, fmt.Errorf("%s:1: not a gorun BPE merges file (want first line %q)", path, bpeHeader)
			}
			continue
		}
		if !utf8.ValidString(l) {
			return nil, fmt.Errorf("%s:%d: invalid UTF-8", path, n)
		}
		parts := strings.Split(l, " ")
		if len(parts) != 2 || parts[0] == "" || parts[1] == "" {
			return nil, fmt.Errorf("%s:%d: want two symbols separated by one space, got %q", path, n, l)
		}
		b.merges = append(b.merges, [2]string{parts[0], parts[1]})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s:%d: %w", path, n+1, err)
	}
	if n == 0 {
		return nil, fmt.Errorf("%s: empty file, not a gorun BPE merges file", path)
	}
	b.build()
	return b, nil
}

// Detokenize joins pieces and turns each "▁" into a space (none at the
// start): the inverse of Apply up to whitespace.
func Detokenize(pieces []string) string {
	s := strings.Join(pieces, "")
	s = strings.ReplaceAll(s, WordBoundary, " ")
	return strings.TrimSpace(s)
}

// SplitPieces splits a line of the lab's tokenized files into pieces.
func SplitPieces(line string) []string { return strings.Fields(line) }
