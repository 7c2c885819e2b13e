package train

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/kernels"
	"github.com/gorun/gorun/transformer"
)

// One optimizer step: the micro-batches' forward and backward passes,
// the token count's allreduce (with the stop vote), the gradients'
// reduction, the loss scaler and the update, with its divergence checks.

// stepResult is one optimizer step as measured by this rank.
type stepResult struct {
	lossRaw, lossLab float64 // global, token-weighted
	tokens           int     // global target tokens
	dur, compute     time.Duration
	backward, sync   time.Duration // of compute: backward passes, the token-count allreduce
	comm             commStats
	skipped          bool
	stop             bool // a rank asked to stop after this step
}

func (t *Trainer) trainStep(ctx context.Context) (stepResult, error) {
	var r stepResult
	t0 := time.Now()
	m := t.m
	be := m.Backend()
	// One rank on a GPU: the step's scalars (its loss, the gradients' and
	// the weights' checks) are queued on the device and read once, at the
	// step's end (takeScalars): no synchronisation inside the step. With
	// more ranks the loss goes into the token count's all-reduce before
	// the backward pass, on every rank alike (a CPU rank may train with
	// GPU ranks), and is read there.
	ds, _ := be.(kernels.DeferredScalars)
	if t.comm.Size() > 1 {
		ds = nil
	}
	m.DeferLoss = ds != nil
	defer func() { m.DeferLoss = false }()
	if pr, ok := t.red.(*plainReducer); ok {
		pr.flag = ds
	}
	// This rank's micro-batches of the step: one per pass of
	// --backward-passes-per-step, or as many as its share of a resumed
	// run's global batch takes (see batchSource).
	batches, err := t.data.Train.Next()
	if err != nil {
		return r, err
	}
	k := len(batches)
	// Gradient accumulation keeps Grads = (sum over passes of n_j g_j) / cur,
	// where g_j is pass j's mean gradient over its n_j target tokens and cur
	// is the token count of the last pass that had any. The last pass's
	// hook multiplies by cur/N (N: all ranks' tokens of the step), so the
	// summed gradient is the gradient of the global mean loss, whatever the
	// token counts of the ranks.
	var raw, lab, cur, total float64
	t.red.SetStep(t.step)
	if t.lossScaling {
		// the reducer unscales the gradients and checks them for Inf/NaN
		// (an fp16 product overflowed under the scale: the step is skipped
		// and the scale halved)
		m.LossScale = t.scaler.Scale
		t.red.SetScale(1 / m.LossScale)
	}
	for pass := 0; pass < k; pass++ {
		last := pass == k-1
		b := batches[pass]
		var n float64
		if b.B > 0 {
			loss, err := m.Forward(b, true)
			if err != nil {
				return r, err
			}
			n = float64(loss.Tokens)
			total += n
			if ds == nil { // else read at the end
				raw += loss.Raw * n
				lab += loss.Lab * n
			}
		}
		var scale float32 = 1
		if last {
			// the 4th sum is the stop vote: a rank that got a stop signal
			// makes every rank stop after this step
			vote := 0.0
			if t.stopRequested() != nil {
				vote = 1
			}
			ts := time.Now()
			glob, err := t.allreduceSums(ctx, []float64{total, raw, lab, vote})
			r.sync = time.Since(ts)
			if err != nil {
				return r, err
			}
			N := glob[0]
			r.tokens = int(N)
			r.lossRaw, r.lossLab = glob[1]/N, glob[2]/N
			r.stop = glob[3] > 0
			if n > 0 {
				scale = float32(n / N)
			} else {
				scale = float32(cur / N)
			}
		}
		var hook func(int)
		if last {
			red := t.red
			hook = func(p int) {
				if scale != 1 {
					be.Scale(m.Grad(p), scale)
				}
				red.Ready(p)
			}
		}
		if n == 0 {
			// This rank has no sentence in this pass (a split batch with fewer
			// rows than ranks): nothing to add.
			if last {
				if cur == 0 {
					be.Zero(m.Grads)
					scale = 1
				}
				for p := len(m.Params) - 1; p >= 0; p-- {
					hook(p)
				}
				t.red.BackwardDone()
			}
			continue
		}
		m.AccumulateGrads = cur > 0
		if cur > 0 {
			be.Scale(m.Grads, float32(cur/n))
		}
		cur = n
		tb := time.Now()
		if err := m.Backward(hook); err != nil {
			return r, err
		}
		r.backward += time.Since(tb)
		if last {
			t.red.BackwardDone()
		}
	}
	m.AccumulateGrads = false
	cs, err := t.red.Wait()
	if err != nil {
		return r, err
	}
	r.comm = cs
	// A loss that is not finite (all ranks': the same on every rank) stops
	// the run before its gradients touch the weights. (Deferred, it is read
	// at the end; the update was then cancelled on the device, since such
	// a loss leaves gradients that are not finite.)
	if ds == nil && (math.IsNaN(r.lossRaw) || math.IsInf(r.lossRaw, 0)) {
		return r, t.diverged(t.step+1, fmt.Sprintf("the loss is %v", r.lossRaw))
	}
	lr := t.lr.LR(t.step)
	if !cs.OverflowFlagged && t.scaler.Update(cs.Overflow) {
		r.skipped = true
	} else {
		end := t.tl.Begin("optimizer", "step")
		t.opt.SkipOnOverflow = cs.OverflowFlagged // the overflow flag cancels it on the device
		err := t.opt.Step(m, lr, nil)
		t.opt.SkipOnOverflow = false
		if err != nil {
			return r, err
		}
		// The update that makes a weight NaN or infinite (an overflowing
		// learning rate, a gradient the loss scaler did not catch) stops
		// the run at this step, not one later at the next loss: one pass
		// over the weights, on their device (docs/nmt-train.md, Divergence).
		if ds != nil {
			ds.FlagInfNaN(m.Weights, kernels.FlagWeights)
		} else if be.HasInfNaN(m.Weights) {
			end()
			return r, t.diverged(t.step+1, fmt.Sprintf("the update at learning rate %.4g made the weights non-finite (%s)", lr, t.firstNonFinite(m.Weights, "")))
		}
		end()
	}
	if ds != nil {
		if err := t.takeScalars(ds, &r, cs.OverflowFlagged, lr); err != nil {
			return r, err
		}
	}
	r.dur = time.Since(t0)
	r.compute = r.dur - cs.Exposed
	return r, nil
}

// takeScalars reads what a step on one rank queued on the GPU
// (kernels.DeferredScalars), its one synchronisation: the loss, the
// overflow flag (its update was cancelled on the device: the step is
// skipped and the optimizer's count taken back) and the weights' check,
// with the checks of the step without deferral.
func (t *Trainer) takeScalars(ds kernels.DeferredScalars, r *stepResult, flagged bool, lr float64) error {
	m := t.m
	sum, count, flags := ds.TakeScalars()
	N := float64(r.tokens)
	r.lossRaw = sum / N
	r.lossLab = (sum - transformer.SmoothedEntropy(m.Cfg.Vocab, float64(m.Cfg.LabelSmoothing))*float64(count)) / N
	if math.IsNaN(r.lossRaw) || math.IsInf(r.lossRaw, 0) {
		return t.diverged(t.step+1, fmt.Sprintf("the loss is %v", r.lossRaw))
	}
	if flagged {
		overflow := flags[kernels.FlagOverflow]
		if overflow && !t.lossScaling {
			return t.diverged(t.step+1, "the gradients are not finite")
		}
		if t.scaler.Update(overflow) {
			r.skipped = true
			t.opt.T-- // the update was cancelled
		}
	}
	if flags[kernels.FlagWeights] {
		return t.diverged(t.step+1, fmt.Sprintf("the update at learning rate %.4g made the weights non-finite (%s)", lr, t.firstNonFinite(m.Weights, "")))
	}
	return nil
}

// allreduceSums sums a few numbers over ranks (float32 on the wire: token
// counts are exact below 2^24 per step).
func (t *Trainer) allreduceSums(ctx context.Context, v []float64) ([]float64, error) {
	f := make([]float32, len(v))
	for i := range v {
		f[i] = float32(v[i])
	}
	b := collective.Float32Bytes(f)
	end := t.tl.Begin("collective", "token count")
	err := t.comm.Allreduce(ctx, b, b, dtype.Float32, collective.Sum, collective.WithAlgorithm(algo.Ring))
	end()
	if err != nil {
		return nil, err
	}
	out := make([]float64, len(v))
	for i := range f {
		out[i] = float64(f[i])
	}
	return out, nil
}
