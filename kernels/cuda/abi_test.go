package cuda

import (
	"debug/elf"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/gorun/gorun/kernels"
)

// ptxParams maps each .entry of a PTX module to its parameter types.
func ptxParams(t *testing.T, ptx string) map[string][]string {
	t.Helper()
	entry := regexp.MustCompile(`(?s)\.entry\s+(\w+)\s*\((.*?)\)`)
	param := regexp.MustCompile(`\.param\s+\.(\w+)\s+\w+`)
	out := map[string][]string{}
	for _, m := range entry.FindAllStringSubmatch(ptx, -1) {
		var types []string
		for _, p := range param.FindAllStringSubmatch(m[2], -1) {
			types = append(types, p[1])
		}
		out[m[1]] = types
	}
	return out
}

// ptxType is how nvcc declares a parameter of each type.
var ptxType = map[ptype]string{pPtr: "u64", pI64: "u64", pU64: "u64", pI32: "u32", pU32: "u32", pF32: "f32"}

// TestKernelABIMatchesPTX checks the Go side's declaration of every kernel
// against the embedded PTX: the same kernels, with the same parameter
// types in the same order. A mismatch would pass wrong bytes to a kernel,
// which no test without a GPU would otherwise see.
func TestKernelABIMatchesPTX(t *testing.T) {
	for name, ptx := range map[string][]byte{"sm70": ptxSM70, "sm80": ptxSM80} {
		t.Run(name, func(t *testing.T) {
			if len(ptx) == 0 {
				t.Fatalf("the embedded %s PTX is empty: run make cuda-toolchain && make ptx", name)
			}
			entries := ptxParams(t, string(ptx))
			declared := map[string]bool{}
			for _, k := range allKernels() {
				declared[k.name] = true
				got, ok := entries[k.name]
				if !ok {
					t.Errorf("%s: not in the PTX", k.name)
					continue
				}
				var want []string
				for _, p := range k.params {
					want = append(want, ptxType[p])
				}
				if strings.Join(got, ",") != strings.Join(want, ",") {
					t.Errorf("%s: PTX parameters %v, Go declares %v (%v)", k.name, got, want, k.params)
				}
			}
			var extra []string
			for e := range entries {
				if !declared[e] {
					extra = append(extra, e)
				}
			}
			sort.Strings(extra)
			if len(extra) > 0 {
				t.Errorf("kernels in the PTX that Go never launches: %v", extra)
			}
		})
	}
}

// toolchainDir is where `make cuda-toolchain` unpacks Debian's CUDA
// packages (kernels/cuda/toolchain.sh).
func toolchainDir() string {
	if d := os.Getenv("GORUN_CUDA_TOOLCHAIN"); d != "" {
		return d
	}
	h, _ := os.UserHomeDir()
	return filepath.Join(h, ".cache", "gorun", "cuda-11.8")
}

// definedFuncs lists the functions a shared library exports.
func definedFuncs(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
			out[s.Name] = true
		}
	}
	return out
}

// TestBindingsResolveAgainstDebianLibraries checks every symbol the
// backend binds against the libraries of Debian's libcuda1 (driver 535,
// CUDA 12.2), libcublas11 and libnvidia-ml1, read from their ELF symbol
// tables (loading them needs a GPU driver; reading them does not).
func TestBindingsResolveAgainstDebianLibraries(t *testing.T) {
	root := toolchainDir()
	libs := map[string]string{
		"libcuda.so.1":      filepath.Join(root, "usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1"),
		"libnvidia-ml.so.1": filepath.Join(root, "usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.1"),
		"libcublas.so.11":   filepath.Join(root, "usr/lib/x86_64-linux-gnu/libcublas.so.11"),
	}
	for _, p := range libs {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("Debian's CUDA libraries are not unpacked in %s (make cuda-toolchain): %v", root, err)
		}
	}
	var d driver
	var c cublas
	var n nvml
	dn, _ := d.symbols()
	cn, _ := c.symbols()
	nn, _ := n.symbols()
	for lib, names := range map[string][]string{"libcuda.so.1": dn, "libcublas.so.11": cn, "libnvidia-ml.so.1": nn} {
		have := definedFuncs(t, libs[lib])
		for _, s := range names {
			if !have[s] {
				t.Errorf("%s does not export %s", lib, s)
			}
		}
		t.Logf("%s: %d symbols resolved", lib, len(names))
	}
}

// colSplits covers every row once with splits of equal size but the last
// (none empty), keeps to its bounds, and gives the shapes of
// Transformer-base's reductions enough blocks for a large GPU.
func TestColSplits(t *testing.T) {
	for _, rows := range []int{0, 1, 31, 255, 256, 257, 1000, 4097, 12500, 25000, 1 << 20} {
		for _, d := range []int{1, 3, 33, 48, 512, 2048, 32768} {
			s, per := colSplits(rows, d)
			blocks := (d + 31) / 32
			if s < 1 || s > colMaxSplits || s*per < rows || (rows > 0 && (s-1)*per >= rows) {
				t.Errorf("%d x %d: %d splits of %d rows", rows, d, s, per)
			}
			if s > 1 && (per < colMinRows || blocks*(s-1) >= colTargetBlocks) {
				t.Errorf("%d x %d: %d splits of %d rows, %d blocks: more than needed", rows, d, s, per, blocks*s)
			}
		}
	}
	for _, k := range []struct{ rows, d, blocks int }{{12500, 512, 512}, {12500, 2048, 512}, {25000, 512, 512}} {
		if s, _ := colSplits(k.rows, k.d); s*((k.d+31)/32) != k.blocks {
			t.Errorf("%d x %d: %d splits, %d blocks; want %d blocks", k.rows, k.d, s, s*((k.d+31)/32), k.blocks)
		}
	}
}

// TestOrthoConstantsMatch: gr_orthonormalize_f32's drop tolerance and
// column limit are the kernels package's, and its block size is a
// multiple of 32 up to 1024 for every row count.
func TestOrthoConstantsMatch(t *testing.T) {
	src, err := os.ReadFile("kernels.cu")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"GR_ORTHO_DROP_TOL": strconv.FormatFloat(kernels.OrthoDropTol, 'g', -1, 64),
		"GR_ORTHO_MAX_COLS": strconv.Itoa(kernels.OrthoMaxCols),
	} {
		m := regexp.MustCompile(`(?m)^#define\s+` + name + `\s+(\S+)\s*$`).FindSubmatch(src)
		if m == nil {
			t.Errorf("kernels.cu defines no %s", name)
			continue
		}
		if got, _ := strconv.ParseFloat(string(m[1]), 64); strconv.FormatFloat(got, 'g', -1, 64) != want {
			t.Errorf("kernels.cu: %s is %s, the kernels package's %s", name, m[1], want)
		}
	}
	for _, rows := range []int{1, 31, 32, 33, 512, 1000, 1024, 1025, 32768, 1 << 24} {
		if n := orthoThreads(rows); n%32 != 0 || n < 32 || n > 1024 {
			t.Errorf("orthoThreads(%d) = %d", rows, n)
		}
	}
}
