package bench

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/data"
)

// benchText makes n lines of made-up text that looks like news text to a
// tokenizer: 200,000 word types drawn with Zipf's law (s = 1.1), with
// capitals, umlauts, digits and punctuation, 5-45 words per line.
func benchText(seed uint64, n int) []string {
	vocab := benchWords()
	rng := rand.New(rand.NewPCG(seed, 99))
	z := rand.NewZipf(rng, 1.1, 2, uint64(len(vocab)-1))
	lines := make([]string, n)
	var sb strings.Builder
	for i := range lines {
		sb.Reset()
		k := 5 + rng.IntN(41)
		for j := 0; j < k; j++ {
			if j > 0 {
				sb.WriteByte(' ')
			}
			w := vocab[z.Uint64()]
			if j == 0 {
				w = strings.ToUpper(w[:1]) + w[1:]
			}
			sb.WriteString(w)
			if rng.IntN(12) == 0 {
				sb.WriteByte(',')
			}
		}
		sb.WriteString(" .")
		lines[i] = sb.String()
	}
	return lines
}

var (
	benchWordsOnce sync.Once
	benchWordList  []string
)

func benchWords() []string {
	benchWordsOnce.Do(func() {
		rng := rand.New(rand.NewPCG(7, 7))
		cons := strings.Fields("b c d f g h k l m n p r s t v w z ch sch st tr")
		vows := strings.Fields("a e i o u ä ö ü ei au ie")
		seen := map[string]bool{}
		for len(benchWordList) < 200000 {
			var sb strings.Builder
			for s := 1 + rng.IntN(4); s > 0; s-- {
				sb.WriteString(cons[rng.IntN(len(cons))])
				sb.WriteString(vows[rng.IntN(len(vows))])
			}
			if rng.IntN(3) == 0 {
				sb.WriteString(cons[rng.IntN(len(cons))])
			}
			if rng.IntN(40) == 0 {
				sb.Reset()
				fmt.Fprint(&sb, rng.IntN(100000))
			}
			w := sb.String()
			if !seen[w] {
				seen[w] = true
				benchWordList = append(benchWordList, w)
			}
		}
	})
	return benchWordList
}

// textFile writes lines to a file in the benchmark's temporary directory.
func textFile(b *testing.B, lines []string) string {
	path := filepath.Join(b.TempDir(), "text")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	return path
}

// learnBPE learns merges from the words of the text file path, as prepare
// does (both languages' files counted as one text).
func learnBPE(b *testing.B, path string, merges int) *data.BPE {
	counts, err := data.CountPieces(strings.Fields, path)
	if err != nil {
		b.Fatal(err)
	}
	return data.LearnBPECounts(counts, merges)
}

// BenchmarkBPEApply applies a joint BPE of 8,000 merges (learned on 50,000
// lines) to 200,000 other lines, cycling, with one word cache as prepare
// uses; reports lines/s on one goroutine. With GORUN_DATA_BENCH_TEXT=DIR it
// also writes the learning and applying text to DIR (learn.txt, apply.txt)
// for a side-by-side run of SentencePiece (docs/data.md).
//
//	go test -bench BPEApply -benchtime 400000x ./bench/
func BenchmarkBPEApply(b *testing.B) {
	learn := benchText(1, 50000)
	apply := benchText(2, 200000)
	if dir := os.Getenv("GORUN_DATA_BENCH_TEXT"); dir != "" {
		os.WriteFile(filepath.Join(dir, "learn.txt"), []byte(strings.Join(learn, "\n")+"\n"), 0o644)
		os.WriteFile(filepath.Join(dir, "apply.txt"), []byte(strings.Join(apply, "\n")+"\n"), 0o644)
	}
	bpe := learnBPE(b, textFile(b, learn), 8000)
	b.ResetTimer()
	pieces := 0
	for i := 0; i < b.N; i++ {
		pieces += len(bpe.Apply(apply[i%len(apply)]))
	}
	s := b.Elapsed().Seconds()
	b.ReportMetric(float64(b.N)/s, "lines/s")
	b.ReportMetric(float64(pieces)/float64(b.N), "pieces/line")
}

// BenchmarkBPELearn learns 8,000 merges on 50,000 lines (both counted as
// one text, as prepare's joint BPE does).
//
//	go test -bench BPELearn -benchtime 1x ./bench/
func BenchmarkBPELearn(b *testing.B) {
	learn := benchText(1, 50000)
	path := textFile(b, learn)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		learnBPE(b, path, 8000)
	}
	b.ReportMetric(float64(len(learn)*b.N)/b.Elapsed().Seconds(), "lines/s")
}

// BenchmarkBPELearn1M learns 32,000 merges on 1,000,000 lines (the
// issue's "learning on 1 M lines in minutes").
//
//	go test -bench BPELearn1M -benchtime 1x ./bench/
func BenchmarkBPELearn1M(b *testing.B) {
	path := textFile(b, benchText(3, 1000000))
	b.ResetTimer()
	var m int
	for i := 0; i < b.N; i++ {
		m = learnBPE(b, path, 32000).NumMerges()
	}
	b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/learn")
	b.ReportMetric(float64(m), "merges")
}

// BenchmarkBatcher cuts a memory-mapped corpus of 1,000,000 pairs (lengths
// 1-60, skewed short like WMT) into global batches of 4 x 4,096 padded
// tokens (4 ranks' worth); reports lines/s and µs per batch of Next (epochs
// roll over inside the loop, so their planning is included), and the time
// NewBatcher takes to plan (every line's lengths are read).
//
//	go test -bench Batcher -benchtime 20000x ./bench/
func BenchmarkBatcher(b *testing.B) {
	path := filepath.Join(b.TempDir(), "bench.bin")
	rng := rand.New(rand.NewPCG(3, 3))
	const n = 1000000
	src, tgt := make([][]int32, n), make([][]int32, n)
	for i := range src {
		l := 1 + int(rng.ExpFloat64()*18)%60
		src[i] = make([]int32, l)
		tgt[i] = make([]int32, max(1, l+rng.IntN(7)-3))
		for j := range src[i] {
			src[i][j] = int32(4 + rng.IntN(32000))
		}
		for j := range tgt[i] {
			tgt[i][j] = int32(4 + rng.IntN(32000))
		}
	}
	hash := strings.Repeat("ab", 32)
	if err := data.WriteCorpus(path, src, tgt, hash, 32004, 0); err != nil {
		b.Fatal(err)
	}
	src, tgt = nil, nil
	c, err := data.OpenCorpus(path)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	t0 := time.Now()
	bt, err := data.NewBatcher(c, data.BatchConfig{TokensPerBatch: 4 * 4096, MaxLen: 56, Seed: 1, VocabSize: 32004})
	if err != nil {
		b.Fatal(err)
	}
	plan := time.Since(t0)
	b.ResetTimer()
	lines := 0
	for i := 0; i < b.N; i++ {
		x, err := bt.Next()
		if err != nil {
			b.Fatal(err)
		}
		lines += x.B
	}
	s := b.Elapsed().Seconds()
	b.ReportMetric(float64(lines)/s, "lines/s")
	b.ReportMetric(s/float64(b.N)*1e6, "us/batch")
	b.ReportMetric(plan.Seconds()*1e3, "plan-ms")
	b.ReportMetric(float64(bt.StepsPerEpoch()), "steps/epoch")
}
