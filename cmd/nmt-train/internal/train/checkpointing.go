package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/kernels"
	"github.com/gorun/gorun/transformer"
)

// Writing a checkpoint during training: rank 0 saves (with every rank's
// PowerSGD state) and prunes; the others check their weights and moments.

func (t *Trainer) checkpoint(ctx context.Context) error {
	// Every rank is at the same data position; rank 0 writes.
	t.ckptStep = t.step
	psgd, err := t.gatherPowerSGD(ctx) // every rank's error feedback, to rank 0
	if err != nil {
		return fmt.Errorf("checkpoint at step %d: %w", t.step, err)
	}
	var extra []checkpoint.File
	if psgd != nil {
		extra = append(extra, *psgd)
	}
	if !t.leader() {
		// Rank 0's save refuses weights or moments that are not finite;
		// the other ranks, which hold the same, check theirs on their
		// device, so that every rank stops at this step.
		for _, x := range []struct {
			prefix string
			t      kernels.Tensor
		}{{"", t.m.Weights}, {"m/", t.opt.M}, {"v/", t.opt.V}} {
			if t.m.Backend().HasInfNaN(x.t) {
				return t.diverged(t.step, fmt.Sprintf("%s not written: %s", checkpoint.DirName(t.step), t.firstNonFinite(x.t, x.prefix)))
			}
		}
		return nil
	}
	ts := map[string]json.RawMessage{"data": t.data.Train.Position()}
	sc, _ := json.Marshal(t.scaler)
	ts["loss_scaler"] = sc
	end := t.tl.Begin("checkpoint", "save")
	path, err := checkpoint.Save(t.o.RunDir, t.runID, t.step, t.m, t.opt, t.data.VocabHash, ts, extra...)
	end()
	var nonFinite *transformer.NonFiniteError
	if errors.As(err, &nonFinite) {
		return t.diverged(t.step, fmt.Sprintf("%s not written: %v", checkpoint.DirName(t.step), nonFinite))
	}
	if err != nil {
		return fmt.Errorf("checkpoint at step %d: %w", t.step, err)
	}
	t.logf("nmt-train: checkpoint %s", path)
	// this run's newest --keep-checkpoints, counting back from the one
	// latest now names; never that one, a newer one or another run's
	if _, err := checkpoint.Prune(t.o.RunDir, t.runID, t.o.KeepCkpts); err != nil {
		return fmt.Errorf("checkpoint at step %d: pruning old checkpoints: %w", t.step, err)
	}
	return nil
}
