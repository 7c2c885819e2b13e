package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/internal/envconf"
	"github.com/gorun/gorun/kernels"
	"github.com/gorun/gorun/kernels/cuda"
	"github.com/gorun/gorun/kernels/device"
	"github.com/gorun/gorun/transformer"
)

// BenchmarkTrainStepDevice times Transformer-base training steps (forward
// and loss, backward, LazyAdam) on the device GORUN_BENCH_DEVICE names
// (cuda or cpu; unset: skipped), with the matrix-product precision
// GORUN_BENCH_PRECISION (fp32, fp16 or bf16; default fp16 on a GPU), over
// the batch shapes of GORUN_BENCH_BATCHES: the JSON lines that
// `bench/peers/torch_transformer.py --dump-batches` writes, so gorun and
// PyTorch time the very same batches (bench/gpu/run.sh does both). One
// sub-benchmark per token budget; it reports non-pad target tokens/s (what
// nmt-train logs), source+target tokens/s, step time and gorun's peak
// device memory. With GORUN_CUDA_PROFILE=1 on a GPU it also logs the GPU
// time of every kind of operation (kernels, GEMMs by shape, copies) over
// the timed steps, the largest first.
//
//	GORUN_BENCH_DEVICE=cuda GORUN_BENCH_BATCHES=batches.jsonl go test -bench TrainStepDevice -benchtime 20x ./bench/
func BenchmarkTrainStepDevice(b *testing.B) {
	dev := os.Getenv("GORUN_BENCH_DEVICE")
	if dev == "" {
		b.Skip("set GORUN_BENCH_DEVICE=cuda (or cpu) and GORUN_BENCH_BATCHES to run it")
	}
	shapes, err := readShapes(os.Getenv("GORUN_BENCH_BATCHES"))
	if err != nil {
		b.Fatal(err)
	}
	set, err := envconf.Device(os.LookupEnv)
	if err != nil {
		b.Fatal(err)
	}
	be, why, err := device.Open(dev, set)
	if err != nil {
		b.Fatal(err)
	}
	prec := os.Getenv("GORUN_BENCH_PRECISION")
	acts := dtype.Float32
	if mp, ok := be.(kernels.MixedPrecision); ok {
		if prec == "" {
			prec = "fp16"
		}
		acts = map[string]dtype.DType{"fp32": dtype.Float32, "fp16": dtype.Float16, "bf16": dtype.BFloat16}[prec]
		mp.SetMatmulPrecision(acts)
	} else {
		prec = "fp32"
	}
	b.Logf("%s, precision %s", why, prec)
	// GORUN_BENCH_PRESET and GORUN_BENCH_VOCAB: base and 32768 (the lab's
	// model, PyTorch's) unless set (bench/gpu/run.sh's dry run on the
	// emulator: tiny, 1000)
	preset, vocab := os.Getenv("GORUN_BENCH_PRESET"), 32768
	if preset == "" {
		preset = "base"
	}
	if v := os.Getenv("GORUN_BENCH_VOCAB"); v != "" {
		if vocab, err = strconv.Atoi(v); err != nil || vocab < 8 {
			b.Fatalf("GORUN_BENCH_VOCAB=%q: want a vocabulary size of 8 or more", v)
		}
	}
	cfg, err := transformer.Preset(preset, vocab)
	if err != nil {
		b.Fatal(err)
	}
	m, err := transformer.New(cfg, be, 1)
	if err != nil {
		b.Fatal(err)
	}
	m.Activations = acts
	if prec == "fp16" {
		m.LossScale = 1 << 14
	}
	opt := transformer.NewLazyAdam(m)
	budgets := []int{}
	byBudget := map[int][]*transformer.Batch{}
	r := rand.New(rand.NewPCG(1, 2))
	for _, s := range shapes {
		if _, ok := byBudget[s.Budget]; !ok {
			budgets = append(budgets, s.Budget)
		}
		byBudget[s.Budget] = append(byBudget[s.Budget], s.batch(r, vocab))
	}
	for _, bt := range budgets {
		batches := byBudget[bt]
		b.Run(fmt.Sprintf("%s/%s/tokens=%d", preset, prec, bt), func(b *testing.B) {
			step := func(batch *transformer.Batch) (int, int) {
				l, err := m.Forward(batch, true)
				if err != nil {
					b.Fatal(err)
				}
				if err := m.Backward(nil); err != nil {
					b.Fatal(err)
				}
				if m.LossScale > 0 {
					be.Scale(m.Grads, 1/m.LossScale)
				}
				if err := opt.Step(m, 1e-4, nil); err != nil {
					b.Fatal(err)
				}
				src := 0
				for _, id := range batch.Src {
					if id != transformer.PAD {
						src++
					}
				}
				return l.Tokens, src
			}
			for _, batch := range batches { // warm-up: every shape once
				step(batch)
			}
			be.Sync()
			cb, _ := be.(*cuda.Backend)
			if cb != nil {
				cb.TakeProfile() // GORUN_CUDA_PROFILE=1: the timed steps' only
			}
			b.ResetTimer()
			t0 := time.Now()
			tgt, all := 0, 0
			for i := 0; i < b.N; i++ {
				t, s := step(batches[i%len(batches)])
				tgt, all = tgt+t, all+t+s
			}
			be.Sync()
			d := time.Since(t0).Seconds()
			b.StopTimer()
			b.ReportMetric(float64(tgt)/d, "tgt_tok/s")
			b.ReportMetric(float64(all)/d, "src+tgt_tok/s")
			b.ReportMetric(1e3*d/float64(b.N), "step_ms")
			if cb != nil {
				_, peak, _ := cb.MemStats()
				b.ReportMetric(float64(peak)/(1<<20), "gpu_peak_MiB")
				if cb.Profiling() {
					b.Logf("GPU time by operation over %d step(s) (%s=1; its events slow the steps above):\n%s",
						b.N, cuda.EnvProfile, cuda.FormatProfile(cb.TakeProfile(), b.N, 40))
				}
			}
		})
	}
}

// shape is one batch of torch_transformer.py --dump-batches.
type shape struct {
	Budget  int   `json:"budget"`
	B       int   `json:"B"`
	S       int   `json:"S"`
	T       int   `json:"T"`
	SrcLens []int `json:"src_lens"`
	TgtLens []int `json:"tgt_lens"`
}

// batch fills the shape with random ids (EOS last, PAD after).
func (s shape) batch(r *rand.Rand, vocab int) *transformer.Batch {
	bt := &transformer.Batch{B: s.B, S: s.S, T: s.T, Src: make([]int32, s.B*s.S), Tgt: make([]int32, s.B*s.T)}
	fill := func(ids []int32, n int) {
		for j := 0; j < n-1; j++ {
			ids[j] = int32(4 + r.IntN(vocab-4))
		}
		ids[n-1] = transformer.EOS
	}
	for i := 0; i < s.B; i++ {
		fill(bt.Src[i*s.S:(i+1)*s.S], s.SrcLens[i])
		fill(bt.Tgt[i*s.T:(i+1)*s.T], s.TgtLens[i])
	}
	return bt
}

// readShapes reads --dump-batches lines; without a file, 20 batches of 32
// sentence pairs of 32 tokens at a budget of 1024.
func readShapes(path string) ([]shape, error) {
	if path == "" {
		var out []shape
		for i := 0; i < 20; i++ {
			s := shape{Budget: 1024, B: 32, S: 32, T: 32}
			for j := 0; j < 32; j++ {
				s.SrcLens, s.TgtLens = append(s.SrcLens, 32), append(s.TgtLens, 32)
			}
			out = append(out, s)
		}
		return out, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []shape
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for line := 1; sc.Scan(); line++ {
		var s shape
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			return nil, fmt.Errorf("%s:%d: %v", path, line, err)
		}
		if s.B < 1 || len(s.SrcLens) != s.B || len(s.TgtLens) != s.B {
			return nil, fmt.Errorf("%s:%d: %d rows but %d and %d lengths", path, line, s.B, len(s.SrcLens), len(s.TgtLens))
		}
		for i := range s.SrcLens {
			if s.SrcLens[i] < 1 || s.SrcLens[i] > s.S || s.TgtLens[i] < 1 || s.TgtLens[i] > s.T {
				return nil, fmt.Errorf("%s:%d: row %d lengths %d/%d outside %d/%d", path, line, i, s.SrcLens[i], s.TgtLens[i], s.S, s.T)
			}
		}
		out = append(out, s)
	}
	return out, sc.Err()
}
