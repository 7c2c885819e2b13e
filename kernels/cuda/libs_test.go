package cuda

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/gorun/gorun/dtype"
)

// libSearchChild reports whether this process is TestFindsCublas's child,
// and then makes the search see only what the test laid out: no system
// directories, no system Python, no dynamic loader search (a machine with
// NVIDIA's libraries installed would otherwise answer).
func libSearchChild() bool {
	if os.Getenv(envTestChild) != "libs" {
		return false
	}
	systemLibDirs, systemSiteRoots, loaderSearch = nil, nil, false
	return true
}

// TestLibSearchChild is TestFindsCublas's child: it opens the backend,
// runs a GEMM, and prints the cuBLAS it loaded and every cublasLt mapped
// into the process. As a plain test it has nothing to do.
func TestLibSearchChild(t *testing.T) {
	if os.Getenv(envTestChild) != "libs" {
		return
	}
	b, err := Open(0, envSettings())
	if err != nil {
		t.Fatal(err)
	}
	x, y := b.Alloc(dtype.Float32, 2, 2), b.Alloc(dtype.Float32, 2, 2)
	b.Upload(x, []float32{1, 2, 3, 4})
	b.Gemm(false, false, 1, x, x, 0, y)
	got := make([]float32, 4)
	b.Download(got, y)
	if !slices.Equal(got, []float32{7, 10, 15, 22}) {
		t.Errorf("GEMM through %s: %v", b.blas.lib.path, got)
	}
	fmt.Printf("CUBLAS=%s\n", b.blas.lib.path)
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, l := range strings.Split(string(maps), "\n") {
		if f := strings.Fields(l); len(f) >= 6 && strings.HasPrefix(filepath.Base(f[5]), "libcublasLt") && !seen[f[5]] {
			seen[f[5]] = true
			fmt.Printf("LT=%s\n", f[5])
		}
	}
}

// TestFindsCublas lays the emulator's libraries out as NVIDIA's are found
// on GPU machines, each case in a process of its own with nothing else to
// find (libSearchChild): cuBLAS as CUDA 12's and 13's toolkits name it
// (libcublas.so.12, .13, beside libcublasLt of the same version), a
// partial install before the real one, pip's CUDA 12 wheels in a venv
// whose python3 is on PATH, and pip's CUDA 13 wheels (nvidia/cu13/lib, as
// on the lent H200) that only the python3 on PATH can point to (a
// stand-in script answering sys.path). Each must load the expected cuBLAS,
// run a GEMM through it, and have mapped the cublasLt beside it and no
// other.
func TestFindsCublas(t *testing.T) {
	if testMode != "emu" {
		t.Skip("lays out the emulator's libraries")
	}
	if setupErr != nil {
		t.Fatal(setupErr)
	}
	emu := os.Getenv(EnvLibDir)
	root := t.TempDir()
	// a cublasLt stand-in: any shared object (the emulated cuBLAS needs none)
	lt := filepath.Join(root, "lt.so")
	cc := exec.Command("g++", "-shared", "-fPIC", "-x", "c++", "-", "-o", lt)
	cc.Stdin = strings.NewReader(`extern "C" int gorun_cublaslt_stand_in = 1;` + "\n")
	if out, err := cc.CombinedOutput(); err != nil {
		t.Skipf("no g++ to build a cublasLt stand-in: %v\n%s", err, out)
	}
	put := func(src, dst string) {
		t.Helper()
		b, err := os.ReadFile(src)
		if err == nil {
			err = os.MkdirAll(filepath.Dir(dst), 0o755)
		}
		if err == nil {
			err = os.WriteFile(dst, b, 0o755)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// the driver and NVML alone where GORUN_CUDA_LIB_DIR points
	drv := filepath.Join(root, "driver")
	put(filepath.Join(emu, "libcuda.so.1"), filepath.Join(drv, "libcuda.so.1"))
	put(filepath.Join(emu, "libnvidia-ml.so.1"), filepath.Join(drv, "libnvidia-ml.so.1"))
	cublas := func(dir, ver string) string {
		put(filepath.Join(emu, "libcublas.so.11"), filepath.Join(dir, "libcublas.so."+ver))
		put(lt, filepath.Join(dir, "libcublasLt.so."+ver))
		return filepath.Join(dir, "libcublas.so."+ver)
	}
	python := func(bin, answer string) {
		t.Helper()
		// a stand-in python3: answers gorun's sys.path question, refuses anything else
		script := "#!/bin/sh\ncase \"$1 $2\" in\n\"-c \"*sys.path*) printf '%s\\n' " + answer + " ;;\n*) echo \"stand-in python3: $*\" >&2; exit 1 ;;\nesac\n"
		if err := os.MkdirAll(bin, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(bin, "python3"), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name      string
		layout    func(dir string) (env []string, want string, wantLt []string)
		pythonRan bool
	}{
		{"CUDA 12 toolkit", func(d string) ([]string, string, []string) {
			want := cublas(filepath.Join(d, "cuda-12", "lib64"), "12")
			return []string{"CUDA_HOME=" + filepath.Join(d, "cuda-12")}, want, []string{filepath.Join(d, "cuda-12", "lib64", "libcublasLt.so.12")}
		}, false},
		{"CUDA 13 toolkit after a partial install", func(d string) ([]string, string, []string) {
			// lib64 holds a cublasLt without its cuBLAS (searched first), lib the real pair
			put(lt, filepath.Join(d, "cuda", "lib64", "libcublasLt.so.13"))
			put(lt, filepath.Join(d, "cuda", "lib64", "libcublasLt.so.12"))
			want := cublas(filepath.Join(d, "cuda", "lib"), "13")
			return []string{"CUDA_PATH=" + filepath.Join(d, "cuda")}, want, []string{filepath.Join(d, "cuda", "lib", "libcublasLt.so.13")}
		}, false},
		{"pip CUDA 12 wheels in the venv of the python3 on PATH", func(d string) ([]string, string, []string) {
			venv := filepath.Join(d, "venv")
			python(filepath.Join(venv, "bin"), "/nonexistent")
			lib := filepath.Join(venv, "lib", "python3.12", "site-packages", "nvidia", "cublas", "lib")
			want := cublas(lib, "12")
			return []string{"PATH=" + filepath.Join(venv, "bin") + ":/usr/bin:/bin"}, want, []string{filepath.Join(lib, "libcublasLt.so.12")}
		}, false},
		{"pip CUDA 13 wheels that only python3 knows of", func(d string) ([]string, string, []string) {
			site := filepath.Join(d, "elsewhere", "site-packages")
			python(filepath.Join(d, "shims"), "/nonexistent/lib/python3.12 "+site)
			// a cublasLt of CUDA 12's wheel layout without its cuBLAS, found first
			put(lt, filepath.Join(site, "nvidia", "cublas", "lib", "libcublasLt.so.13"))
			lib := filepath.Join(site, "nvidia", "cu13", "lib")
			want := cublas(lib, "13")
			return []string{"PATH=" + filepath.Join(d, "shims") + ":/usr/bin:/bin"}, want, []string{filepath.Join(lib, "libcublasLt.so.13")}
		}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := filepath.Join(root, strings.ReplaceAll(c.name, " ", "-"))
			env, want, wantLt := c.layout(d)
			cmd := exec.Command(os.Args[0], "-test.run=^TestLibSearchChild$", "-test.count=1", "-test.v")
			cmd.Env = []string{envTestChild + "=libs", EnvLibDir + "=" + drv, "HOME=" + d, "GORUN_CUDA_TEST_DEVICE=emu"}
			if !slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, "PATH=") }) {
				cmd.Env = append(cmd.Env, "PATH=/nonexistent")
			}
			cmd.Env = append(cmd.Env, env...)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			var got string
			var gotLt []string
			for _, l := range strings.Split(out.String(), "\n") {
				if v, ok := strings.CutPrefix(l, "CUBLAS="); ok {
					got = v
				}
				if v, ok := strings.CutPrefix(l, "LT="); ok {
					gotLt = append(gotLt, v)
				}
			}
			if got != want {
				t.Errorf("loaded cuBLAS %q, want %q\n%s", got, want, out.String())
			}
			if !slices.Equal(gotLt, wantLt) {
				t.Errorf("cublasLt mapped: %q, want only %q (the one beside the cuBLAS loaded)", gotLt, wantLt)
			}
		})
	}
}

// TestCublasOnAThreadWithoutContext: a GEMM on an OS thread that has no
// current context (as a fresh thread a goroutine moved to), then a kernel
// on that thread. cuBLAS does not answer CUDA_ERROR_INVALID_CONTEXT there:
// the CUDA runtime makes device 0's primary context current, so a backend
// on device 1 would run the GEMM in the wrong context (the emulator fails
// it, and the kernel launched after it). TestHopperEmulation runs this on
// device 1; on device 0 it passes either way.
func TestCublasOnAThreadWithoutContext(t *testing.T) {
	b := backend(t)
	x, y := b.Alloc(dtype.Float32, 2, 2), b.Alloc(dtype.Float32, 2, 2)
	defer b.Free(x)
	defer b.Free(y)
	b.Upload(x, []float32{1, 2, 3, 4})
	b.Sync()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.drv.call(b.drv.ctxSetCurrent, 0) // this thread now has no context
	b.Gemm(false, false, 1, x, x, 0, y)
	b.Scale(y, 0.5)
	got := make([]float32, 4)
	b.Download(got, y)
	if !slices.Equal(got, []float32{3.5, 5, 7.5, 11}) {
		t.Errorf("device %d: x*x/2 = %v", b.index, got)
	}
}

// TestBlockingSyncEventsRefused: where the driver refuses blocking-sync
// events (GORUN_CUDA_EMU_NO_BLOCKING_SYNC=1 makes the emulator do so, as
// some sandboxes' drivers do), the host staging still works on default
// events, and the backend says so in one log line.
func TestBlockingSyncEventsRefused(t *testing.T) {
	if testMode != "emu" {
		t.Skip("the emulator refuses the events")
	}
	out := runChild(t, "noblockingsync", "^(TestBlockingSyncFallback|TestHostStagingRoundTrip)$", "GORUN_CUDA_EMU_NO_BLOCKING_SYNC=1")
	for _, want := range []string{"--- PASS: TestBlockingSyncFallback", "--- PASS: TestHostStagingRoundTrip"} {
		if !strings.Contains(out, want) {
			t.Errorf("the child's output lacks %q:\n%s", want, out)
		}
	}
}

// TestBlockingSyncFallback: Fences work, and exactly one log line says
// that blocking-sync events were refused, when they are; none when not.
func TestBlockingSyncFallback(t *testing.T) {
	var lines []string
	old := logf
	logf = func(f string, a ...any) { lines = append(lines, fmt.Sprintf(f, a...)) }
	defer func() { logf = old }()
	b, err := Open(testIndex(), envSettings())
	if err != nil {
		t.Fatal(err)
	}
	g := b.Alloc(dtype.Float32, 1000)
	host := make([]float32, 1000)
	for i := range host {
		host[i] = float32(i)
	}
	b.Upload(g, host)
	for i := 0; i < 3; i++ {
		pin := b.PinnedHost(4000)
		if err := b.CopyOutAsync(pin, g, dtype.Float32).Wait(); err != nil {
			t.Fatal(err)
		}
		if v := math.Float32frombits(le32(pin[4*999:])); v != 999 {
			t.Fatalf("copy %d: [999] = %v", i, v)
		}
	}
	if testMode != "emu" { // a GPU's driver: whether it refuses them is what we learn
		if len(lines) > 1 || (len(lines) == 1 && !strings.Contains(lines[0], "blocking-sync events refused")) {
			t.Errorf("log lines %q, want at most one, about blocking-sync events", lines)
		}
		t.Logf("blocking-sync events: %q (none: accepted)", lines)
		return
	}
	refused := os.Getenv("GORUN_CUDA_EMU_NO_BLOCKING_SYNC") == "1"
	if refused && (len(lines) != 1 || !strings.Contains(lines[0], "blocking-sync events refused")) {
		t.Errorf("blocking-sync events refused: log lines %q, want one saying so", lines)
	}
	if !refused && len(lines) != 0 {
		t.Errorf("log lines %q, want none", lines)
	}
}
