package cuda

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/gorun/gorun/dtype"
	"github.com/gorun/gorun/kernels"
)

// cuBLAS through purego. cublasGemmEx takes 19 arguments and
// cublasGemmStridedBatchedEx 23: purego v0.11 passes up to 32 (the older
// releases stopped at 15), every one of them an integer or a pointer (alpha
// and beta are host pointers), so the System V calling convention puts the
// first six in registers and the rest on the stack, which purego's
// trampoline does. No assembly of our own is needed.

// cuBLAS enums.
const (
	cublasOpN = 0
	cublasOpT = 1

	cudaR32F  = 0
	cudaR16F  = 2
	cudaR16BF = 14

	cublasCompute32F     = 68
	cublasCompute32FTF32 = 77

	cublasDefaultMath = 0
)

type cublas struct {
	lib    *library
	handle uintptr
	// drv and ctx: the context call makes current on the calling thread
	drv *driver
	ctx uintptr

	create, destroy, setStream, setMathMode, getVersion, gemmEx, gemmStridedBatchedEx uintptr
}

func (c *cublas) symbols() ([]string, []*uintptr) {
	return []string{"cublasCreate_v2", "cublasDestroy_v2", "cublasSetStream_v2", "cublasSetMathMode",
			"cublasGetVersion_v2", "cublasGemmEx", "cublasGemmStridedBatchedEx"},
		[]*uintptr{&c.create, &c.destroy, &c.setStream, &c.setMathMode, &c.getVersion, &c.gemmEx, &c.gemmStridedBatchedEx}
}

// cublasSonames are the cuBLAS major versions gorun can use, newest first.
var cublasSonames = []string{"libcublas.so.13", "libcublas.so.12", "libcublas.so.11"}

// cublasCandidates lists where cuBLAS is looked for: the library
// directories (s.LibDir first), the loader's own search, and the
// lib directories of pip's wheels (nvidia/cublas/lib up to CUDA 12,
// nvidia/cu13/lib from 13: where PyTorch's cuBLAS is) found without
// running Python.
func cublasCandidates(s Settings) []string {
	dirs := append(libDirs(s), pythonCUDALibDirs(s, "cublas")...)
	return candidates(s, dirs, cublasSonames...)
}

// loadCublas opens cuBLAS (with its cublasLt, openWithLt) from the first
// candidate that loads; when none is there, from the wheels under the
// sys.path of the python3 on PATH (pythonSysPath: asked only then).
func loadCublas(s Settings) (*cublas, error) {
	what := "cuBLAS (" + strings.Join(cublasSonames, ", ") + ")"
	lib, err := openWithLt(what, cublasCandidates(s))
	if errors.Is(err, errNotFound) {
		if sp := pythonSysPath(); len(sp) > 0 {
			var cands []string
			for _, d := range wheelLibDirs(sp, "cublas") {
				for _, n := range cublasSonames {
					cands = append(cands, filepath.Join(d, n))
				}
			}
			if l, err2 := openWithLt(what, cands); !errors.Is(err2, errNotFound) {
				lib, err = l, err2
			} else {
				err = fmt.Errorf("%w, nor in the wheels under the sys.path of the python3 on PATH", err)
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%w; install it (pip install nvidia-cublas, or the CUDA toolkit) or set %s", err, EnvLibDir)
	}
	c := &cublas{lib: lib}
	names, ptrs := c.symbols()
	if err := lib.resolve(names, ptrs); err != nil {
		return nil, err
	}
	return c, nil
}

// call runs one cuBLAS function with the backend's context current on
// the calling OS thread. cuBLAS works in the calling thread's current
// context and, on a thread that has none, the CUDA runtime under it makes
// device 0's primary context current: it never answers
// CUDA_ERROR_INVALID_CONTEXT as the driver does, so the driver's
// make-current-and-retry (driver.call) cannot catch it, and a backend on
// another device would run its GEMMs in device 0's context (and leave
// that context current on the thread for the driver calls that follow).
// So the goroutine stays on its thread for the call and the context is
// made current first (a thread-local store in the driver). Pointer
// arguments as in driver.call.
//
//go:uintptrescapes
func (c *cublas) call(fn uintptr, args ...uintptr) uintptr {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if c.ctx != 0 {
		purego.SyscallN(c.drv.ctxSetCurrent, c.ctx)
	}
	r, _, _ := purego.SyscallN(fn, args...)
	return r
}

func (c *cublas) check(call string, r uintptr) error {
	if r == 0 {
		return nil
	}
	return &Error{Call: call, Code: int(int32(r)), Name: cublasStatus(int32(r))}
}

func cublasStatus(s int32) string {
	switch s {
	case 1:
		return "CUBLAS_STATUS_NOT_INITIALIZED"
	case 3:
		return "CUBLAS_STATUS_ALLOC_FAILED"
	case 7:
		return "CUBLAS_STATUS_INVALID_VALUE"
	case 8:
		return "CUBLAS_STATUS_ARCH_MISMATCH"
	case 11:
		return "CUBLAS_STATUS_MAPPING_ERROR"
	case 13:
		return "CUBLAS_STATUS_EXECUTION_FAILED"
	case 14:
		return "CUBLAS_STATUS_INTERNAL_ERROR"
	case 15:
		return "CUBLAS_STATUS_NOT_SUPPORTED"
	}
	return fmt.Sprintf("cublasStatus %d", s)
}

func (c *cublas) version() int {
	var v int32
	c.call(c.getVersion, c.handle, uintptr(unsafe.Pointer(&v)))
	return int(v)
}

func cudaType(dt dtype.DType) uintptr {
	switch dt {
	case dtype.Float16:
		return cudaR16F
	case dtype.BFloat16:
		return cudaR16BF
	}
	return cudaR32F
}

// gemmCall is one row-major GEMM, C = alpha*op(A)*op(B) + beta*C, for a
// batch of matrices at fixed strides (batch 1: a plain GEMM).
type gemmCall struct {
	transA, transB bool
	m, n, k        int
	a, b, c        kernels.Tensor
	lda, ldb, ldc  int
	sa, sb, sc     int // strides between batch members, in elements
	batch          int
	alpha, beta    float32
}

// op names the call for the profiler: its types (A, B -> C) and
// transposes, and for a single product its shape, each dimension above
// 1024 as the power of two it does not exceed (the token counts of a
// step's batches differ a little; their products share a row); batched
// ones (attention's, over the heads, of lengths that vary by batch) are
// one row per kind; a batch with one operand for all (the stacked
// attention projections) is named by its size and shape, as "x3".
func (g *gemmCall) op() string {
	t := func(b bool) string {
		if b {
			return "T"
		}
		return "N"
	}
	up := func(dt dtype.DType) string { return strings.ToUpper(typeName(dt)) }
	s := fmt.Sprintf("gemm %s,%s->%s %s%s", up(g.a.DType), up(g.b.DType), up(g.c.DType), t(g.transA), t(g.transB))
	if g.batch > 1 {
		if g.sa != 0 && g.sb != 0 {
			return s + " batched"
		}
		s += " x" + strconv.Itoa(g.batch)
	}
	dim := func(d int) string {
		if d <= 1024 {
			return strconv.Itoa(d)
		}
		p := 2048
		for p < d {
			p *= 2
		}
		return "≤" + strconv.Itoa(p)
	}
	return s + " m=" + dim(g.m) + " n=" + dim(g.n) + " k=" + dim(g.k)
}

// run issues the call. cuBLAS is column-major: a row-major C = A*B is
// the column-major C^T = B^T * A^T, so the operands swap places and m and n
// with them; the leading dimensions stay the row-major row lengths.
func (c *cublas) run(g *gemmCall, tf32 bool, scalars *[2]float32) error {
	opA, opB := uintptr(cublasOpN), uintptr(cublasOpN)
	if g.transA {
		opA = cublasOpT
	}
	if g.transB {
		opB = cublasOpT
	}
	compute := uintptr(cublasCompute32F)
	if tf32 && g.c.DType == dtype.Float32 && g.a.DType == dtype.Float32 {
		compute = cublasCompute32FTF32
	}
	scalars[0], scalars[1] = g.alpha, g.beta
	alpha, beta := uintptr(unsafe.Pointer(&scalars[0])), uintptr(unsafe.Pointer(&scalars[1]))
	algo := ^uintptr(0) // CUBLAS_GEMM_DEFAULT, -1
	if g.batch <= 1 {
		r := c.call(c.gemmEx, c.handle, opB, opA, uintptr(g.n), uintptr(g.m), uintptr(g.k),
			alpha, g.b.Ptr, cudaType(g.b.DType), uintptr(g.ldb), g.a.Ptr, cudaType(g.a.DType), uintptr(g.lda),
			beta, g.c.Ptr, cudaType(g.c.DType), uintptr(g.ldc), compute, algo)
		return c.check("cublasGemmEx", r)
	}
	r := c.call(c.gemmStridedBatchedEx, c.handle, opB, opA, uintptr(g.n), uintptr(g.m), uintptr(g.k),
		alpha, g.b.Ptr, cudaType(g.b.DType), uintptr(g.ldb), uintptr(g.sb), g.a.Ptr, cudaType(g.a.DType), uintptr(g.lda), uintptr(g.sa),
		beta, g.c.Ptr, cudaType(g.c.DType), uintptr(g.ldc), uintptr(g.sc), uintptr(g.batch), compute, algo)
	return c.check("cublasGemmStridedBatchedEx", r)
}
