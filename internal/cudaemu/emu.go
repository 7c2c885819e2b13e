// Package cudaemu builds a CPU emulator of the parts of the CUDA driver API
// (libcuda.so.1), cuBLAS (libcublas.so.11) and NVML (libnvidia-ml.so.1)
// that gorun's CUDA backend (kernels/cuda) calls, so that the backend's Go
// code and the CUDA C of kernels/cuda/kernels.cu are exercised end to end
// on every machine: where no GPU is, in CI, under `make test`. It is test
// infrastructure, not a GPU: the device it reports is named
// "gorun CUDA emulator (CPU)", and nothing it measures says anything about
// a GPU's speed.
//
// Build compiles the three libraries with g++ from the C++ sources in
// csrc/ (embedded in this package) and the kernel files it is given; the Go
// side loads them from that directory (it dlopens dir/libcuda.so.1 etc.
// through purego, exactly as it loads NVIDIA's): in-process with
// cuda.Settings{LibDir: dir}, in a program a test starts by setting
// GORUN_CUDA_LIB_DIR=dir in its environment. ForTest builds once per test
// process:
//
//	s := cuda.Settings{LibDir: cudaemu.ForTest(t)}
//
// # What is emulated
//
//   - The driver API calls the backend makes, with their C signatures and
//     CUresult codes: cuInit, devices (one, or $GORUN_CUDA_EMU_DEVICES of
//     them sharing one context and one memory; compute capability 7.0,
//     2 multiprocessors, named as above, total memory 8 GiB or
//     $GORUN_CUDA_EMU_MEMORY, e.g. "512M"; CUDA_VISIBLE_DEVICES is honoured
//     as by the driver, so a rank that the launcher gives
//     CUDA_VISIBLE_DEVICES=1 on a host without GPUs sees no device unless
//     GORUN_CUDA_EMU_DEVICES is 2 or more), the primary context (current per OS thread, as in CUDA: a call on a thread
//     without it fails with CUDA_ERROR_INVALID_CONTEXT; its last release
//     frees everything it owned), streams, events (elapsed time is host
//     time), device and pinned host memory, copies and memsets, modules and
//     cuLaunchKernel, error names and strings.
//   - Kernels: every extern "C" __global__ function of the kernel files,
//     compiled for the host by g++ with the header csrc/include/cuda_emu.h
//     force-included (threadIdx and friends, __syncthreads, warp shuffles and
//     votes, atomics, static __shared__ arrays, the float16 and bfloat16
//     conversions of cuda_fp16.h / cuda_bf16.h, bit-exact with package half).
//     cuModuleLoadData takes the embedded PTX; cuModuleGetFunction finds the
//     host-compiled kernel of that name and, when the PTX declares .entry
//     functions, checks that the PTX has the kernel with the same parameter
//     sizes (a stale PTX fails with CUDA_ERROR_INVALID_IMAGE).
//   - cuBLAS: cublasGemmEx and cublasGemmStridedBatchedEx (column-major,
//     float32 / float16 / bfloat16 operands in the combinations cuBLAS
//     supports, computed in double on the CPU; the FAST_16F, FAST_16BF and
//     FAST_TF32 compute types, and TF32 math mode, round the inputs as the
//     tensor cores would), handles, streams, math mode, workspace, version.
//   - NVML: init, device count, handle, name, utilization (always 0) and
//     memory (the emulated allocator's, this process only).
//
// # Checks a GPU would not make (they catch Go-side bugs without a GPU)
//
//   - Copies and memsets must lie inside one live cuMemAlloc allocation; the
//     host side of a copy must not be device memory; cuMemFree of anything
//     but the start of a live allocation fails; a kernel's pointer
//     parameters must be null or point into live device or pinned memory
//     (else CUDA_ERROR_ILLEGAL_ADDRESS, reported at the launch); GEMM
//     operands must lie inside live allocations (else
//     CUBLAS_STATUS_EXECUTION_FAILED).
//   - New device memory is filled with 0xff bytes (a NaN as float32, -1 as
//     int), so reading memory nobody wrote shows.
//   - Every device allocation has guard regions (csrc/emu_guard.h): after a
//     kernel has run, a write it made near one of the allocations its
//     pointer parameters point into (256 bytes before, up to 256 after the
//     next multiple of 256) fails the launch with CUDA_ERROR_ILLEGAL_ADDRESS
//     naming the kernel and the byte. The CUDA backend's allocator rounds
//     tensors up to size classes unless GORUN_CUDA_EXACT_ALLOC=1. BuildASan
//     compiles the kernels with AddressSanitizer instead (asan.go): every
//     read or write outside an allocation, or of freed memory, stops the
//     process with ASan's report.
//   - A block whose threads do not all reach a __syncthreads (or whose lanes
//     do not all reach a warp collective) fails the launch with
//     CUDA_ERROR_LAUNCH_FAILED and names the threads, where a GPU would hang
//     or compute garbage. A launch with more threads than the kernel's
//     __launch_bounds__ fails with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES.
//   - Every failure is explained in one line on stderr ("gorun CUDA
//     emulator: ..."; GORUN_CUDA_EMU_QUIET=1 silences it) and kept for
//     gorunEmuLastError; all but CUDA_ERROR_INVALID_CONTEXT for a thread
//     without a current context, which the backend handles by design
//     (making the context current and calling again).
//
// # What is not emulated
//
//   - Concurrency: by default every call does its work before it returns,
//     under one process-wide lock; streams never overlap, events are
//     complete when recorded, cuEventQuery never says CUDA_ERROR_NOT_READY.
//     GORUN_CUDA_EMU_SCHED=async (below) queues the work per stream and runs
//     it later, in an order chosen to break code that misses an event wait;
//     even then two operations never run at the same instant, so a race
//     that needs them to overlap in time (two kernels, or a kernel and a
//     copy, touching the same bytes concurrently) is seen only as one of
//     its orders.
//   - Memory spaces: device pointers are host addresses; a kernel that reads
//     host memory through a pointer it computed is not caught; an access out
//     of bounds is caught only as above (a write near the allocation, or
//     anything in the ASan build), and not within a size class's slack.
//   - Timing: meaningless; the kernels run on one CPU core.
//   - Errors are reported by the call that causes them, and they are not
//     sticky (a GPU reports a kernel's fault at a later synchronising call
//     and the context is then unusable); under GORUN_CUDA_EMU_SCHED=async a
//     queued launch's fault is reported as a GPU's is, and sticks.
//   - Numerics: the host's libm and no FMA contraction, so results differ
//     from a GPU's in the last bits; NaN payloads of float16 conversions are
//     package half's (a GPU gives the canonical 0x7fff).
//   - Scheduling: the threads of a block run one after another and switch
//     only at __syncthreads and warp collectives, so a kernel that spins
//     waiting for another thread hangs, and warp-synchronous code that
//     relies on lockstep execution without a *_sync intrinsic sees one lane
//     run ahead. Blocks run one after another, never two at once: a race
//     between blocks is seen only as an order of whole blocks (and of
//     threads between two barriers), which GORUN_CUDA_EMU_SCHED varies.
//
// # Schedules (GORUN_CUDA_EMU_SCHED)
//
// The variable, read by cuInit (gorunEmuSetSched changes it in a test), is
// a comma-separated list (csrc/emu_sched.h):
//
//   - reverse: blocks in reverse grid order, the threads of a block started
//     from the last, and released from every barrier and warp collective by
//     descending index;
//   - random: blocks (a keyed permutation of the grid), threads at the start
//     and after every barrier and collective in a seeded random order
//     (seed=N, default 1: the same seed and calls give the same order);
//   - async: every stream operation (launch, copy, memset, GEMM, event
//     record and wait) is queued on its stream and runs only when the host
//     waits for it (cuStreamSynchronize, cuEventSynchronize, cuEventQuery one
//     operation at a time, cuCtxSynchronize, the frees, the synchronous
//     copies, a copy to pageable memory), in stream order and after the
//     records its waits name, the streams interleaved in the order above:
//     forward (the default) runs the stream created first whenever it can
//     (the backend's compute stream ahead of its copy stream: work queued
//     after a copy runs before it), reverse the last created first (a copy
//     as soon as its waits allow), random at random. A queued launch that
//     fails is reported at the next synchronisation and every stream call
//     returns that error from then on, as a GPU's context is lost
//     (csrc/emu_streams.h).
//
// kernels/cuda's TestEmulatorSchedules runs the backend's conformance
// table, staging and training-step tests under async in the three orders
// and the table under reverse; nmt-train's TestCUDAEmulatorParity runs two
// ranks under async,random.
//
// # What a kernel file must keep to
//
// Besides what CUDA requires: every kernel extern "C" __global__ (C++
// kernels are known to the driver by mangled names only and are not
// registered; kernels made by macros are found, since Build preprocesses
// the file); static __shared__ arrays, whose contents carry over from one
// block to the next as they may on a GPU (never read before writing);
// every thread of a block at every __syncthreads, every lane of a
// collective's mask at the collective, one collective at a time in a warp;
// no spin-waiting on other threads or blocks; no names the header defines
// (uint3, dim3, warpSize, min and max for int, unsigned, long long and
// float, rsqrtf, __ldg, __popc, ...). See csrc/include/cuda_emu.h.
//
// # Speed
//
// Measured on a 2-core x86-64 VM: a launch of 64 blocks of 256 threads with
// 4 __syncthreads and 5 shuffles per block takes about 3 ms (ucontext:
// 30 ms); a kernel without barriers costs about 2 ns a thread over the
// work its threads do one after another. Grid-stride loops over large
// arrays are slower than that suggests (about 15 ns an element for 2^20
// floats with 64 x 256 threads): each emulated thread walks the whole array
// at a large power-of-two stride, which the CPU's caches handle badly. A
// build from scratch takes 3 to 5 s (the three libraries in parallel); a
// build from the same inputs, found in the cache, about 50 ms.
//
// # Limits
//
// Up to 1024 threads a block (as CUDA), each on a 256 KiB fiber stack
// (mapped lazily; a guard page below it faults on overflow); fibers are
// kept for the process's lifetime. Kernel parameters: trivially copyable,
// 4 KiB in all. Dynamic shared memory (extern __shared__) is not supported.
// Fibers use a small x86-64 context switch; other architectures fall back
// on ucontext (correct, several times slower).
package cudaemu

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/cpu"
)

//go:embed csrc
var csrc embed.FS

// Libraries are the files Build writes, under the names the CUDA backend
// dlopens.
var Libraries = []string{"libcuda.so.1", "libcublas.so.11", "libnvidia-ml.so.1"}

// ErrNoCompiler is returned (wrapped) by Build when there is no C++
// compiler.
var ErrNoCompiler = errors.New("no C++ compiler")

// EnvCXX overrides the compiler Build runs ("g++").
const EnvCXX = "GORUN_CUDA_EMU_CXX"

// EnvCache, set to "off", makes Build compile every time instead of
// reusing the libraries it built before from the same sources
// ($XDG_CACHE_HOME/gorun/cuda-emu, else ~/.cache/gorun/cuda-emu).
const EnvCache = "GORUN_CUDA_EMU_CACHE"

// cacheVersion changes when Build's output changes for the same inputs.
const cacheVersion = "gorun-cuda-emu 2"

// Compiler flags: modest optimisation (every `make test` may pay the
// build); -fno-strict-aliasing because kernel code type-puns as nvcc
// allows; a*b+c contracted into one FMA where the CPU has it, as nvcc
// compiles kernels (--fmad=true), so that arithmetic which is exact only
// without contraction fails here as on a GPU (LayerNormBackward's
// dy*g - mean did on an H200).
var (
	commonFlags = []string{"-std=c++20", "-O2", "-g0", "-fPIC", "-shared", "-fvisibility=hidden", "-pthread",
		"-Wl,--version-script=exports.map", "-Wl,-z,defs"}
	kernelFlags = fmaFlags([]string{"-fno-strict-aliasing", "-ffp-contract=fast"})
)

// fmaFlags adds -mfma on an x86-64 CPU that has FMA.
func fmaFlags(flags []string) []string {
	if runtime.GOARCH == "amd64" && cpu.X86.HasFMA {
		flags = append(flags, "-mfma")
	}
	return flags
}

// Kernel is one extern "C" __global__ function of a kernel file.
type Kernel struct {
	Name string
	// LaunchBounds is the first argument of its __launch_bounds__ (a C
	// expression, macros expanded), "" without.
	LaunchBounds string
}

func cxx() (string, error) {
	name := os.Getenv(EnvCXX)
	if name == "" {
		name = "g++"
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%w: %s not found on PATH (the CUDA emulator is compiled with it)", ErrNoCompiler, name)
	}
	return p, nil
}

// writeSources copies the embedded C++ sources into dir.
func writeSources(dir string) error {
	return fs.WalkDir(csrc, "csrc", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(p, "csrc"), "/")
		dst := filepath.Join(dir, filepath.FromSlash(rel))
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		b, err := csrc.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o644)
	})
}

// scan preprocesses one kernel file with the scan markers of cuda_emu.h and
// returns its text (macros expanded) and its kernels.
func scan(cc, src, file string) ([]byte, []Kernel, error) {
	cmd := exec.Command(cc, "-std=c++20", "-E", "-P", "-DGORUN_EMU_SCAN", "-I", filepath.Join(src, "include"),
		"-include", "cuda_emu.h", "-x", "c++", file)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, nil, fmt.Errorf("preprocessing %s: %w\n%s", file, err, stderr.Bytes())
	}
	return out, findKernels(string(out)), nil
}

// findKernels finds `extern "C" __global__ [__launch_bounds__(...)] void
// [__launch_bounds__(...)] NAME(` in preprocessed text (where __global__
// and __launch_bounds__ are the scan markers).
func findKernels(text string) []Kernel {
	var out []Kernel
	seen := map[string]bool{}
	const marker = "__gorun_global__"
	for i := 0; ; {
		j := strings.Index(text[i:], marker)
		if j < 0 {
			return out
		}
		start := i + j
		i = start + len(marker)
		before := strings.TrimRight(text[:start], " \t\r\n")
		if !strings.HasSuffix(before, `"C"`) || !strings.HasSuffix(strings.TrimRight(strings.TrimSuffix(before, `"C"`), " \t\r\n"), "extern") {
			continue // not extern "C": a C++ kernel the driver would know by its mangled name only
		}
		p := i
		var bounds string
		skipSpace := func() {
			for p < len(text) && strings.ContainsRune(" \t\r\n", rune(text[p])) {
				p++
			}
		}
		launchBounds := func() bool {
			skipSpace()
			if !strings.HasPrefix(text[p:], "__gorun_lb__") {
				return true
			}
			p += len("__gorun_lb__")
			skipSpace()
			if p >= len(text) || text[p] != '(' {
				return false
			}
			depth, arg0 := 0, -1
			for q := p; q < len(text); q++ {
				switch text[q] {
				case '(':
					depth++
				case ')':
					depth--
					if depth == 0 {
						if arg0 < 0 {
							arg0 = q
						}
						bounds = strings.TrimSpace(text[p+1 : arg0])
						p = q + 1
						return true
					}
				case ',':
					if depth == 1 && arg0 < 0 {
						arg0 = q
					}
				}
			}
			return false
		}
		if !launchBounds() {
			continue
		}
		skipSpace()
		if !strings.HasPrefix(text[p:], "void") {
			continue
		}
		p += 4
		if !launchBounds() {
			continue
		}
		skipSpace()
		q := p
		for q < len(text) && (text[q] == '_' || text[q] >= '0' && text[q] <= '9' || text[q]|32 >= 'a' && text[q]|32 <= 'z') {
			q++
		}
		name := text[p:q]
		p = q
		skipSpace()
		if name == "" || p >= len(text) || text[p] != '(' {
			continue
		}
		if !seen[name] { // a declaration and then the definition
			seen[name] = true
			out = append(out, Kernel{Name: name, LaunchBounds: bounds})
		} else if bounds != "" {
			for i := range out {
				if out[i].Name == name && out[i].LaunchBounds == "" {
					out[i].LaunchBounds = bounds
				}
			}
		}
	}
}

// Scan returns the extern "C" __global__ kernels of a kernel file, as
// Build registers them (macros expanded).
func Scan(kernelFile string) ([]Kernel, error) {
	cc, err := cxx()
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "gorun-cuda-emu-scan")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	if err := writeSources(tmp); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(kernelFile)
	if err != nil {
		return nil, err
	}
	_, ks, err := scan(cc, tmp, abs)
	return ks, err
}

// registration is the generated .cc that compiles one kernel file and
// registers its kernels with the emulated driver.
func registration(file string, ks []Kernel) string {
	var b strings.Builder
	fmt.Fprintf(&b, "// Generated by cudaemu.Build: the kernels of %s.\n", file)
	b.WriteString("#include \"emu_registry.h\"\n")
	fmt.Fprintf(&b, "#include \"%s\"\n", file)
	if len(ks) == 0 {
		return b.String()
	}
	b.WriteString("namespace {\n__attribute__((constructor)) void gorun_emu_register_file() {\n")
	b.WriteString("  static const gorun_emu::KernelDef defs[] = {\n")
	for _, k := range ks {
		bounds := "0"
		if k.LaunchBounds != "" {
			bounds = "(int)(" + k.LaunchBounds + ")"
		}
		fmt.Fprintf(&b, "    gorun_emu::def(\"%s\", &%s, %s, \"%s\"),\n", k.Name, k.Name, bounds, file)
	}
	b.WriteString("  };\n  __gorun_emu_register(defs, (int)(sizeof defs / sizeof defs[0]));\n}\n}  // namespace\n")
	return b.String()
}

// Build compiles the emulated libcuda.so.1, libcublas.so.11 and
// libnvidia-ml.so.1 into dir (created if needed), with the kernels of the
// given kernel files (normally kernels/cuda/kernels.cu; relative paths are
// taken from the working directory). Point GORUN_CUDA_LIB_DIR at dir to
// have the CUDA backend load them.
//
// The three libraries are compiled concurrently, one g++ invocation each
// (after one preprocessor run per kernel file, which finds the kernels).
// Unless GORUN_CUDA_EMU_CACHE=off, the result is kept in the user's cache
// directory under a hash of everything that goes into it (the emulator's
// sources, the kernel files preprocessed, so with every header they
// include, the compiler's version and the flags) and later builds from
// the same inputs copy it from there.
//
// A missing compiler is reported as an error wrapping ErrNoCompiler; a
// kernel file that does not compile, with the compiler's output.
func Build(dir string, kernelFiles ...string) error {
	_, err := build(dir, kernelFiles)
	return err
}

// build is Build; it returns the directory holding the libraries (the
// cache entry when there is one, else dir). dir "" means: the cache entry
// only (a temporary directory when there is no cache).
func build(dir string, kernelFiles []string) (string, error) {
	return buildWith(dir, kernelFiles, false)
}

// buildWith is build, with the kernel files compiled with AddressSanitizer
// when asan (asan.go).
func buildWith(dir string, kernelFiles []string, asan bool) (string, error) {
	cc, err := cxx()
	if err != nil {
		return "", err
	}
	var files []string
	for _, f := range kernelFiles {
		abs, err := filepath.Abs(f)
		if err != nil {
			return "", err
		}
		if _, err := os.Stat(abs); err != nil {
			return "", fmt.Errorf("emu: kernel file: %w", err)
		}
		if strings.ContainsAny(abs, "\"\\\n") {
			return "", fmt.Errorf("emu: kernel file path %q has a quote, backslash or newline", abs)
		}
		files = append(files, abs)
	}
	if dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", err
		}
	}
	work, err := os.MkdirTemp(dir, ".emu-build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	src := filepath.Join(work, "src")
	if err := writeSources(src); err != nil {
		return "", err
	}

	// The cache key: everything that goes into the libraries.
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n%s\n", cacheVersion, runtime.GOARCH, strings.Join(commonFlags, " "), strings.Join(kernelFlags, " "))
	if asan {
		fmt.Fprintf(h, "asan %s\n", strings.Join(asanFlags, " "))
	}
	if v, err := exec.Command(cc, "--version").Output(); err == nil {
		h.Write(v)
	}
	fs.WalkDir(csrc, "csrc", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := csrc.ReadFile(p)
			fmt.Fprintf(h, "%s %d\n", p, len(b))
			h.Write(b)
		}
		return nil
	})
	var regs []string
	for i, f := range files {
		text, ks, err := scan(cc, src, f)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", f, len(text))
		h.Write(text)
		reg := filepath.Join(src, fmt.Sprintf("kernels_%d.cc", i))
		if err := os.WriteFile(reg, []byte(registration(f, ks)), 0o644); err != nil {
			return "", err
		}
		regs = append(regs, reg)
	}
	key := hex.EncodeToString(h.Sum(nil))[:24]

	cache := cacheDir()
	if cache != "" {
		entry := filepath.Join(cache, key)
		if complete(entry) {
			now := time.Now()
			os.Chtimes(entry, now, now) // most recently used: kept by prune
			if dir == "" {
				return entry, nil
			}
			return dir, install(dir, entry)
		}
	}

	out := filepath.Join(work, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		return "", err
	}
	inc := []string{"-I", filepath.Join(src, "include"), "-I", src}
	cuda := append(append(append([]string{}, commonFlags...), kernelFlags...), inc...)
	cuda = append(cuda, "-include", "cuda_emu.h", "-Wl,-soname,libcuda.so.1", "-o", filepath.Join(out, "libcuda.so.1"),
		filepath.Join(src, "libcuda.cc"))
	cuda = append(append(cuda, regs...), "-ldl")
	blas := append(append(append([]string{}, commonFlags...), inc...), "-Wl,-soname,libcublas.so.11",
		"-o", filepath.Join(out, "libcublas.so.11"), filepath.Join(src, "libcublas.cc"), "-ldl")
	nvml := append(append(append([]string{}, commonFlags...), inc...), "-Wl,-soname,libnvidia-ml.so.1",
		"-o", filepath.Join(out, "libnvidia-ml.so.1"), filepath.Join(src, "libnvml.cc"), "-ldl")
	cudaSteps := [][]string{cuda}
	if asan {
		cudaSteps = asanSteps(src, filepath.Join(out, "libcuda.so.1"), inc, regs)
	}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i, steps := range [][][]string{cudaSteps, {blas}, {nvml}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, args := range steps {
				cmd := exec.Command(cc, args...)
				cmd.Dir = src
				if b, err := cmd.CombinedOutput(); err != nil {
					errs[i] = fmt.Errorf("emu: compiling %s: %w\n%s %s\n%s", Libraries[i], err, cc, strings.Join(args, " "), b)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return "", err
	}

	result := out
	if cache != "" {
		entry := filepath.Join(cache, key)
		tmp, err := os.MkdirTemp(cache, ".tmp-")
		if err == nil {
			err = install(tmp, out)
			if err == nil {
				if os.Rename(tmp, entry) != nil && !complete(entry) {
					err = errors.New("not renamed")
				}
			}
			os.RemoveAll(tmp)
		}
		if err == nil && complete(entry) {
			result = entry
			prune(cache, 8)
		}
	}
	if dir == "" {
		if result == out { // no cache: keep the build in a directory of its own
			keep, err := os.MkdirTemp("", "gorun-cuda-emu-")
			if err != nil {
				return "", err
			}
			return keep, install(keep, out)
		}
		return result, nil
	}
	return dir, install(dir, out)
}

// complete reports whether dir holds the three libraries.
func complete(dir string) bool {
	for _, l := range Libraries {
		if _, err := os.Stat(filepath.Join(dir, l)); err != nil {
			return false
		}
	}
	return true
}

// install copies the three libraries from src into dir, each through a
// temporary file renamed into place.
func install(dir, src string) error {
	for _, l := range Libraries {
		b, err := os.ReadFile(filepath.Join(src, l))
		if err != nil {
			return err
		}
		f, err := os.CreateTemp(dir, ".lib-")
		if err != nil {
			return err
		}
		_, err = f.Write(b)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Chmod(f.Name(), 0o755)
		}
		if err == nil {
			err = os.Rename(f.Name(), filepath.Join(dir, l))
		}
		if err != nil {
			os.Remove(f.Name())
			return err
		}
	}
	return nil
}

// cacheDir is where built libraries are kept, "" for none.
func cacheDir() string {
	if os.Getenv(EnvCache) == "off" {
		return ""
	}
	base, err := os.UserCacheDir()
	if err != nil {
		base = filepath.Join(os.TempDir(), fmt.Sprintf("gorun-cache-%d", os.Getuid()))
	}
	d := filepath.Join(base, "gorun", "cuda-emu")
	if os.MkdirAll(d, 0o755) != nil {
		return ""
	}
	return d
}

// prune keeps the keep most recently used cache entries.
func prune(cache string, keep int) {
	ents, err := os.ReadDir(cache)
	if err != nil {
		return
	}
	type entry struct {
		name string
		t    time.Time
	}
	var es []entry
	for _, e := range ents {
		if info, err := e.Info(); err == nil && e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			es = append(es, entry{e.Name(), info.ModTime()})
		}
	}
	sort.Slice(es, func(i, j int) bool { return es[i].t.After(es[j].t) })
	for _, e := range es[min(keep, len(es)):] {
		os.RemoveAll(filepath.Join(cache, e.name)) // a process using it keeps its mapped libraries
	}
}

// KernelsCU returns the path of kernels/cuda/kernels.cu in this source
// tree.
func KernelsCU() (string, error) {
	var tried []string
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		p := filepath.Join(filepath.Dir(file), "..", "..", "kernels", "cuda", "kernels.cu")
		if _, err := os.Stat(p); err == nil {
			return filepath.Clean(p), nil
		}
		tried = append(tried, p)
	}
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && bytes.Contains(b, []byte("module github.com/gorun/gorun\n")) {
				p := filepath.Join(d, "kernels", "cuda", "kernels.cu")
				if _, err := os.Stat(p); err == nil {
					return p, nil
				}
				tried = append(tried, p)
				break
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	return "", fmt.Errorf("emu: kernels/cuda/kernels.cu not found (looked at %s)", strings.Join(tried, ", "))
}

var (
	testOnce sync.Once
	testDir  string
	testErr  error
)

// ForTest returns a directory holding the emulated libraries built with
// kernels/cuda/kernels.cu, building them the first time a test process
// asks (from the cache when it has them). It skips the test, saying why,
// when there is no g++, and fails it when the build fails. Use it as
//
//	t.Setenv("GORUN_CUDA_LIB_DIR", cudaemu.ForTest(t))
//
// before the backend first loads the driver (it does so once per process).
func ForTest(t testing.TB) string {
	t.Helper()
	testOnce.Do(func() {
		var cu string
		if cu, testErr = KernelsCU(); testErr == nil {
			testDir, testErr = build("", []string{cu})
		}
	})
	if errors.Is(testErr, ErrNoCompiler) {
		t.Skipf("skipping: the CUDA emulator cannot be built: %v", testErr)
	}
	if testErr != nil {
		t.Fatalf("building the CUDA emulator: %v", testErr)
	}
	return testDir
}
