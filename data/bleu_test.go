package data

import (
	"math"
	"reflect"
	"strings"
	"testing"
)

// sacreBLEU's README example (two reference sets).
func TestCorpusBLEUSacreREADME(t *testing.T) {
	sys := []string{"The dog bit the man.", "It wasn't surprising.", "The man had just bitten him."}
	refs := [][]string{
		{"The dog bit the man.", "It was not unexpected.", "The man bit him first."},
		{"The dog had bit the man.", "No one was surprised.", "The man had bitten the dog."},
	}
	r := CorpusBLEU(sys, refs...)
	if math.Abs(r.Score-48.530827) > 1e-5 {
		t.Errorf("score %.6f, want 48.530827 (%v)", r.Score, r)
	}
	if r.Counts != [4]int{14, 7, 5, 3} || r.Totals != [4]int{17, 14, 11, 8} || r.SysLen != 17 || r.RefLen != 18 {
		t.Errorf("got %v counts %v totals %v", r, r.Counts, r.Totals)
	}
	if got, want := r.String(), "BLEU = 48.53 82.4/50.0/45.5/37.5 (BP = 0.943 ratio = 0.944 hyp_len = 17 ref_len = 18)"; got != want {
		t.Errorf("String()\n got %s\nwant %s", got, want)
	}
	if !strings.HasPrefix(r.Signature(), "nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp|version:") {
		t.Errorf("signature %s", r.Signature())
	}
}

// Hugging Face evaluate's sacrebleu metric card example scores 100.
func TestCorpusBLEUPerfect(t *testing.T) {
	r := CorpusBLEU([]string{"hello there general kenobi", "foo bar foobar"},
		[]string{"hello there general kenobi", "foo bar foobar"},
		[]string{"hello there !", "foo bar foobar"})
	if math.Abs(r.Score-100) > 1e-9 {
		t.Errorf("score %v", r)
	}
}

// torchmetrics' example: 'the cat is on the mat' against two references
// gives 0.7598 = (5/6 * 4/5 * 3/4 * 2/3)^(1/4).
func TestCorpusBLEUCat(t *testing.T) {
	r := CorpusBLEU([]string{"the cat is on the mat"}, []string{"there is a cat on the mat"}, []string{"a cat is on the mat"})
	want := 100 * math.Pow(1.0/3, 0.25)
	if math.Abs(r.Score-want) > 1e-9 || r.Counts != [4]int{5, 4, 3, 2} || r.RefLen != 6 {
		t.Errorf("got %v %v, want %.4f", r, r.Counts, want)
	}
}

// Exp smoothing: no 4-gram match gives precision 100/(2*total); a brevity
// penalty applies; no unigram match gives 0.
func TestCorpusBLEUSmoothing(t *testing.T) {
	r := CorpusBLEU([]string{"a b c d"}, []string{"a b c x y"})
	p := [4]float64{75, 100 * 2.0 / 3, 50, 100 / (2 * 1.0)}
	bp := math.Exp(1 - 5.0/4)
	want := bp * math.Exp((math.Log(p[0])+math.Log(p[1])+math.Log(p[2])+math.Log(p[3]))/4)
	if r.Precisions != p || math.Abs(r.BP-bp) > 1e-12 || math.Abs(r.Score-want) > 1e-9 {
		t.Errorf("got %v %v, want %v %v", r, r.Precisions, want, p)
	}
	if r := CorpusBLEU([]string{"x y"}, []string{"a b"}); r.Score != 0 {
		t.Errorf("no match scored %v", r)
	}
	if r := CorpusBLEU([]string{""}, []string{"a b"}); r.Score != 0 || r.BP != 0 {
		t.Errorf("empty hypothesis scored %v", r)
	}
}

func TestTokenize13a(t *testing.T) {
	for in, want := range map[string]string{
		"Hello, world.":               "Hello , world .",
		"It costs $3.50, or 1,000.":   "It costs $ 3.50 , or 1,000 .",
		"state-of-the-art 1990-2000":  "state-of-the-art 1990 - 2000",
		"a &amp; b &quot;c&quot;":     `a & b " c "`,
		"(Ärger) über [x] {y}: ü/z?!": "( Ärger ) über [ x ] { y } : ü / z ? !",
		"  many   spaces\there ":      "many spaces here",
		"don't 'quote'":               "don't 'quote'", // the apostrophe is not in 13a's class
		"a &lt;b&gt; c":               "a < b > c",
		"x<skipped> y":                "x y",
	} {
		if got := strings.Join(Tokenize13a(in), " "); got != want {
			t.Errorf("Tokenize13a(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestTokenizedBLEU(t *testing.T) {
	h := [][]string{strings.Fields("▁the ▁cat ▁is ▁on ▁the ▁mat")}
	if got := TokenizedBLEU(h, h); math.Abs(got-1) > 1e-12 {
		t.Errorf("identical: %v", got)
	}
	r := [][]string{strings.Fields("▁a ▁cat ▁is ▁on ▁the ▁mat")}
	// 5/6, 4/5, 3/4, 2/3 with the same length: BP 1.
	if got, want := TokenizedBLEU(h, r), math.Pow(1.0/3, 0.25); math.Abs(got-want) > 1e-12 {
		t.Errorf("got %v want %v", got, want)
	}
	// no smoothing: a missing 4-gram match gives 0
	if got := TokenizedBLEU([][]string{{"a", "b", "c", "d"}}, [][]string{{"a", "b", "c", "x"}}); got != 0 {
		t.Errorf("unsmoothed got %v", got)
	}
	if !reflect.DeepEqual(Tokenize13a(""), []string(nil)) && len(Tokenize13a("")) != 0 {
		t.Errorf("empty")
	}
}

// Vectors of sacreBLEU's own test suite (test/test_bleu.py).
func TestBLEUSacreTestSuite(t *testing.T) {
	sys := []string{"The dog bit the man.", "It wasn't surprising.", "The man had just bitten him."}
	refs := [][]string{
		{"The dog bit the man.", "It was not unexpected.", "The man bit him first."},
		{"The dog had bit the man.", "No one was surprised.", "The man had bitten the dog."},
	}
	// empty hypotheses are scored, not removed: 0
	if r := CorpusBLEU([]string{"", "", ""}, refs...); r.Score != 0 || r.RefLen != 6+5+6 {
		t.Errorf("empty hypotheses: %v", r)
	}
	// tokenize='none': 49.1919566
	hs := make([][]string, len(sys))
	rs := make([][][]string, len(sys))
	for i := range sys {
		hs[i] = strings.Fields(sys[i])
		rs[i] = [][]string{strings.Fields(refs[0][i]), strings.Fields(refs[1][i])}
	}
	if r := bleu(hs, rs, true); math.Abs(r.Score-49.1919566) > 1e-6 {
		t.Errorf("tokenize none: %v", r.Score)
	}
	// statistics
	r := CorpusBLEU([]string{"am I am a character sequence"}, []string{"I am a symbol string sequence a a"})
	if r.Counts != [4]int{4, 2, 1, 0} || r.Totals != [4]int{6, 5, 4, 3} {
		t.Errorf("statistics %v %v", r.Counts, r.Totals)
	}
	// scoring from statistics: 0.8375922397
	s := BLEUResult{Counts: [4]int{9, 7, 5, 3}, Totals: [4]int{10, 8, 6, 4}, SysLen: 11, RefLen: 11}
	s.score(true)
	if math.Abs(s.Score/100-0.8375922397) > 1e-8 {
		t.Errorf("scoring: %v", s.Score)
	}
}

// The closest reference length goes to the shorter reference on a tie
// (hypothesis of 5 tokens, references of 4 and 6): ref_len 4, no brevity
// penalty.
func TestCorpusBLEUClosestRefTie(t *testing.T) {
	for _, refs := range [][][]string{{{"a b c d"}, {"a b c d e f"}}, {{"a b c d e f"}, {"a b c d"}}} {
		r := CorpusBLEU([]string{"a b c d e"}, refs...)
		if r.RefLen != 4 || r.BP != 1 {
			t.Errorf("refs %q: ref_len %d BP %v, want 4 and 1", refs, r.RefLen, r.BP)
		}
	}
}

// n-grams are sequences of tokens, not of characters: "ab c" and "a bc"
// share no bigram.
func TestCorpusBLEUNgramBoundaries(t *testing.T) {
	r := CorpusBLEU([]string{"ab c x y"}, []string{"a bc x y"})
	if r.Counts != [4]int{2, 1, 0, 0} || r.Totals != [4]int{4, 3, 2, 1} {
		t.Errorf("counts %v totals %v, want [2 1 0 0] of [4 3 2 1]", r.Counts, r.Totals)
	}
}

// A segment shorter than n adds no n-grams (not a negative count): a
// perfect corpus with one-word segments scores 100.
func TestCorpusBLEUShortSegments(t *testing.T) {
	segs := []string{"a b c d", "x", "y z"}
	r := CorpusBLEU(segs, segs)
	if r.Totals != [4]int{7, 4, 2, 1} || r.Counts != r.Totals || math.Abs(r.Score-100) > 1e-9 {
		t.Errorf("score %v, counts %v of %v; want 100, totals [7 4 2 1]", r.Score, r.Counts, r.Totals)
	}
}
