// Package envconf reads gorun's environment variables at a program's edge:
// a command calls it once with os.LookupEnv, and the libraries get what it
// read in their Config and Settings structs. A malformed value is an error
// that names the variable; an unset one leaves the library's default.
package envconf

import (
	"fmt"
	"strconv"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/kernels/cpu"
	"github.com/gorun/gorun/kernels/cuda"
	"github.com/gorun/gorun/kernels/device"
	"github.com/gorun/gorun/rank"
)

// Lookup is os.LookupEnv, or a map's lookup in tests.
type Lookup func(name string) (string, bool)

// The collectives' variables (docs/collective.md). Every rank of a job
// must be given the same values.
const (
	Allreduce    = "GORUN_ALLREDUCE"    // ring | tree | direct | shm | hd | rd | auto
	SliceBytes   = "GORUN_SLICE_BYTES"  // pipeline slice size in bytes (>= 64)
	Rings        = "GORUN_RINGS"        // channels (rings, trees) used in parallel (>= 1)
	Hierarchical = "GORUN_HIERARCHICAL" // 0: no two-level allreduce
	SharedRound  = "GORUN_SHM_ROUND"    // bytes a round of the shared-memory allreduce handles (>= 4096)
)

// Collective is the collective.Config the variables above ask for.
// GORUN_SHM_ROUND below 4096 or not a number is ignored, as it always was.
func Collective(get Lookup) (collective.Config, error) {
	var cfg collective.Config
	if v, ok := get(Allreduce); ok {
		a, err := algo.ParseAlgorithm(v)
		if err != nil {
			return cfg, fmt.Errorf("%s: %w", Allreduce, err)
		}
		cfg.Algorithm = a
	}
	var err error
	if cfg.SliceBytes, err = atLeast(get, SliceBytes, 64); err != nil {
		return cfg, err
	}
	if cfg.Channels, err = atLeast(get, Rings, 1); err != nil {
		return cfg, err
	}
	if v, _ := get(Hierarchical); v == "0" {
		cfg.Flat = true
	}
	if v, _ := get(SharedRound); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n >= 4096 {
			cfg.SharedRoundBytes = n
		}
	}
	return cfg, nil
}

// Where the CUDA backend looks for NVIDIA's libraries besides
// cuda.EnvLibDir (docs/cuda.md). The backend's own variables
// (cuda.EnvLibDir, cuda.EnvExactAlloc, cuda.EnvProfile,
// cuda.EnvVisibleDevices) are declared there: its messages name them.
const (
	CUDAHome    = "CUDA_HOME"    // a CUDA toolkit: its lib64 and lib
	CUDAPath    = "CUDA_PATH"    // the same, as some installers name it
	VirtualEnv  = "VIRTUAL_ENV"  // the active venv: pip's NVIDIA wheels
	CondaPrefix = "CONDA_PREFIX" // the active conda environment: the same
	PythonPath  = "PYTHONPATH"   // more Python package directories: the same
)

// CUDA is the cuda.Settings the variables ask for. GORUN_CUDA_EXACT_ALLOC
// and GORUN_CUDA_PROFILE take 1 or 0 (unset or empty: 0).
func CUDA(get Lookup) (cuda.Settings, error) {
	s := cuda.Settings{
		LibDir:         value(get, cuda.EnvLibDir),
		CUDAHome:       value(get, CUDAHome),
		CUDAPath:       value(get, CUDAPath),
		VirtualEnv:     value(get, VirtualEnv),
		CondaPrefix:    value(get, CondaPrefix),
		PythonPath:     value(get, PythonPath),
		VisibleDevices: value(get, cuda.EnvVisibleDevices),
	}
	var err error
	if s.Profile, err = onOff(get, cuda.EnvProfile, "time every operation on the GPU"); err != nil {
		return s, err
	}
	if s.ExactAlloc, err = onOff(get, cuda.EnvExactAlloc, "every allocation its exact size, every Free to the driver"); err != nil {
		return s, err
	}
	return s, nil
}

// Device is the device.Settings the variables ask for: CUDA's, the CPU's
// SGEMM micro-kernel (cpu.EnvSgemmKernel; set but empty: the best this
// CPU runs; whether this CPU runs it is device.Open's to say) and the
// local rank (rank.EnvLocalRank; not a number is 0, as it always was).
func Device(get Lookup) (device.Settings, error) {
	c, err := CUDA(get)
	if err != nil {
		return device.Settings{}, err
	}
	s := device.Settings{CUDA: c}
	if v, ok := get(cpu.EnvSgemmKernel); ok {
		s.SgemmKernel = v
		if v == "" {
			s.SgemmKernel = "auto"
		}
	}
	s.LocalRank, _ = strconv.Atoi(value(get, rank.EnvLocalRank))
	return s, nil
}

// value is name's value; unset is "".
func value(get Lookup, name string) string {
	v, _ := get(name)
	return v
}

// onOff reads name as 1 (on: what) or 0; unset or empty is 0.
func onOff(get Lookup, name, what string) (bool, error) {
	switch v := value(get, name); v {
	case "", "0":
		return false, nil
	case "1":
		return true, nil
	default:
		return false, fmt.Errorf("cuda: %s=%q: want 1 (%s) or 0", name, v, what)
	}
}

// atLeast reads name as an integer of at least lo; unset or empty is 0.
func atLeast(get Lookup, name string, lo int) (int, error) {
	v, _ := get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo {
		return 0, fmt.Errorf("%s=%q: want an integer >= %d", name, v, lo)
	}
	return n, nil
}
