package cudaemu

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"unsafe"
)

// The device's properties (GORUN_CUDA_EMU_CC, GORUN_CUDA_EMU_SMS), the PTX
// a device of them loads, and the primary context of each device. The
// driver reads its variables once, at cuInit: each case runs in a process
// of its own (TestDevPropsHelper).

const envDevProps = "GORUN_EMU_DEVPROPS_HELPER"

// TestDevPropsHelper is not a test: the tests below run the test binary
// again with GORUN_EMU_DEVPROPS_HELPER naming the case.
func TestDevPropsHelper(t *testing.T) {
	switch os.Getenv(envDevProps) {
	case "":
		return
	case "default":
		helperCC(t, 7, 0, 2)
	case "hopper":
		helperCC(t, 9, 0, 132)
	case "badcc":
		l := openLibs(t)
		l.quiet(t)
		l.expect(t, cuInvalidValue, "cuInit", 0)
		if e := l.lastError(t); !strings.Contains(e, "GORUN_CUDA_EMU_CC=nine") {
			t.Errorf("cuInit's error %q does not name the variable", e)
		}
	case "contexts":
		helperContexts(t)
	default:
		t.Fatalf("unknown case %q", os.Getenv(envDevProps))
	}
}

func runDevProps(t *testing.T, name string, env ...string) {
	t.Helper()
	l := openLibs(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestDevPropsHelper$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), append([]string{envDevProps + "=" + name, envHelperDir + "=" + l.dir}, env...)...)
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "--- PASS: TestDevPropsHelper") {
		t.Fatalf("%s: %v\n%s", name, err, out)
	}
}

// By default the emulator is a device of compute capability 7.0 with 2
// multiprocessors; GORUN_CUDA_EMU_CC=9.0 GORUN_CUDA_EMU_SMS=132 make it an
// H100/H200's 9.0 and 132. Either way PTX for a newer architecture than
// the device's is refused at cuModuleLoadData (CUDA_ERROR_NO_BINARY_FOR_GPU,
// as by the driver), and a module records its .target
// (gorunEmuModuleTarget).
func TestComputeCapability(t *testing.T) {
	runDevProps(t, "default")
	runDevProps(t, "hopper", "GORUN_CUDA_EMU_CC=9.0", "GORUN_CUDA_EMU_SMS=132")
	runDevProps(t, "badcc", "GORUN_CUDA_EMU_CC=nine")
}

const cuNoBinaryForGPU = 209

func helperCC(t *testing.T, major, minor, sms int) {
	l := setup(t)
	for attr, want := range map[int]int{75: major, 76: minor, 16: sms} {
		var v int32
		l.must(t, "cuDeviceGetAttribute", uintptr(unsafe.Pointer(&v)), uintptr(attr), 0)
		if int(v) != want {
			t.Errorf("attribute %d: %d, want %d", attr, v, want)
		}
	}
	l.quiet(t)
	for _, target := range []int{70, 75, 80, 86, 90, 100} {
		ptx := append([]byte(".version 7.8\n.target sm_"+itoa(target)+"\n.address_size 64\n"), 0)
		var m uintptr
		r := l.call(t, "cuModuleLoadData", uintptr(unsafe.Pointer(&m)), uintptr(unsafe.Pointer(&ptx[0])))
		loads := target <= 10*major+minor
		switch {
		case loads && r != cuSuccess:
			t.Errorf("compute capability %d.%d: sm_%d PTX refused: %d %s", major, minor, target, r, l.lastError(t))
		case !loads && r != cuNoBinaryForGPU:
			t.Errorf("compute capability %d.%d: sm_%d PTX: %d, want CUDA_ERROR_NO_BINARY_FOR_GPU", major, minor, target, r)
		case loads:
			if got := l.call(t, "gorunEmuModuleTarget", m); got != target {
				t.Errorf("sm_%d module: gorunEmuModuleTarget %d", target, got)
			}
		}
	}
	// a kernel's .maxntid must be its host-compiled __launch_bounds__ (128)
	for maxntid, want := range map[string]int{"128, 1, 1": cuSuccess, "64, 1, 1": cuInvalidImage, "": cuInvalidImage} {
		dir := ""
		if maxntid != "" {
			dir = ".maxntid " + maxntid + "\n"
		}
		ptx := append([]byte(".version 7.8\n.target sm_70\n.address_size 64\n.visible .entry emu_test_bounded(\n\t.param .u64 p0\n)\n"+
			dir+"{\n\tret;\n}\n"), 0)
		var m, f uintptr
		l.must(t, "cuModuleLoadData", uintptr(unsafe.Pointer(&m)), uintptr(unsafe.Pointer(&ptx[0])))
		if r := l.call(t, "cuModuleGetFunction", uintptr(unsafe.Pointer(&f)), m, uintptr(unsafe.Pointer(cstr("emu_test_bounded")))); r != want {
			t.Errorf(".maxntid %q against __launch_bounds__(128): %d, want %d (%s)", maxntid, r, want, l.lastError(t))
		}
	}
}

func itoa(v int) string {
	if v < 10 {
		return string(rune('0' + v))
	}
	return itoa(v/10) + string(rune('0'+v%10))
}

// With two devices each has its own primary context; a module and a stream
// belong to the context they were made in, and a launch with another
// context current fails. cuBLAS works in the calling thread's current
// context, and on a thread without one (as the CUDA runtime does) in
// device 0's: a handle created in device 1's context then fails, and the
// thread is left with device 0's context current.
func TestContextPerDevice(t *testing.T) {
	runDevProps(t, "contexts", "GORUN_CUDA_EMU_DEVICES=2")
}

func helperContexts(t *testing.T) {
	l := openLibs(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	l.must(t, "cuInit", 0)
	var c0, c1, cur uintptr
	l.must(t, "cuDevicePrimaryCtxRetain", uintptr(unsafe.Pointer(&c0)), 0)
	l.must(t, "cuDevicePrimaryCtxRetain", uintptr(unsafe.Pointer(&c1)), 1)
	if c0 == c1 || c0 == 0 || c1 == 0 {
		t.Fatalf("primary contexts %#x and %#x", c0, c1)
	}
	l.must(t, "cuCtxSetCurrent", c1)
	img := append([]byte(testPTXWithoutCode), 0)
	var m, f, s uintptr
	l.must(t, "cuModuleLoadData", uintptr(unsafe.Pointer(&m)), uintptr(unsafe.Pointer(&img[0])))
	l.must(t, "cuModuleGetFunction", uintptr(unsafe.Pointer(&f)), m, uintptr(unsafe.Pointer(cstr("emu_test_fill_i32"))))
	l.must(t, "cuStreamCreate", uintptr(unsafe.Pointer(&s)), 0)
	var p uintptr
	l.must(t, "cuMemAlloc_v2", uintptr(unsafe.Pointer(&p)), 64)
	launch := func(stream uintptr) int {
		v, n := int32(7), int64(16)
		args := []uintptr{uintptr(unsafe.Pointer(&p)), uintptr(unsafe.Pointer(&v)), uintptr(unsafe.Pointer(&n))}
		r := l.call(t, "cuLaunchKernel", f, 1, 1, 1, 32, 1, 1, 0, stream, uintptr(unsafe.Pointer(&args[0])), 0)
		runtime.KeepAlive(args)
		return r
	}
	if r := launch(s); r != cuSuccess {
		t.Fatalf("launch in its own context: %d %s", r, l.lastError(t))
	}
	l.quiet(t)
	l.must(t, "cuCtxSetCurrent", c0)
	if r := launch(0); r != cuInvalidHandle || !strings.Contains(l.lastError(t), "device 1's context, but device 0's is current") {
		t.Errorf("a device-1 function launched in device 0's context: %d %s", r, l.lastError(t))
	}
	// cuBLAS
	l.must(t, "cuCtxSetCurrent", c1)
	var h uintptr
	l.must(t, "cublasCreate_v2", uintptr(unsafe.Pointer(&h)))
	l.must(t, "cublasSetStream_v2", h, s)
	one, zero := float32(1), float32(0)
	gemm := func() int {
		return l.call(t, "cublasGemmEx", h, 0, 0, 4, 4, 4, uintptr(unsafe.Pointer(&one)), p, 0, 4, p, 0, 4,
			uintptr(unsafe.Pointer(&zero)), p, 0, 4, 68, ^uintptr(0))
	}
	if r := gemm(); r != 0 {
		t.Fatalf("cublasGemmEx with its context current: %d %s", r, l.lastError(t))
	}
	l.must(t, "cuCtxSetCurrent", 0) // a thread without a context
	if r := gemm(); r != 13 || !strings.Contains(l.lastError(t), "created in device 1's context, but device 0's is current") {
		t.Errorf("cublasGemmEx on a thread without a context: %d %s; want CUBLAS_STATUS_EXECUTION_FAILED naming the contexts", r, l.lastError(t))
	}
	l.must(t, "cuCtxGetCurrent", uintptr(unsafe.Pointer(&cur)))
	if cur != c0 {
		t.Errorf("after cuBLAS on a thread without a context, its current context is %#x, want device 0's %#x (the runtime's)", cur, c0)
	}
}
