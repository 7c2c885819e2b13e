package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/data"
	"github.com/gorun/gorun/fusion"
	"github.com/gorun/gorun/internal/envconf"
	"github.com/gorun/gorun/kernels"
	"github.com/gorun/gorun/kernels/cpu"
	"github.com/gorun/gorun/kernels/cuda"
	"github.com/gorun/gorun/kernels/device"
	"github.com/gorun/gorun/metrics"
	"github.com/gorun/gorun/plan"
	"github.com/gorun/gorun/rank"
	"github.com/gorun/gorun/report"
	"github.com/gorun/gorun/transformer"
)

// source hands out this rank's batches of each step (the micro-batches of
// one backward pass each).
type source interface {
	Next() ([]*transformer.Batch, error)
	// Position is the data position to store in a checkpoint: a global
	// position, the same on every rank and for any number of ranks.
	Position() json.RawMessage
	Restore(json.RawMessage) error
	Epoch() int
	// GlobalBatch is the batches per step, over all ranks, and the
	// position, whose Tokens or Rows say their size: the run's, kept
	// across resumes.
	GlobalBatch() (batches int, size data.Position)
}

// corpus is what the trainer needs from the data side.
type corpus struct {
	Name      string
	VocabSize int
	VocabHash string
	Vocab     *data.Vocab // written into the run directory for `translate`
	Extra     []string
	Decode    func(ids []int32) string   // detokenized text
	Pieces    func(ids []int32) []string // vocabulary pieces
	Train     source
	Valid     [][2][]int32 // source ids, target ids ending with EOS
	ValidRefs []string     // detokenized references
	Stats     metrics.Dataset
	Close     func()
	text      *Cached // the cache entry of a corpus of text files (Options.Text)
}

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
	acts kernels.DType
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

// commConfig is the collectives' settings for a communicator over mesh:
// the environment's, the trainer's timeout and the link between hosts.
func (t *Trainer) commConfig(mesh *rank.Mesh) collective.Config {
	cfg := t.o.Collective
	cfg.Timeout, cfg.Across = t.o.Timeout, plan.Across(mesh.TransportChoice())
	return cfg
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

// stopRequested reports whether a stop signal has arrived.
func (t *Trainer) stopRequested() os.Signal {
	t.stopMu.Lock()
	defer t.stopMu.Unlock()
	return t.stopSig
}

// ErrReported is returned by Run after it printed the error itself.
var ErrReported = errors.New("error reported")

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

// errLeaderFailed: rank 0 could not open the run directory or its
// checkpoint, and says why; the other ranks exit without a word.
var errLeaderFailed = errors.New("rank 0 failed to start the run")

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

func (t *Trainer) setup(ctx context.Context) error {
	o := t.o
	// Rank 0 takes an existing run directory first: one in use by another
	// process, or holding a run without --resume, is refused before the
	// device, the data or the model are touched. An absent one is created
	// (and taken) later, so that a bad flag leaves nothing behind.
	if t.leader() {
		if err := runDirIsFile(o.RunDir); err != nil {
			return t.abortJob(ctx, err)
		}
		if fi, err := os.Stat(o.RunDir); err == nil && fi.IsDir() {
			if err := t.takeRunDir(); err != nil {
				return t.abortJob(ctx, err)
			}
		} else if o.Resume {
			return t.abortJob(ctx, fmt.Errorf("--resume: --run-dir %s: no such directory", o.RunDir))
		}
	}
	// The device first: an unknown or unusable --device fails at once.
	be, why, err := t.openDevice(o.Device)
	if err != nil {
		return err
	}
	// Then the data: a bad corpus should fail before the network is touched.
	t.data, err = loadCorpus(ctx, o, t.id.Rank, t.id.Size)
	if err != nil {
		return err
	}
	t.logText()
	cfg, err := t.modelConfig()
	if err != nil {
		return err
	}
	if o.NoDropout {
		cfg = cfg.NoDropout()
	}
	threads, err := t.configure(be, why)
	if err != nil {
		return err
	}
	t.m, err = transformer.New(cfg, be, o.Seed)
	if err != nil {
		return err
	}
	t.m.Activations = t.acts
	t.opt = newOptimizer(t.m, o.Adam)
	t.lr, err = transformer.ParsePolicy(o.LRPolicy, o.LearningRate, cfg.DModel, o.Warmup)
	if err != nil {
		return err
	}

	t.mesh, err = rank.Connect(ctx, t.id, rank.Options{Timeout: o.Timeout})
	if err != nil {
		return err
	}
	t.comm, err = collective.New(t.mesh, t.commConfig(t.mesh))
	if err != nil {
		return err
	}
	// Ranks started with different settings are refused before anything
	// is written (and before the link probe, which --link-gbps decides).
	if err := t.checkSettings(ctx, t.settings()); err != nil {
		return err
	}
	if t.id.Size > 1 {
		t.logf("nmt-train: %v", t.mesh.TransportChoice())
		t.logf("nmt-train: allreduce algorithm chosen with %s", t.comm.AutoBasis())
	}
	t.linkSource = "flag"
	if o.LinkGbps == 0 && t.id.Size > 1 {
		gbps, peer, err := probeLink(ctx, t.mesh)
		if err != nil {
			return fmt.Errorf("link probe: %w", err)
		}
		if gbps > 0 {
			t.o.LinkGbps, t.linkSource = gbps, "probe"
			t.logf("nmt-train: link probe rank 0 -> rank %d (%s): %.2f Gbit/s point to point", peer, t.mesh.HostNames()[peer], gbps)
		}
	}
	if o.Timeline != "" {
		t.tl, err = metrics.CreateTimeline(timelinePart(o.Timeline, t.id.Rank), t.id.Rank)
		if err != nil {
			return err
		}
		t.m.Trace = t.tl.LayerHook()
	}

	// Rank 0 takes the run directory and, on --resume, reads the
	// checkpoint; everything is broadcast (or, if rank 0 failed, the
	// failure, so that the other ranks stop without a word).
	var st *checkpoint.State
	var dirErr error
	if t.leader() && t.unlockDir == nil {
		dirErr = t.takeRunDir()
	}
	if t.leader() && t.o.Resume && dirErr == nil {
		st, dirErr = t.resumeRunDir()
	}
	if err := t.broadcastState(ctx, st, dirErr); err != nil {
		return err
	}
	// Every rank draws its own dropout masks.
	t.m.Seed = o.Seed*0x9E3779B97F4A7C15 + uint64(t.id.Rank) + 1

	if o.Overlap && t.id.Size > 1 {
		t.red, err = newBucketReducer(ctx, t.comm, t.m, o, t.tl)
		if err != nil {
			return err
		}
		if err := t.restorePowerSGD(ctx, t.psgdCkpt); err != nil {
			return err
		}
		t.psgdCkpt = nil
	} else {
		comp, _ := compression(o) // one rank communicates nothing: no PowerSGD
		t.red = newPlainReducer(ctx, t.comm, t.m, comp.Wire())
	}

	if t.leader() {
		if err := t.openRunFiles(cfg, threads); err != nil {
			return err
		}
	}
	compute := fmt.Sprintf("%d threads per rank", threads)
	if threads == 0 {
		compute = "on " + be.Device().String()
	}
	t.logf("nmt-train: %d rank(s) on %s; preset %s, %s parameters; %s; %s; run dir %s",
		t.id.Size, strings.Join(report.UniqueHosts(t.mesh.HostNames()), ", "), o.Preset, report.Commas(int64(t.m.NumParams())), t.data.Name, compute, o.RunDir)
	if st != nil {
		t.logf("nmt-train: resumed from step %d", t.step)
		if p, u := t.data.Train.GlobalBatch(); p != o.PassesPerStep*t.id.Size || u.Tokens != o.BatchTokens && u.Rows == 0 || u.Rows != o.BatchPairs {
			asked := fmt.Sprintf("--batch-tokens %d", o.BatchTokens)
			if o.BatchPairs > 0 {
				asked = fmt.Sprintf("--batch-pairs %d", o.BatchPairs)
			}
			t.logf("nmt-train: the run's global batch is kept: %d batches of %s a step (not --backward-passes-per-step %d x %d rank(s) of %s); %s",
				p, u.BatchSize(), o.PassesPerStep, t.id.Size, asked, shareNote(p, t.id.Size))
		}
	}
	return nil
}

// modelConfig is the architecture: --preset's, or the one an OpenSeq2Seq
// config gives, for the corpus's vocabulary.
func (t *Trainer) modelConfig() (transformer.Config, error) {
	if t.o.Model == nil {
		return transformer.Preset(t.o.Preset, t.data.VocabSize)
	}
	cfg := *t.o.Model
	cfg.Vocab = t.data.VocabSize
	if cfg.LNEps == 0 {
		cfg.LNEps = 1e-6
	}
	return cfg, cfg.Validate()
}

// newOptimizer is the lab's LazyAdam, or the optimizer a config names.
func newOptimizer(m *transformer.Model, a *AdamConfig) *transformer.Adam {
	if a == nil {
		return transformer.NewLazyAdam(m)
	}
	o := transformer.NewAdam(m, a.Beta1, a.Beta2, a.Eps)
	o.Lazy = a.Lazy
	return o
}

// configure sets the backend up: the CPU threads (0 on a device, the
// count otherwise), the --precision, the GPU sampler.
func (t *Trainer) configure(be kernels.Backend, why string) (int, error) {
	o := t.o
	threads := 0 // compute threads per rank, on the CPU
	if c, ok := be.(*cpu.Backend); ok {
		threads = o.threadsFor(t.id.LocalSize)
		c.Threads = threads
		cpu.SetThreads(threads)
	}
	t.logf("nmt-train: device %s", why)
	var err error
	t.acts, t.prec, err = precision(o.Precision, be)
	if err != nil {
		return 0, err
	}
	t.lossScaling = t.prec == "fp16"
	switch t.prec {
	case "fp16", "bf16":
		t.logf("nmt-train: precision %s: activations in %s, matrix products on tensor cores with float32 accumulation; weights, gradients and Adam in float32%s",
			t.prec, t.prec, map[bool]string{true: "; dynamic loss scaling (OpenSeq2Seq's Backoff, from 2^14)"}[t.lossScaling])
	}
	if t.gpu, err = newGPUSampler(be); err != nil {
		t.logf("nmt-train: no GPU utilization figures: %v", err)
	}
	return threads, nil
}

// openRunFiles (rank 0) cuts the killed attempt's records after a resume,
// opens metrics and events, and writes run.json and the vocabulary.
func (t *Trainer) openRunFiles(cfg transformer.Config, threads int) error {
	o := t.o
	var rw metrics.Rewind
	if t.resumedFrom >= 0 {
		// The records of the steps after the checkpoint belong to the
		// attempt that was killed: they go (kept aside), so that the
		// files and the report hold the run as it went.
		var err error
		rw, err = metrics.RewindRun(o.RunDir, int64(t.resumedFrom))
		if err != nil {
			return fmt.Errorf("--resume: %v", err)
		}
		if rw.Dropped > 0 || rw.Events > 0 {
			t.logf("nmt-train: metrics.jsonl and the event files cut back to step %d (records up to step %d of the killed attempt removed; the old metrics.jsonl is %s)",
				t.resumedFrom, rw.LastStep, orNone(filepath.Base(rw.Aside)))
		}
	}
	var err error
	t.run, err = metrics.OpenRun(o.RunDir)
	if err != nil {
		return err
	}
	// a segment of the run starts: the report adds up their times
	if err := t.run.Log("start", int64(max(0, t.resumedFrom)), nil, nil); err != nil {
		return err
	}
	if t.id.Restart > 0 {
		// the report lists the restarts: the step resumed from and the
		// logged steps the failed start made after it
		lost := max(0, rw.LastStep-int64(t.resumedFrom))
		vals := map[string]float64{"restart": float64(t.id.Restart), "steps_lost": float64(lost)}
		var text map[string]string
		if c := os.Getenv(rank.EnvRestartCause); c != "" {
			text = map[string]string{"cause": c}
		}
		if err := t.run.Log("restart", int64(t.resumedFrom), vals, text); err != nil {
			return err
		}
		if lost > 0 {
			t.logf("nmt-train: restart %d: the failed start had logged up to step %d; %d steps lost", t.id.Restart, rw.LastStep, lost)
		}
	}
	if err := t.writeRunInfo(cfg, threads); err != nil {
		return err
	}
	if err := t.data.Vocab.WriteFile(filepath.Join(o.RunDir, VocabFile)); err != nil {
		return err
	}
	for _, f := range t.data.Extra {
		if err := copyFile(f, filepath.Join(o.RunDir, filepath.Base(f))); err != nil {
			return err
		}
	}
	return nil
}

func orNone(s string) string {
	if s == "" || s == "." {
		return "unchanged"
	}
	return s
}

// abortJob is rank 0's way out when it fails before the mesh exists:
// alone it returns err; in a job it joins the mesh, as far as the first
// broadcast, to tell the other ranks, which then stop without a word
// (instead of waiting for a rendezvous that never comes).
func (t *Trainer) abortJob(ctx context.Context, err error) error {
	if t.id.Size == 1 {
		return err
	}
	mesh, cerr := rank.Connect(ctx, t.id, rank.Options{Timeout: t.o.Timeout})
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
		return fmt.Errorf("broadcast of the initial state: %v", err)
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

func (t *Trainer) writeRunInfo(cfg transformer.Config, threads int) error {
	dev := t.m.Backend().Device().String()
	if d, ok := t.m.Backend().(interface{ Describe() string }); ok {
		dev += " (" + d.Describe() + ")"
	}
	_, batch := t.data.Train.GlobalBatch() // a resumed run's own, whatever --batch-tokens says
	batchTokens := batch.Tokens
	buckets, err := bucketBytes(t.m, t.o)
	if err != nil {
		return err
	}
	ri := metrics.RunInfo{
		Preset: t.o.Preset, Params: int64(t.m.NumParams()), DModel: cfg.DModel, WorldSize: t.id.Size,
		Hosts: t.mesh.HostNames(), Device: dev, CPUModel: cpuModel(), CPUs: runtime.NumCPU(), Threads: threads, BatchTokens: batchTokens,
		LRPolicy: t.o.LRPolicy, LearningRate: t.o.LearningRate, Warmup: t.o.Warmup, MaxSteps: t.o.MaxSteps,
		LinkGbps: t.o.LinkGbps, Compression: t.o.Compression, Dataset: t.data.Stats,
		Started: float64(time.Now().UnixNano()) / 1e9, CheckpointDir: t.o.RunDir,
		Vocab: cfg.Vocab, Overlap: &t.o.Overlap, Buckets: buckets,
	}
	if t.o.LinkGbps > 0 {
		ri.LinkSource = t.linkSource
	}
	if t.o.Compression == compressPowerSGD {
		ri.PowerSGDRank, ri.PowerSGDStartStep = t.o.PowerSGDRank, t.o.PowerSGDStart
	}
	if t.resumedFrom >= 0 {
		// the run started when its first attempt did
		if prev, err := metrics.ReadRunInfo(t.o.RunDir); err == nil && prev.Started > 0 {
			ri.Started = prev.Started
		}
	}
	if err := t.run.HParams(ri); err != nil {
		return err
	}
	t.info = ri
	return metrics.WriteRunInfo(t.o.RunDir, ri)
}

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
	err := t.comm.Allreduce(ctx, b, b, collective.Float32, collective.Sum, collective.WithAlgorithm(collective.Ring))
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

func (t *Trainer) loop(ctx context.Context) error {
	o := t.o
	var (
		win        window
		lastBytes  = meshTraffic(t.mesh)
		lastLog    = time.Now()
		cpuLast    = cpuSeconds()
		smoothRaw  = math.NaN()
		trainStart = time.Now()
		// lowest: the lowest smoothed raw loss of any step so far; warned:
		// the loss growth warning was given (once a run)
		lowest = math.Inf(1)
		warned bool
	)
	t.bar = newProgress(t.out, t.leader() && !o.Quiet, t.step, o.MaxSteps)
	for t.step < o.MaxSteps {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("interrupted at step %d: %v", t.step, err)
		}
		r, err := t.trainStep(ctx)
		var diverged *divergedError
		if errors.As(err, &diverged) {
			return err
		}
		if err != nil {
			return fmt.Errorf("step %d: %w", t.step, err)
		}
		lr := t.lr.LR(t.step)
		t.step++
		win.add(r)
		t.computeTotal += r.compute.Seconds()
		t.syncTotal += r.sync.Seconds()
		t.backTotal += r.backward.Seconds()
		t.computeSteps++
		if p := r.comm.PowerSGD; p.Compressed {
			t.psgd.PowerSGDSteps++
			t.psgd.PowerSGDBytes += float64(p.Bytes)
			t.psgd.PowerSGDFP16Bytes += float64(p.FP16Bytes)
			t.psgd.PowerSGDCompute += p.Compute.Seconds()
			t.psgd.PowerSGDStep += r.dur.Seconds()
		}
		if math.IsNaN(smoothRaw) {
			smoothRaw = r.lossRaw
		} else {
			smoothRaw = 0.98*smoothRaw + 0.02*r.lossRaw
		}
		lowest = min(lowest, smoothRaw)
		t.bar.update(t.step, r.lossLab, r.tokens, r.dur)
		if t.step%o.LogEvery == 0 || t.step == o.MaxSteps {
			now := time.Now()
			moved := meshTraffic(t.mesh)
			secs := now.Sub(lastLog).Seconds()
			cpuNow := cpuSeconds()
			own := figuresOf(moved, lastBytes, secs, 100*(cpuNow-cpuLast)/secs/float64(max(1, runtime.NumCPU()/max(1, t.id.LocalSize))))
			lastBytes, lastLog, cpuLast = moved, now, cpuNow
			a := win.avg()
			win = window{}
			vals := map[string]float64{
				"loss": a.lossLab, "loss_raw": a.lossRaw, "loss_raw_smoothed": smoothRaw, "loss_raw_smoothed_lowest": lowest, "lr": lr,
				"step_time_s": a.dur, "tokens_per_s": a.tokensPerSec, "comm_exposed_ms": a.exposed * 1e3,
				"comm_ms": a.comm * 1e3, "comm_hidden_pct": a.hiddenPct, "compute_s": a.compute,
				"backward_s": a.backward, "sync_s": a.sync, "compute_sd_s": a.ownSD,
				"skipped_steps": float64(a.skipped), "epoch": float64(t.data.Train.Epoch()),
			}
			gpuNote, err := t.gatherFigures(ctx, own, vals)
			if err != nil {
				return fmt.Errorf("step %d: gathering the ranks' figures: %w", t.step, err)
			}
			outMB, inMB := vals["net_out_MBps"], vals["net_in_MBps"] // the ranks' mean, as logged
			if t.lossScaling {
				vals["loss_scale"] = float64(t.scaler.Scale)
			}
			psgd := "" // the compressed matrices' bytes and the compressor's time (docs/fusion.md)
			if t.powerSGD() != nil {
				vals["powersgd_bytes"], vals["powersgd_fp16_bytes"], vals["powersgd_compute_ms"] = a.psgdBytes, a.psgdFP16, a.psgdSec*1e3
				if a.psgdFP16 > 0 {
					psgd = fmt.Sprintf(" | powersgd %.2f MB for fp16's %.1f MB, %.0f ms", a.psgdBytes/1e6, a.psgdFP16/1e6, a.psgdSec*1e3)
				}
			}
			comm := "" // one rank communicates nothing
			if t.id.Size > 1 {
				traffic := fmt.Sprintf("net %.0f MB/s out %.0f MB/s in", outMB, inMB)
				if shmOut, shmIn := vals["shm_out_MBps"], vals["shm_in_MBps"]; shmOut+shmIn > 0 {
					if outMB+inMB == 0 { // one host: shared memory carried everything
						traffic = fmt.Sprintf("shm %.0f MB/s out %.0f MB/s in", shmOut, shmIn)
					} else {
						traffic += fmt.Sprintf(", shm %.0f/%.0f", shmOut, shmIn)
					}
				}
				comm = fmt.Sprintf(" | %s | comm exposed %.0f ms (%.0f %% hidden)%s", traffic, a.exposed*1e3, a.hiddenPct, psgd)
			}
			t.logf("step %s/%s | loss %.4f (smoothed raw %.2f) | lr %.3e | %.3f s/step | %s tok/s%s%s | ETA %s",
				report.Commas(int64(t.step)), report.Commas(int64(o.MaxSteps)), a.lossLab, smoothRaw, lr, a.dur, report.Commas(int64(a.tokensPerSec)), comm, gpuNote, t.bar.eta(t.step))
			if !warned && report.LossDiverging(smoothRaw, lowest, t.data.VocabSize) {
				warned = true
				t.logf("nmt-train: warning: %s", report.DescribeDiverging(int64(t.step), smoothRaw, lowest, t.data.VocabSize))
			}
			if t.run != nil {
				if err := t.run.Log("train", int64(t.step), vals, nil); err != nil {
					return err
				}
			}
		}
		evalNow := !o.NoEval && ((o.EvalEvery > 0 && t.step%o.EvalEvery == 0) || t.step == o.MaxSteps)
		if evalNow {
			t.bar.clear()
			if err := t.evaluate(ctx); err != nil {
				return fmt.Errorf("eval at step %d: %w", t.step, err)
			}
		}
		if (o.CkptEvery > 0 && t.step%o.CkptEvery == 0) || t.step == o.MaxSteps {
			if err := t.checkpoint(ctx); err != nil {
				return err
			}
		}
		if r.stop {
			t.bar.clear()
			return t.stop(ctx)
		}
	}
	t.bar.clear()
	if err := t.comm.Barrier(ctx); err != nil {
		return err
	}
	if t.tl != nil {
		t.tl.Close()
		t.tl = nil
		// Every rank's part is complete; rank 0 merges those it can see.
		if err := t.comm.Barrier(ctx); err != nil {
			return err
		}
	}
	if t.leader() {
		if o.Timeline != "" {
			if err := t.mergeTimeline(); err != nil {
				return err
			}
		}
		t.run.Close()
		t.run = nil
		if t.computeSteps > 0 && t.id.Size > 1 {
			n := float64(t.computeSteps)
			st := report.StepTimes{Steps: int64(t.computeSteps), Compute: t.computeTotal / n, Sync: t.syncTotal / n, Backward: t.backTotal / n}
			if k := float64(t.psgd.PowerSGDSteps); k > 0 { // means over the compressed steps
				st.PowerSGDSteps = t.psgd.PowerSGDSteps
				st.PowerSGDBytes, st.PowerSGDFP16Bytes = t.psgd.PowerSGDBytes/k, t.psgd.PowerSGDFP16Bytes/k
				st.PowerSGDCompute, st.PowerSGDStep = t.psgd.PowerSGDCompute/k, t.psgd.PowerSGDStep/k
			}
			t.logf("%s", report.AnalyzeBottleneck(t.info, st))
		}
		if err := t.writeGPUProfile(); err != nil {
			return err
		}
		rep, err := WriteReport(o.RunDir)
		if err != nil {
			return fmt.Errorf("report: %v", err)
		}
		done := fmt.Sprintf("%d steps in %s", t.step, time.Since(trainStart).Round(time.Second))
		if t.resumedFrom > 0 { // this process made only the steps after the checkpoint; the report sums every segment
			done = fmt.Sprintf("steps %d-%d in %s (the whole run: report.md)", t.resumedFrom+1, t.step, time.Since(trainStart).Round(time.Second))
		}
		t.logf("nmt-train: done, %s. Report: %s; plots: %s/*.png; TensorBoard: tensorboard --logdir %s; checkpoints: %s/ckpt-*",
			done, rep, o.RunDir, o.RunDir, o.RunDir)
	}
	return nil
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

func timelinePart(path string, r int) string { return fmt.Sprintf("%s.rank%d", path, r) }

// mergeTimeline joins the ranks' parts into one trace. Ranks on other hosts
// wrote their part on their own host; those parts are named, not merged.
func (t *Trainer) mergeTimeline() error {
	var parts, missing []string
	for r := 0; r < t.id.Size; r++ {
		p := timelinePart(t.o.Timeline, r)
		if _, err := os.Stat(p); err == nil {
			parts = append(parts, p)
		} else {
			missing = append(missing, p)
		}
	}
	if err := metrics.MergeTimelineFiles(t.o.Timeline, parts...); err != nil {
		return fmt.Errorf("timeline: %v", err)
	}
	for _, p := range parts {
		os.Remove(p)
	}
	t.logf("nmt-train: timeline of %d rank(s) written to %s (open it in https://ui.perfetto.dev or chrome://tracing)", len(parts), t.o.Timeline)
	if len(missing) > 0 {
		t.logf("nmt-train: the other ranks' timelines are on their hosts: %s", strings.Join(missing, ", "))
	}
	return nil
}

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
		return fmt.Errorf("checkpoint at step %d: %v", t.step, err)
	}
	t.logf("nmt-train: checkpoint %s", path)
	// this run's newest --keep-checkpoints, counting back from the one
	// latest now names; never that one, a newer one or another run's
	if _, err := checkpoint.Prune(t.o.RunDir, t.runID, t.o.KeepCkpts); err != nil {
		return fmt.Errorf("checkpoint at step %d: pruning old checkpoints: %v", t.step, err)
	}
	return nil
}

// divergedError ends a run that diverged: a loss, weight or Adam moment
// that is not finite, at a step in the log's numbering. Every rank meets
// it at the same step (the loss is all ranks', the weights and moments are
// the same on every rank), and only rank 0 prints it (see run). Nothing of
// the diverged state is saved: latest keeps naming the last good
// checkpoint.
type divergedError struct {
	step   int
	what   string
	latest string // rank 0: what latest names, for the line
}

func (e *divergedError) Error() string {
	return fmt.Sprintf("step %d: diverged: %s; nothing saved (%s); try a smaller --learning-rate or more --warmup-steps", e.step, e.what, e.latest)
}

// diverged is the error that stops a run diverged at step.
func (t *Trainer) diverged(step int, what string) error {
	e := &divergedError{step: step, what: what, latest: "no checkpoint yet"}
	if t.leader() {
		if ck, err := checkpoint.Latest(t.o.RunDir); err == nil {
			e.latest = "latest still names " + filepath.Base(ck)
		}
	}
	return e
}

// firstNonFinite names the first NaN or infinite value of x, a tensor laid
// out like the weights (prefix "m/" or "v/" for Adam's moments). It copies
// x to the host: for the error, not for the check.
func (t *Trainer) firstNonFinite(x kernels.Tensor, prefix string) string {
	host := make([]float32, x.Len())
	t.m.Backend().Download(host, x)
	if e := transformer.FirstNonFinite(t.m, prefix, host); e != nil {
		return e.Error()
	}
	return "a value that is not finite"
}

// runDirIsFile refuses a --run-dir that is a file, or one below a file
// (which mkdir would report as "not a directory").
func runDirIsFile(dir string) error {
	for p := filepath.Clean(dir); ; {
		if fi, err := os.Stat(p); err == nil {
			if fi.IsDir() {
				return nil
			}
			if p == filepath.Clean(dir) {
				return fmt.Errorf("--run-dir %s: is a file, not a directory", dir)
			}
			return fmt.Errorf("--run-dir %s: %s is a file, not a directory", dir, p)
		}
		up := filepath.Dir(p)
		if up == p {
			return nil
		}
		p = up
	}
}

// window averages the steps between two log lines.
type window struct {
	n                         int
	raw, lab, dur, comm, expo float64
	compute, tokens           float64 // tokens: target tokens of all ranks
	backward, sync            float64
	own, own2                 float64 // compute less sync (this rank's own work), and its squares
	skipped                   int
	// PowerSGD: the bytes of P and Q all-reduced, what the compressed
	// matrices would have been in fp16, the compressor's time
	psgdBytes, psgdFP16, psgdSec float64
}

type windowAvg struct {
	lossRaw, lossLab, dur, comm, exposed, compute, tokensPerSec, hiddenPct float64
	// backward and sync: parts of compute; ownSD: the standard deviation
	// from step to step of compute less sync (the planner's spread)
	backward, sync, ownSD float64
	skipped               int
	// per step: PowerSGD's bytes, fp16's for the same matrices, its
	// compute (0 before --powersgd-start-step)
	psgdBytes, psgdFP16, psgdSec float64
}

func (w *window) add(r stepResult) {
	w.n++
	w.raw += r.lossRaw
	w.lab += r.lossLab
	w.dur += r.dur.Seconds()
	w.comm += r.comm.Comm.Seconds()
	w.expo += r.comm.Exposed.Seconds()
	w.compute += r.compute.Seconds()
	w.backward += r.backward.Seconds()
	w.sync += r.sync.Seconds()
	own := (r.compute - r.sync).Seconds()
	w.own += own
	w.own2 += own * own
	w.tokens += float64(r.tokens)
	if r.skipped {
		w.skipped++
	}
	if p := r.comm.PowerSGD; p.Compressed {
		w.psgdBytes += float64(p.Bytes)
		w.psgdFP16 += float64(p.FP16Bytes)
		w.psgdSec += p.Compute.Seconds()
	}
}

func (w *window) avg() windowAvg {
	n := float64(max(w.n, 1))
	a := windowAvg{lossRaw: w.raw / n, lossLab: w.lab / n, dur: w.dur / n, comm: w.comm / n, exposed: w.expo / n,
		compute: w.compute / n, backward: w.backward / n, sync: w.sync / n, skipped: w.skipped,
		psgdBytes: w.psgdBytes / n, psgdFP16: w.psgdFP16 / n, psgdSec: w.psgdSec / n}
	if w.n > 1 {
		m := w.own / n
		a.ownSD = math.Sqrt(math.Max(0, (w.own2-n*m*m)/(n-1)))
	}
	if w.dur > 0 {
		a.tokensPerSec = w.tokens / w.dur
	}
	if w.comm > 0 {
		a.hiddenPct = 100 * (1 - w.expo/w.comm)
		if a.hiddenPct < 0 {
			a.hiddenPct = 0
		}
	} else {
		a.hiddenPct = 100
	}
	return a
}

// cpuSeconds is this process's user+system CPU time.
func cpuSeconds() float64 {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		s = s[i+1:]
	}
	f := strings.Fields(s)
	if len(f) < 13 {
		return 0
	}
	var u, sy float64
	fmt.Sscan(f[11], &u)
	fmt.Sscan(f[12], &sy)
	return (u + sy) / 100 // USER_HZ is 100 on Linux
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}
