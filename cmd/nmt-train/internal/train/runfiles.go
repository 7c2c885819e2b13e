package train

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/gorun/gorun/metrics"
	"github.com/gorun/gorun/rank"
	"github.com/gorun/gorun/transformer"
)

// The files rank 0 opens and writes in the run directory at the start of
// a run: metrics and events (cut back after a resume, with the restart's
// record), run.json, the vocabulary and the config's extra files.

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
			return fmt.Errorf("--resume: %w", err)
		}
		if rw.Dropped > 0 || rw.Events > 0 {
			t.logf("nmt-train: metrics.jsonl and the event files cut back to step %d (records up to step %d of the killed attempt removed; the old metrics.jsonl is %s)",
				t.resumedFrom, rw.LastStep, orUnchanged(filepath.Base(rw.Aside)))
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

func orUnchanged(s string) string {
	if s == "" || s == "." {
		return "unchanged"
	}
	return s
}

func (t *Trainer) writeRunInfo(cfg transformer.Config, threads int) error {
	dev := t.m.Backend().Device().String()
	if d, ok := t.m.Backend().(interface{ Describe() string }); ok {
		dev += " (" + d.Describe() + ")"
	}
	_, batch := t.data.Train.GlobalBatch() // a resumed run's own, whatever --batch-tokens says
	batchTokens := batch.Tokens
	buckets, err := BucketBytes(t.m.Params, t.o.BucketCapMB, t.o.FirstBucketMB)
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

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}
