package cuda

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"
)

// EnvLibDir names a directory searched first for libcuda.so.1,
// libcublas.so.* and libnvidia-ml.so.1 (Settings.LibDir: the tests point
// it at the CPU emulator; a user can point it at a driver or toolkit
// outside the usual places).
const EnvLibDir = "GORUN_CUDA_LIB_DIR"

// library is a shared library opened with dlopen and its resolved symbols.
type library struct {
	path   string
	handle uintptr
}

// errNotFound marks openFirst's error when no candidate exists at all.
var errNotFound = errors.New("not found")

// openFirst dlopens the first candidate that loads and returns it, or an
// error listing every place tried with the reason it failed (wrapping
// errNotFound when none was there).
func openFirst(what string, candidates []string) (*library, error) {
	return openEach(what, candidates, nil)
}

// openEach is openFirst; preload, when not nil, runs before each candidate
// path that exists is opened, and the function it returns, if any, runs
// when that candidate then fails to load (cuBLAS: its cublasLt).
func openEach(what string, candidates []string, preload func(path string) (undo func())) (*library, error) {
	var tried []string
	absent := true // every failure was "no such file"
	seen := map[string]bool{}
	for _, c := range candidates {
		if c == "" || seen[c] {
			continue
		}
		seen[c] = true
		var undo func()
		if strings.Contains(c, "/") {
			if _, err := os.Stat(c); err != nil {
				continue // not there: not worth listing every absent path
			}
			if preload != nil {
				undo = preload(c)
			}
		}
		h, err := dlopen(c)
		if err == nil {
			return &library{path: c, handle: h}, nil
		}
		if undo != nil {
			undo()
		}
		tried = append(tried, fmt.Sprintf("%s (%v)", c, err))
		absent = absent && strings.Contains(err.Error(), "cannot open shared object file")
	}
	if absent {
		return nil, fmt.Errorf("%s %w (looked in $%s, $CUDA_HOME, the dynamic loader's path and %s)",
			what, errNotFound, EnvLibDir, strings.Join(systemLibDirs, ", "))
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

// systemLibDirs are where container runtimes put the driver and where
// toolkits and distributions put the libraries. (Tests of the search
// empty it, and loaderSearch, so that only what they lay out is found.)
var systemLibDirs = []string{"/usr/local/nvidia/lib64", "/usr/local/cuda/lib64", "/usr/lib/x86_64-linux-gnu",
	"/usr/lib64", "/usr/lib/wsl/lib"}

// loaderSearch: also dlopen the plain soname (the dynamic loader's own
// search: LD_LIBRARY_PATH, ld.so.cache).
var loaderSearch = true

// libDirs lists the directories searched for NVIDIA libraries, most
// specific first: s.LibDir, s.CUDAHome's (and s.CUDAPath's) lib64 and lib,
// then systemLibDirs. The plain soname (the dynamic loader's own search) is
// tried after the first of these.
func libDirs(s Settings) []string {
	var dirs []string
	if s.LibDir != "" {
		dirs = append(dirs, s.LibDir)
	}
	for _, d := range []string{s.CUDAHome, s.CUDAPath} {
		if d != "" {
			dirs = append(dirs, filepath.Join(d, "lib64"), filepath.Join(d, "lib"))
		}
	}
	return append(dirs, systemLibDirs...)
}

// candidates returns dir/name for every directory, with the bare name
// (the dynamic loader's search) right after s.LibDir's entry.
func candidates(s Settings, dirs []string, names ...string) []string {
	var out []string
	for i, d := range dirs {
		for _, n := range names {
			out = append(out, filepath.Join(d, n))
		}
		if i == 0 && s.LibDir != "" && loaderSearch {
			out = append(out, names...)
		}
	}
	if s.LibDir == "" && loaderSearch {
		out = append(names, out...)
	}
	return out
}

// systemSiteRoots are the system Python installations' package
// directories (globs).
var systemSiteRoots = []string{"/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
	"/usr/lib/python3/dist-packages", "/usr/lib/python3*/site-packages", "/opt/conda/lib/python3*/site-packages",
	"/opt/*/.venv/lib/python3*/site-packages"}

// pythonCUDALibDirs finds the lib directories of pip's NVIDIA wheels
// (nvidia/<pkg>/lib inside a site-packages or dist-packages directory, up
// to CUDA 12's wheels; nvidia/cu<N>/lib from CUDA 13's) in the active
// virtual or conda environment, PYTHONPATH (as s gives them), the
// environment of the python3 on PATH, the user's and the system's Python
// installations: where a machine with PyTorch keeps cuBLAS. It runs no
// Python (pythonSysPath does, when these find nothing).
func pythonCUDALibDirs(s Settings, pkg string) []string {
	var roots []string
	for _, d := range []string{s.VirtualEnv, s.CondaPrefix} {
		if d != "" {
			roots = append(roots, filepath.Join(d, "lib", "python3*", "site-packages"))
		}
	}
	for _, d := range filepath.SplitList(s.PythonPath) {
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
	roots = append(roots, systemSiteRoots...)
	return wheelLibDirs(roots, pkg)
}

// wheelLibDirs is the nvidia/<pkg>/lib and nvidia/cu<N>/lib directories
// under each root (a glob), the newest Python (and CUDA) first within one.
func wheelLibDirs(roots []string, pkg string) []string {
	var dirs []string
	for _, r := range roots {
		m, _ := filepath.Glob(filepath.Join(r, "nvidia", pkg, "lib"))
		m13, _ := filepath.Glob(filepath.Join(r, "nvidia", "cu[0-9]*", "lib"))
		m = append(m, m13...)
		sort.Sort(sort.Reverse(sort.StringSlice(m)))
		dirs = append(dirs, m...)
	}
	return dirs
}

// pythonSysPath asks the python3 on PATH for its sys.path (its
// site-packages, user site, .pth additions and PYTHONPATH, wherever its
// installation keeps them: a pyenv shim or a symlinked venv python does
// not tell by its own path). Empty when there is no python3 or it fails
// within 10 s.
func pythonSysPath() []string {
	py, err := exec.LookPath("python3")
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, py, "-c", "import sys; print('\\n'.join(p for p in sys.path if p))").Output()
	if err != nil {
		return nil
	}
	var dirs []string
	for _, l := range strings.Split(string(out), "\n") {
		if l = strings.TrimSpace(l); filepath.IsAbs(l) {
			dirs = append(dirs, l)
		}
	}
	return dirs
}

// openWithLt opens cuBLAS from candidates (as openFirst), loading first
// the cublasLt of the same version that sits beside each candidate path
// (pip's wheels do not always find it on their own; cuBLAS needs it): only
// the cublasLt beside the cuBLAS that loads stays loaded, so no other
// version's can satisfy its dependency.
func openWithLt(what string, cands []string) (*library, error) {
	return openEach(what, cands, func(path string) func() {
		lt := filepath.Join(filepath.Dir(path), "libcublasLt"+strings.TrimPrefix(filepath.Base(path), "libcublas"))
		if _, err := os.Stat(lt); err != nil {
			return nil
		}
		h, err := dlopen(lt)
		if err != nil {
			return nil // cuBLAS then reports what is missing
		}
		return func() { purego.Dlclose(h) }
	})
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
