package train

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/kernels"
	"github.com/gorun/gorun/kernels/cuda"
)

// precision resolves --precision for the backend: the type of the
// activations (and of the inputs of matrix products), and its name; the
// loss is scaled for fp16 only (bf16 has float32's range).
func precision(flag string, be kernels.Backend) (dt dtype.DType, name string, err error) {
	mp, gpu := be.(kernels.MixedPrecision)
	switch flag {
	case "auto":
		if gpu {
			flag = "fp16"
		} else {
			flag = "fp32"
		}
	case "fp16", "bf16":
		if !gpu {
			return 0, "", fmt.Errorf("--precision %s needs a GPU (--device cuda); the %s backend computes in fp32", flag, be.Name())
		}
	}
	dt = map[string]dtype.DType{"fp32": dtype.Float32, "fp16": dtype.Float16, "bf16": dtype.BFloat16}[flag]
	if gpu {
		mp.SetMatmulPrecision(dt)
	}
	return dt, flag, nil
}

// gpuSampler averages NVML's utilization of the rank's GPU over each log
// interval (the lab's "were the GPUs busy?"), sampling four times a
// second; NVML's own figure is the share of its last sample period in
// which a kernel ran.
type gpuSampler struct {
	be   *cuda.Backend
	mon  *cuda.Monitor
	stop chan struct{}
	done chan struct{}

	mu   sync.Mutex
	sum  float64
	n    int
	last cuda.GPUStats
}

// newGPUSampler starts sampling when be is a GPU; nil when it is not.
func newGPUSampler(be kernels.Backend) (*gpuSampler, error) {
	cb, ok := be.(*cuda.Backend)
	if !ok {
		return nil, nil
	}
	mon, err := cb.NewMonitor()
	if err != nil {
		return nil, err
	}
	g := &gpuSampler{be: cb, mon: mon, stop: make(chan struct{}), done: make(chan struct{})}
	go g.run()
	return g, nil
}

func (g *gpuSampler) run() {
	defer close(g.done)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-tick.C:
		}
		s, err := g.mon.Sample()
		if err != nil {
			continue
		}
		g.mu.Lock()
		g.sum += float64(s.Util)
		g.n++
		g.last = s
		g.mu.Unlock()
	}
}

// take returns the interval's mean utilization (percent), the device
// memory in use (MiB, every process, as nvidia-smi shows) and the peak
// of gorun's own allocations (MiB), and starts a new interval.
func (g *gpuSampler) take() (util, usedMiB, peakMiB float64, ok bool) {
	if g == nil {
		return 0, 0, 0, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n == 0 {
		return 0, 0, 0, false
	}
	util, usedMiB = g.sum/float64(g.n), float64(g.last.MemUsed)/(1<<20)
	g.sum, g.n = 0, 0
	_, peak, _ := g.be.MemStats()
	return util, usedMiB, float64(peak) / (1 << 20), true
}

func (g *gpuSampler) close() {
	if g != nil {
		close(g.stop)
		<-g.done
	}
}

// GPUProfileFile is where rank 0 writes its GPU's profile at the end of a
// run with GORUN_CUDA_PROFILE=1 (in the run directory).
const GPUProfileFile = "gpu-profile.txt"

// writeGPUProfile writes rank 0's GPU time by operation over this
// process's steps (and the evaluations and checkpoints among them: they
// queue their work on the GPU too) to the run directory and logs its largest rows, when
// the backend profiles (GORUN_CUDA_PROFILE=1); nothing otherwise.
func (t *Trainer) writeGPUProfile() error {
	if t.gpu == nil || !t.gpu.be.Profiling() {
		return nil
	}
	steps := t.step - max(0, t.resumedFrom)
	head := fmt.Sprintf("GPU time by operation on rank 0's %s over %d steps, with the evaluations and checkpoints among them "+
		"(%s=1: two CUDA events around each operation, which slow the steps)\n\n", t.gpu.be.Describe(), steps, cuda.EnvProfile)
	path := filepath.Join(t.o.RunDir, GPUProfileFile)
	if err := os.WriteFile(path, []byte(head+cuda.FormatProfile(t.gpu.be.TakeProfile(), steps, 1000)), 0o644); err != nil {
		return fmt.Errorf("GPU profile: %w", err)
	}
	t.logf("nmt-train: GPU profile (%s=1): %s", cuda.EnvProfile, path)
	return nil
}
