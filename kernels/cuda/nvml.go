package cuda

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"unsafe"
)

// NVML (libnvidia-ml.so.1) answers the lab's "were the GPUs busy?": the
// share of time a kernel ran over the driver's last sample period, and
// the memory in use on the device (by every process, as nvidia-smi shows).

// GPUStats is one NVML sample.
type GPUStats struct {
	Util     int    // percent of time a kernel was running
	MemUsed  uint64 // bytes in use on the device
	MemTotal uint64
}

type nvml struct {
	lib                                                   *library
	init, handleByIndex, utilization, memoryInfo, errText uintptr
}

func (n *nvml) symbols() ([]string, []*uintptr) {
	return []string{"nvmlInit_v2", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo", "nvmlErrorString"},
		[]*uintptr{&n.init, &n.handleByIndex, &n.utilization, &n.memoryInfo, &n.errText}
}

var (
	nvmlOnce sync.Once
	nvmlLib  *nvml
	nvmlErr  error
)

// loadNVML opens libnvidia-ml.so.1 once per process, from where the
// first call's s says, and runs nvmlInit.
func loadNVML(s Settings) (*nvml, error) {
	nvmlOnce.Do(func() {
		lib, err := openFirst("NVML (libnvidia-ml.so.1)", candidates(s, libDirs(s), "libnvidia-ml.so.1"))
		if err != nil {
			nvmlErr = err
			return
		}
		n := &nvml{lib: lib}
		names, ptrs := n.symbols()
		if err := lib.resolve(names, ptrs); err != nil {
			nvmlErr = err
			return
		}
		if err := n.check("nvmlInit_v2", callRet(n.init)); err != nil {
			nvmlErr = err
			return
		}
		nvmlLib = n
	})
	return nvmlLib, nvmlErr
}

func (n *nvml) check(call string, r uintptr) error {
	if int32(r) == 0 {
		return nil
	}
	return fmt.Errorf("nvml: %s: %s", call, cstring(callRet(n.errText, r)))
}

// nvmlIndex maps the process's CUDA device index to NVML's, which ignores
// CUDA_VISIBLE_DEVICES (visible: its value): entry index of that list when
// it names devices by number (as gorun sets it), else index itself.
func nvmlIndex(index int, visible string) int {
	v := strings.TrimSpace(visible)
	if v == "" {
		return index
	}
	f := strings.Split(v, ",")
	if index < len(f) {
		if i, err := strconv.Atoi(strings.TrimSpace(f[index])); err == nil {
			return i
		}
	}
	return index
}

// Monitor samples NVML for the backend's GPU.
type Monitor struct {
	n      *nvml
	handle uintptr
}

// NewMonitor opens NVML for the backend's device.
func (b *Backend) NewMonitor() (*Monitor, error) {
	n, err := loadNVML(b.settings)
	if err != nil {
		return nil, err
	}
	m := &Monitor{n: n}
	if err := n.check("nvmlDeviceGetHandleByIndex_v2", callRet(n.handleByIndex, uintptr(nvmlIndex(b.index, b.settings.VisibleDevices)), uintptr(unsafe.Pointer(&m.handle)))); err != nil {
		return nil, err
	}
	return m, nil
}

// Sample reads the utilization and memory now.
func (m *Monitor) Sample() (GPUStats, error) {
	var u [2]uint32   // nvmlUtilization_t: gpu, memory
	var mem [3]uint64 // nvmlMemory_t: total, free, used
	if err := m.n.check("nvmlDeviceGetUtilizationRates", callRet(m.n.utilization, m.handle, uintptr(unsafe.Pointer(&u[0])))); err != nil {
		return GPUStats{}, err
	}
	if err := m.n.check("nvmlDeviceGetMemoryInfo", callRet(m.n.memoryInfo, m.handle, uintptr(unsafe.Pointer(&mem[0])))); err != nil {
		return GPUStats{}, err
	}
	return GPUStats{Util: int(u[0]), MemUsed: mem[2], MemTotal: mem[0]}, nil
}
