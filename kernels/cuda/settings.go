package cuda

// EnvVisibleDevices is the variable through which the driver is given the
// GPUs a process sees (gorun leaves each rank one). The backend does not
// read it (the driver does): Settings.VisibleDevices carries its value
// for NVML's device numbers and for messages.
const EnvVisibleDevices = "CUDA_VISIBLE_DEVICES"

// Settings are where the backend looks for NVIDIA's libraries and the
// modes Open starts it in. A program reads them from its environment once,
// at its edge (internal/envconf.CUDA); the zero value looks in the
// system's places only and opens a backend in neither mode. The libraries
// are loaded once per process: from the places that the Settings of the
// first Available, Count or Open name.
type Settings struct {
	// LibDir is searched first for libcuda.so.1, libcublas.so.* and
	// libnvidia-ml.so.1 (EnvLibDir).
	LibDir string
	// CUDAHome and CUDAPath are toolkits whose lib64 and lib are searched
	// next ($CUDA_HOME, $CUDA_PATH).
	CUDAHome, CUDAPath string
	// VirtualEnv and CondaPrefix are the active Python environments, and
	// PythonPath a list of package directories ($VIRTUAL_ENV,
	// $CONDA_PREFIX, $PYTHONPATH): where cuBLAS from pip's wheels is
	// looked for.
	VirtualEnv, CondaPrefix, PythonPath string
	// VisibleDevices is the value of EnvVisibleDevices the driver was
	// given (empty: unset).
	VisibleDevices string
	// ExactAlloc makes every allocation its exact size (EnvExactAlloc).
	ExactAlloc bool
	// Profile times every operation on the GPU (EnvProfile).
	Profile bool
}
