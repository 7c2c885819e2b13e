package bench

import (
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/kernels/cpu"
	"github.com/gorun/gorun/transformer"
)

// BenchmarkTransformer times one training step (forward + loss, backward,
// LazyAdam update) of the tiny, small and base presets at 32 sentences x
// 32 tokens per side (random ids, no padding), as bench/peers/
// torch_transformer.py does for PyTorch. Threads: GOMAXPROCS (run with
// -cpu 2 for the setting). Reports target tokens/s, the phases,
// and the process's peak resident memory (VmHWM).
//
//	go test -bench Transformer -benchtime 5x -cpu 2 ./bench/
func BenchmarkTransformer(b *testing.B) {
	for _, c := range []struct {
		preset string
		vocab  int
	}{{"tiny", 8000}, {"small", 8000}, {"base", 32000}} {
		b.Run(c.preset, func(b *testing.B) { benchStep(b, c.preset, c.vocab) })
	}
}

func benchStep(b *testing.B, preset string, vocab int) {
	const B, T = 32, 32
	cfg, err := transformer.Preset(preset, vocab)
	if err != nil {
		b.Fatal(err)
	}
	be := cpu.New()
	m, err := transformer.New(cfg, be, 1)
	if err != nil {
		b.Fatal(err)
	}
	opt := transformer.NewLazyAdam(m)
	r := rand.New(rand.NewPCG(1, 2))
	batch := &transformer.Batch{B: B, S: T, T: T, Src: make([]int32, B*T), Tgt: make([]int32, B*T)}
	for i := range batch.Src {
		batch.Src[i] = int32(4 + r.IntN(vocab-4))
		batch.Tgt[i] = int32(4 + r.IntN(vocab-4))
	}
	step := func() (fwd, bwd, upd time.Duration) {
		t0 := time.Now()
		if _, err := m.Forward(batch, true); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := m.Backward(nil); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if err := opt.Step(m, 1e-4, nil); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		return t1.Sub(t0), t2.Sub(t1), t3.Sub(t2)
	}
	step() // warm-up: allocates the activations
	var ms0 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	b.ResetTimer()
	var f, bw, u time.Duration
	for i := 0; i < b.N; i++ {
		a, c, d := step()
		f, bw, u = f+a, bw+c, u+d
	}
	b.StopTimer()
	var ms1 runtime.MemStats
	runtime.ReadMemStats(&ms1)
	n := float64(b.N)
	per := (f + bw + u).Seconds() / n
	b.ReportMetric(float64(B*T)/per, "tgt_tok/s")
	b.ReportMetric(f.Seconds()/n, "fwd_s")
	b.ReportMetric(bw.Seconds()/n, "bwd_s")
	b.ReportMetric(u.Seconds()/n, "adam_s")
	b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/n, "allocs/step")
	b.ReportMetric(float64(ms1.HeapSys)/(1<<20), "heap_MiB")
	b.ReportMetric(peakRSS(), "peak_rss_MiB")
	b.Logf("%s: %d params, vocab %d, %d threads", preset, m.NumParams(), vocab, runtime.GOMAXPROCS(0))
}

// peakRSS is the process's peak resident set (VmHWM) in MiB, 0 if unknown.
func peakRSS() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			f := strings.Fields(l)
			if len(f) >= 2 {
				kb, _ := strconv.ParseFloat(f[1], 64)
				return kb / 1024
			}
		}
	}
	return 0
}

// BenchmarkTranslate decodes 32 random source sentences of 20 tokens with
// an untrained model (so every output runs to the maximum, input length +
// 50: the worst case), greedy and beam 4, and reports output tokens/s.
//
//	go test -bench Translate -benchtime 2x -cpu 2 ./bench/
func BenchmarkTranslate(b *testing.B) {
	for _, preset := range []string{"tiny", "small"} {
		for _, beam := range []int{1, 4} {
			b.Run(preset+"/beam"+strconv.Itoa(beam), func(b *testing.B) {
				cfg, err := transformer.Preset(preset, 8000)
				if err != nil {
					b.Fatal(err)
				}
				m, err := transformer.New(cfg, cpu.New(), 1)
				if err != nil {
					b.Fatal(err)
				}
				r := rand.New(rand.NewPCG(3, 4))
				src := make([][]int32, 32)
				for i := range src {
					for j := 0; j < 19; j++ {
						src[i] = append(src[i], int32(4+r.IntN(7996)))
					}
					src[i] = append(src[i], transformer.EOS)
				}
				opt := transformer.DecodeOptions{Beam: beam, Alpha: 0.6, MaxExtra: 50}
				toks := 0
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					out, err := m.Translate(src, opt)
					if err != nil {
						b.Fatal(err)
					}
					for _, o := range out {
						toks += len(o)
					}
				}
				b.ReportMetric(float64(toks)/b.Elapsed().Seconds(), "out_tok/s")
				b.ReportMetric(float64(32*b.N)/b.Elapsed().Seconds(), "sent/s")
			})
		}
	}
}
