package data

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unsafe"
)

func TestLoadVocabLabFormat(t *testing.T) {
	v, err := LoadVocab("testdata/m_common.vocab")
	if err != nil {
		t.Fatal(err)
	}
	for id, p := range []string{"<pad>", "</s>", "<s>", "<unk>", "▁The"} {
		if v.Piece(int32(id)) != p || v.ID(p) != int32(id) {
			t.Errorf("id %d: piece %q, ID(%q) = %d", id, v.Piece(int32(id)), p, v.ID(p))
		}
	}
	if v.ID("▁Geduld") != UNK || v.Has("▁Geduld") {
		t.Errorf("a piece not in the file must be UNK")
	}
	// write and read back: same pieces, same hash
	p := filepath.Join(t.TempDir(), "v.txt")
	if err := v.WriteFile(p); err != nil {
		t.Fatal(err)
	}
	w, err := LoadVocab(p)
	if err != nil {
		t.Fatal(err)
	}
	if w.Hash() != v.Hash() || w.Size() != v.Size() {
		t.Errorf("round trip changed the vocabulary")
	}
	ids := v.Encode([]string{"▁Das", "▁Haus", "▁Geduld"})
	if got := v.Decode(append(ids, EOS, v.ID("▁Das"))); !reflect.DeepEqual(got, []string{"▁Das", "▁Haus", "<unk>"}) {
		t.Errorf("Decode = %q", got)
	}
}

func TestVocabErrors(t *testing.T) {
	dir := t.TempDir()
	for name, c := range map[string]struct{ text, want string }{
		"dup":     {"<pad>\t0\n</s>\t0\n<s>\t0\n<unk>\t0\n▁a\t-0\nb\t-1\n▁a\t-2\n", ":7: duplicate piece \"▁a\" (first on line 5)"},
		"missing": {"<pad>\t0\n</s>\t0\n<unk>\t0\n▁a\t-0\n", ":3: want special piece <s> (id 2)"},
		"order":   {"<unk>\t0\n<s>\t0\n</s>\t0\n<pad>\t0\n", ":1: want special piece <pad> (id 0)"},
		"short":   {"<pad>\t0\n</s>\t0\n", ":3: want special piece <s> (id 2), got end of file"},
		"utf8":    {"<pad>\t0\n</s>\t0\n<s>\t0\n<unk>\t0\n\xff\t-1\n", ":5: invalid UTF-8"},
		"score":   {"<pad>\t0\n</s>\t0\n<s>\t0\n<unk>\t0\nx\tabc\n", ":5: score \"abc\" is not a number"},
		"empty":   {"<pad>\t0\n</s>\t0\n<s>\t0\n<unk>\t0\n\t-1\n", ":5: empty piece"},
	} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(c.text), 0o644)
		_, err := LoadVocab(p)
		if err == nil || !strings.HasPrefix(err.Error(), p+c.want) {
			t.Errorf("%s: error %v, want prefix %s%s", name, err, p, c.want)
		}
	}
}

func TestBuildVocab(t *testing.T) {
	v := BuildVocab(map[string]int64{"▁b": 5, "▁a": 5, "c": 9, "<unk>": 100, "d": 1}, 7)
	want := []string{"<pad>", "</s>", "<s>", "<unk>", "c", "▁a", "▁b"}
	for i, p := range want {
		if v.Piece(int32(i)) != p {
			t.Errorf("id %d = %q, want %q", i, v.Piece(int32(i)), p)
		}
	}
	if v.Size() != 7 {
		t.Errorf("size %d", v.Size())
	}
}

func TestReadParallelLabFormat(t *testing.T) {
	v, err := LoadVocab("testdata/m_common.vocab")
	if err != nil {
		t.Fatal(err)
	}
	src, tgt, st, err := ReadParallelFunc("testdata/sample.en.tok", "testdata/sample.de.tok", SplitPieces, v, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(src) != 8 || st.Lines != 8 || st.Kept != 8 || st.Dropped() != 0 {
		t.Fatalf("read %d lines, stats %s", len(src), st.String())
	}
	if got := v.Decode(src[0]); strings.Join(got, " ") != "▁The ▁tour ▁programs ▁last ▁2 7 ▁days ." {
		t.Errorf("line 1 = %q", got)
	}
	if Detokenize(v.Decode(tgt[2])) != "Das Haus ist klein, aber der Garten ist groß." {
		t.Errorf("detok %q", Detokenize(v.Decode(tgt[2])))
	}
	// ▁Geduld and programme are not in the vocabulary
	if st.TgtUnk != 2 || st.SrcUnk != 0 {
		t.Errorf("unknown %d/%d", st.SrcUnk, st.TgtUnk)
	}
	var n int64
	for _, s := range src {
		n += int64(len(s))
	}
	if n != st.SrcTokens {
		t.Errorf("source tokens %d vs %d", n, st.SrcTokens)
	}
	// --max-length 10: lines 2, 3 and 6 have a side of more than 9 pieces
	src, _, st, err = ReadParallelFunc("testdata/sample.en.tok", "testdata/sample.de.tok", SplitPieces, v, 10)
	if err != nil {
		t.Fatal(err)
	}
	if st.DroppedLong != 3 || st.Kept != 5 || len(src) != 5 {
		t.Errorf("max length 10: %s", st.String())
	}
	var sb strings.Builder
	st.Markdown(&sb, "train")
	if !strings.Contains(sb.String(), "| dropped: longer than 10 tokens (with EOS) | 3 |") {
		t.Errorf("markdown:\n%s", sb.String())
	}
}

func TestReadParallelErrors(t *testing.T) {
	dir := t.TempDir()
	v := SyntheticVocab()
	w := func(name, text string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(text), 0o644)
		return p
	}
	a := w("a", "x y\nz\nw\n")
	b := w("b", "x\ny\n")
	if _, _, _, err := ReadParallelFunc(a, b, SplitPieces, v, 0); err == nil || err.Error() != fmt.Sprintf("%s has 3 lines but %s has 2: the files are not parallel", a, b) {
		t.Errorf("line counts: %v", err)
	}
	c := w("c", "x\ny \xc3\x28\n")
	if _, _, _, err := ReadParallelFunc(a, c, SplitPieces, v, 0); err == nil || err.Error() != c+":2: invalid UTF-8" {
		t.Errorf("utf8: %v", err)
	}
	d := w("d", "x\n\ny\n")
	_, _, st, err := ReadParallelFunc(a, d, SplitPieces, v, 0)
	if err != nil || st.DroppedEmpty != 1 || st.Kept != 2 {
		t.Errorf("empty line: %v %s", err, st.String())
	}
	if _, _, _, err := ReadParallelFunc(a, filepath.Join(dir, "nope"), SplitPieces, v, 0); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("missing file: %v", err)
	}
}

func TestCorpusRoundTrip(t *testing.T) {
	v := SyntheticVocab()
	s, g := Synthetic(3, 200)
	src, tgt := EncodeLines(s, WordPieces, v), EncodeLines(g, WordPieces, v)
	src[5] = nil // an empty side is representable
	p := filepath.Join(t.TempDir(), "c.bin")
	if err := WriteCorpus(p, src, tgt, v.Hash(), v.Size(), 7); err != nil {
		t.Fatal(err)
	}
	c, err := OpenCorpus(p)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Len() != 200 || c.VocabHash() != v.Hash() || c.Dropped() != 7 || c.CheckVocab(v) != nil {
		t.Fatalf("header: %d lines, hash %s, dropped %d", c.Len(), c.VocabHash(), c.Dropped())
	}
	for i := range src {
		a, b := c.Pair(i)
		if !reflect.DeepEqual(append([]int32{}, a...), append([]int32{}, src[i]...)) || !reflect.DeepEqual(b, tgt[i]) {
			t.Fatalf("line %d differs", i)
		}
		if ls, lt := c.Lens(i); ls != len(src[i]) || lt != len(tgt[i]) {
			t.Fatalf("line %d lengths", i)
		}
	}
	other, _ := NewVocab([]string{"x"})
	if err := c.CheckVocab(other); err == nil || !strings.HasPrefix(err.Error(), p+": made with a vocabulary of 411 pieces") {
		t.Errorf("vocab mismatch: %v", err)
	}
}

func TestCorpusBadFiles(t *testing.T) {
	dir, b := goodCorpus(t)
	cases := map[string]struct {
		data []byte
		want string
	}{
		"truncated": {b[:len(b)-4], "truncated or garbled"},
		"short":     {b[:100], "shorter than the 128-byte header"},
		"magic":     {append([]byte("NOTACORP"), b[8:]...), "bad magic"},
		"header":    {func() []byte { c := append([]byte{}, b...); c[20] ^= 1; return c }(), "header checksum mismatch"},
		"offsets": {func() []byte {
			c := append([]byte{}, b...)
			binary.LittleEndian.PutUint64(c[headerSize+8*3:], 1<<30)
			return c
		}(), "source offset of line 4 goes backwards"},
		"empty": {nil, "shorter than the 128-byte header"},
	}
	for name, c := range cases {
		p := filepath.Join(dir, name)
		os.WriteFile(p, c.data, 0o644)
		_, err := OpenCorpus(p)
		if err == nil || !strings.HasPrefix(err.Error(), p+": ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
	if err := WriteCorpus(filepath.Join(dir, "x"), [][]int32{{500}}, [][]int32{{1}}, SyntheticVocab().Hash(), SyntheticVocab().Size(), 0); err == nil {
		t.Errorf("an id outside the vocabulary was written")
	}
}

func FuzzOpenCorpus(f *testing.F) {
	v := SyntheticVocab()
	s, g := Synthetic(3, 5)
	p := filepath.Join(f.TempDir(), "seed.bin")
	if err := WriteCorpus(p, EncodeLines(s, WordPieces, v), EncodeLines(g, WordPieces, v), v.Hash(), v.Size(), 0); err != nil {
		f.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	f.Add(b)
	f.Add(b[:headerSize])
	f.Add([]byte(corpusMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		// parseCorpus is what OpenCorpus runs on the mapping; a Go slice
		// avoids a file per input. 8-byte alignment as a mapping has.
		buf := make([]uint64, (len(b)+7)/8)
		al := unsafeBytes(buf)[:len(b)]
		copy(al, b)
		c, err := parseCorpus(al)
		if err != nil {
			return
		}
		for i := 0; i < c.Len(); i++ {
			c.Pair(i)
			c.Lens(i)
		}
	})
}

func FuzzParseVocab(f *testing.F) {
	b, _ := os.ReadFile("testdata/m_common.vocab")
	f.Add(b)
	f.Add([]byte("<pad>\t0\n</s>\t0\n<s>\t0\n<unk>\t0\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := ParseVocab(b)
		if err != nil {
			return
		}
		for i := 0; i < v.Size(); i++ {
			if v.ID(v.Piece(int32(i))) != int32(i) {
				t.Fatalf("id %d does not round trip", i)
			}
		}
	})
}

func TestSynthetic(t *testing.T) {
	s1, t1 := Synthetic(1, 500)
	s2, t2 := Synthetic(1, 500)
	if !reflect.DeepEqual(s1, s2) || !reflect.DeepEqual(t1, t2) {
		t.Fatal("same seed, different corpus")
	}
	s3, _ := Synthetic(2, 500)
	same := 0
	for i := range s1 {
		if s1[i] == s3[i] {
			same++
		}
	}
	if same > 5 {
		t.Errorf("seeds 1 and 2 share %d of 500 sentences", same)
	}
	v := SyntheticVocab()
	if v.Size() < 200 || v.Size() > 600 {
		t.Errorf("vocabulary of %d", v.Size())
	}
	lens := map[int]int{}
	for i := range s1 {
		for _, line := range []string{s1[i], t1[i]} {
			n := len(strings.Fields(line))
			if n < 4 || n > 20 {
				t.Errorf("line %d has %d words: %s", i, n, line)
			}
			lens[n]++
			for _, id := range v.Encode(WordPieces(line)) {
				if id == UNK {
					t.Fatalf("line %q has a word outside the vocabulary", line)
				}
			}
			if Detokenize(WordPieces(line)) != line {
				t.Errorf("detokenize %q", line)
			}
		}
	}
	if len(lens) < 10 {
		t.Errorf("only %d distinct lengths", len(lens))
	}
	// agreement and order: the target verb form of a clause depends on the
	// subject's number; a plural source subject noun ends in s and its
	// target clause's verb in ön.
	l := lexicon()
	pl := map[string]bool{}
	for _, n := range l.nouns {
		pl[n.srcPl] = true
	}
	plVerb := map[string]bool{}
	for _, vb := range l.verbs {
		plVerb[vb.tgtPl] = true
	}
	checked := 0
	for i := range s1 {
		if strings.Contains(s1[i], ",") {
			continue
		}
		sw, tw := strings.Fields(s1[i]), strings.Fields(t1[i])
		// subject noun: the first noun form in the source
		subjPl := false
		for _, w := range sw {
			if pl[w] {
				subjPl = true
				break
			}
			if l.isNoun(w) {
				break
			}
		}
		verb := tw[len(tw)-2]
		if plVerb[verb] != subjPl {
			t.Errorf("agreement: %q -> %q", s1[i], t1[i])
		}
		if tw[len(tw)-3] == "wo" || (len(tw) > 3 && l.isAdv(tw[len(tw)-3])) {
			checked++
		}
	}
	if checked < 100 {
		t.Errorf("only %d target clauses end in 'wo [adverb] verb .'", checked)
	}
}

func (l *synthLexicon) isNoun(w string) bool {
	for _, n := range l.nouns {
		if n.src == w || n.srcPl == w {
			return true
		}
	}
	return false
}

func (l *synthLexicon) isAdv(w string) bool {
	for _, a := range l.advs {
		if a.tgt == w {
			return true
		}
	}
	return false
}

func TestBPERoundTrip(t *testing.T) {
	lines := []string{
		"Die Größe der Häuser in München beträgt 1234 m² und 56,7 %.",
		"Über 3 Millionen Bürger grüßen die Bären.",
		"The 2 houses in Munich cost 1,234 euros; Ärger über Öl.",
		"häuser häuser häuser Häuser bären bären 12 12 123 123",
	}
	for i := 0; i < 4; i++ {
		lines = append(lines, lines...)
	}
	b := learnBPE(lines, 200)
	if b.NumMerges() == 0 || b.NumMerges() > 200 {
		t.Fatalf("%d merges", b.NumMerges())
	}
	for _, l := range append(lines[:4:4], "unseen Wörter: Zwölf Boxkämpfer jagen 987 Eichhörnchen ÿ") {
		ps := b.Apply(l)
		if Detokenize(ps) != strings.Join(strings.Fields(l), " ") {
			t.Errorf("round trip %q -> %q -> %q", l, ps, Detokenize(ps))
		}
		for _, p := range ps {
			if strings.Contains(strings.TrimPrefix(p, WordBoundary), WordBoundary) || p == "" {
				t.Errorf("bad piece %q", p)
			}
		}
	}
	// frequent words become one piece
	if got := b.Apply("häuser bären"); !reflect.DeepEqual(got, []string{"▁häuser", "▁bären"}) {
		t.Errorf("Apply = %q", got)
	}
	// deterministic, and the merges file round-trips
	if c := learnBPE(lines, 200); !reflect.DeepEqual(c.merges, b.merges) {
		t.Errorf("two runs learned different merges")
	}
	p := filepath.Join(t.TempDir(), "bpe.codes")
	if err := b.WriteFile(p); err != nil {
		t.Fatal(err)
	}
	c, err := LoadBPE(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lines[:4] {
		if !reflect.DeepEqual(c.Apply(l), b.Apply(l)) {
			t.Errorf("loaded merges apply differently to %q", l)
		}
	}
	os.WriteFile(p, []byte("#version: gorun-bpe 1\na b\nab\n"), 0o644)
	if _, err := LoadBPE(p); err == nil || !strings.HasPrefix(err.Error(), p+":3: ") {
		t.Errorf("bad merges file: %v", err)
	}
}

// The merge order follows pair frequency, ties going to the pair of older
// symbols (base runes in byte order: "▁" sorts after ASCII); learning stops
// when no pair occurs twice.
func TestBPEMergeOrder(t *testing.T) {
	b := LearnBPECounts(map[string]int64{"ab": 10, "abc": 4, "c": 1}, 10)
	want := [][2]string{{"a", "b"}, {"▁", "ab"}, {"▁ab", "c"}}
	if !reflect.DeepEqual(b.merges, want) {
		t.Errorf("merges %q, want %q", b.merges, want)
	}
}

func batchSource(n int, seed int64) *Pairs {
	v := SyntheticVocab()
	s, g := Synthetic(seed, n)
	return &Pairs{EncodeLines(s, WordPieces, v), EncodeLines(g, WordPieces, v)}
}

func TestBatcherInvariants(t *testing.T) {
	src := batchSource(1003, 5)
	src.Src[7] = make([]int32, 40) // longer than MaxLen: skipped
	for i := range src.Src[7] {
		src.Src[7][i] = 9
	}
	cfg := BatchConfig{TokensPerBatch: 200, MaxLen: 24, Seed: 11, VocabSize: 411}
	b, err := NewBatcher(src, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if b.Skipped() != 1 || b.Lines() != src.Len()-1 {
		t.Fatalf("%d lines used, %d skipped; want %d and 1", b.Lines(), b.Skipped(), src.Len()-1)
	}
	steps := b.StepsPerEpoch()
	seen := make([]int, src.Len())
	for e := 0; e < 2; e++ {
		for k := 0; k < steps; k++ {
			bt, err := b.Next()
			if err != nil {
				t.Fatal(err)
			}
			if bt.Padded() > cfg.TokensPerBatch {
				t.Fatalf("batch of %dx(%d,%d) = %d padded tokens over %d", bt.B, bt.S, bt.T, bt.Padded(), cfg.TokensPerBatch)
			}
			checkBatch(t, src, bt)
			for _, l := range bt.Lines {
				seen[l]++
			}
		}
		if b.Epoch() != e {
			t.Fatalf("epoch %d after %d steps", b.Epoch(), (e+1)*steps)
		}
	}
	for i, c := range seen {
		want := 2
		if i == 7 {
			want = 0
		}
		if c != want {
			t.Fatalf("line %d seen %d times in 2 epochs", i, c)
		}
	}
}

// Ranks that split a batch by rows: every row in exactly one rank's
// share, rank r holding rows r, r+size, ..., in the batch's padding, with
// the right token counts. Skip passes over a batch as Next would.
func TestBatchShareAndSkip(t *testing.T) {
	src := batchSource(400, 8)
	cfg := BatchConfig{TokensPerBatch: 300, MaxLen: 24, Seed: 2}
	b, err := NewBatcher(src, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for k := 0; k < b.StepsPerEpoch(); k++ {
		bt, err := b.Next()
		if err != nil {
			t.Fatal(err)
		}
		for _, size := range []int{1, 2, 3, 5} {
			seen := map[int]int{}
			for r := 0; r < size; r++ {
				p := bt.Share(r, size)
				if p.S != bt.S || p.T != bt.T {
					t.Fatalf("share padded to (%d,%d), batch to (%d,%d)", p.S, p.T, bt.S, bt.T)
				}
				checkBatch(t, src, p)
				st, tt := 0, 0
				for _, l := range p.Lines {
					s, g := src.Pair(l)
					st, tt = st+len(s)+1, tt+len(g)+1
					seen[l]++
				}
				if p.SrcTokens != st || p.TgtTokens != tt {
					t.Fatalf("share tokens %d+%d, want %d+%d", p.SrcTokens, p.TgtTokens, st, tt)
				}
				var want []int
				for i := r; i < bt.B; i += size {
					want = append(want, bt.Lines[i])
				}
				if !reflect.DeepEqual(p.Lines, want) {
					t.Fatalf("size %d rank %d: rows %v, want %v", size, r, p.Lines, want)
				}
			}
			if len(seen) != bt.B {
				t.Fatalf("size %d: %d of %d rows", size, len(seen), bt.B)
			}
			for l, c := range seen {
				if c != 1 {
					t.Fatalf("size %d: line %d in %d shares", size, l, c)
				}
			}
		}
	}
	// Skip, across an epoch's end
	a, _ := NewBatcher(src, cfg)
	c, _ := NewBatcher(src, cfg)
	for k := 0; k < a.StepsPerEpoch()+3; k++ {
		x, _ := a.Next()
		if k%2 == 1 {
			c.Skip()
			continue
		}
		y, _ := c.Next()
		if !reflect.DeepEqual(x, y) {
			t.Fatalf("batch %d after skips differs", k)
		}
	}
	if a.Pos() != c.Pos() {
		t.Fatalf("positions %+v and %+v after as many batches", a.Pos(), c.Pos())
	}
}

// checkBatch checks the padded layout against the source lines.
func checkBatch(t *testing.T, s Source, b *Batch) {
	t.Helper()
	if len(b.Src) != b.B*b.S || len(b.Tgt) != b.B*b.T || len(b.Lines) != b.B {
		t.Fatalf("batch shape %d %d %d", b.B, b.S, b.T)
	}
	for i, l := range b.Lines {
		src, tgt := s.Pair(l)
		for _, c := range []struct {
			row  []int32
			line []int32
		}{{b.Src[i*b.S : (i+1)*b.S], src}, {b.Tgt[i*b.T : (i+1)*b.T], tgt}} {
			want := append(append(append([]int32{}, c.line...), EOS), make([]int32, len(c.row)-len(c.line)-1)...)
			if !reflect.DeepEqual(c.row, want) {
				t.Fatalf("row %d = %v, want %v", i, c.row, want)
			}
		}
	}
}

func TestBatcherDeterministicAndResume(t *testing.T) {
	src := batchSource(500, 6)
	cfg := BatchConfig{TokensPerBatch: 150, Seed: 3}
	a, _ := NewBatcher(src, cfg)
	b, _ := NewBatcher(src, cfg)
	var pos json.RawMessage
	var rest [][]int
	for k := 0; k < 3*a.StepsPerEpoch(); k++ {
		x, _ := a.Next()
		y, _ := b.Next()
		if !reflect.DeepEqual(x, y) {
			t.Fatalf("step %d differs between two batchers of the same seed", k)
		}
		if k == a.StepsPerEpoch()+5 {
			pos, _ = json.Marshal(a.Pos())
		}
		if k > a.StepsPerEpoch()+5 {
			rest = append(rest, x.Lines)
		}
	}
	// epochs differ
	c, _ := NewBatcher(src, cfg)
	first, _ := c.Next()
	for k := 1; k < c.StepsPerEpoch(); k++ {
		c.Next()
	}
	second, _ := c.Next()
	if reflect.DeepEqual(first.Lines, second.Lines) {
		t.Errorf("epochs 0 and 1 start with the same batch")
	}
	// resume: a fresh batcher restored to pos yields the same sequence,
	// also one made with another budget (a job resumed on another number
	// of ranks): it continues the position's order, of 150-token batches
	for _, tokens := range []int{150, 300} {
		cfg.TokensPerBatch = tokens
		d, _ := NewBatcher(src, cfg)
		if err := d.Restore(pos); err != nil {
			t.Fatal(err)
		}
		for k, want := range rest {
			x, _ := d.Next()
			if !reflect.DeepEqual(x.Lines, want) {
				t.Fatalf("budget %d: resumed step %d differs", tokens, k)
			}
		}
		if p := d.Pos(); p.Tokens != 150 || p.Steps != a.StepsPerEpoch() {
			t.Fatalf("budget %d: resumed position %+v", tokens, p)
		}
	}
	cfg.TokensPerBatch, cfg.Seed = 150, 4
	e, _ := NewBatcher(src, cfg)
	if err := e.Restore(pos); err == nil || !strings.Contains(err.Error(), "seed 3") {
		t.Errorf("restore with another seed: %v", err)
	}
	// positions written before the order was global: one shard continues
	// (its batches are this order's), several are refused
	cfg.Seed = 3
	var p Position
	json.Unmarshal(pos, &p)
	old := fmt.Sprintf(`{"epoch":%d,"index":%d,"seed":3,"size":1,"lines":500,"steps_per_epoch":%d}`, p.Epoch, p.Index, p.Steps)
	f, _ := NewBatcher(src, cfg)
	if err := f.Restore(json.RawMessage(old)); err != nil {
		t.Fatalf("restore a single-shard position of an older version: %v", err)
	}
	if x, _ := f.Next(); !reflect.DeepEqual(x.Lines, rest[0]) {
		t.Fatalf("a single-shard position of an older version resumes elsewhere")
	}
	old = strings.Replace(old, `"size":1`, `"size":2`, 1)
	if err := f.Restore(json.RawMessage(old)); err == nil || !strings.Contains(err.Error(), "one of 2 per-rank shards") {
		t.Errorf("restore a 2-shard position of an older version: %v", err)
	}
}

func TestBatcherErrors(t *testing.T) {
	src := batchSource(10, 6)
	if _, err := NewBatcher(src, BatchConfig{TokensPerBatch: 1}); err == nil {
		t.Errorf("a budget of 1 token accepted")
	}
	src.Tgt[3][0] = 9999
	b, _ := NewBatcher(src, BatchConfig{TokensPerBatch: 1000, VocabSize: 411})
	var err error
	for k := 0; k < b.StepsPerEpoch() && err == nil; k++ {
		_, err = b.Next()
	}
	if err == nil || !strings.Contains(err.Error(), "line 4 has id 9999") {
		t.Errorf("bad id: %v", err)
	}
	// the first id outside the vocabulary is its size
	src = batchSource(10, 6)
	src.Src[5][0] = 411
	b2, _ := NewBatcher(src, BatchConfig{TokensPerBatch: 1000, VocabSize: 411})
	err = nil
	for k := 0; k < b2.StepsPerEpoch() && err == nil; k++ {
		_, err = b2.Next()
	}
	if err == nil || !strings.Contains(err.Error(), "line 6 has id 411 outside the vocabulary of 411") {
		t.Errorf("id = vocabulary size: %v", err)
	}
	if err := b.Restore(json.RawMessage(`{"epoch":0,"index":0,"seed":0,"batch_tokens":1,"lines":10,"steps_per_epoch":1}`)); err == nil {
		t.Errorf("a position with a budget of 1 token accepted")
	}
}

func unsafeBytes(u []uint64) []byte {
	if len(u) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&u[0])), 8*len(u))
}

// Apply is safe for concurrent use (run with -race) and gives the same
// pieces as on one goroutine.
func TestBPEApplyConcurrent(t *testing.T) {
	s, g := Synthetic(9, 400)
	b := learnBPE(append(append([]string{}, s...), g...), 300)
	want := make([][]string, len(s))
	ref := learnBPE(append(append([]string{}, s...), g...), 300)
	for i, l := range s {
		want[i] = ref.Apply(l)
	}
	done := make(chan error, 4)
	for w := 0; w < 4; w++ {
		go func(w int) {
			for k := 0; k < len(s); k++ {
				i := (k*7 + w*101) % len(s)
				if got := b.Apply(s[i]); !reflect.DeepEqual(got, want[i]) {
					done <- fmt.Errorf("line %d: %q, want %q", i, got, want[i])
					return
				}
			}
			done <- nil
		}(w)
	}
	for w := 0; w < 4; w++ {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// Files of several reading chunks: order kept, a late line-count mismatch
// found, an error from keep stops the reading.
func TestReadParallelEachChunks(t *testing.T) {
	dir := t.TempDir()
	s, g := Synthetic(4, 1500)
	sp := filepath.Join(dir, "s")
	gp := filepath.Join(dir, "g")
	os.WriteFile(sp, []byte(strings.Join(s, "\n")+"\n"), 0o644)
	os.WriteFile(gp, []byte(strings.Join(g, "\n")+"\n"), 0o644)
	v := SyntheticVocab()
	k := 0
	st, err := ReadParallelEach(sp, gp, WordPieces, v, 0, func(a, b []int32) error {
		if Detokenize(v.Decode(a)) != s[k] || Detokenize(v.Decode(b)) != g[k] {
			return fmt.Errorf("pair %d out of order", k)
		}
		k++
		return nil
	})
	if err != nil || k != 1500 || st.Kept != 1500 {
		t.Fatalf("%v, %d pairs", err, k)
	}
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte(strings.Join(g[:1499], "\n")+"\n"), 0o644)
	if _, err := ReadParallelEach(sp, short, WordPieces, v, 0, func(a, b []int32) error { return nil }); err == nil || err.Error() != fmt.Sprintf("%s has 1500 lines but %s has 1499: the files are not parallel", sp, short) {
		t.Errorf("late mismatch: %v", err)
	}
	stopErr := fmt.Errorf("full")
	k = 0
	if _, err := ReadParallelEach(sp, gp, WordPieces, v, 0, func(a, b []int32) error {
		if k++; k == 700 {
			return stopErr
		}
		return nil
	}); err != stopErr || k != 700 {
		t.Errorf("keep's error: %v after %d pairs", err, k)
	}
}

// learnBPE learns merges jointly over lines' whitespace-separated words,
// as prepare does over its files (CountPieces with strings.Fields).
func learnBPE(lines []string, merges int) *BPE {
	counts := map[string]int64{}
	for _, l := range lines {
		for _, w := range strings.Fields(l) {
			counts[w]++
		}
	}
	return LearnBPECounts(counts, merges)
}

// The --max-length boundary (a side of exactly maxLen tokens with EOS is
// kept, one more is dropped), the longer side deciding, the length
// histogram's bins ((k*8, (k+1)*8], dropped long pairs included) and the
// size of both files on disk.
func TestReadParallelLengthsAndStats(t *testing.T) {
	dir := t.TempDir()
	words := func(n int) string { return strings.TrimSpace(strings.Repeat("▁x ", n)) }
	// longer side with EOS: 8, 9 (the target), 16, 17
	sp := filepath.Join(dir, "s")
	gp := filepath.Join(dir, "g")
	os.WriteFile(sp, []byte(words(7)+"\n"+words(1)+"\n"+words(15)+"\n"+words(2)+"\n"), 0o644)
	os.WriteFile(gp, []byte(words(3)+"\n"+words(8)+"\n"+words(1)+"\n"+words(16)+"\n"), 0o644)
	src, tgt, st, err := ReadParallelFunc(sp, gp, SplitPieces, SyntheticVocab(), 9)
	if err != nil {
		t.Fatal(err)
	}
	if st.Lines != 4 || st.Kept != 2 || st.DroppedLong != 2 || len(src) != 2 || len(src[0]) != 7 || len(tgt[1]) != 8 {
		t.Errorf("max length 9 (a pair of 9 tokens with EOS is kept, 16 and 17 are dropped): %s", st.String())
	}
	if st.SrcTokens != 8 || st.TgtTokens != 11 || st.SrcUnk != 8 || st.TgtUnk != 11 {
		t.Errorf("tokens of the kept pairs: %s", st.String())
	}
	if want := []int64{1, 2, 1}; !reflect.DeepEqual(st.Hist, want) {
		t.Errorf("histogram of lengths 8, 9, 16, 17 in bins of 8: %v, want %v", st.Hist, want)
	}
	var size int64
	for _, p := range []string{sp, gp} {
		fi, _ := os.Stat(p)
		size += fi.Size()
	}
	if st.Bytes != size {
		t.Errorf("Bytes = %d, want both files' %d", st.Bytes, size)
	}
	var sb strings.Builder
	st.Markdown(&sb, "train")
	for _, want := range []string{"| 1-8 | 1 | ", "| 9-16 | 2 | ", "| 17-24 | 1 | "} {
		if !strings.Contains(sb.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, sb.String())
		}
	}
}

// A line longer than the scanner's limit is an error naming file:line,
// not the end of the file (which would read as a line-count mismatch or
// silently drop the rest).
func TestReadLineTooLong(t *testing.T) {
	dir := t.TempDir()
	sp := filepath.Join(dir, "s")
	gp := filepath.Join(dir, "g")
	os.WriteFile(sp, []byte("▁a\n▁b\n▁c\n"), 0o644)
	os.WriteFile(gp, []byte("▁a\n"+strings.Repeat("x", maxLineBytes+1)+"\n▁c\n"), 0o644)
	want := gp + ":2: bufio.Scanner: token too long"
	if _, _, _, err := ReadParallelFunc(sp, gp, SplitPieces, SyntheticVocab(), 0); err == nil || err.Error() != want {
		t.Errorf("ReadParallelFunc: %v, want %s", err, want)
	}
	if _, err := CountPieces(SplitPieces, sp, gp); err == nil || err.Error() != want {
		t.Errorf("CountPieces: %v, want %s", err, want)
	}
}

// CountPieces and ReadLines (prepare's counting passes, bleu's references)
// name file:line of invalid UTF-8.
func TestCountPiecesErrors(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	bad := filepath.Join(dir, "bad")
	os.WriteFile(good, []byte("▁a ▁b\n▁a\n"), 0o644)
	os.WriteFile(bad, []byte("▁a\n▁b\n▁c \xff\n"), 0o644)
	counts, err := CountPieces(SplitPieces, good, good)
	if err != nil || !reflect.DeepEqual(counts, map[string]int64{"▁a": 4, "▁b": 2}) {
		t.Errorf("counts %v, %v", counts, err)
	}
	if _, err := CountPieces(SplitPieces, good, bad); err == nil || err.Error() != bad+":3: invalid UTF-8" {
		t.Errorf("CountPieces: %v, want %s:3: invalid UTF-8", err, bad)
	}
	if _, err := ReadLines(bad); err == nil || err.Error() != bad+":3: invalid UTF-8" {
		t.Errorf("ReadLines: %v, want %s:3: invalid UTF-8", err, bad)
	}
}

// The hash identifies the pieces in id order (not the scores): a
// vocabulary of the same size with other pieces or another order is
// refused by CheckVocab.
func TestVocabHashAndCheck(t *testing.T) {
	ab, _ := NewVocab([]string{"ab", "c"})
	abSwapped, _ := NewVocab([]string{"c", "ab"})
	split, _ := NewVocab([]string{"a", "bc"})
	if ab.Hash() == abSwapped.Hash() || ab.Hash() == split.Hash() {
		t.Errorf("pieces [ab c], [c ab] and [a bc] share a hash: %s %s %s", ab.Hash(), abSwapped.Hash(), split.Hash())
	}
	rescored, err := ParseVocab([]byte("<pad>\t0\n</s>\t0\n<s>\t0\n<unk>\t0\nab\t-5.5\nc\t-7\n"))
	if err != nil || rescored.Hash() != ab.Hash() {
		t.Errorf("other scores changed the hash: %v", err)
	}
	p := filepath.Join(t.TempDir(), "c.bin")
	if err := WriteCorpus(p, [][]int32{{4}}, [][]int32{{5}}, ab.Hash(), ab.Size(), 0); err != nil {
		t.Fatal(err)
	}
	c, err := OpenCorpus(p)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.CheckVocab(ab); err != nil {
		t.Errorf("its own vocabulary: %v", err)
	}
	for _, other := range []*Vocab{abSwapped, split} {
		if err := c.CheckVocab(other); err == nil || !strings.HasPrefix(err.Error(), p+": made with a vocabulary of 6 pieces") {
			t.Errorf("a vocabulary of the same size with other pieces: %v", err)
		}
	}
}

// Decode skips PAD and BOS anywhere and stops at EOS; Piece outside the
// vocabulary is <unk>, never a panic.
func TestVocabDecodeSpecials(t *testing.T) {
	v, _ := NewVocab([]string{"▁a", "▁b", "▁c"})
	a, b, c := v.ID("▁a"), v.ID("▁b"), v.ID("▁c")
	if got := v.Decode([]int32{BOS, a, PAD, b, PAD, EOS, c}); !reflect.DeepEqual(got, []string{"▁a", "▁b"}) {
		t.Errorf("Decode = %q, want [▁a ▁b]", got)
	}
	for _, id := range []int32{-1, int32(v.Size()), 1 << 30} {
		if p := v.Piece(id); p != UNKPiece {
			t.Errorf("Piece(%d) = %q, want %s", id, p, UNKPiece)
		}
	}
}

// More vocabulary file errors and forms: a piece with a space is an error
// naming the line; CRLF line ends read as LF ones; WriteFile keeps scores.
func TestVocabFileForms(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "space")
	os.WriteFile(p, []byte("<pad>\t0\n</s>\t0\n<s>\t0\n<unk>\t0\na b\t-1\n"), 0o644)
	if _, err := LoadVocab(p); err == nil || err.Error() != p+`:5: piece "a b" contains a space` {
		t.Errorf("space: %v", err)
	}
	lf := "<pad>\t0\n</s>\t0\n<s>\t0\n<unk>\t0\n▁a\t-1\n▁b\n"
	want, err := ParseVocab([]byte(lf))
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseVocab([]byte(strings.ReplaceAll(lf, "\n", "\r\n")))
	if err != nil || got.Hash() != want.Hash() || got.ID("▁b") != 5 {
		t.Errorf("CRLF vocabulary: %v", err)
	}
	v, err := LoadVocab("testdata/m_common.vocab")
	if err != nil {
		t.Fatal(err)
	}
	p = filepath.Join(dir, "copy")
	if err := v.WriteFile(p); err != nil {
		t.Fatal(err)
	}
	w, err := LoadVocab(p)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(w.scores, v.scores) || v.scores[10] == 0 {
		t.Errorf("WriteFile lost the scores: %v, want %v", w.scores[:12], v.scores[:12])
	}
}

// LearnBPECounts stops at the number of merges asked for, and a shorter
// run learns a prefix of a longer one.
func TestBPEMergeLimit(t *testing.T) {
	counts := map[string]int64{"abcdef": 10, "abcxyz": 7, "defxyz": 5}
	all := LearnBPECounts(counts, 100)
	if all.NumMerges() < 5 {
		t.Fatalf("only %d merges learned", all.NumMerges())
	}
	for _, m := range []int{1, 2, 4} {
		b := LearnBPECounts(counts, m)
		if b.NumMerges() != m || !reflect.DeepEqual(b.merges, all.merges[:m]) {
			t.Errorf("%d merges asked: got %q, want %q", m, b.merges, all.merges[:m])
		}
	}
}

// Apply merges the lowest-ranked (earliest) pair first, and a pair listed
// twice in a merges file keeps its first rank (as subword-nmt does).
func TestBPEApplyRankOrder(t *testing.T) {
	dir := t.TempDir()
	for name, c := range map[string]struct {
		merges string
		want   []string
	}{
		"bc first":  {"b c\na b\n", []string{"▁", "a", "bc"}},
		"ab first":  {"a b\nb c\n", []string{"▁", "ab", "c"}},
		"duplicate": {"b c\na b\nb c\n", []string{"▁", "a", "bc"}},
	} {
		p := filepath.Join(dir, strings.ReplaceAll(name, " ", "_"))
		os.WriteFile(p, []byte(bpeHeader+"\n"+c.merges), 0o644)
		b, err := LoadBPE(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := b.Apply("abc"); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: Apply(abc) = %q, want %q", name, got, c.want)
		}
	}
}

// LoadBPE refuses what WriteFile would not write, naming file:line.
func TestLoadBPEErrors(t *testing.T) {
	dir := t.TempDir()
	for name, c := range map[string]struct{ text, want string }{
		"header":    {"#version: 0.2\na b\n", ":1: not a gorun BPE merges file"},
		"vocab":     {"<pad>\t0\n</s>\t0\n", ":1: not a gorun BPE merges file"},
		"empty":     {"", ": empty file, not a gorun BPE merges file"},
		"utf8":      {bpeHeader + "\na b\nc \xff\n", ":3: invalid UTF-8"},
		"three":     {bpeHeader + "\na b c\n", `:2: want two symbols separated by one space, got "a b c"`},
		"two space": {bpeHeader + "\na  b\n", ":2: want two symbols separated by one space"},
	} {
		p := filepath.Join(dir, strings.ReplaceAll(name, " ", "_"))
		os.WriteFile(p, []byte(c.text), 0o644)
		if _, err := LoadBPE(p); err == nil || !strings.HasPrefix(err.Error(), p+c.want) {
			t.Errorf("%s: %v, want prefix %s%s", name, err, p, c.want)
		}
	}
}

// More damaged corpora: trailing bytes, offsets ending short of the token
// count, another version (with a valid checksum), header counts whose size
// arithmetic overflows; each is one error naming the file, never a panic.
func TestCorpusBadFilesMore(t *testing.T) {
	dir, b := goodCorpus(t)
	le := binary.LittleEndian
	n := le.Uint64(b[16:])
	resum := func(c []byte) []byte { le.PutUint32(c[124:], crc32.ChecksumIEEE(c[:124])); return c }
	cases := map[string]struct {
		data []byte
		want string
	}{
		"trailing": {append(append([]byte{}, b...), 0, 0, 0, 0), "truncated or garbled"},
		"end offset": {func() []byte {
			c := append([]byte{}, b...)
			at := headerSize + 8*int(n)
			le.PutUint64(c[at:], le.Uint64(c[at:])-1)
			return c
		}(), "source offsets run from 0 to"},
		"version": {func() []byte {
			c := append([]byte{}, b...)
			le.PutUint32(c[8:], 2)
			return resum(c)
		}(), "corpus format version 2, this program reads version 1"},
		"overflow": {func() []byte {
			c := append([]byte{}, b[:headerSize]...)
			le.PutUint64(c[16:], 1<<60-1) // 16*(n+1) wraps to 0
			le.PutUint64(c[24:], 0)
			le.PutUint64(c[32:], 0)
			return resum(c)
		}(), "header counts out of range"},
	}
	for name, c := range cases {
		p := filepath.Join(dir, strings.ReplaceAll(name, " ", "_"))
		os.WriteFile(p, c.data, 0o644)
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s: panic %v", name, r)
				}
			}()
			_, err := OpenCorpus(p)
			if err == nil || !strings.HasPrefix(err.Error(), p+": ") || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: %v, want %q", name, err, c.want)
			}
		}()
	}
}

// WriteCorpus refuses an id equal to the vocabulary size or negative and
// sides of different lengths, and leaves nothing behind (no corpus, no
// temporary files).
func TestWriteCorpusRefusals(t *testing.T) {
	v := SyntheticVocab()
	dir := t.TempDir()
	for name, c := range map[string]struct {
		src, tgt [][]int32
		want     string
	}{
		"id = size": {[][]int32{{4}, {5}}, [][]int32{{4}, {int32(v.Size())}}, "pair 2 has id 411 outside the vocabulary of 411"},
		"negative":  {[][]int32{{-1}}, [][]int32{{4}}, "pair 1 has id -1 outside the vocabulary of 411"},
		"lengths":   {[][]int32{{4}, {5}}, [][]int32{{4}}, "2 source and 1 target lines"},
	} {
		p := filepath.Join(dir, "c.bin")
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s: panic %v", name, r)
				}
			}()
			if err := WriteCorpus(p, c.src, c.tgt, v.Hash(), v.Size(), 0); err == nil || err.Error() != p+": "+c.want {
				t.Errorf("%s: %v, want %s: %s", name, err, p, c.want)
			}
		}()
		if es, _ := os.ReadDir(dir); len(es) != 0 {
			t.Errorf("%s: left %v behind", name, es)
		}
	}
}

// The Batcher's --max-length boundary: a pair of exactly MaxLen tokens
// with EOS is used, one more is skipped.
func TestBatcherMaxLenBoundary(t *testing.T) {
	src := &Pairs{Src: [][]int32{make([]int32, 9), make([]int32, 2), make([]int32, 10)}, Tgt: [][]int32{make([]int32, 3), make([]int32, 9), make([]int32, 1)}}
	for _, s := range append(src.Src, src.Tgt...) {
		for i := range s {
			s[i] = 4
		}
	}
	b, err := NewBatcher(src, BatchConfig{TokensPerBatch: 100, MaxLen: 10, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if b.Lines() != 2 || b.Skipped() != 1 {
		t.Errorf("MaxLen 10 on pairs of 10, 10 and 11 tokens with EOS: %d used, %d skipped; want 2 and 1", b.Lines(), b.Skipped())
	}
	for k := 0; k < b.StepsPerEpoch(); k++ {
		bt, _ := b.Next()
		for _, l := range bt.Lines {
			if l == 2 {
				t.Errorf("the pair of 11 tokens with EOS is in a batch")
			}
		}
	}
}

// The order of batches is part of every checkpoint ever written: a run
// resumes (also from an older version's single-shard position) by its
// index into this order, so it must not change with a refactoring of the
// shuffles, the PCG stream or the bucketing.
func TestBatcherOrderPinned(t *testing.T) {
	p := &Pairs{}
	for i := 0; i < 60; i++ {
		s, g := make([]int32, 1+(i*7)%20), make([]int32, 1+(i*13)%20)
		for j := range s {
			s[j] = 4
		}
		for j := range g {
			g[j] = 5
		}
		p.Src, p.Tgt = append(p.Src, s), append(p.Tgt, g)
	}
	b, err := NewBatcher(p, BatchConfig{TokensPerBatch: 64, Seed: 42})
	if err != nil {
		t.Fatal(err)
	}
	if b.StepsPerEpoch() != 21 {
		t.Fatalf("%d batches per epoch, want 21", b.StepsPerEpoch())
	}
	want := [2][3][]int{{{30, 50, 10}, {37, 17}, {6, 34, 26}}, {{37, 3}, {34, 46, 54}, {21, 39}}}
	for e := range want {
		for k, w := range want[e] {
			bt, _ := b.Next()
			if !reflect.DeepEqual(bt.Lines, w) {
				t.Errorf("epoch %d batch %d: lines %v, want %v (the order of existing checkpoints changed)", e, k, bt.Lines, w)
			}
		}
		for k := len(want[e]); k < b.StepsPerEpoch(); k++ {
			b.Skip()
		}
	}
}

// What a position may be: one at an epoch's end (index = steps) continues
// with the next epoch; other corpora (line count, batches per epoch) and
// out-of-range epochs or indices are refused, naming what differs.
func TestBatcherRestoreChecks(t *testing.T) {
	src := batchSource(300, 6)
	cfg := BatchConfig{TokensPerBatch: 150, Seed: 3}
	a, _ := NewBatcher(src, cfg)
	for k := 0; k < a.StepsPerEpoch(); k++ {
		a.Skip()
	}
	end := a.Pos()
	if end.Index != end.Steps || end.Epoch != 0 {
		t.Fatalf("position after one epoch: %+v", end)
	}
	next, _ := a.Next()
	b, _ := NewBatcher(src, cfg)
	if err := b.SetPos(end); err != nil {
		t.Fatalf("a position at the end of an epoch: %v", err)
	}
	if x, _ := b.Next(); !reflect.DeepEqual(x.Lines, next.Lines) {
		t.Errorf("resumed at an epoch's end: %v, want %v", x.Lines, next.Lines)
	}
	b300, _ := NewBatcher(src, BatchConfig{TokensPerBatch: 300, Seed: 3})
	steps300 := b300.StepsPerEpoch()
	for name, c := range map[string]struct {
		edit func(*Position)
		want string
	}{
		"lines":      {func(p *Position) { p.Lines = 299 }, "299 lines"},
		"steps":      {func(p *Position) { p.Steps++ }, fmt.Sprintf("saved with %d batches of 150 tokens per epoch", end.Steps+1)},
		"index":      {func(p *Position) { p.Index = p.Steps + 1 }, "invalid data position"},
		"epoch":      {func(p *Position) { p.Epoch = -1 }, "invalid data position"},
		"index < 0":  {func(p *Position) { p.Index = -1 }, "invalid data position"},
		"seed 3 → 4": {func(p *Position) { p.Seed = 4 }, "seed 4"},
		// another budget re-plans the batches; refused, it must not stay
		"budget, steps": {func(p *Position) { p.Tokens = 300; p.Steps = 1 }, "saved with 1 batches of 300 tokens"},
		"budget, index": {func(p *Position) { p.Tokens, p.Steps, p.Index = 300, steps300, -1 }, "invalid data position"},
	} {
		p := end
		c.edit(&p)
		j, _ := json.Marshal(p)
		d, _ := NewBatcher(src, cfg)
		before := d.Pos()
		if err := d.Restore(j); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
		if d.Pos() != before {
			t.Errorf("%s: a refused position moved the batcher to %+v", name, d.Pos())
		}
	}
}

// goodCorpus writes 50 synthetic pairs as a corpus in a new directory and
// returns the directory and the file's bytes, for tests that damage them.
func goodCorpus(t *testing.T) (dir string, b []byte) {
	t.Helper()
	v := SyntheticVocab()
	s, g := Synthetic(3, 50)
	dir = t.TempDir()
	path := filepath.Join(dir, "good.bin")
	if err := WriteCorpus(path, EncodeLines(s, WordPieces, v), EncodeLines(g, WordPieces, v), v.Hash(), v.Size(), 0); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return dir, b
}

// Rows: every batch holds Rows sentence pairs of one length bucket (the
// last of a bucket fewer), every eligible line once an epoch, whatever the
// lengths; the position records the rows and continues a Batcher planned
// with a token budget by re-planning with rows, and the reverse.
func TestBatcherRows(t *testing.T) {
	src := batchSource(300, 6)
	b, err := NewBatcher(src, BatchConfig{Rows: 7, MaxLen: 20, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]int{}
	partial := 0
	for k := 0; k < b.StepsPerEpoch(); k++ {
		bt, err := b.Next()
		if err != nil {
			t.Fatal(err)
		}
		if bt.B > 7 || bt.B < 1 {
			t.Fatalf("batch %d has %d rows, want 1..7", k, bt.B)
		}
		if bt.B < 7 {
			partial++
		}
		for _, l := range bt.Lines {
			seen[l]++
		}
	}
	if len(seen) != b.Lines() || b.Lines()+b.Skipped() != 300 {
		t.Fatalf("an epoch saw %d lines, %d eligible, %d skipped", len(seen), b.Lines(), b.Skipped())
	}
	for l, n := range seen {
		if n != 1 {
			t.Fatalf("line %d seen %d times in an epoch", l, n)
		}
	}
	if partial > len(b.bounds) {
		t.Errorf("%d batches below 7 rows; at most one per bucket (%d)", partial, len(b.bounds))
	}
	if b.Pos().Rows != 7 || b.Pos().Tokens != 0 || b.Pos().BatchSize() != "7 sentence pairs" {
		t.Errorf("position %+v (%s)", b.Pos(), b.Pos().BatchSize())
	}
	// A token-budget Batcher continues a rows position with its rows.
	b.Next()
	j, _ := json.Marshal(b.Pos())
	tok, _ := NewBatcher(src, BatchConfig{TokensPerBatch: 150, MaxLen: 20, Seed: 5})
	if err := tok.Restore(j); err != nil {
		t.Fatal(err)
	}
	again, _ := NewBatcher(src, BatchConfig{Rows: 7, MaxLen: 20, Seed: 5})
	for k := 0; k < again.StepsPerEpoch()+1; k++ {
		again.Skip()
	}
	want, _ := again.Next()
	got, _ := tok.Next()
	if !reflect.DeepEqual(got.Lines, want.Lines) {
		t.Errorf("resumed rows position: lines %v, want %v", got.Lines, want.Lines)
	}
	// Without MaxLen the longest pair bounds the buckets: nothing skipped.
	all, err := NewBatcher(src, BatchConfig{Rows: 16, Seed: 5})
	if err != nil || all.Skipped() != 0 || all.Lines() != 300 {
		t.Fatalf("rows without a max length: %v, %d skipped", err, all.Skipped())
	}
	if _, err := NewBatcher(src, BatchConfig{Rows: -1}); err == nil {
		t.Error("negative rows accepted")
	}
}
