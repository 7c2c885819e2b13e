package data

import (
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
)

// The built-in synthetic corpus: two made-up languages generated from a
// seed, no files. The source language is SVO with adjectives before the
// noun, determiners before it, plural nouns marked by an -s form, a
// prepositional phrase after the object and the adverb at the end of the
// clause. The target language is SOV: noun, then adjective, then the
// definite particle "ka" (indefinite: none) or a numeral; the object is
// followed by the case particle "wo"; the place phrase comes before the
// object with a postposition; the adverb comes right before the verb, and
// the verb agrees with the number of the subject (singular -ä, plural -ön
// forms). Both vocabularies are fixed (about 200 words each, the target's
// with umlauts), so the mapping is learnable: a small Transformer learns it
// to a high BLEU in minutes.

// The built-in corpus's fixed seeds and validation size (a dataset, not a
// run's --seed): `prepare --synthetic` and the trainer's default use them.
const (
	SyntheticTrainSeed  = 1
	SyntheticValidSeed  = 2
	SyntheticValidLines = 500
)

type synthConcept struct {
	src, srcPl string // source forms (singular, plural)
	tgt, tgtPl string // target forms (nouns: singular/plural; verbs: singular/plural subject)
}

type synthLexicon struct {
	nouns, verbs, adjs, advs, preps, conjs []synthConcept
	// determiners and numerals: source word -> target word ("" = none)
	defSg, defPl, indef synthConcept
	nums                []synthConcept
}

var (
	synthOnce sync.Once
	synthLex  *synthLexicon
)

// lexicon builds the fixed vocabularies from a fixed seed.
func lexicon() *synthLexicon {
	synthOnce.Do(func() {
		rng := rand.New(rand.NewPCG(0x676f72756e, 1))
		used := map[string]bool{
			"la": true, "las": true, "un": true, "du": true, "tri": true, "kvar": true,
			"ka": true, "wo": true, "ni": true, "sa": true, "yo": true,
		}
		word := func(cons, vows []string, minSyl, maxSyl int) string {
			for {
				n := minSyl + rng.IntN(maxSyl-minSyl+1)
				var b strings.Builder
				for i := 0; i < n; i++ {
					b.WriteString(cons[rng.IntN(len(cons))])
					b.WriteString(vows[rng.IntN(len(vows))])
				}
				w := b.String()
				if !used[w] && !used[w+"s"] {
					used[w] = true
					return w
				}
			}
		}
		sc := strings.Fields("b d f g k l m n p r s t v")
		sv := strings.Fields("a e i o u")
		tc := strings.Fields("ch sh z h j w y ts k m n r")
		tv := strings.Fields("a ä o ö u ü i")
		make1 := func(n, minSyl, maxSyl int, noun, verb bool) []synthConcept {
			out := make([]synthConcept, n)
			for i := range out {
				s, t := word(sc, sv, minSyl, maxSyl), word(tc, tv, minSyl, maxSyl)
				c := synthConcept{src: s, tgt: t}
				if noun {
					c.srcPl, c.tgtPl = s+"s", t+"ün"
					used[s+"s"], used[t+"ün"] = true, true
				}
				if verb {
					c.tgt, c.tgtPl = t+"ä", t+"ön"
				}
				out[i] = c
			}
			return out
		}
		l := &synthLexicon{}
		l.nouns = make1(48, 2, 3, true, false)
		l.verbs = make1(32, 2, 3, false, true)
		l.adjs = make1(32, 2, 2, false, false)
		l.advs = make1(12, 3, 3, false, false)
		l.preps = make1(6, 1, 2, false, false)
		l.conjs = []synthConcept{{src: "e", tgt: "ni"}, {src: "ma", tgt: "sa"}, {src: "ke", tgt: "yo"}}
		l.defSg = synthConcept{src: "la", tgt: "ka"}
		l.defPl = synthConcept{src: "las", tgt: "ka"}
		l.indef = synthConcept{src: "un"}
		l.nums = []synthConcept{{src: "du", tgt: word(tc, tv, 2, 2)}, {src: "tri", tgt: word(tc, tv, 2, 2)}, {src: "kvar", tgt: word(tc, tv, 2, 2)}}
		synthLex = l
	})
	return synthLex
}

// np generates a noun phrase; it returns source and target words and
// whether it is plural.
func (l *synthLexicon) np(rng *rand.Rand) (src, tgt []string, plural bool) {
	n := l.nouns[rng.IntN(len(l.nouns))]
	plural = rng.IntN(3) == 0
	nAdj := []int{0, 0, 1, 1, 1, 2}[rng.IntN(6)]
	adjs := make([]synthConcept, nAdj)
	for i := range adjs {
		adjs[i] = l.adjs[rng.IntN(len(l.adjs))]
	}
	var det synthConcept
	switch {
	case plural && rng.IntN(2) == 0:
		det = l.nums[rng.IntN(len(l.nums))]
	case plural:
		det = l.defPl
	case rng.IntN(2) == 0:
		det = l.defSg
	default:
		det = l.indef
	}
	src = append(src, det.src)
	for _, a := range adjs {
		src = append(src, a.src)
	}
	if plural {
		src = append(src, n.srcPl)
		tgt = append(tgt, n.tgtPl)
	} else {
		src = append(src, n.src)
		tgt = append(tgt, n.tgt)
	}
	// target adjectives follow the noun in mirror order
	for i := len(adjs) - 1; i >= 0; i-- {
		tgt = append(tgt, adjs[i].tgt)
	}
	if det.tgt != "" {
		tgt = append(tgt, det.tgt)
	}
	return src, tgt, plural
}

// clause generates one clause in both languages.
func (l *synthLexicon) clause(rng *rand.Rand) (src, tgt []string) {
	ss, ts, pl := l.np(rng)
	v := l.verbs[rng.IntN(len(l.verbs))]
	objS, objT, _ := l.np(rng)
	var ps, pt []string
	if rng.IntN(3) == 0 {
		p := l.preps[rng.IntN(len(l.preps))]
		s, t, _ := l.np(rng)
		ps = append([]string{p.src}, s...)
		pt = append(t, p.tgt)
	}
	var adv *synthConcept
	if rng.IntN(3) == 0 {
		adv = &l.advs[rng.IntN(len(l.advs))]
	}
	src = append(src, ss...)
	src = append(src, v.src)
	src = append(src, objS...)
	src = append(src, ps...)
	if adv != nil {
		src = append(src, adv.src)
	}
	tgt = append(tgt, ts...)
	tgt = append(tgt, pt...)
	tgt = append(tgt, objT...)
	tgt = append(tgt, "wo")
	if adv != nil {
		tgt = append(tgt, adv.tgt)
	}
	if pl {
		tgt = append(tgt, v.tgtPl)
	} else {
		tgt = append(tgt, v.tgt)
	}
	return src, tgt
}

// Synthetic returns n parallel sentences (source, target) of 4 to 20
// words each, lower case, words separated by single spaces, ending with
// " ."; the same seed gives the same sentences. Use different seeds for
// training and validation.
func Synthetic(seed int64, n int) (src, tgt []string) {
	l := lexicon()
	rng := rand.New(rand.NewPCG(uint64(seed), 0x73796e7468))
	src, tgt = make([]string, 0, n), make([]string, 0, n)
	for len(src) < n {
		s, t := l.clause(rng)
		if rng.IntN(4) == 0 {
			c := l.conjs[rng.IntN(len(l.conjs))]
			s2, t2 := l.clause(rng)
			s = append(append(s, ",", c.src), s2...)
			t = append(append(t, ",", c.tgt), t2...)
		}
		if len(s)+1 > 20 || len(t)+1 > 20 {
			continue
		}
		src = append(src, strings.Join(s, " ")+" .")
		tgt = append(tgt, strings.Join(t, " ")+" .")
	}
	return src, tgt
}

// SyntheticWords lists every word the synthetic languages use, sorted.
func SyntheticWords() []string {
	l := lexicon()
	set := map[string]bool{".": true, ",": true, "wo": true}
	add := func(cs ...synthConcept) {
		for _, c := range cs {
			for _, w := range []string{c.src, c.srcPl, c.tgt, c.tgtPl} {
				if w != "" {
					set[w] = true
				}
			}
		}
	}
	for _, g := range [][]synthConcept{l.nouns, l.verbs, l.adjs, l.advs, l.preps, l.conjs, l.nums} {
		add(g...)
	}
	add(l.defSg, l.defPl, l.indef)
	out := make([]string, 0, len(set))
	for w := range set {
		out = append(out, w)
	}
	sort.Strings(out)
	return out
}

// SyntheticVocab is the joint word-level vocabulary of the synthetic
// corpus: the specials, then "▁"+word for every word. Split its lines with
// WordPieces.
func SyntheticVocab() *Vocab {
	ws := SyntheticWords()
	ps := make([]string, len(ws))
	for i, w := range ws {
		ps[i] = WordBoundary + w
	}
	v, err := NewVocab(ps)
	if err != nil {
		panic(err)
	}
	return v
}

// WordPieces splits a line into whole-word pieces, "▁" + word.
func WordPieces(line string) []string {
	ws := strings.Fields(line)
	for i, w := range ws {
		ws[i] = WordBoundary + w
	}
	return ws
}

// EncodeLines splits and encodes lines.
func EncodeLines(lines []string, split func(string) []string, v *Vocab) [][]int32 {
	out := make([][]int32, len(lines))
	for i, l := range lines {
		out[i] = v.Encode(split(l))
	}
	return out
}
