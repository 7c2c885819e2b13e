package data

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/gorun/gorun/internal/atomicfile"
)

// Vocab maps pieces to ids and back. Ids 0..3 are PAD, EOS, BOS, UNK.
type Vocab struct {
	pieces []string
	scores []float32
	ids    map[string]int32
	hash   string
}

// LoadVocab reads a SentencePiece vocabulary file: one `piece<TAB>score`
// line per id (the score may be absent), the first four being <pad>, </s>,
// <s>, <unk>. Duplicates, missing specials, empty pieces and invalid UTF-8
// are errors naming the file and line.
func LoadVocab(path string) (*Vocab, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	v, err := ParseVocab(b)
	if err != nil {
		return nil, fmt.Errorf("%s:%w", path, err)
	}
	return v, nil
}

// ParseVocab parses the contents of a vocabulary file; errors start with
// the line number ("12: ...").
func ParseVocab(b []byte) (*Vocab, error) {
	var pieces []string
	var scores []float32
	line := 0
	for len(b) > 0 {
		line++
		var l []byte
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			l, b = b[:i], b[i+1:]
		} else {
			l, b = b, nil
		}
		l = bytes.TrimSuffix(l, []byte{'\r'})
		if !utf8.Valid(l) {
			return nil, fmt.Errorf("%d: invalid UTF-8", line)
		}
		piece, score := string(l), float32(0)
		if i := bytes.IndexByte(l, '\t'); i >= 0 {
			piece = string(l[:i])
			f, err := strconv.ParseFloat(strings.TrimSpace(string(l[i+1:])), 32)
			if err != nil {
				return nil, fmt.Errorf("%d: score %q is not a number", line, l[i+1:])
			}
			score = float32(f)
		}
		if piece == "" {
			return nil, fmt.Errorf("%d: empty piece", line)
		}
		if strings.ContainsAny(piece, " \t") {
			return nil, fmt.Errorf("%d: piece %q contains a space", line, piece)
		}
		pieces = append(pieces, piece)
		scores = append(scores, score)
	}
	v, err := newVocab(pieces, scores)
	if err != nil {
		return nil, err
	}
	return v, nil
}

var specials = [4]string{PadPiece, EOSPiece, BOSPiece, UNKPiece}

func newVocab(pieces []string, scores []float32) (*Vocab, error) {
	for i, s := range specials {
		if i >= len(pieces) || pieces[i] != s {
			got := "end of file"
			if i < len(pieces) {
				got = strconv.Quote(pieces[i])
			}
			return nil, fmt.Errorf("%d: want special piece %s (id %d), got %s; the first four lines must be <pad>, </s>, <s>, <unk>", i+1, s, i, got)
		}
	}
	v := &Vocab{pieces: pieces, scores: scores, ids: make(map[string]int32, len(pieces))}
	for i, p := range pieces {
		if j, dup := v.ids[p]; dup {
			return nil, fmt.Errorf("%d: duplicate piece %q (first on line %d)", i+1, p, j+1)
		}
		v.ids[p] = int32(i)
	}
	h := sha256.New()
	for _, p := range pieces {
		h.Write([]byte(p))
		h.Write([]byte{'\n'})
	}
	v.hash = hex.EncodeToString(h.Sum(nil))
	return v, nil
}

// NewVocab builds a vocabulary from pieces that do not include the four
// specials (they are prepended); scores are -rank like SentencePiece's.
func NewVocab(pieces []string) (*Vocab, error) {
	all := append(specials[:0:0], specials[:]...)
	all = append(all, pieces...)
	scores := make([]float32, len(all))
	for i := 4; i < len(all); i++ {
		scores[i] = -float32(i - 4)
	}
	return newVocab(all, scores)
}

// BuildVocab keeps the size-4 most frequent pieces of counts (all of them
// when size <= 0), most frequent first, ties in byte order, after the four
// specials.
func BuildVocab(counts map[string]int64, size int) *Vocab {
	ps := make([]string, 0, len(counts))
	for p := range counts {
		if p == "" || p == PadPiece || p == EOSPiece || p == BOSPiece || p == UNKPiece {
			continue
		}
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool {
		if counts[ps[i]] != counts[ps[j]] {
			return counts[ps[i]] > counts[ps[j]]
		}
		return ps[i] < ps[j]
	})
	if size > 0 && len(ps) > size-4 {
		ps = ps[:max(0, size-4)]
	}
	v, err := NewVocab(ps)
	if err != nil {
		panic(err) // cannot happen: pieces are unique and not special
	}
	return v
}

// Size is the number of ids.
func (v *Vocab) Size() int { return len(v.pieces) }

// ID returns the id of piece, UNK when it is not in the vocabulary.
func (v *Vocab) ID(piece string) int32 {
	if id, ok := v.ids[piece]; ok {
		return id
	}
	return UNK
}

// Has reports whether piece is in the vocabulary.
func (v *Vocab) Has(piece string) bool { _, ok := v.ids[piece]; return ok }

// Piece returns the piece of id ("<unk>" outside the vocabulary).
func (v *Vocab) Piece(id int32) string {
	if id < 0 || int(id) >= len(v.pieces) {
		return UNKPiece
	}
	return v.pieces[id]
}

// Hash is a stable hex SHA-256 of the pieces in id order (scores do not
// count): two vocabularies with the same hash give the same ids.
func (v *Vocab) Hash() string { return v.hash }

// Encode maps pieces to ids (UNK for unknown pieces); no EOS is added.
func (v *Vocab) Encode(pieces []string) []int32 {
	ids := make([]int32, len(pieces))
	for i, p := range pieces {
		ids[i] = v.ID(p)
	}
	return ids
}

// Decode maps ids to pieces, stopping at the first EOS and skipping PAD
// and BOS.
func (v *Vocab) Decode(ids []int32) []string {
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		switch id {
		case EOS:
			return out
		case PAD, BOS:
			continue
		}
		out = append(out, v.Piece(id))
	}
	return out
}

// WriteFile writes the vocabulary in SentencePiece format.
func (v *Vocab) WriteFile(path string) error {
	var buf bytes.Buffer
	for i, p := range v.pieces {
		buf.WriteString(p)
		buf.WriteByte('\t')
		buf.WriteString(strconv.FormatFloat(float64(v.scores[i]), 'g', -1, 32))
		buf.WriteByte('\n')
	}
	return atomicfile.WriteFile(path, "."+filepath.Base(path)+".tmp*", buf.Bytes())
}

// CountPieces counts the pieces of every line of the files, split by
// split (strings.Fields for the lab's tokenized files).
func CountPieces(split func(string) []string, paths ...string) (map[string]int64, error) {
	counts := map[string]int64{}
	for _, p := range paths {
		err := eachLine(p, func(n int, line string) error {
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

// eachLine calls fn for every line of path (1-based numbers), checking
// UTF-8; errors name path:line.
func eachLine(path string, fn func(n int, line string) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), maxLineBytes)
	n := 0
	for sc.Scan() {
		n++
		l := sc.Bytes()
		if !utf8.Valid(l) {
			return fmt.Errorf("%s:%d: invalid UTF-8", path, n)
		}
		if err := fn(n, strings.TrimSuffix(string(l), "\r")); err != nil {
			return fmt.Errorf("%s:%d: %w", path, n, err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s:%d: %w", path, n+1, err)
	}
	return nil
}

const maxLineBytes = 16 << 20
