package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/fusion"
	"github.com/gorun/gorun/kernels"
)

// The start every rank gets from rank 0: its weights, optimizer moments,
// step and data position (fresh or resumed), or instead the news that rank
// 0 failed, which it gives even before the mesh exists (abortJob).

// errLeaderFailed: rank 0 could not open the run directory or its
// checkpoint, and says why; the other ranks exit without a word.
var errLeaderFailed = errors.New("rank 0 failed to start the run")

// abortJob is rank 0's way out when it fails before the mesh exists:
// alone it returns err; in a job it joins the mesh, as far as the first
// broadcast, to tell the other ranks, which then stop without a word
// (instead of waiting for a rendezvous that never comes).
func (t *Trainer) abortJob(ctx context.Context, err error) error {
	if t.id.Size == 1 {
		return err
	}
	mesh, cerr := t.connect(ctx, t.o.Timeout)
	if cerr != nil {
		return err
	}
	t.mesh = mesh
	if t.comm, cerr = collective.New(mesh, t.commConfig(mesh)); cerr != nil {
		return err
	}
	if t.checkSettings(ctx, nil) != nil {
		return err
	}
	if t.o.LinkGbps == 0 {
		if _, _, perr := probeLink(ctx, mesh); perr != nil {
			return err
		}
	}
	return t.broadcastState(ctx, nil, err)
}

// trainerState is the part of state.json that belongs to the trainer.
type trainerState struct {
	// Abort: rank 0 failed (it says why); nothing else is sent.
	Abort       bool               `json:"abort,omitempty"`
	Step        int                `json:"step"`
	DropoutStep uint64             `json:"dropout_step"`
	OptStep     int                `json:"optimizer_step"`
	Data        json.RawMessage    `json:"data"`
	Scaler      *fusion.LossScaler `json:"loss_scaler,omitempty"`
}

// broadcastState gives every rank rank 0's weights, optimizer moments and
// position (fresh or resumed). If rank 0 failed (failed: its error), the
// ranks learn that instead, meet at a barrier (so that rank 0 does not
// close the mesh under the message) and return: rank 0 failed, the others
// errLeaderFailed.
func (t *Trainer) broadcastState(ctx context.Context, st *checkpoint.State, failed error) error {
	var blob []byte
	if t.leader() {
		ts := trainerState{Abort: failed != nil}
		if st != nil && failed == nil {
			ts.Step, ts.DropoutStep, ts.OptStep = st.Step, st.DropoutStep, st.OptimizerStep
			ts.Data = st.Trainer["data"]
			if raw, ok := st.Trainer["loss_scaler"]; ok {
				ts.Scaler = fusion.NewLossScaler() // fields the file lacks keep their defaults
				json.Unmarshal(raw, ts.Scaler)
			}
		}
		blob, _ = json.Marshal(ts)
	}
	// Length first, then the bytes.
	n := []float32{float32(len(blob))}
	if err := t.comm.Broadcast(ctx, collective.Float32Bytes(n), 0); err != nil {
		if failed != nil {
			return failed
		}
		return fmt.Errorf("broadcast of the initial state: %w", err)
	}
	if !t.leader() {
		blob = make([]byte, int(n[0]))
	}
	if err := t.comm.Broadcast(ctx, blob, 0); err != nil {
		if failed != nil {
			return failed
		}
		return fmt.Errorf("broadcast of the initial state: %w", err)
	}
	var ts trainerState
	if err := json.Unmarshal(blob, &ts); err != nil {
		return fmt.Errorf("broadcast of the initial state: %w", err)
	}
	if ts.Abort {
		t.comm.Barrier(ctx)
		if failed != nil {
			return failed
		}
		return errLeaderFailed
	}
	if err := t.broadcastTensors(ctx, t.m.Weights, t.opt.M, t.opt.V); err != nil {
		return fmt.Errorf("broadcast of the initial weights: %w", err)
	}
	t.step, t.m.DropoutStep, t.opt.T = ts.Step, ts.DropoutStep, ts.OptStep
	t.scaler = fusion.NewLossScaler()
	if ts.Scaler != nil {
		t.scaler = ts.Scaler
	}
	if len(ts.Data) > 0 && string(ts.Data) != "null" {
		if err := t.data.Train.Restore(ts.Data); err != nil {
			return err
		}
	}
	return nil
}

// broadcastTensors gives every rank rank 0's values of the F32 tensors ts.
// On the CPU they are broadcast in place; on another backend rank 0
// downloads each one into a host buffer, which is broadcast and uploaded
// on the other ranks.
func (t *Trainer) broadcastTensors(ctx context.Context, ts ...kernels.Tensor) error {
	if t.id.Size == 1 {
		return nil
	}
	be := t.m.Backend()
	var host []float32
	for _, x := range ts {
		if onCPU(be) {
			if err := t.comm.Broadcast(ctx, collective.Float32Bytes(x.F32), 0); err != nil {
				return err
			}
			continue
		}
		if cap(host) < x.Len() {
			host = make([]float32, x.Len())
		}
		host = host[:x.Len()]
		if t.leader() {
			be.Download(host, x)
		}
		if err := t.comm.Broadcast(ctx, collective.Float32Bytes(host), 0); err != nil {
			return err
		}
		if !t.leader() {
			be.Upload(x, host)
		}
	}
	return nil
}
