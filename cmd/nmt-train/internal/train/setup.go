package train

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/kernels"
	"github.com/gorun/gorun/kernels/cpu"
	"github.com/gorun/gorun/metrics"
	"github.com/gorun/gorun/plan"
	"github.com/gorun/gorun/rank"
	"github.com/gorun/gorun/report"
	"github.com/gorun/gorun/transformer"
)

// The trainer's setup before the first step: the device and its
// precision, the corpus, the model and its optimizer, the mesh and the
// communicator, the settings check and the link probe, the initial state
// and the gradient reducer, and the run's files (rank 0).

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

	t.mesh, err = t.connect(ctx, o.Timeout)
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
		t.red = newPlainReducer(ctx, t.comm, t.m, comp)
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

// commConfig is the collectives' settings for a communicator over mesh:
// the environment's, the trainer's timeout and the link between hosts.
func (t *Trainer) commConfig(mesh *rank.Mesh) collective.Config {
	cfg := t.o.Collective
	cfg.Timeout, cfg.Across = t.o.Timeout, plan.Across(mesh.TransportChoice())
	return cfg
}
