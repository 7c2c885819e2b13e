package cudaemu

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
)

// The tests call the emulated libraries exactly as the CUDA backend does:
// dlopen through purego, every argument an integer or a pointer.

// CUresult codes.
const (
	cuSuccess          = 0
	cuInvalidValue     = 1
	cuOutOfMemory      = 2
	cuNotInitialized   = 3
	cuNoDevice         = 100
	cuInvalidImage     = 200
	cuInvalidContext   = 201
	cuInvalidHandle    = 400
	cuNotFound         = 500
	cuIllegalAddress   = 700
	cuOutOfResources   = 701
	cuMisaligned       = 716
	cuLaunchFailed     = 719
	testKernelsCU      = "csrc/test_kernels.cu"
	envHelper          = "GORUN_EMU_TEST_HELPER"
	envHelperDir       = "GORUN_EMU_TEST_DIR"
	testPTXWithoutCode = "// gorun CUDA emulator test module: no .entry, every host-compiled kernel\n"
)

type emuLibs struct {
	dir              string
	cuda, blas, nvml uintptr
	mu               sync.Mutex
	syms             map[string]uintptr
	ctx              uintptr
	module           uintptr
	fns              map[string]uintptr
}

var (
	libsOnce sync.Once
	libs     *emuLibs
	libsErr  error
)

// openLibs builds (or takes from the cache) the emulator with the test
// kernels only and loads it, once per process.
func openLibs(t testing.TB) *emuLibs {
	t.Helper()
	libsOnce.Do(func() {
		dir := os.Getenv(envHelperDir)
		if dir == "" {
			dir, libsErr = build("", []string{testKernelsCU})
			if libsErr != nil {
				return
			}
		}
		l := &emuLibs{dir: dir, syms: map[string]uintptr{}, fns: map[string]uintptr{}}
		for _, x := range []struct {
			p    *uintptr
			name string
		}{{&l.cuda, "libcuda.so.1"}, {&l.blas, "libcublas.so.11"}, {&l.nvml, "libnvidia-ml.so.1"}} {
			h, err := purego.Dlopen(filepath.Join(dir, x.name), purego.RTLD_NOW|purego.RTLD_GLOBAL)
			if err != nil {
				libsErr = err
				return
			}
			*x.p = h
		}
		libs = l
	})
	if errors.Is(libsErr, ErrNoCompiler) {
		t.Skipf("skipping: %v", libsErr)
	}
	if libsErr != nil {
		t.Fatalf("building or loading the emulator: %v", libsErr)
	}
	return libs
}

func (l *emuLibs) sym(t testing.TB, name string) uintptr {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if p, ok := l.syms[name]; ok {
		return p
	}
	var h uintptr
	switch {
	case strings.HasPrefix(name, "cublas"):
		h = l.blas
	case strings.HasPrefix(name, "nvml"):
		h = l.nvml
	default:
		h = l.cuda
	}
	p, err := purego.Dlsym(h, name)
	if err != nil || p == 0 {
		t.Fatalf("no symbol %s: %v", name, err)
	}
	l.syms[name] = p
	return p
}

// call returns the int32 result of name(args...). Like purego.SyscallN it
// is go:uintptrescapes: what a uintptr(unsafe.Pointer(&v)) argument points
// to is moved to the heap, so a stack growth during the call cannot leave
// the C side writing to a stale copy of v.
//
//go:uintptrescapes
func (l *emuLibs) call(t testing.TB, name string, args ...uintptr) int {
	t.Helper()
	r, _, _ := purego.SyscallN(l.sym(t, name), args...)
	return int(int32(r))
}

// callPtr returns the pointer name(args...) returns.
func (l *emuLibs) callPtr(t testing.TB, name string, args ...uintptr) uintptr {
	t.Helper()
	r, _, _ := purego.SyscallN(l.sym(t, name), args...)
	return r
}

func (l *emuLibs) lastError(t testing.TB) string {
	buf := make([]byte, 2048)
	n := l.call(t, "gorunEmuLastError", uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
	return string(buf[:min(n, len(buf)-1)])
}

// must fails the test unless name(args...) returns CUDA_SUCCESS (or
// CUBLAS_STATUS_SUCCESS, NVML_SUCCESS).
//
//go:uintptrescapes
func (l *emuLibs) must(t testing.TB, name string, args ...uintptr) {
	t.Helper()
	if r := l.call(t, name, args...); r != 0 {
		t.Fatalf("%s: %d: %s", name, r, l.lastError(t))
	}
}

// expect fails the test unless name(args...) returns want.
//
//go:uintptrescapes
func (l *emuLibs) expect(t testing.TB, want int, name string, args ...uintptr) {
	t.Helper()
	if r := l.call(t, name, args...); r != want {
		t.Errorf("%s: got %d, want %d (last error: %s)", name, r, want, l.lastError(t))
	}
}

// quiet silences the emulator's stderr lines while a test provokes errors.
func (l *emuLibs) quiet(t testing.TB) {
	l.call(t, "gorunEmuSetQuiet", 1)
	t.Cleanup(func() { l.call(t, "gorunEmuSetQuiet", 0) })
}

// setup loads the emulator, initialises the driver and makes the primary
// context current on this test's OS thread (locked for the test).
func setup(t testing.TB) *emuLibs {
	t.Helper()
	l := openLibs(t)
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	l.must(t, "cuInit", 0)
	if l.ctx == 0 {
		l.must(t, "cuDevicePrimaryCtxRetain", uintptr(unsafe.Pointer(&l.ctx)), 0)
	}
	l.must(t, "cuCtxSetCurrent", l.ctx)
	if l.module == 0 {
		img := append([]byte(testPTXWithoutCode), 0)
		l.must(t, "cuModuleLoadData", uintptr(unsafe.Pointer(&l.module)), uintptr(unsafe.Pointer(&img[0])))
	}
	return l
}

func cstr(s string) *byte { return &append([]byte(s), 0)[0] }

func (l *emuLibs) fn(t testing.TB, name string) uintptr {
	t.Helper()
	if f, ok := l.fns[name]; ok {
		return f
	}
	var f uintptr
	n := cstr(name)
	l.must(t, "cuModuleGetFunction", uintptr(unsafe.Pointer(&f)), l.module, uintptr(unsafe.Pointer(n)))
	runtime.KeepAlive(n)
	l.fns[name] = f
	return f
}

// alloc returns n bytes of device memory, freed at the end of the test.
func (l *emuLibs) alloc(t testing.TB, n int) uintptr {
	t.Helper()
	var p uintptr
	l.must(t, "cuMemAlloc_v2", uintptr(unsafe.Pointer(&p)), uintptr(n))
	t.Cleanup(func() { l.call(t, "cuMemFree_v2", p) })
	return p
}

func bytesOf[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(s[0])))
}

// upload copies s to new device memory.
func upload[T any](t testing.TB, l *emuLibs, s []T) uintptr {
	t.Helper()
	b := bytesOf(s)
	p := l.alloc(t, max(len(b), 1))
	if len(b) > 0 {
		l.must(t, "cuMemcpyHtoD_v2", p, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	}
	return p
}

// download copies len(s) elements from device memory p into s.
func download[T any](t testing.TB, l *emuLibs, s []T, p uintptr) {
	t.Helper()
	b := bytesOf(s)
	l.must(t, "cuMemcpyDtoH_v2", uintptr(unsafe.Pointer(&b[0])), p, uintptr(len(b)))
}

// dim is a grid or block shape.
type dim [3]uint32

func d1(x int) dim { return dim{uint32(x), 1, 1} }

// launch runs a kernel; args are uintptr (pointers), int32, int64, uint32,
// uint64, float32 or float64, as the kernel declares them. It returns the
// CUresult.
func (l *emuLibs) launch(t testing.TB, name string, grid, block dim, args ...any) int {
	t.Helper()
	return l.launchFn(t, l.fn(t, name), grid, block, args...)
}

func (l *emuLibs) launchFn(t testing.TB, f uintptr, grid, block dim, args ...any) int {
	t.Helper()
	vals := make([]uint64, len(args)+1)
	ptrs := make([]uintptr, len(args)+1)
	for i, a := range args {
		switch v := a.(type) {
		case uintptr:
			vals[i] = uint64(v)
		case int32:
			vals[i] = uint64(uint32(v))
		case int64:
			vals[i] = uint64(v)
		case uint32:
			vals[i] = uint64(v)
		case uint64:
			vals[i] = v
		case float32:
			vals[i] = uint64(math.Float32bits(v))
		case float64:
			vals[i] = math.Float64bits(v)
		default:
			panic(fmt.Sprintf("launch: argument %d of type %T", i, a))
		}
		ptrs[i] = uintptr(unsafe.Pointer(&vals[i]))
	}
	r := l.call(t, "cuLaunchKernel", f, uintptr(grid[0]), uintptr(grid[1]), uintptr(grid[2]),
		uintptr(block[0]), uintptr(block[1]), uintptr(block[2]), 0, 0, uintptr(unsafe.Pointer(&ptrs[0])), 0)
	runtime.KeepAlive(vals)
	runtime.KeepAlive(ptrs)
	return r
}

func (l *emuLibs) mustLaunch(t testing.TB, name string, grid, block dim, args ...any) {
	t.Helper()
	if r := l.launch(t, name, grid, block, args...); r != cuSuccess {
		t.Fatalf("launch %s grid %v block %v: %d: %s", name, grid, block, r, l.lastError(t))
	}
}

func (l *emuLibs) stats(t testing.TB) [5]uint64 {
	var s [5]uint64
	l.call(t, "gorunEmuStats", uintptr(unsafe.Pointer(&s[0])))
	return s
}
