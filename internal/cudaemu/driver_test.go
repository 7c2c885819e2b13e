package cudaemu

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"unsafe"
)

// TestHelperProcess is not a test: the tests below run the test binary
// again with GORUN_EMU_TEST_HELPER set, for what needs a fresh process.
func TestHelperProcess(t *testing.T) {
	switch os.Getenv(envHelper) {
	case "":
		return // run as a test, it has nothing to do (not a skip: nothing is left unchecked)
	case "notinit":
		helperNotInit(t)
	case "novisible":
		helperNoVisible(t)
	case "visible":
		helperVisible(t)
	case "kernelscu":
		helperKernelsCU(t)
	default:
		t.Fatalf("unknown helper %q", os.Getenv(envHelper))
	}
}

// runHelper runs TestHelperProcess in a new process.
func runHelper(t *testing.T, helper string, env ...string) string {
	t.Helper()
	l := openLibs(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.v")
	cmd.Env = append(os.Environ(), append([]string{envHelper + "=" + helper, envHelperDir + "=" + l.dir}, env...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper %s: %v\n%s", helper, err, out)
	}
	return string(out)
}

func TestNotInitialized(t *testing.T) { runHelper(t, "notinit") }

func helperNotInit(t *testing.T) {
	l := openLibs(t)
	l.quiet(t)
	var n int32
	l.expect(t, cuNotInitialized, "cuDeviceGetCount", uintptr(unsafe.Pointer(&n)))
	var p uintptr
	l.expect(t, cuNotInitialized, "cuMemAlloc_v2", uintptr(unsafe.Pointer(&p)), 64)
	var v int32
	l.must(t, "cuDriverGetVersion", uintptr(unsafe.Pointer(&v))) // allowed before cuInit
	l.expect(t, cuInvalidValue, "cuInit", 1)
	l.must(t, "cuInit", 0)
	l.must(t, "cuDeviceGetCount", uintptr(unsafe.Pointer(&n)))
	if n != 1 {
		t.Errorf("%d devices, want 1", n)
	}
	// NVML before nvmlInit
	var cnt uint32
	l.expect(t, 1, "nvmlDeviceGetCount_v2", uintptr(unsafe.Pointer(&cnt)))
	l.expect(t, 1, "nvmlShutdown")
}

func TestCUDAVisibleDevices(t *testing.T) { runHelper(t, "novisible", "CUDA_VISIBLE_DEVICES=1") }

func helperNoVisible(t *testing.T) {
	l := openLibs(t)
	l.quiet(t)
	l.expect(t, cuNoDevice, "cuInit", 0)
}

// GORUN_CUDA_EMU_DEVICES emulates more devices (a rank per device on a
// host without GPUs); the list stops at the first device that is not there.
func TestMoreDevices(t *testing.T) {
	runHelper(t, "visible", "GORUN_CUDA_EMU_DEVICES=2", "CUDA_VISIBLE_DEVICES=1, 0,5,1")
}

func helperVisible(t *testing.T) {
	l := openLibs(t)
	l.must(t, "cuInit", 0)
	var n int32
	l.must(t, "cuDeviceGetCount", uintptr(unsafe.Pointer(&n)))
	var nv uint32
	l.must(t, "nvmlInit_v2")
	l.must(t, "nvmlDeviceGetCount_v2", uintptr(unsafe.Pointer(&nv)))
	var dev uintptr
	l.must(t, "nvmlDeviceGetHandleByIndex_v2", 1, uintptr(unsafe.Pointer(&dev)))
	if n != 2 || nv != 2 {
		t.Errorf("%d CUDA devices, %d NVML devices; want 2, 2", n, nv)
	}
}

func TestDriverBasics(t *testing.T) {
	l := setup(t)
	var v int32
	l.must(t, "cuDriverGetVersion", uintptr(unsafe.Pointer(&v)))
	if v != 12020 {
		t.Errorf("driver version %d", v)
	}
	var n, dev int32
	l.must(t, "cuDeviceGetCount", uintptr(unsafe.Pointer(&n)))
	l.must(t, "cuDeviceGet", uintptr(unsafe.Pointer(&dev)), 0)
	if n != 1 || dev != 0 {
		t.Errorf("count %d, device %d", n, dev)
	}
	l.quiet(t)
	l.expect(t, 101, "cuDeviceGet", uintptr(unsafe.Pointer(&dev)), 1)
	buf := make([]byte, 64)
	l.must(t, "cuDeviceGetName", uintptr(unsafe.Pointer(&buf[0])), 64, 0)
	if got := cstring(buf); got != "gorun CUDA emulator (CPU)" {
		t.Errorf("name %q", got)
	}
	short := make([]byte, 6)
	l.must(t, "cuDeviceGetName", uintptr(unsafe.Pointer(&short[0])), 6, 0)
	if got := cstring(short); got != "gorun" {
		t.Errorf("truncated name %q", got)
	}
	for attr, want := range map[int]int32{75: 7, 76: 0, 16: 2, 1: 1024, 10: 32, 8: 49152, 60: 0} {
		var x int32 = -1
		l.must(t, "cuDeviceGetAttribute", uintptr(unsafe.Pointer(&x)), uintptr(attr), 0)
		if x != want {
			t.Errorf("attribute %d = %d, want %d", attr, x, want)
		}
	}
	var x int32
	l.expect(t, cuInvalidValue, "cuDeviceGetAttribute", uintptr(unsafe.Pointer(&x)), 0, 0)
	var total, free uint64
	l.must(t, "cuDeviceTotalMem_v2", uintptr(unsafe.Pointer(&total)), 0)
	l.must(t, "cuMemGetInfo_v2", uintptr(unsafe.Pointer(&free)), uintptr(unsafe.Pointer(&total)))
	if total != 8<<30 || free > total {
		t.Errorf("total %d, free %d", total, free)
	}
	var cur uintptr
	l.must(t, "cuCtxGetCurrent", uintptr(unsafe.Pointer(&cur)))
	if cur != l.ctx {
		t.Errorf("current context %#x, want %#x", cur, l.ctx)
	}
	l.must(t, "cuCtxSynchronize")
	l.expect(t, cuInvalidContext, "cuCtxSetCurrent", 12345)
	for code, name := range map[int]string{0: "CUDA_SUCCESS", 1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY",
		3: "CUDA_ERROR_NOT_INITIALIZED", 100: "CUDA_ERROR_NO_DEVICE", 101: "CUDA_ERROR_INVALID_DEVICE",
		200: "CUDA_ERROR_INVALID_IMAGE", 201: "CUDA_ERROR_INVALID_CONTEXT", 400: "CUDA_ERROR_INVALID_HANDLE",
		500: "CUDA_ERROR_NOT_FOUND", 600: "CUDA_ERROR_NOT_READY", 719: "CUDA_ERROR_LAUNCH_FAILED"} {
		var p, s uintptr
		l.must(t, "cuGetErrorName", uintptr(code), uintptr(unsafe.Pointer(&p)))
		l.must(t, "cuGetErrorString", uintptr(code), uintptr(unsafe.Pointer(&s)))
		if got := goString(p); got != name || goString(s) == "" {
			t.Errorf("error %d: name %q, string %q", code, got, goString(s))
		}
	}
	var p uintptr
	l.expect(t, cuInvalidValue, "cuGetErrorName", 12345, uintptr(unsafe.Pointer(&p)))
}

func cstring(b []byte) string {
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		return string(b[:i])
	}
	return string(b)
}

func goString(p uintptr) string {
	if p == 0 {
		return ""
	}
	var b []byte
	for i := 0; ; i++ {
		c := *(*byte)(unsafe.Add(cptr(p), i))
		if c == 0 {
			return string(b)
		}
		b = append(b, c)
	}
}

// cptr turns an address of C memory into a pointer (without go vet's
// unsafeptr complaint, which is about Go memory).
func cptr(p uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }

// A thread without a current context gets CUDA_ERROR_INVALID_CONTEXT, as
// on a GPU (contexts are current per OS thread): clearing it on one thread
// leaves the test's own thread with its context.
func TestContextPerThread(t *testing.T) {
	l := setup(t)
	l.quiet(t)
	done := make(chan [3]int)
	go func() {
		// Locked and never unlocked: the thread exits with the goroutine.
		// The runtime may hand it a thread an earlier test made current,
		// so the context is cleared first.
		runtime.LockOSThread()
		var p uintptr
		var r [3]int
		l.call(t, "cuCtxSetCurrent", 0)
		r[0] = l.call(t, "cuMemAlloc_v2", uintptr(unsafe.Pointer(&p)), 64)
		l.call(t, "cuCtxSetCurrent", l.ctx)
		r[1] = l.call(t, "cuMemAlloc_v2", uintptr(unsafe.Pointer(&p)), 64)
		r[2] = l.call(t, "cuMemFree_v2", p)
		done <- r
	}()
	r := <-done
	if r != [3]int{cuInvalidContext, 0, 0} {
		t.Errorf("without, then with a current context: %v", r)
	}
	var cur uintptr
	l.must(t, "cuCtxGetCurrent", uintptr(unsafe.Pointer(&cur)))
	if cur != l.ctx {
		t.Errorf("the test's thread lost its context: %#x, want %#x", cur, l.ctx)
	}
}

func TestMemory(t *testing.T) {
	l := setup(t)
	var free0, free1, total uint64
	l.must(t, "cuMemGetInfo_v2", uintptr(unsafe.Pointer(&free0)), uintptr(unsafe.Pointer(&total)))
	p := l.alloc(t, 1000)
	l.must(t, "cuMemGetInfo_v2", uintptr(unsafe.Pointer(&free1)), uintptr(unsafe.Pointer(&total)))
	if free0-free1 != 1024 || p%256 != 0 {
		t.Errorf("1000 bytes took %d bytes at %#x", free0-free1, p)
	}
	got := make([]byte, 1000)
	download(t, l, got, p)
	for i, b := range got {
		if b != 0xff {
			t.Fatalf("fresh memory byte %d = %#x, want 0xff", i, b)
		}
	}
	l.must(t, "cuMemsetD8Async", p, 7, 1000, 0)
	l.must(t, "cuMemsetD32Async", p+4, 0x01020304, 10, 0)
	download(t, l, got, p)
	if got[0] != 7 || got[4] != 4 || got[7] != 1 || got[43] != 1 || got[44] != 7 || got[999] != 7 {
		t.Errorf("memset: %v", got[:48])
	}
	src := make([]byte, 100)
	for i := range src {
		src[i] = byte(i)
	}
	l.must(t, "cuMemcpyHtoDAsync_v2", p+100, uintptr(unsafe.Pointer(&src[0])), 100, 0)
	q := l.alloc(t, 300)
	l.must(t, "cuMemcpyDtoDAsync_v2", q, p+100, 100, 0)
	back := make([]byte, 100)
	l.must(t, "cuMemcpyDtoHAsync_v2", uintptr(unsafe.Pointer(&back[0])), q, 100, 0)
	if string(back) != string(src) {
		t.Errorf("round trip: %v", back)
	}

	// Errors that catch Go-side bugs.
	l.quiet(t)
	var r uintptr
	l.expect(t, cuInvalidValue, "cuMemAlloc_v2", uintptr(unsafe.Pointer(&r)), 0)
	l.expect(t, cuOutOfMemory, "cuMemAlloc_v2", uintptr(unsafe.Pointer(&r)), uintptr(total+1))
	l.expect(t, cuInvalidValue, "cuMemcpyHtoD_v2", p+1, uintptr(unsafe.Pointer(&src[0])), 1000) // runs past the end
	l.expect(t, cuInvalidValue, "cuMemcpyDtoH_v2", uintptr(unsafe.Pointer(&back[0])), p+999, 2)
	l.expect(t, cuInvalidValue, "cuMemcpyHtoD_v2", p, q, 10) // the host side is device memory
	l.expect(t, cuInvalidValue, "cuMemcpyHtoD_v2", uintptr(unsafe.Pointer(&src[0])), p, 10)
	l.expect(t, cuInvalidValue, "cuMemcpyDtoDAsync_v2", q, p, 1001, 0)
	l.expect(t, cuInvalidValue, "cuMemsetD8Async", q+200, 0, 101, 0)
	l.expect(t, cuInvalidValue, "cuMemsetD32Async", q+2, 0, 1, 0)
	l.expect(t, cuInvalidValue, "cuMemFree_v2", q+8)
	if msg := l.lastError(t); !strings.Contains(msg, "not its start") {
		t.Errorf("interior free explained as %q", msg)
	}
	l.expect(t, cuInvalidValue, "cuMemFree_v2", uintptr(unsafe.Pointer(&src[0])))
	var once uintptr
	l.must(t, "cuMemAlloc_v2", uintptr(unsafe.Pointer(&once)), 64)
	l.must(t, "cuMemFree_v2", once)
	l.expect(t, cuInvalidValue, "cuMemFree_v2", once) // twice
	l.expect(t, cuInvalidHandle, "cuMemsetD8Async", p, 0, 1, 12345)

	var h uintptr
	l.must(t, "cuMemAllocHost_v2", uintptr(unsafe.Pointer(&h)), 4096)
	l.must(t, "cuMemcpyDtoHAsync_v2", h, p, 1000, 0) // pinned memory is host memory
	if b := unsafe.Slice((*byte)(cptr(h)), 1000); b[0] != 7 || b[100] != 0 || b[150] != 50 {
		t.Errorf("into pinned memory: %v", b[:8])
	}
	l.expect(t, cuInvalidValue, "cuMemcpyHtoD_v2", h, p, 10) // not device memory
	l.expect(t, cuInvalidValue, "cuMemFree_v2", h)
	l.must(t, "cuMemFreeHost", h)
	l.expect(t, cuInvalidValue, "cuMemFreeHost", h)
}

func TestStreamsAndEvents(t *testing.T) {
	l := setup(t)
	var s, e1, e2, nt uintptr
	l.must(t, "cuStreamCreate", uintptr(unsafe.Pointer(&s)), 1)
	l.must(t, "cuEventCreate", uintptr(unsafe.Pointer(&e1)), 0)
	l.must(t, "cuEventCreate", uintptr(unsafe.Pointer(&e2)), 1)
	l.must(t, "cuEventCreate", uintptr(unsafe.Pointer(&nt)), 3)
	l.must(t, "cuEventQuery", e1) // never recorded: complete
	l.must(t, "cuEventRecord", e1, s)
	l.must(t, "cuStreamWaitEvent", 0, e1, 0)
	l.must(t, "cuEventRecord", e2, 0)
	l.must(t, "cuEventSynchronize", e2)
	l.must(t, "cuEventQuery", e2)
	l.must(t, "cuStreamSynchronize", s)
	var ms float32 = -1
	l.must(t, "cuEventElapsedTime", uintptr(unsafe.Pointer(&ms)), e1, e2)
	if ms < 0 || ms > 1000 {
		t.Errorf("elapsed %v ms", ms)
	}
	l.quiet(t)
	l.must(t, "cuEventRecord", nt, s)
	l.expect(t, cuInvalidHandle, "cuEventElapsedTime", uintptr(unsafe.Pointer(&ms)), e1, nt) // timing disabled
	var fresh uintptr
	l.must(t, "cuEventCreate", uintptr(unsafe.Pointer(&fresh)), 0)
	l.expect(t, cuInvalidHandle, "cuEventElapsedTime", uintptr(unsafe.Pointer(&ms)), fresh, e1) // not recorded
	l.expect(t, cuInvalidValue, "cuEventCreate", uintptr(unsafe.Pointer(&fresh)), 4)
	l.expect(t, cuInvalidValue, "cuStreamCreate", uintptr(unsafe.Pointer(&fresh)), 2)
	for _, e := range []uintptr{e1, e2, nt} {
		l.must(t, "cuEventDestroy_v2", e)
	}
	l.expect(t, cuInvalidHandle, "cuEventDestroy_v2", e1)
	l.expect(t, cuInvalidHandle, "cuEventRecord", e1, 0)
	l.expect(t, cuInvalidHandle, "cuStreamWaitEvent", s, e1, 0)
	l.must(t, "cuStreamDestroy_v2", s)
	l.expect(t, cuInvalidHandle, "cuStreamDestroy_v2", s)
	l.expect(t, cuInvalidHandle, "cuStreamSynchronize", s)
}

func TestModules(t *testing.T) {
	l := setup(t)
	l.quiet(t)
	var m, f uintptr
	for _, bad := range []string{"", "\x7fELF...", "hello"} {
		img := append([]byte(bad), 0)
		l.expect(t, cuInvalidImage, "cuModuleLoadData", uintptr(unsafe.Pointer(&m)), uintptr(unsafe.Pointer(&img[0])))
	}
	l.expect(t, cuNotFound, "cuModuleGetFunction", uintptr(unsafe.Pointer(&f)), l.module, uintptr(unsafe.Pointer(cstr("no_such_kernel"))))
	l.expect(t, cuInvalidHandle, "cuModuleGetFunction", uintptr(unsafe.Pointer(&f)), 12345, uintptr(unsafe.Pointer(cstr("emu_test_axpy"))))

	// A module whose PTX declares entries: names and parameter sizes are
	// checked against the host-compiled kernels.
	ptx := `//
// Generated by NVIDIA NVVM Compiler
.version 7.8
.target sm_70
.address_size 64

.visible .entry emu_test_axpy(
	.param .u64 emu_test_axpy_param_0,
	.param .f32 emu_test_axpy_param_1,
	.param .u64 emu_test_axpy_param_2,
	.param .u64 emu_test_axpy_param_3
)
{ ret; }
.visible .entry emu_test_coords(
	.param .u64 emu_test_coords_param_0,
	.param .u32 emu_test_coords_param_1
)
{ ret; }
.visible .entry ptx_only(
	.param .u64 ptx_only_param_0
)
{ ret; }
`
	img := append([]byte(ptx), 0)
	l.must(t, "cuModuleLoadData", uintptr(unsafe.Pointer(&m)), uintptr(unsafe.Pointer(&img[0])))
	l.must(t, "cuModuleGetFunction", uintptr(unsafe.Pointer(&f)), m, uintptr(unsafe.Pointer(cstr("emu_test_axpy"))))
	var g uintptr
	l.must(t, "cuModuleGetFunction", uintptr(unsafe.Pointer(&g)), m, uintptr(unsafe.Pointer(cstr("emu_test_axpy"))))
	if f == 0 || g != f {
		t.Errorf("the same function twice: %#x, %#x", f, g)
	}
	l.expect(t, cuInvalidImage, "cuModuleGetFunction", uintptr(unsafe.Pointer(&g)), m, uintptr(unsafe.Pointer(cstr("emu_test_coords"))))
	if msg := l.lastError(t); !strings.Contains(msg, "stale") {
		t.Errorf("parameter mismatch explained as %q", msg)
	}
	l.expect(t, cuNotFound, "cuModuleGetFunction", uintptr(unsafe.Pointer(&g)), m, uintptr(unsafe.Pointer(cstr("emu_test_shfl")))) // not in this PTX
	l.expect(t, cuNotFound, "cuModuleGetFunction", uintptr(unsafe.Pointer(&g)), m, uintptr(unsafe.Pointer(cstr("ptx_only"))))      // not compiled

	y := upload(t, l, []float32{1, 2, 3})
	x := upload(t, l, []float32{10, 20, 30})
	if r := l.launchFn(t, f, d1(1), d1(32), y, float32(2), x, int64(3)); r != cuSuccess {
		t.Fatalf("launch through the PTX module: %d: %s", r, l.lastError(t))
	}
	got := make([]float32, 3)
	download(t, l, got, y)
	if got[0] != 21 || got[1] != 42 || got[2] != 63 {
		t.Errorf("axpy: %v", got)
	}
	l.must(t, "cuModuleUnload", m)
	l.expect(t, cuInvalidHandle, "cuModuleUnload", m)
	if r := l.launchFn(t, f, d1(1), d1(32), y, float32(2), x, int64(3)); r != cuInvalidHandle {
		t.Errorf("launch of an unloaded module's function: %d", r)
	}
}

func TestLaunchErrors(t *testing.T) {
	l := setup(t)
	l.quiet(t)
	x := l.alloc(t, 4096)
	if r := l.launchFn(t, 0, d1(1), d1(32), x); r != cuInvalidHandle {
		t.Errorf("null function: %d", r)
	}
	if r := l.launchFn(t, 0xdead0, d1(1), d1(32), x); r != cuInvalidHandle {
		t.Errorf("bogus function: %d", r)
	}
	for _, c := range []struct{ grid, block dim }{
		{d1(1), d1(0)}, {d1(1), d1(1025)}, {d1(1), dim{32, 32, 2}}, {d1(0), d1(32)}, {dim{1, 65536, 1}, d1(32)},
		{d1(1), dim{1, 1, 65}},
	} {
		if r := l.launch(t, "emu_test_trap", c.grid, c.block, x); r != cuInvalidValue {
			t.Errorf("grid %v block %v: %d, want %d", c.grid, c.block, r, cuInvalidValue)
		}
	}
	out := l.alloc(t, 4*256)
	if r := l.launch(t, "emu_test_bounded", d1(1), d1(256), out); r != cuOutOfResources {
		t.Errorf("256 threads with __launch_bounds__(128): %d", r)
	}
	l.mustLaunch(t, "emu_test_bounded", d1(1), d1(128), out)
	var freed uintptr
	l.must(t, "cuMemAlloc_v2", uintptr(unsafe.Pointer(&freed)), 64)
	l.must(t, "cuMemFree_v2", freed)
	if r := l.launch(t, "emu_test_trap", d1(1), d1(32), freed); r != cuIllegalAddress {
		t.Errorf("freed pointer parameter: %d", r)
	}
	host := make([]float32, 64)
	if r := l.launch(t, "emu_test_trap", d1(1), d1(32), uintptr(unsafe.Pointer(&host[0]))); r != cuIllegalAddress {
		t.Errorf("host pointer parameter: %d", r)
	}
	for _, c := range []struct {
		kernel, want string
	}{
		{"emu_test_exit_before_barrier", "16 of its 32 threads wait at __syncthreads"},
		{"emu_test_exit_before_shfl", "31 in a warp collective"},
		{"emu_test_trap", "__trap()"},
	} {
		if r := l.launch(t, c.kernel, d1(3), d1(32), x); r != cuLaunchFailed {
			t.Errorf("%s: %d, want %d", c.kernel, r, cuLaunchFailed)
		}
		if msg := l.lastError(t); !strings.Contains(msg, c.want) {
			t.Errorf("%s explained as %q, want it to say %q", c.kernel, msg, c.want)
		}
	}
	// A misaligned 32-bit access (kernels.cu's pairs of 16-bit values
	// check theirs with GR_CHECK_ALIGNED): what a GPU faults on.
	l.mustLaunch(t, "emu_test_misaligned", d1(1), d1(32), x, int32(4))
	if r := l.launch(t, "emu_test_misaligned", d1(1), d1(32), x, int32(2)); r != cuMisaligned {
		t.Errorf("a 4-byte access at byte 2: %d, want %d", r, cuMisaligned)
	}
	if msg := l.lastError(t); !strings.Contains(msg, "not 4-byte aligned") {
		t.Errorf("the misaligned access explained as %q", msg)
	}
	// The emulator is fine after failed launches (parked fibers recycled).
	testBlockSum(t, l, "emu_test_block_sum", 256)
}
