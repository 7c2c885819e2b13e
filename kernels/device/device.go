// Package device chooses the compute backend a process trains on: the
// --device flag of nmt-train (auto, cpu or cuda).
package device

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/gorun/gorun/kernels"
	"github.com/gorun/gorun/kernels/cpu"
	"github.com/gorun/gorun/kernels/cuda"
	"github.com/gorun/gorun/rank"
)

// Names lists the accepted --device values.
const Names = "auto, cpu or cuda"

// Open returns the backend that spec names: "cpu"; "cuda" (a GPU, or an
// error naming what is missing); "auto" (cuda when a GPU is usable, else
// cpu). The second result says what was chosen and why, for the log.
//
// A rank uses the GPU its local rank selects: gorun leaves each rank one
// device through CUDA_VISIBLE_DEVICES, and where a rank sees several it
// takes local rank modulo their number (cuda.VisibleIndex).
func Open(spec string) (kernels.Backend, string, error) {
	switch strings.ToLower(strings.TrimSpace(spec)) {
	case "cpu":
		return openCPU("--device cpu")
	case "", "auto":
		if err := cuda.Available(); err != nil {
			return openCPU(fmt.Sprintf("--device auto: no usable GPU: %v", err))
		}
		be, why, err := openCUDA()
		if err != nil {
			return nil, "", fmt.Errorf("--device auto: a GPU is present but %w", err)
		}
		return be, why, nil
	case "cuda", "gpu":
		be, why, err := openCUDA()
		if err != nil {
			return nil, "", fmt.Errorf("--device cuda: %w", err)
		}
		return be, why, nil
	}
	return nil, "", fmt.Errorf("unknown --device %q (want %s)", spec, Names)
}

// openCPU opens the CPU backend with the SGEMM micro-kernel that
// GORUN_SGEMM_KERNEL names (unset: the best this CPU runs); why says how
// the CPU was chosen.
func openCPU(why string) (kernels.Backend, string, error) {
	if name, ok := os.LookupEnv(cpu.EnvSgemmKernel); ok {
		if _, err := cpu.SetSgemmKernel(name); err != nil {
			return nil, "", fmt.Errorf("%s=%s: %w", cpu.EnvSgemmKernel, name, err)
		}
	}
	return cpu.New(), fmt.Sprintf("cpu (%s; SGEMM micro-kernel %s of %s)", why, cpu.SgemmKernel(), strings.Join(cpu.SgemmKernels(), ", ")), nil
}

func openCUDA() (kernels.Backend, string, error) {
	if err := cuda.Available(); err != nil {
		return nil, "", err
	}
	n, _ := cuda.Count()
	local, _ := strconv.Atoi(os.Getenv(rank.EnvLocalRank))
	idx := cuda.VisibleIndex(local, n)
	be, err := cuda.Open(idx)
	if err != nil {
		return nil, "", err
	}
	return be, fmt.Sprintf("cuda:%d %s, CUDA_VISIBLE_DEVICES=%q", idx, be.Describe(), os.Getenv("CUDA_VISIBLE_DEVICES")), nil
}
