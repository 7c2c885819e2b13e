package train

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/gorun/gorun/checkpoint"
)

// Stopping on a signal (Options.Stop): the request, the step's vote, and
// the stop after the step, with a checkpoint (StoppedError).

// stopRequested reports whether a stop signal has arrived.
func (t *Trainer) stopRequested() os.Signal {
	t.stopMu.Lock()
	defer t.stopMu.Unlock()
	return t.stopSig
}

// StoppedError is Run's result when a signal on Options.Stop stopped the
// job after a step: every rank returns it, rank 0's with the checkpoint it
// wrote. The process should exit with 128 + the signal's number, as a
// process stopped by the signal would.
type StoppedError struct {
	Sig        os.Signal
	Step       int
	Checkpoint string // rank 0: the checkpoint written at Step
}

func (e *StoppedError) Error() string {
	if e.Checkpoint == "" {
		return fmt.Sprintf("stopped by %v after step %d", e.Sig, e.Step)
	}
	return fmt.Sprintf("stopped by %v after step %d; checkpoint %s written: continue with --resume", e.Sig, e.Step, e.Checkpoint)
}

// stop ends the job after the step in which a rank voted to stop (a stop
// signal): rank 0 writes a checkpoint, unless the step has one already,
// and the report; every rank then meets at a barrier, so that none exits
// before the checkpoint is complete, and returns a *StoppedError.
func (t *Trainer) stop(ctx context.Context) error {
	sig := t.stopRequested()
	if t.ckptStep != t.step {
		if err := t.checkpoint(ctx); err != nil {
			return err
		}
	}
	if err := t.comm.Barrier(ctx); err != nil {
		return err
	}
	e := &StoppedError{Sig: sig, Step: t.step}
	if sig == nil {
		e.Sig = syscall.SIGTERM // another rank's signal
	}
	if t.leader() {
		e.Checkpoint = filepath.Join(t.o.RunDir, checkpoint.DirName(t.step))
		if err := t.run.Log("stop", int64(t.step), nil, map[string]string{"signal": e.Sig.String(), "checkpoint": checkpoint.DirName(t.step)}); err != nil {
			return err
		}
		t.run.Close()
		t.run = nil
		if _, err := WriteReport(t.o.RunDir); err != nil {
			t.logf("nmt-train: report: %v", err)
		}
	}
	return e
}
