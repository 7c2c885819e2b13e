package kerneltest_test

import (
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/gorun/gorun/kernels"
	"github.com/gorun/gorun/kernels/cpu"
	"github.com/gorun/gorun/kernels/kerneltest"
)

// Every method of kernels.Backend has a subtest of its own, or is covered
// by the one named here: a new op cannot be added without a table.
func TestEveryOpHasATable(t *testing.T) {
	coveredBy := map[string]string{
		"Alloc": "AllocUploadDownload", "Upload": "AllocUploadDownload", "UploadI32": "AllocUploadDownload",
		"Download": "AllocUploadDownload", "Name": "AllocUploadDownload", "Device": "AllocUploadDownload",
		"Sync": "AllocUploadDownload",
	}
	ops := kerneltest.Ops()
	bt := reflect.TypeFor[kernels.Backend]()
	for i := range bt.NumMethod() {
		m := bt.Method(i).Name
		name := m
		if c, ok := coveredBy[m]; ok {
			name = c
		}
		if !slices.Contains(ops, name) {
			t.Errorf("kernels.Backend.%s has no subtest in kerneltest.Run (subtests: %s)", m, strings.Join(ops, ", "))
		}
	}
}

// tf32 is the CPU backend with the inputs of its matrix products truncated
// to TF32 (10 mantissa bits), as tensor cores read them, the worst a GPU
// backend's TF32 path does: Gemm's operands, and attention's q, k, v and
// do (its softmax and softmax backward stay float32, as a GPU's row
// kernels are; the weights that then enter the products are not
// truncated here). The table must pass it with the TF32 tolerance.
type tf32 struct{ *cpu.Backend }

func trunc(x kernels.Tensor) kernels.Tensor {
	y := x
	y.F32 = make([]float32, len(x.F32))
	for i, v := range x.F32 {
		y.F32[i] = math.Float32frombits(math.Float32bits(v) &^ 0x1fff)
	}
	return y
}

func (b tf32) Gemm(ta, tb bool, alpha float32, x, y kernels.Tensor, beta float32, c kernels.Tensor) {
	b.Backend.Gemm(ta, tb, alpha, trunc(x), trunc(y), beta, c)
}

func (b tf32) Attention(o, probs, q, k, v kernels.Tensor, a kernels.AttnArgs) {
	b.Backend.Attention(o, probs, trunc(q), trunc(k), trunc(v), a)
}

func (b tf32) AttentionBackward(dq, dk, dv, dprobs, do, q, k, v, probs kernels.Tensor, a kernels.AttnArgs) {
	b.Backend.AttentionBackward(dq, dk, dv, dprobs, trunc(do), trunc(q), trunc(k), trunc(v), probs, a)
}

func TestTF32Tolerance(t *testing.T) {
	kerneltest.Run(t, tf32{cpu.New()}, kerneltest.TF32())
}
