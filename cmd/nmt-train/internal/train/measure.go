package train

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/gorun/gorun/kernels/cpu"
	"github.com/gorun/gorun/transformer"
)

// Measured is one rank's compute per step, timed on this machine's CPU.
type Measured struct {
	Steps                         int // timed (after the warm-up)
	Threads, BatchTokens          int
	ComputeS, ComputeSD, Backward float64 // mean and spread of a step, mean of its backward pass
	TargetTokens                  float64 // per step
	Params                        int64
	Vocab                         int
}

// MeasureCompute times training steps of preset with a vocabulary of
// vocab ids (at least the corpus's) alone on this machine's CPU, as one
// rank of nmt-train computes them: the built-in synthetic corpus in the
// trainer's batches of batchTokens, threads compute threads, forward,
// backward and LazyAdam; warmup steps first, untimed. Nothing is
// communicated or written.
func MeasureCompute(preset string, vocab, threads, batchTokens, warmup, steps int) (Measured, error) {
	me := Measured{Steps: steps, Threads: threads, BatchTokens: batchTokens}
	if threads < 1 || steps < 2 || warmup < 0 {
		return me, fmt.Errorf("measuring compute: %d threads, %d steps: want at least 1 and 2", threads, steps)
	}
	o := Options{SyntheticLines: 40000, BatchTokens: batchTokens, MaxLength: 56, PassesPerStep: 1, Seed: 1}
	c, err := loadCorpus(context.Background(), o, 0, 1)
	if err != nil {
		return me, fmt.Errorf("measuring compute: %w", err)
	}
	defer c.Close()
	cfg, err := transformer.Preset(preset, max(vocab, c.VocabSize))
	if err != nil {
		return me, err
	}
	be := cpu.New()
	be.Threads = threads
	defer cpu.SetThreads(cpu.SetThreads(threads))
	m, err := transformer.New(cfg, be, 1)
	if err != nil {
		return me, err
	}
	opt := transformer.NewLazyAdam(m)
	me.Params, me.Vocab = int64(m.NumParams()), cfg.Vocab
	var sum, sum2, back, toks float64
	for i := 0; i < warmup+steps; i++ {
		bs, err := c.Train.Next()
		if err != nil {
			return me, err
		}
		t0 := time.Now()
		loss, err := m.Forward(bs[0], true)
		if err != nil {
			return me, err
		}
		tb := time.Now()
		if err := m.Backward(nil); err != nil {
			return me, err
		}
		bd := time.Since(tb).Seconds()
		if err := opt.Step(m, 1e-4, nil); err != nil {
			return me, err
		}
		if i < warmup {
			continue
		}
		d := time.Since(t0).Seconds()
		sum, sum2, back, toks = sum+d, sum2+d*d, back+bd, toks+float64(loss.Tokens)
	}
	n := float64(steps)
	me.ComputeS, me.Backward, me.TargetTokens = sum/n, back/n, toks/n
	me.ComputeSD = math.Sqrt(math.Max(0, (sum2-n*me.ComputeS*me.ComputeS)/(n-1)))
	return me, nil
}
