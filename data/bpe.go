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

type bpeSym struct {
	id         int32
	start, end int32
}

func (b *BPE) applyWord(w string) []string {
	b.mu.RLock()
	v, ok := b.cache[w]
	b.mu.RUnlock()
	if ok {
		return v
	}
	word := WordBoundary + w
	syms := make([]bpeSym, 0, utf8.RuneCountInString(word))
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
		syms = append(syms, bpeSym{id, int32(i), int32(i + n)})
	}
	for len(syms) > 1 {
		best, at := int32(-1), -1
		for i := 0; i+1 < len(syms); i++ {
			if syms[i].id < 0 || syms[i+1].id < 0 {
				continue
			}
			if r, ok := b.rank[pairKey(syms[i].id, syms[i+1].id)]; ok && (best < 0 || r < best) {
				best, at = r, i
			}
		}
		if at < 0 {
			break
		}
		syms[at] = bpeSym{b.result[best], syms[at].start, syms[at+1].end}
		syms = append(syms[:at+1], syms[at+2:]...)
	}
	pieces := make([]string, len(syms))
	for i, s := range syms {
		pieces[i] = word[s.start:s.end]
	}
	b.mu.Lock()
	if len(b.cache) < bpeCacheMax {
		b.cache[strings.Clone(w)] = pieces
	}
	b.mu.Unlock()
	return pieces
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
		return nil, fmt.Errorf("%s:%d: %v", path, n+1, err)
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
