package data

import (
	"fmt"
	"math"
	"regexp"
	"strings"
)

// BLEUVersion names this implementation in signatures.
const BLEUVersion = "gorun-1"

// BLEUResult is a corpus-level BLEU score computed as sacreBLEU does by
// default (4-grams, 13a tokenizer, exp smoothing, closest reference length,
// mixed case).
type BLEUResult struct {
	Score      float64    // 0-100
	Counts     [4]int     // clipped n-gram matches
	Totals     [4]int     // hypothesis n-grams
	Precisions [4]float64 // 0-100
	BP         float64
	Ratio      float64 // SysLen / RefLen
	SysLen     int
	RefLen     int
	NRefs      int
}

// Signature describes the settings, in sacreBLEU's format, with gorun's
// version: the numbers are comparable with sacreBLEU's of the same
// settings.
func (r BLEUResult) Signature() string {
	return fmt.Sprintf("nrefs:%d|case:mixed|eff:no|tok:13a|smooth:exp|version:%s", max(r.NRefs, 1), BLEUVersion)
}

// String formats the result as sacreBLEU's text output does.
func (r BLEUResult) String() string {
	return fmt.Sprintf("BLEU = %.2f %.1f/%.1f/%.1f/%.1f (BP = %.3f ratio = %.3f hyp_len = %d ref_len = %d)",
		r.Score, r.Precisions[0], r.Precisions[1], r.Precisions[2], r.Precisions[3], r.BP, r.Ratio, r.SysLen, r.RefLen)
}

var (
	re13aPunct  = regexp.MustCompile(`([\{-\~\[-\x60 -\&\(-\+\:-\@/])`)
	re13aPeriod = regexp.MustCompile(`([^0-9])([\.,])`)
	re13aPerio2 = regexp.MustCompile(`([\.,])([^0-9])`)
	re13aDash   = regexp.MustCompile(`([0-9])(-)`)
)

// Tokenize13a is sacreBLEU's default tokenizer (mteval-v13a): unescape a
// few XML entities, split off punctuation and symbols, split periods and
// commas except inside numbers, and a dash after a digit.
func Tokenize13a(line string) []string {
	line = strings.ReplaceAll(line, "<skipped>", "")
	line = strings.ReplaceAll(line, "-\n", "")
	line = strings.ReplaceAll(line, "\n", " ")
	if strings.Contains(line, "&") {
		line = strings.ReplaceAll(line, "&quot;", `"`)
		line = strings.ReplaceAll(line, "&amp;", "&")
		line = strings.ReplaceAll(line, "&lt;", "<")
		line = strings.ReplaceAll(line, "&gt;", ">")
	}
	line = " " + line + " "
	line = re13aPunct.ReplaceAllString(line, " $1 ")
	line = re13aPeriod.ReplaceAllString(line, "$1 $2 ")
	line = re13aPerio2.ReplaceAllString(line, " $1 $2")
	line = re13aDash.ReplaceAllString(line, "$1 $2 ")
	return strings.Fields(line)
}

// ngramStats adds the clipped matches and totals of one segment.
func ngramStats(hyp []string, refs [][]string, counts, totals *[4]int) {
	for n := 1; n <= 4; n++ {
		maxRef := map[string]int{}
		for _, ref := range refs {
			for g, c := range ngrams(ref, n) {
				maxRef[g] = max(maxRef[g], c)
			}
		}
		for g, c := range ngrams(hyp, n) {
			counts[n-1] += min(c, maxRef[g])
		}
		totals[n-1] += max(0, len(hyp)-n+1)
	}
}

// ngrams counts the n-grams of toks, joined by NUL.
func ngrams(toks []string, n int) map[string]int {
	m := make(map[string]int, len(toks))
	for i := 0; i+n <= len(toks); i++ {
		m[strings.Join(toks[i:i+n], "\x00")]++
	}
	return m
}

// closestRefLen is the reference length closest to hypLen, the shorter on
// ties.
func closestRefLen(hypLen int, refs [][]string) int {
	best, diff := -1, 0
	for _, r := range refs {
		d := len(r) - hypLen
		if d < 0 {
			d = -d
		}
		if best < 0 || d < diff || (d == diff && len(r) < best) {
			best, diff = len(r), d
		}
	}
	return max(best, 0)
}

// CorpusBLEU scores detokenized hypotheses against one or more reference
// sets (refs[k][i] is reference k of segment i), like
// sacrebleu.corpus_bleu(hyps, refs). Missing segments count as empty.
func CorpusBLEU(hyps []string, refs ...[]string) BLEUResult {
	tok := func(s string) []string { return Tokenize13a(strings.TrimSpace(s)) }
	hs := make([][]string, len(hyps))
	rs := make([][][]string, len(hyps))
	for i, h := range hyps {
		hs[i] = tok(h)
		for _, set := range refs {
			if i < len(set) {
				rs[i] = append(rs[i], tok(set[i]))
			} else {
				rs[i] = append(rs[i], nil)
			}
		}
	}
	r := bleu(hs, rs, true)
	r.NRefs = len(refs)
	return r
}

func bleu(hyps [][]string, refs [][][]string, smoothExp bool) BLEUResult {
	var r BLEUResult
	for i, h := range hyps {
		r.SysLen += len(h)
		r.RefLen += closestRefLen(len(h), refs[i])
		ngramStats(h, refs[i], &r.Counts, &r.Totals)
	}
	r.score(smoothExp)
	return r
}

// score fills Ratio, BP, Precisions and Score from the counts and lengths.
func (r *BLEUResult) score(smoothExp bool) {
	if r.RefLen > 0 {
		r.Ratio = float64(r.SysLen) / float64(r.RefLen)
	}
	r.BP = 1
	if r.SysLen < r.RefLen {
		r.BP = 0
		if r.SysLen > 0 {
			r.BP = math.Exp(1 - float64(r.RefLen)/float64(r.SysLen))
		}
	}
	smooth := 1.0
	for n := 0; n < 4; n++ {
		if r.Totals[n] == 0 {
			break
		}
		if r.Counts[n] == 0 {
			if smoothExp {
				smooth *= 2
				r.Precisions[n] = 100 / (smooth * float64(r.Totals[n]))
			}
		} else {
			r.Precisions[n] = 100 * float64(r.Counts[n]) / float64(r.Totals[n])
		}
	}
	if r.Counts[0] == 0 {
		return
	}
	var logSum float64
	for n := 0; n < 4; n++ {
		if r.Precisions[n] == 0 {
			return
		}
		logSum += math.Log(r.Precisions[n])
	}
	r.Score = r.BP * math.Exp(logSum/4)
}

// TokenizedBLEU is the lab's number: corpus BLEU-4 on already tokenized
// text (e.g. the BPE pieces), one reference, no smoothing, on a 0-1 scale
// (as nltk's corpus_bleu reports it).
func TokenizedBLEU(hyps, refs [][]string) float64 {
	rs := make([][][]string, len(hyps))
	for i := range hyps {
		if i < len(refs) {
			rs[i] = [][]string{refs[i]}
		} else {
			rs[i] = [][]string{nil}
		}
	}
	return bleu(hyps, rs, false).Score / 100
}
