package data

// Issue 40, item 5: applying a BPE was quadratic in a word's length (a
// 1 MB word took over 10 minutes), prepare learned and applied BPE on
// any word however long, and its length histogram printed a row for every
// 8 tokens up to the longest line. These tests use only what the code
// before the fix had (Apply, Prepare, Stats.Markdown), so that they run
// against it too; prepare_ctx_test.go tests what the fix added.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"
)

// refSegment is Apply's word segmentation as it was before the heap
// (data/bpe.go at 1476090), kept as the reference the new one must match
// byte for byte: find the adjacent pair of the lowest merge index (the
// leftmost on a tie), merge it, look again.
func refSegment(b *BPE, w string) []string {
	type bpeSym struct {
		id         int32
		start, end int32
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
	return pieces
}

// refApply is Apply with refSegment: words split at white space as
// unicode.IsSpace says (Apply's rule).
func refApply(b *BPE, line string) []string {
	out := []string{}
	for _, w := range strings.FieldsFunc(line, unicode.IsSpace) {
		out = append(out, refSegment(b, w)...)
	}
	return out
}

// checkSame fails unless b.Apply and the reference agree on every line
// (b's word cache is cleared first, so each word is segmented anew).
func checkSame(t *testing.T, what string, b *BPE, lines []string) {
	t.Helper()
	b.mu.Lock()
	clear(b.cache)
	b.mu.Unlock()
	bad := 0
	for _, l := range lines {
		got, want := b.Apply(l), refApply(b, l)
		if len(got) == 0 && len(want) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, want) {
			if bad++; bad <= 3 {
				t.Errorf("%s: Apply(%.80q)\n got %.200q\nwant %.200q", what, l, got, want)
			}
		}
	}
	if bad > 3 {
		t.Errorf("%s: %d lines differ in all", what, bad)
	}
}

// realText is the repository's documentation and the data package's own
// source, one line each: English prose with code, punctuation, numbers,
// Markdown, ▁, arrows and other non-ASCII.
func realText(t testing.TB) []string {
	t.Helper()
	var lines []string
	ps, _ := filepath.Glob("../docs/*.md")
	gs, _ := filepath.Glob("*.go")
	for _, p := range append(append(ps, "../README.md"), gs...) {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		lines = append(lines, strings.Split(string(b), "\n")...)
	}
	if len(lines) < 1000 {
		t.Fatalf("found %d lines of documentation and source, want more", len(lines))
	}
	return lines
}

// Apply's pieces are those of the plain loop for every input: BPE learned
// on real text (the docs and sources) applied to all of it and to the
// synthetic corpus; on random words; and random merge lists (merges out of
// learning order, duplicates, merges of unknown symbols, ▁ inside a piece)
// on random words with invalid UTF-8, U+FFFD, unknown runes and long runs
// of one letter (ties between equal pairs go to the leftmost).
func TestBPESegmentSameAsReference(t *testing.T) {
	real := realText(t)
	for _, merges := range []int{50, 3000} {
		b := learnBPE(real[:len(real)/2], merges)
		checkSame(t, fmt.Sprintf("docs BPE of %d merges on the docs", b.NumMerges()), b, real)
		s, g := Synthetic(SyntheticTrainSeed, 2000)
		checkSame(t, "docs BPE on the synthetic corpus", b, append(s, g...))
		// whole lines glued into one word: long words of real pieces
		var glued []string
		for i := 0; i+20 < len(real); i += 97 {
			glued = append(glued, strings.Join(strings.Fields(strings.Join(real[i:i+20], " ")), ""))
		}
		checkSame(t, "docs BPE on lines without their spaces", b, glued)
	}

	rng := rand.New(rand.NewPCG(40, 5))
	alphabet := []string{"a", "b", "c", "é", "▁", "\uFFFD", "z", "\xff", "\xe2\x96", "字"}
	randWord := func(n, letters int) string {
		var sb strings.Builder
		for i := 0; i < n; i++ {
			sb.WriteString(alphabet[rng.IntN(letters)])
		}
		return sb.String()
	}
	var words []string
	for i := 0; i < 3000; i++ {
		words = append(words, randWord(1+rng.IntN(12), 4))
	}
	counts := map[string]int64{}
	for _, w := range words {
		counts[w] += int64(1 + rng.IntN(5))
	}
	learned := LearnBPECounts(counts, 400)
	var lines []string
	for i := 0; i < 2000; i++ {
		lines = append(lines, randWord(rng.IntN(40), len(alphabet)))
	}
	for _, n := range []int{300, 2000, 5000} {
		lines = append(lines, randWord(n, 3), strings.Repeat("a", n), strings.Repeat("ab", n/2), strings.Repeat("aab", n/3))
	}
	lines = append(lines, "", " ", "a b\tc\u3000a\u0085b\u00a0c", "\uFFFD", "\xff\xfe", "▁▁▁")
	checkSame(t, "a BPE learned on random words", learned, lines)

	for trial := 0; trial < 300; trial++ {
		syms := []string{"a", "b", "c", "é", "▁", "\uFFFD"}
		var ms [][2]string
		for m := rng.IntN(60); m > 0; m-- {
			x, y := syms[rng.IntN(len(syms))], syms[rng.IntN(len(syms))]
			switch rng.IntN(10) {
			case 0:
				y = "q" // a symbol no word has
			case 1:
				if len(ms) > 0 {
					ms = append(ms, ms[rng.IntN(len(ms))]) // a duplicate
					continue
				}
			}
			ms = append(ms, [2]string{x, y})
			syms = append(syms, x+y)
		}
		rng.Shuffle(len(ms), func(i, j int) {
			if rng.IntN(4) == 0 { // some merges before the ones making their parts
				ms[i], ms[j] = ms[j], ms[i]
			}
		})
		b := &BPE{merges: ms}
		b.build()
		var lines []string
		for i := 0; i < 40; i++ {
			lines = append(lines, randWord(rng.IntN(30), 7)+" "+randWord(rng.IntN(8), len(alphabet)))
		}
		lines = append(lines, randWord(1000, 3), strings.Repeat("a", 257), strings.Repeat("▁a", 100))
		checkSame(t, fmt.Sprintf("random merge list %d (%d merges)", trial, len(ms)), b, lines)
		if t.Failed() {
			t.Fatalf("merges: %q", ms)
		}
	}
}

// A 1 MB word is segmented (it took over 10 minutes when each merge
// rescanned the word; now about 0.2 s, a few seconds under the race
// detector). The guard is for a hang, not a speed claim.
func TestBPELongWordFinishes(t *testing.T) {
	b := learnBPE(realText(t), 3000)
	rng := rand.New(rand.NewPCG(1, 2))
	var sb strings.Builder
	for sb.Len() < 1<<20 {
		// letters, and now and then a real word: many merges apply
		if rng.IntN(4) == 0 {
			sb.WriteString("translation")
		} else {
			sb.WriteByte(byte('a' + rng.IntN(26)))
		}
	}
	word := sb.String()
	done := make(chan []string, 1)
	go func() { done <- b.Apply(word) }()
	select {
	case p := <-done:
		if strings.Join(p, "") != WordBoundary+word || len(p) >= utf8.RuneCountInString(word) {
			t.Fatalf("the pieces of a 1 MB word: %d pieces, not the word's %d bytes merged", len(p), len(word))
		}
	case <-time.After(3 * time.Minute):
		t.Fatal("a 1 MB word not segmented after 3 minutes: quadratic again?")
	}
}

// maxWord is DefaultMaxWordBytes, spelled out so that this file compiles
// against the code before it.
const maxWord = 4192

// A word longer than DefaultMaxWordBytes in raw text is refused naming
// file:line (with its length and first bytes), in the training files
// (before the BPE is learned or applied to it) and in the validation
// files, and --out is left as it was.
func TestPrepareLongWordRefused(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	long := strings.Repeat("QUJD", 1<<18) // 1 MiB of base64-looking text
	ok := "the house is small\nthe garden is big\nwe have rooms\n"
	src := write("src", ok)
	tgt := write("tgt", "das Haus ist klein\nder Garten ist gross\nwir haben "+long+" Zimmer\n")
	vsrc := write("vsrc", "a house\nbig rooms\n")
	vtgt := write("vtgt", "ein Haus\n"+strings.Repeat("x", maxWord+1)+"\n")
	good := write("good", ok)
	want := func(p string, line, n int, head string) string {
		return fmt.Sprintf("%s:%d: a word of %d bytes without white space at byte %d (%q...) is longer than --max-word-bytes %d: ", p, line, n, 11, head, maxWord)
	}
	codes := filepath.Join(dir, "codes")
	if err := learnBPE(strings.Split(ok, "\n"), 10).WriteFile(codes); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what string
		cfg  PrepareConfig
		want string
	}{
		{"the validation files", PrepareConfig{Src: src, Tgt: good, BPE: codes, ValidSrc: vsrc, ValidTgt: vtgt}, ""},
		{"learning a BPE", PrepareConfig{Src: src, Tgt: tgt, BPEMerges: 20, ValidLines: 1}, want(tgt, 3, len(long), long[:20])},
		{"applying a BPE", PrepareConfig{Src: src, Tgt: tgt, BPE: codes, ValidLines: 1}, want(tgt, 3, len(long), long[:20])},
	} {
		out := filepath.Join(dir, "out-"+strings.ReplaceAll(c.what, " ", "-"))
		c.cfg.Out = out
		if c.want == "" {
			c.want = fmt.Sprintf("%s:2: a word of %d bytes without white space at byte 1 (%q...) is longer than --max-word-bytes %d: ", vtgt, maxWord+1, strings.Repeat("x", 20), maxWord)
		}
		done := make(chan error, 1)
		go func() {
			_, err := Prepare(context.Background(), c.cfg)
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.HasPrefix(err.Error(), c.want) {
				t.Errorf("%s: %v\nwant %s...", c.what, err, c.want)
			}
		case <-time.After(3 * time.Minute):
			t.Fatalf("%s: prepare with a 1 MB word still running after 3 minutes", c.what)
		}
		if ents, _ := os.ReadDir(out); len(ents) != 0 {
			t.Errorf("%s: %s holds %d entries after the refusal, want none", c.what, out, len(ents))
		}
	}
}

// A line of 150,000 pieces adds a few rows to the report's length
// histogram (the empty ranges collapsed, ranges doubling above 256
// tokens), not 19,000 rows of 8.
func TestStatsMarkdownLongLine(t *testing.T) {
	dir := t.TempDir()
	sp, gp := filepath.Join(dir, "s"), filepath.Join(dir, "g")
	os.WriteFile(sp, []byte("▁a ▁b\n"+strings.Repeat("▁x ", 150000)+"\n▁a ▁b ▁c\n"), 0o644)
	os.WriteFile(gp, []byte("▁a\n▁y\n"+strings.Repeat("▁z ", 300)+"\n"), 0o644)
	_, _, st, err := ReadParallelFunc(sp, gp, SplitPieces, SyntheticVocab(), 0)
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	st.Markdown(&sb, "train")
	var rows []string
	for _, l := range strings.Split(sb.String(), "\n") {
		if strings.HasPrefix(l, "| ") && strings.Count(l, "|") == 4 && l[2] >= '0' && l[2] <= '9' {
			rows = append(rows, l)
		}
	}
	// lengths with EOS: 3, 150001, 301
	want := []string{
		"| 1-8 | 1 | " + strings.Repeat("#", 40) + " |",
		"| 9-256 | 0 |  |",
		"| 257-512 | 1 | " + strings.Repeat("#", 40) + " |",
		"| 513-131072 | 0 |  |",
		"| 131073-262144 | 1 | " + strings.Repeat("#", 40) + " |",
	}
	if !reflect.DeepEqual(rows, want) {
		t.Errorf("histogram rows (%d):\n%s\nwant:\n%s", len(rows), strings.Join(rows[:min(len(rows), 12)], "\n"), strings.Join(want, "\n"))
	}
}

// BenchmarkBPEApplyWords segments distinct words of real text (the docs
// and sources) without the word cache (each word is forgotten after it is
// applied): the cost of segmentation itself, which BenchmarkBPEApply in
// bench/ mostly hides behind the cache.
//
//	go test -run '^$' -bench BPEApplyWords -count 5 ./data/
func BenchmarkBPEApplyWords(b *testing.B) {
	real := realText(b)
	bpe := learnBPE(real, 8000)
	seen := map[string]bool{}
	var words []string
	for _, l := range real {
		for _, w := range strings.Fields(l) {
			if !seen[w] {
				seen[w] = true
				words = append(words, w)
			}
		}
	}
	b.ResetTimer()
	pieces := 0
	for i := 0; i < b.N; i++ {
		w := words[i%len(words)]
		pieces += len(bpe.Apply(w))
		delete(bpe.cache, w)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "words/s")
	b.ReportMetric(float64(pieces)/float64(b.N), "pieces/word")
}

// BenchmarkBPEApplyLongWord segments one word of 1 K, 20 K and 40 K bytes
// (letters and a real word now and then), uncached.
//
//	go test -run '^$' -bench BPEApplyLongWord -benchtime 3x ./data/
func BenchmarkBPEApplyLongWord(b *testing.B) {
	bpe := learnBPE(realText(b), 8000)
	for _, n := range []int{1000, 20000, 40000} {
		rng := rand.New(rand.NewPCG(1, 2))
		var sb strings.Builder
		for sb.Len() < n {
			if rng.IntN(4) == 0 {
				sb.WriteString("translation")
			} else {
				sb.WriteByte(byte('a' + rng.IntN(26)))
			}
		}
		w := sb.String()
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				bpe.Apply(w)
				delete(bpe.cache, w)
			}
		})
	}
}
