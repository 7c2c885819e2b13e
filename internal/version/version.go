// Package version describes a gorun binary for --version: its module
// version and commit (from the build information the go command embeds),
// the Go toolchain, the CPU features the kernels use and the GPUs found.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"

	"golang.org/x/sys/cpu"

	"github.com/gorun/gorun/half"
	"github.com/gorun/gorun/internal/aegis"
	"github.com/gorun/gorun/internal/aesgcm"
)

// String is the --version text of program prog; devices, when not empty,
// says what GPUs the program found (each binary looks in its own way).
func String(prog, devices string) string {
	var b strings.Builder
	ver, commit := "(devel)", "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			ver = bi.Main.Version
		}
		var rev, modified string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					modified = ", with uncommitted changes"
				}
			}
		}
		if rev != "" {
			commit = shortRev(rev) + modified
		}
	}
	fmt.Fprintf(&b, "%s %s (commit %s)\n", prog, ver, commit)
	fmt.Fprintf(&b, "%s %s/%s, %d CPUs\n", runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	fmt.Fprintf(&b, "CPU features: %s\n", orNone(strings.Join(Features(), " ")))
	if devices != "" {
		fmt.Fprintf(&b, "GPUs: %s\n", devices)
	}
	return b.String()
}

func shortRev(r string) string {
	if len(r) > 12 {
		return r[:12]
	}
	return r
}

func orNone(s string) string {
	if s == "" {
		return "none of avx2 fma f16c avx512f vaes neon"
	}
	return s
}

// Features lists the SIMD features of this CPU that gorun's kernels use
// (SGEMM, the half-precision conversions, and vaes: the sealed records'
// AEGIS-128X4, package aegis, and AES-GCM four blocks at a time, package
// aesgcm, both on VAES with AVX-512).
func Features() []string {
	var f []string
	add := func(ok bool, name string) {
		if ok {
			f = append(f, name)
		}
	}
	switch runtime.GOARCH {
	case "amd64":
		add(cpu.X86.HasAVX2, "avx2")
		add(cpu.X86.HasFMA, "fma")
		add(cpu.X86.HasAVX512F, "avx512f")
		add(slices.Contains(half.Vectorized(), "f16c"), "f16c") // as package half detects it
		add(aesgcm.Vector() || aegis.Available(), "vaes")
	case "arm64":
		add(cpu.ARM64.HasASIMD, "neon")
	}
	return f
}
