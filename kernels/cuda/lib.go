package cuda

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
)

// EnvLibDir names a directory searched first for libcuda.so.1,
// libcublas.so.* and libnvidia-ml.so.1 (the tests point it at the CPU
// emulator; a user can point it at a driver or toolkit outside the usual
// places).
const EnvLibDir = "GORUN_CUDA_LIB_DIR"

// library is a shared library opened with dlopen and its resolved symbols.
type library struct {
	path   string
	handle uintptr
}

// openFirst dlopens the first candidate that loads and returns it, or an
// error listing every place tried with the reason it failed.
func openFirst(what string, candidates []string) (*library, error) {
	var tried []string
	absent := true // every failure was "no such file"
	seen := map[string]bool{}
	for _, c := range candidates {
		if c == "" || seen[c] {
			continue
		}
		seen[c] = true
		if strings.Contains(c, "/") {
			if _, err := os.Stat(c); err != nil {
				continue // not there: not worth listing every absent path
			}
		}
		h, err := dlopen(c)
		if err == nil {
			return &library{path: c, handle: h}, nil
		}
		tried = append(tried, fmt.Sprintf("%s (%v)", c, err))
		absent = absent && strings.Contains(err.Error(), "cannot open shared object file")
	}
	if absent {
		return nil, fmt.Errorf("%s not found (looked in $%s, $CUDA_HOME, the dynamic loader's path and %s)",
			what, EnvLibDir, strings.Join(libDirs()[len(libDirs())-5:], ", "))
	}
	return nil, fmt.Errorf("%s could not be loaded: %s", what, strings.Join(tried, "; "))
}

// dlopen opens a library on one OS thread: dlerror's message is per
// thread, and a goroutine moved between the two calls would lose it.
func dlopen(path string) (uintptr, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
}

// sym resolves name or returns an error naming the library.
func (l *library) sym(name string) (uintptr, error) {
	p, err := purego.Dlsym(l.handle, name)
	if err != nil || p == 0 {
		return 0, fmt.Errorf("%s has no symbol %s", l.path, name)
	}
	return p, nil
}

// resolve fills *dst[i] with the address of names[i]; all missing symbols
// are reported together.
func (l *library) resolve(names []string, dst []*uintptr) error {
	var errs []error
	for i, n := range names {
		p, err := l.sym(n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		*dst[i] = p
	}
	return errors.Join(errs...)
}

// libDirs lists the directories searched for NVIDIA libraries, most
// specific first: $GORUN_CUDA_LIB_DIR, $CUDA_HOME (and CUDA_PATH) lib64,
// where container runtimes put the driver, the usual toolkit prefix. The
// plain soname (the dynamic loader's own search: LD_LIBRARY_PATH,
// ld.so.cache) is tried after the first of these.
func libDirs() []string {
	var dirs []string
	if d := os.Getenv(EnvLibDir); d != "" {
		dirs = append(dirs, d)
	}
	for _, v := range []string{"CUDA_HOME", "CUDA_PATH"} {
		if d := os.Getenv(v); d != "" {
			dirs = append(dirs, filepath.Join(d, "lib64"), filepath.Join(d, "lib"))
		}
	}
	return append(dirs, "/usr/local/nvidia/lib64", "/usr/local/cuda/lib64", "/usr/lib/x86_64-linux-gnu",
		"/usr/lib64", "/usr/lib/wsl/lib")
}

// candidates returns dir/name for every directory, with the bare name
// (the dynamic loader's search) right after $GORUN_CUDA_LIB_DIR's entry.
func candidates(dirs []string, names ...string) []string {
	var out []string
	for i, d := range dirs {
		for _, n := range names {
			out = append(out, filepath.Join(d, n))
		}
		if i == 0 && os.Getenv(EnvLibDir) != "" {
			out = append(out, names...)
		}
	}
	if os.Getenv(EnvLibDir) == "" {
		out = append(names, out...)
	}
	return out
}

// pythonCUDALibDirs finds the lib directories of pip's NVIDIA wheels
// (nvidia/<pkg>/lib inside a site-packages or dist-packages directory) in
// the active virtual or conda environment, PYTHONPATH, the user's and the
// system's Python installations: where a machine with PyTorch keeps
// cuBLAS.
func pythonCUDALibDirs(pkg string) []string {
	var roots []string
	for _, v := range []string{"VIRTUAL_ENV", "CONDA_PREFIX"} {
		if d := os.Getenv(v); d != "" {
			roots = append(roots, filepath.Join(d, "lib", "python3*", "site-packages"))
		}
	}
	for _, d := range filepath.SplitList(os.Getenv("PYTHONPATH")) {
		if d != "" {
			roots = append(roots, d)
		}
	}
	// the environment of the python3 on PATH (a venv need not be active)
	if py, err := exec.LookPath("python3"); err == nil {
		prefix := filepath.Dir(filepath.Dir(py))
		roots = append(roots, filepath.Join(prefix, "lib", "python3*", "site-packages"))
	}
	if h, err := os.UserHomeDir(); err == nil {
		roots = append(roots, filepath.Join(h, ".local", "lib", "python3*", "site-packages"))
	}
	roots = append(roots, "/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
		"/usr/lib/python3/dist-packages", "/usr/lib/python3*/site-packages", "/opt/conda/lib/python3*/site-packages",
		"/opt/*/.venv/lib/python3*/site-packages")
	var dirs []string
	for _, r := range roots {
		// nvidia/<pkg>/lib up to CUDA 12's wheels, nvidia/cu<N>/lib from 13 on
		m, _ := filepath.Glob(filepath.Join(r, "nvidia", pkg, "lib"))
		m13, _ := filepath.Glob(filepath.Join(r, "nvidia", "cu[0-9]*", "lib"))
		m = append(m, m13...)
		sort.Sort(sort.Reverse(sort.StringSlice(m))) // newest Python first
		dirs = append(dirs, m...)
	}
	return dirs
}

// cstring copies a NUL-terminated C string.
func cstring(p uintptr) string {
	if p == 0 {
		return ""
	}
	b := *(**byte)(unsafe.Pointer(&p))
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(b), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(b, n))
}

// hostBytes is the n bytes of non-Go host memory at p (pinned buffers).
func hostBytes(p uintptr, n int) []byte {
	b := *(**byte)(unsafe.Pointer(&p))
	return unsafe.Slice(b, n)
}
