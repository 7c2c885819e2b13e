// Package device chooses the compute backend a process trains on: the
// --device flag of nmt-train (auto, cpu or cuda).
package device

import (
	"fmt"
	"strings"

	"github.com/gorun/gorun/kernels"
	"github.com/gorun/gorun/kernels/cpu"
	"github.com/gorun/gorun/kernels/cuda"
)

// Names lists the accepted --device values.
const Names = "auto, cpu or cuda"

// Settings are what Open needs besides the --device value. A program reads
// them from its environment once, at its edge (internal/envconf.Device).
type Settings struct {
	// SgemmKernel names the CPU backend's SGEMM micro-kernel
	// (cpu.EnvSgemmKernel, for cpu.SetSgemmKernel: "auto" is the best this
	// CPU runs); empty leaves the one chosen before.
	SgemmKernel string
	// LocalRank is the rank's number on its host (rank.EnvLocalRank): it
	// picks the GPU among several (cuda.VisibleIndex).
	LocalRank int
	// CUDA is where the GPU backend finds NVIDIA's libraries and the modes
	// it opens in.
	CUDA cuda.Settings
}

// Open returns the backend that spec names: "cpu"; "cuda" (a GPU, or an
// error naming what is missing); "auto" (cuda when a GPU is usable, else
// cpu). The second result says what was chosen and why, for the log.
//
// A rank uses the GPU its local rank selects: gorun leaves each rank one
// device through CUDA_VISIBLE_DEVICES, and where a rank sees several it
// takes local rank modulo their number (cuda.VisibleIndex).
func Open(spec string, s Settings) (kernels.Backend, string, error) {
	switch strings.ToLower(strings.TrimSpace(spec)) {
	case "cpu":
		return openCPU("--device cpu", s)
	case "", "auto":
		if err := cuda.Available(s.CUDA); err != nil {
			return openCPU(fmt.Sprintf("--device auto: no usable GPU: %v", err), s)
		}
		be, why, err := openCUDA(s)
		if err != nil {
			return nil, "", fmt.Errorf("--device auto: a GPU is present but %w", err)
		}
		return be, why, nil
	case "cuda", "gpu":
		be, why, err := openCUDA(s)
		if err != nil {
			return nil, "", fmt.Errorf("--device cuda: %w", err)
		}
		return be, why, nil
	}
	return nil, "", fmt.Errorf("unknown --device %q (want %s)", spec, Names)
}

// openCPU opens the CPU backend with the SGEMM micro-kernel that
// s.SgemmKernel names (empty: the one chosen before, at first the best
// this CPU runs); why says how the CPU was chosen.
func openCPU(why string, s Settings) (kernels.Backend, string, error) {
	if s.SgemmKernel != "" {
		if _, err := cpu.SetSgemmKernel(s.SgemmKernel); err != nil {
			return nil, "", fmt.Errorf("%s=%s: %w", cpu.EnvSgemmKernel, s.SgemmKernel, err)
		}
	}
	return cpu.New(), fmt.Sprintf("cpu (%s; SGEMM micro-kernel %s of %s)", why, cpu.SgemmKernel(), strings.Join(cpu.SgemmKernels(), ", ")), nil
}

func openCUDA(s Settings) (kernels.Backend, string, error) {
	if err := cuda.Available(s.CUDA); err != nil {
		return nil, "", err
	}
	n, _ := cuda.Count(s.CUDA)
	idx := cuda.VisibleIndex(s.LocalRank, n)
	be, err := cuda.Open(idx, s.CUDA)
	if err != nil {
		return nil, "", err
	}
	return be, fmt.Sprintf("cuda:%d %s, %s=%q", idx, be.Describe(), cuda.EnvVisibleDevices, s.CUDA.VisibleDevices), nil
}
