package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// The CUDA driver API (libcuda.so.1), called through purego: no cgo, so
// a binary built here runs on any machine and finds the driver at run
// time. Only the calls the backend needs are bound.

// result is a CUresult.
type result int32

// cuSuccess is the CUresult of a call that worked.
const cuSuccess result = 0

// Device attributes (CUdevice_attribute).
const (
	attrMultiprocessors = 16
	attrCCMajor         = 75
	attrCCMinor         = 76
)

// Flags.
const (
	streamNonBlocking  = 0x1 // CU_STREAM_NON_BLOCKING
	eventBlockingSync  = 0x1 // CU_EVENT_BLOCKING_SYNC: a waiting thread sleeps
	eventDisableTiming = 0x2 // CU_EVENT_DISABLE_TIMING
)

// driver holds the resolved entry points.
type driver struct {
	lib *library

	init, driverGetVersion, deviceGetCount, deviceGet, deviceGetName, deviceGetAttribute uintptr
	deviceTotalMem, primaryCtxRetain, primaryCtxRelease, ctxSetCurrent, ctxSynchronize   uintptr
	streamCreate, streamDestroy, streamSynchronize, streamWaitEvent                      uintptr
	eventCreate, eventRecord, eventSynchronize, eventQuery, eventDestroy, eventElapsed   uintptr
	memAlloc, memFree, memAllocHost, memFreeHost, memGetInfo                             uintptr
	memcpyHtoDAsync, memcpyDtoHAsync, memcpyDtoDAsync, memsetD8Async                     uintptr
	moduleLoadData, moduleGetFunction, launchKernel, getErrorName, getErrorString        uintptr

	// ctx is the primary context that retry makes current on a thread
	// where a call found none.
	ctx uintptr
}

// driverSymbols pairs every driver function the backend calls with its
// slot; the symbol test checks each name against Debian's libcuda1.
func (d *driver) symbols() ([]string, []*uintptr) {
	m := []struct {
		name string
		p    *uintptr
	}{
		{"cuInit", &d.init}, {"cuDriverGetVersion", &d.driverGetVersion}, {"cuDeviceGetCount", &d.deviceGetCount},
		{"cuDeviceGet", &d.deviceGet}, {"cuDeviceGetName", &d.deviceGetName}, {"cuDeviceGetAttribute", &d.deviceGetAttribute},
		{"cuDeviceTotalMem_v2", &d.deviceTotalMem}, {"cuDevicePrimaryCtxRetain", &d.primaryCtxRetain},
		{"cuDevicePrimaryCtxRelease_v2", &d.primaryCtxRelease}, {"cuCtxSetCurrent", &d.ctxSetCurrent},
		{"cuCtxSynchronize", &d.ctxSynchronize}, {"cuStreamCreate", &d.streamCreate}, {"cuStreamDestroy_v2", &d.streamDestroy},
		{"cuStreamSynchronize", &d.streamSynchronize}, {"cuStreamWaitEvent", &d.streamWaitEvent},
		{"cuEventCreate", &d.eventCreate}, {"cuEventRecord", &d.eventRecord}, {"cuEventSynchronize", &d.eventSynchronize},
		{"cuEventQuery", &d.eventQuery}, {"cuEventDestroy_v2", &d.eventDestroy}, {"cuEventElapsedTime", &d.eventElapsed},
		{"cuMemAlloc_v2", &d.memAlloc}, {"cuMemFree_v2", &d.memFree}, {"cuMemAllocHost_v2", &d.memAllocHost},
		{"cuMemFreeHost", &d.memFreeHost}, {"cuMemGetInfo_v2", &d.memGetInfo},
		{"cuMemcpyHtoDAsync_v2", &d.memcpyHtoDAsync}, {"cuMemcpyDtoHAsync_v2", &d.memcpyDtoHAsync},
		{"cuMemcpyDtoDAsync_v2", &d.memcpyDtoDAsync}, {"cuMemsetD8Async", &d.memsetD8Async},
		{"cuModuleLoadData", &d.moduleLoadData}, {"cuModuleGetFunction", &d.moduleGetFunction},
		{"cuLaunchKernel", &d.launchKernel}, {"cuGetErrorName", &d.getErrorName}, {"cuGetErrorString", &d.getErrorString},
	}
	names := make([]string, len(m))
	ptrs := make([]*uintptr, len(m))
	for i, e := range m {
		names[i], ptrs[i] = e.name, e.p
	}
	return names, ptrs
}

var (
	drvOnce sync.Once
	drv     *driver
	drvErr  error
)

// loadDriver opens libcuda.so.1 once per process, from where the first
// call's s says, and runs cuInit.
func loadDriver(s Settings) (*driver, error) {
	drvOnce.Do(func() {
		lib, err := openFirst("the NVIDIA driver library libcuda.so.1", candidates(s, libDirs(s), "libcuda.so.1"))
		if err != nil {
			drvErr = err
			return
		}
		d := &driver{lib: lib}
		names, ptrs := d.symbols()
		if err := lib.resolve(names, ptrs); err != nil {
			drvErr = fmt.Errorf("%s is too old for gorun: %w", lib.path, err)
			return
		}
		if err := d.check("cuInit", d.call(d.init, 0)); err != nil {
			drvErr = err
			return
		}
		drv = d
	})
	return drv, drvErr
}

// call runs one driver function. The context is bound per OS thread and
// goroutines move between threads, so once the backend has its context
// the goroutine stays on its thread for the call and makes the context
// current first (a thread-local store in the driver), as cublas.call
// does. Making it current only after a call failed with
// CUDA_ERROR_INVALID_CONTEXT, and calling again, gave the same results,
// but compute-sanitizer reports every such failed call as an error
// (bench/gpu/run.sh runs the conformance table under it). Pointer
// arguments are passed as uintptr(unsafe.Pointer(&x)) in the call itself;
// uintptrescapes keeps x alive and in place (on the heap) until the call
// returns.
//
//go:uintptrescapes
func (d *driver) call(fn uintptr, args ...uintptr) result {
	if d.ctx == 0 {
		r, _, _ := purego.SyscallN(fn, args...)
		return result(r)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	purego.SyscallN(d.ctxSetCurrent, d.ctx)
	r, _, _ := purego.SyscallN(fn, args...)
	return result(r)
}

// Error is a failed driver or cuBLAS call.
type Error struct {
	Call string
	Code int
	Name string
	Text string
}

func (e *Error) Error() string {
	if e.Text != "" {
		return fmt.Sprintf("cuda: %s: %s (%s)", e.Call, e.Text, e.Name)
	}
	return fmt.Sprintf("cuda: %s: %s", e.Call, e.Name)
}

// Failure turns the panic of a failed GPU call into an error: the
// Backend interface has no error results, so a kernel fault or exhausted
// device memory surfaces as a panic carrying an *Error, and an index out
// of range that a kernel read from data as one carrying an *IndexError. A
// caller that recovers passes the value here to print one line and exit;
// any other panic is a bug and goes on.
func Failure(r any) error {
	if e, ok := r.(error); ok {
		var ce *Error
		var ie *IndexError
		if errors.As(e, &ce) || errors.As(e, &ie) {
			return fmt.Errorf("GPU: %w", e)
		}
	}
	panic(r)
}

// check turns a CUresult into an error naming the call.
func (d *driver) check(call string, r result) error {
	if r == cuSuccess {
		return nil
	}
	var name, text uintptr
	purego.SyscallN(d.getErrorName, uintptr(r), uintptr(unsafe.Pointer(&name)))
	purego.SyscallN(d.getErrorString, uintptr(r), uintptr(unsafe.Pointer(&text)))
	e := &Error{Call: call, Code: int(r), Name: cstring(name), Text: cstring(text)}
	if e.Name == "" {
		e.Name = fmt.Sprintf("CUresult %d", int(r))
	}
	return e
}

// must panics with the error of a failed call: a device failure in the
// middle of an op (an illegal address, a lost GPU) cannot be returned
// through the Backend interface; the trainer's recover turns it into one
// line naming the rank.
func (d *driver) must(call string, r result) {
	if err := d.check(call, r); err != nil {
		panic(err)
	}
}

// deviceCount returns the number of devices this process sees
// (CUDA_VISIBLE_DEVICES applies).
func (d *driver) deviceCount() (int, error) {
	var n int32
	if err := d.check("cuDeviceGetCount", d.call(d.deviceGetCount, uintptr(unsafe.Pointer(&n)))); err != nil {
		return 0, err
	}
	return int(n), nil
}

func (d *driver) attribute(dev int32, attr int) int {
	var v int32
	d.call(d.deviceGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(attr), uintptr(dev))
	return int(v)
}

func (d *driver) deviceName(dev int32) string {
	buf := make([]byte, 256)
	if d.call(d.deviceGetName, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(dev)) != cuSuccess {
		return "unknown GPU"
	}
	for i, c := range buf {
		if c == 0 {
			return string(buf[:i])
		}
	}
	return string(buf)
}

func (d *driver) version() int {
	var v int32
	d.call(d.driverGetVersion, uintptr(unsafe.Pointer(&v)))
	return int(v)
}
