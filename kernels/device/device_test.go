package device

import (
	"strings"
	"testing"

	"github.com/gorun/gorun/kernels/cpu"
)

// TestOpenCPUSgemmKernel: --device cpu runs the SGEMM micro-kernel that
// Settings.SgemmKernel (GORUN_SGEMM_KERNEL) names and says which in the
// log text; a name the CPU cannot run is one error naming the variable;
// empty, the kernel chosen before.
func TestOpenCPUSgemmKernel(t *testing.T) {
	defer cpu.SetSgemmKernel(cpu.SgemmKernel())
	kernels := cpu.SgemmKernels()
	for _, name := range kernels {
		be, why, err := Open("cpu", Settings{SgemmKernel: name})
		if err != nil {
			t.Fatalf("%s=%s: %v", cpu.EnvSgemmKernel, name, err)
		}
		if _, ok := be.(*cpu.Backend); !ok {
			t.Fatalf("Open(cpu) = %T", be)
		}
		if got := cpu.SgemmKernel(); got != name {
			t.Errorf("%s=%s: Sgemm runs %s", cpu.EnvSgemmKernel, name, got)
		}
		if want := "cpu (--device cpu; SGEMM micro-kernel " + name + " of " + strings.Join(kernels, ", ") + ")"; why != want {
			t.Errorf("why = %q, want %q", why, want)
		}
	}

	_, _, err := Open("cpu", Settings{SgemmKernel: "sse9"})
	if want := cpu.EnvSgemmKernel + `=sse9: sgemm: kernel "sse9" not available on this CPU`; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("bad kernel name: %v, want %q...", err, want)
	}

	cpu.SetSgemmKernel("go")
	if _, why, err := Open("cpu", Settings{}); err != nil || cpu.SgemmKernel() != "go" || !strings.Contains(why, "micro-kernel go") {
		t.Errorf("no kernel named: the kernel chosen before must stay (%q, %v)", why, err)
	}
	if _, why, err := Open("cpu", Settings{SgemmKernel: "auto"}); err != nil || cpu.SgemmKernel() != kernels[0] || !strings.Contains(why, "micro-kernel "+kernels[0]) {
		t.Errorf("auto: the best kernel, %s (%q, %v)", kernels[0], why, err)
	}
	if _, _, err := Open("tpu", Settings{}); err == nil || err.Error() != `unknown --device "tpu" (want auto, cpu or cuda)` {
		t.Errorf("Open(tpu): %v", err)
	}
}
