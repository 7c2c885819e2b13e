package train

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/fusion"
	"github.com/gorun/gorun/internal/envconf"
	"github.com/gorun/gorun/kernels"
	"github.com/gorun/gorun/kernels/cuda"
	"github.com/gorun/gorun/kernels/device"
	"github.com/gorun/gorun/metrics"
	"github.com/gorun/gorun/rank"
	"github.com/gorun/gorun/report"
	"github.com/gorun/gorun/transformer"
)

// The entry of a training rank (Run), the Trainer and its life: the stop
// channel's watch, setup (setup.go), the loop (loop.go) or a mode that
// starts from a checkpoint (modes.go), the errors reported once, and the
// end that closes everything.

// Trainer is one rank of a training job.
type Trainer struct {
	o    Options
	id   rank.Identity
	mesh *rank.Mesh
	comm *collective.Communicator
	m    *transformer.Model
	opt  *transformer.Adam
	lr   transformer.LRPolicy
	red  reducer
	data *corpus
	run  *metrics.Run
	out  io.Writer
	bar  *progress // rank 0's progress between log lines (set by loop); logf clears it
	step int
	tl   *metrics.Timeline
	// scaler is OpenSeq2Seq's Backoff loss scaler. The CPU backend computes
	// in float32 and needs no loss scaling, so only the fp16 wire can
	// overflow here; the state is kept and checkpointed for a backend that
	// computes in fp16.
	scaler *fusion.LossScaler
	// lossScaling: --precision fp16 scales the loss by scaler.Scale and
	// the gradients back before the optimizer.
	lossScaling bool
	// acts is the type of the model's activations for that precision.
	acts dtype.DType
	// prec is the --precision resolved on this rank's device.
	prec string
	gpu  *gpuSampler

	// openDevice opens the --device backend (device.Open; tests put a
	// wrapped backend here).
	openDevice func(spec string) (kernels.Backend, string, error)

	linkSource   string
	computeTotal float64
	computeSteps int
	// syncTotal, backTotal: the parts of computeTotal in the token-count
	// allreduce and the backward passes
	syncTotal, backTotal float64
	// psgd: the steps PowerSGD compressed, with the sums of their P and Q
	// bytes, the fp16 bytes those matrices would have been, the
	// compressor's time and the step time (the final verdict's line)
	psgd report.StepTimes
	// info is run.json as rank 0 wrote it (the final analysis reads it)
	info metrics.RunInfo

	// runID names this run's checkpoints (checkpoint.State.Run): new for
	// a fresh run, the checkpoint's on --resume. Rank 0 only.
	runID string
	// unlockDir releases the run directory's lock (rank 0).
	unlockDir func()
	// resumedFrom is the step of the checkpoint resumed from (-1: fresh).
	resumedFrom int
	// stopSig is the signal that asked for a stop (Options.Stop); inLoop
	// says the training loop runs (a stop then waits for the step's end).
	stopMu  sync.Mutex
	stopSig os.Signal
	inLoop  bool
	// ckptStep is the step of the last checkpoint this process wrote.
	ckptStep int
	// psgdCkpt is PowerSGD's state in the checkpoint resumed from (rank 0).
	psgdCkpt *psgdCheckpoint
}

// Run trains as the rank described by the environment.
//
// An error is printed (one line, naming the rank in a job of several)
// before the mesh is closed, since a launcher may stop this process as soon
// as its peers notice; the error returned is then ErrReported.
func Run(ctx context.Context, o Options, out io.Writer) (err error) {
	id, err := rank.FromEnv()
	if err != nil {
		return err
	}
	if o.Collective, err = envconf.Collective(os.LookupEnv); err != nil {
		return err
	}
	dev, err := envconf.Device(os.LookupEnv)
	if err != nil {
		return err
	}
	return run(ctx, o, out, id, func(spec string) (kernels.Backend, string, error) { return device.Open(spec, dev) })
}

// run is Run for the rank id, on the backend that openDevice returns for
// o.Device.
func run(ctx context.Context, o Options, out io.Writer, id rank.Identity, openDevice func(string) (kernels.Backend, string, error)) (err error) {
	t := &Trainer{o: o, id: id, out: out, openDevice: openDevice, resumedFrom: -1}
	defer func() {
		if r := recover(); r != nil {
			err = cuda.Failure(r)
		}
		var stopped *StoppedError
		var diverged *divergedError
		if errors.Is(err, errLeaderFailed) {
			err = ErrReported // rank 0 printed why
		} else if errors.As(err, &diverged) {
			// every rank saw it at the same step; rank 0 says it for all
			if t.leader() {
				fmt.Fprintf(os.Stderr, "nmt-train: %v\n", err)
			}
			err = ErrReported
		} else if errors.As(err, &stopped) {
			if t.leader() {
				fmt.Fprintf(os.Stderr, "nmt-train: %v\n", err)
			}
		} else if err != nil {
			who := ""
			if p := fmt.Sprintf("rank %d: ", id.Rank); id.Size > 1 && !strings.HasPrefix(err.Error(), p) {
				who = p // the mesh's errors name the rank already
			}
			fmt.Fprintf(os.Stderr, "nmt-train: %s%v\n", who, err)
			err = ErrReported
		}
		t.close()
	}()
	// A stop request before the training loop has nothing to save: it
	// cancels, as any signal to a program does. In the loop it is a vote
	// in the next step's token-count allreduce (see trainStep).
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case s := <-o.Stop:
			t.stopMu.Lock()
			t.stopSig = s
			inLoop := t.inLoop
			t.stopMu.Unlock()
			if !inLoop {
				cancel()
			}
		case <-done:
		}
	}()
	for _, n := range o.Notes {
		t.logf("nmt-train: %s", n)
	}
	if o.Mode == ModeEval || o.Mode == ModeInfer {
		return t.runFromCheckpoint(ctx)
	}
	if err := t.setup(ctx); err != nil {
		if s := t.stopRequested(); s != nil && ctx.Err() != nil {
			// the stop cancelled the setup: that, not what it interrupted, is the cause
			return fmt.Errorf("interrupted by %v before the first step", s)
		}
		return err
	}
	t.stopMu.Lock()
	t.inLoop = true
	early := t.stopSig != nil
	t.stopMu.Unlock()
	if early {
		return fmt.Errorf("interrupted by %v before the first step", t.stopSig)
	}
	return t.loop(ctx)
}

// ErrReported is returned by Run after it printed the error itself.
var ErrReported = errors.New("error reported")

func (t *Trainer) close() {
	t.gpu.close()
	if t.red != nil {
		t.red.Close()
	}
	if t.tl != nil {
		t.tl.Close()
	}
	if t.comm != nil {
		t.comm.Close()
	}
	if t.mesh != nil {
		t.mesh.Close()
	}
	if t.run != nil {
		t.run.Close()
	}
	if t.data != nil && t.data.Close != nil {
		t.data.Close()
	}
	if t.unlockDir != nil {
		t.unlockDir()
		t.unlockDir = nil
	}
}

func (t *Trainer) leader() bool { return t.id.Rank == 0 }

func (t *Trainer) logf(format string, a ...any) {
	if t.leader() {
		t.bar.clear()
		fmt.Fprintf(t.out, format+"\n", a...)
	}
}
