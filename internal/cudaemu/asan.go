package cudaemu

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// The AddressSanitizer build. BuildASan compiles the kernel files with
// g++ -fsanitize=address, and libcuda.so.1 with GORUN_EMU_ASAN defined:
// every cuMemAlloc is then exactly the bytes asked for, from malloc, so
// ASan's redzones sit right after each allocation, and a kernel that reads
// or writes outside one (or memory already freed) is reported by ASan in
// that kernel, with its stack, and ends the process (csrc/emu_guard.h).
// libcuda.cc itself is not instrumented: its fibers switch stacks, which
// ASan would need to be told of at every switch.
//
// A process loads such a build only with ASan's runtime loaded before
// anything else: run it with the environment ASanEnv returns (LD_PRELOAD of
// the compiler's libasan, and ASAN_OPTIONS). A Go test does that by running
// its own binary again (kernels/cuda's TestConformanceASan). The Go binary
// must be dynamically linked (purego makes it so); a static one ignores
// LD_PRELOAD.

// ErrNoASan is returned (wrapped) when the compiler has no AddressSanitizer
// runtime.
var ErrNoASan = errors.New("no AddressSanitizer runtime")

// asanFlags compile the kernel files of an ASan build.
var asanFlags = []string{"-fsanitize=address", "-fno-omit-frame-pointer", "-g"}

// asanOptions: no leak check (the Go runtime and the emulated context
// live until exit), no fake stacks (kernels run on the emulator's fiber
// stacks), signals left to the Go runtime, and the first error ends the
// process with exit status 66.
const asanOptions = "detect_leaks=0:detect_stack_use_after_return=0:handle_segv=0:handle_abort=0:halt_on_error=1:exitcode=66"

// ASanExitCode is the exit status of a process that ASan stopped.
const ASanExitCode = 66

// BuildASan is Build with the kernel files compiled with AddressSanitizer.
// A missing compiler is reported as an error wrapping ErrNoCompiler, a
// missing ASan runtime as one wrapping ErrNoASan.
func BuildASan(dir string, kernelFiles ...string) error {
	if _, err := ASanRuntime(); err != nil {
		return err
	}
	_, err := buildWith(dir, kernelFiles, true)
	return err
}

// ASanRuntime returns the path of the compiler's ASan runtime (libasan.so
// and the file it links to).
func ASanRuntime() (string, error) {
	cc, err := cxx()
	if err != nil {
		return "", err
	}
	out, err := exec.Command(cc, "-print-file-name=libasan.so").Output()
	p := strings.TrimSpace(string(out))
	if err != nil || !filepath.IsAbs(p) {
		return "", fmt.Errorf("%w: %s -print-file-name=libasan.so says %q (install libasan, e.g. Debian's libgcc-12-dev)", ErrNoASan, cc, p)
	}
	if r, err := filepath.EvalSymlinks(p); err == nil {
		p = r
	}
	return p, nil
}

// ASanEnv returns the variables a process needs to load an ASan build:
// LD_PRELOAD of the runtime and ASAN_OPTIONS.
func ASanEnv() ([]string, error) {
	rt, err := ASanRuntime()
	if err != nil {
		return nil, err
	}
	return []string{"LD_PRELOAD=" + rt, "ASAN_OPTIONS=" + asanOptions}, nil
}

// asanSteps are the compiler runs that make an ASan libcuda.so.1 at lib:
// each kernel registration compiled with asanFlags, libcuda.cc without
// them but with GORUN_EMU_ASAN, the objects linked with ASan's runtime.
func asanSteps(src, lib string, inc, regs []string) [][]string {
	var compile []string // commonFlags less the linker's
	for _, f := range commonFlags {
		if f != "-shared" && !strings.HasPrefix(f, "-Wl,") {
			compile = append(compile, f)
		}
	}
	base := append(append(append([]string{}, compile...), kernelFlags...), inc...)
	base = append(base, "-include", "cuda_emu.h", "-c")
	var steps [][]string
	var objs []string
	for _, r := range regs {
		o := strings.TrimSuffix(r, ".cc") + ".o"
		steps = append(steps, append(append(append([]string{}, base...), asanFlags...), "-o", o, r))
		objs = append(objs, o)
	}
	drv := filepath.Join(src, "libcuda.o")
	steps = append(steps, append(append([]string{}, base...), "-DGORUN_EMU_ASAN=1", "-o", drv, filepath.Join(src, "libcuda.cc")))
	link := append(append([]string{}, commonFlags...), "-fsanitize=address", "-Wl,-soname,libcuda.so.1", "-o", lib, drv)
	link = append(append(link, objs...), "-ldl")
	return append(steps, link)
}
