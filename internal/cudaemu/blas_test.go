package cudaemu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/gorun/gorun/half"
)

// cuBLAS enums.
const (
	opN = 0
	opT = 1

	r32F  = 0
	r16F  = 2
	r16BF = 14

	compute32F     = 68
	compute32FTF32 = 77
	compute32F16BF = 75

	blasInvalidValue    = 7
	blasNotInitialized  = 1
	blasExecutionFailed = 13
	blasNotSupported    = 15
)

func elemSize(t int) int {
	if t == r32F {
		return 4
	}
	return 2
}

// devMatrix is a column-major matrix in device memory of one data type.
type devMatrix struct {
	typ  int
	ptr  uintptr
	vals []float32 // the host values, as stored (already rounded to typ)
}

// rounded is v as the data type stores it.
func rounded(typ int, v float32) float32 {
	switch typ {
	case r16F:
		return half.F16ToF32(half.F32ToF16(v))
	case r16BF:
		return half.BF16ToF32(half.F32ToBF16(v))
	}
	return v
}

func newMatrix(t *testing.T, l *emuLibs, typ, n int, rng *rand.Rand) *devMatrix {
	m := &devMatrix{typ: typ, vals: make([]float32, n)}
	for i := range m.vals {
		m.vals[i] = rounded(typ, float32(rng.NormFloat64()))
	}
	m.ptr = l.alloc(t, max(n*elemSize(typ), 1))
	m.put(t, l)
	return m
}

func (m *devMatrix) put(t *testing.T, l *emuLibs) {
	switch m.typ {
	case r32F:
		l.must(t, "cuMemcpyHtoD_v2", m.ptr, uintptr(unsafe.Pointer(&m.vals[0])), uintptr(4*len(m.vals)))
	default:
		h := make([]uint16, len(m.vals))
		for i, v := range m.vals {
			if m.typ == r16F {
				h[i] = half.F32ToF16(v)
			} else {
				h[i] = half.F32ToBF16(v)
			}
		}
		l.must(t, "cuMemcpyHtoD_v2", m.ptr, uintptr(unsafe.Pointer(&h[0])), uintptr(2*len(h)))
	}
}

func (m *devMatrix) get(t *testing.T, l *emuLibs) []float32 {
	out := make([]float32, len(m.vals))
	switch m.typ {
	case r32F:
		download(t, l, out, m.ptr)
	case r16F:
		h := make([]uint16, len(out))
		download(t, l, h, m.ptr)
		for i, v := range h {
			out[i] = half.F16ToF32(v)
		}
	default:
		h := make([]uint16, len(out))
		download(t, l, h, m.ptr)
		for i, v := range h {
			out[i] = half.BF16ToF32(v)
		}
	}
	return out
}

// refGemm is C = alpha*op(A)*op(B) + beta*C in float64, column-major, for
// one matrix of a batch; round is applied to the inputs.
func refGemm(ta, tb bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32,
	c []float32, ldc int, round func(float32) float32) []float64 {
	out := make([]float64, len(c))
	for i := range c {
		out[i] = float64(c[i])
	}
	for j := range n {
		for i := range m {
			var acc float64
			for p := range k {
				var av, bv float32
				if ta {
					av = a[p+i*lda]
				} else {
					av = a[i+p*lda]
				}
				if tb {
					bv = b[j+p*ldb]
				} else {
					bv = b[p+j*ldb]
				}
				acc += float64(round(av)) * float64(round(bv))
			}
			v := float64(alpha) * acc
			if beta != 0 {
				v += float64(beta) * float64(c[i+j*ldc])
			}
			out[i+j*ldc] = v
		}
	}
	return out
}

func blasHandle(t *testing.T, l *emuLibs) uintptr {
	var h uintptr
	l.must(t, "cublasCreate_v2", uintptr(unsafe.Pointer(&h)))
	t.Cleanup(func() { l.call(t, "cublasDestroy_v2", h) })
	return h
}

func scalars(alpha, beta float32) (*float32, *float32) { return &alpha, &beta }

func TestGemmEx(t *testing.T) {
	l := setup(t)
	h := blasHandle(t, l)
	var stream uintptr
	l.must(t, "cuStreamCreate", uintptr(unsafe.Pointer(&stream)), 1)
	l.must(t, "cublasSetStream_v2", h, stream)
	l.must(t, "cublasSetMathMode", h, 0)
	rng := rand.New(rand.NewPCG(3, 4))
	const m, n, k = 7, 5, 9
	for _, types := range [][3]int{{r32F, r32F, r32F}, {r16F, r16F, r16F}, {r16F, r16F, r32F}, {r16BF, r16BF, r16BF}, {r16BF, r16BF, r32F}} {
		for _, ta := range []bool{false, true} {
			for _, tb := range []bool{false, true} {
				for _, beta := range []float32{0, 0.5} {
					name := fmt.Sprintf("types %v ta %v tb %v beta %v", types, ta, tb, beta)
					rowsA, colsA := m, k
					if ta {
						rowsA, colsA = k, m
					}
					rowsB, colsB := k, n
					if tb {
						rowsB, colsB = n, k
					}
					lda, ldb, ldc := rowsA+2, rowsB+1, m+3
					A := newMatrix(t, l, types[0], lda*colsA, rng)
					B := newMatrix(t, l, types[1], ldb*colsB, rng)
					C := newMatrix(t, l, types[2], ldc*n, rng)
					if beta == 0 { // C is not read: NaNs there must not show
						for i := range C.vals {
							C.vals[i] = float32(math.NaN())
						}
						C.put(t, l)
					}
					alpha, pbeta := scalars(1.5, beta)
					opA, opB := uintptr(opN), uintptr(opN)
					if ta {
						opA = opT
					}
					if tb {
						opB = opT
					}
					l.must(t, "cublasGemmEx", h, opA, opB, m, n, k, uintptr(unsafe.Pointer(alpha)),
						A.ptr, uintptr(types[0]), uintptr(lda), B.ptr, uintptr(types[1]), uintptr(ldb),
						uintptr(unsafe.Pointer(pbeta)), C.ptr, uintptr(types[2]), uintptr(ldc), compute32F, ^uintptr(0))
					want := refGemm(ta, tb, m, n, k, 1.5, A.vals, lda, B.vals, ldb, beta, C.vals, ldc, func(v float32) float32 { return v })
					got := C.get(t, l)
					compare(t, name, types[2], m, n, ldc, got, want, C.vals)
				}
			}
		}
	}
}

// compare checks the m x n result against the reference to the output
// type's precision, and that the padding rows were not touched.
func compare(t *testing.T, name string, typ, m, n, ldc int, got []float32, want []float64, before []float32) {
	t.Helper()
	tol := 1e-5
	if typ == r16F {
		tol = 1e-3
	} else if typ == r16BF {
		tol = 8e-3
	}
	for j := range n {
		for i := range ldc {
			x := i + j*ldc
			if i >= m {
				if math.Float32bits(got[x]) != math.Float32bits(before[x]) {
					t.Fatalf("%s: padding element (%d,%d) changed to %v", name, i, j, got[x])
				}
				continue
			}
			if d := math.Abs(float64(got[x]) - want[x]); !(d <= tol*(1+math.Abs(want[x]))) {
				t.Fatalf("%s: C(%d,%d) = %v, want %v", name, i, j, got[x], want[x])
			}
		}
	}
}

func TestGemmStridedBatchedEx(t *testing.T) {
	l := setup(t)
	h := blasHandle(t, l)
	rng := rand.New(rand.NewPCG(5, 6))
	const m, n, k, batch = 6, 4, 3, 3
	for _, c := range []struct {
		ta, tb bool
		typ    int
		zeroB  bool // stride 0: one B for the whole batch
	}{{false, false, r32F, false}, {true, false, r32F, true}, {false, true, r16F, false}, {true, true, r16BF, false}} {
		rowsA, colsA := m, k
		if c.ta {
			rowsA, colsA = k, m
		}
		rowsB, colsB := k, n
		if c.tb {
			rowsB, colsB = n, k
		}
		lda, ldb, ldc := rowsA, rowsB+1, m
		sa, sb, sc := lda*colsA+5, ldb*colsB+2, ldc*n+1
		nb := batch
		if c.zeroB {
			sb, nb = 0, 1
		}
		A := newMatrix(t, l, c.typ, sa*batch, rng)
		B := newMatrix(t, l, c.typ, max(sb*nb, ldb*colsB), rng)
		C := newMatrix(t, l, r32F, sc*batch, rng)
		alpha, beta := scalars(-0.75, 2)
		opA, opB := uintptr(opN), uintptr(opN)
		if c.ta {
			opA = opT
		}
		if c.tb {
			opB = opT
		}
		l.must(t, "cublasGemmStridedBatchedEx", h, opA, opB, m, n, k, uintptr(unsafe.Pointer(alpha)),
			A.ptr, uintptr(c.typ), uintptr(lda), uintptr(sa), B.ptr, uintptr(c.typ), uintptr(ldb), uintptr(sb),
			uintptr(unsafe.Pointer(beta)), C.ptr, r32F, uintptr(ldc), uintptr(sc), batch, compute32F, 99)
		got := C.get(t, l)
		for b := range batch {
			want := refGemm(c.ta, c.tb, m, n, k, -0.75, A.vals[b*sa:], lda, B.vals[b*sb:], ldb, 2, C.vals[b*sc:b*sc+ldc*n], ldc,
				func(v float32) float32 { return v })
			compare(t, fmt.Sprintf("%+v batch %d", c, b), r32F, m, n, ldc, got[b*sc:b*sc+ldc*n], want, C.vals[b*sc:])
		}
	}
}

// FAST_TF32 and FAST_16BF round the inputs as tensor cores do.
func TestGemmFastCompute(t *testing.T) {
	l := setup(t)
	h := blasHandle(t, l)
	rng := rand.New(rand.NewPCG(7, 8))
	const m, n, k = 4, 3, 8
	tf32 := func(v float32) float32 { return math.Float32frombits((math.Float32bits(v) + 0x1000) &^ 0x1fff) }
	bf16 := func(v float32) float32 { return half.BF16ToF32(half.F32ToBF16(v)) }
	for _, c := range []struct {
		compute int
		mode    uintptr
		round   func(float32) float32
	}{{compute32FTF32, 0, tf32}, {compute32F16BF, 0, bf16}, {compute32F, 3, tf32}, {compute32F, 0, func(v float32) float32 { return v }}} {
		l.must(t, "cublasSetMathMode", h, c.mode)
		A := newMatrix(t, l, r32F, m*k, rng)
		B := newMatrix(t, l, r32F, k*n, rng)
		C := newMatrix(t, l, r32F, m*n, rng)
		alpha, beta := scalars(1, 0)
		l.must(t, "cublasGemmEx", h, opN, opN, m, n, k, uintptr(unsafe.Pointer(alpha)), A.ptr, r32F, m, B.ptr, r32F, k,
			uintptr(unsafe.Pointer(beta)), C.ptr, r32F, m, uintptr(c.compute), ^uintptr(0))
		want := refGemm(false, false, m, n, k, 1, A.vals, m, B.vals, k, 0, C.vals, m, c.round)
		got := C.get(t, l)
		for i := range got {
			if d := math.Abs(float64(got[i]) - want[i]); d > 1e-6*(1+math.Abs(want[i])) {
				t.Fatalf("compute %d mode %d: C[%d] = %v, want %v", c.compute, c.mode, i, got[i], want[i])
			}
		}
	}
	l.must(t, "cublasSetMathMode", h, 0)
}

func TestBlasErrors(t *testing.T) {
	l := setup(t)
	l.quiet(t)
	h := blasHandle(t, l)
	rng := rand.New(rand.NewPCG(9, 10))
	A := newMatrix(t, l, r32F, 16, rng)
	alpha, beta := scalars(1, 0)
	pa, pb := uintptr(unsafe.Pointer(alpha)), uintptr(unsafe.Pointer(beta))
	gemm := func(h uintptr, ta, tb, m, n, k int, a uintptr, at, lda int, b uintptr, bt, ldb int, c uintptr, ct, ldc, compute, algo int) int {
		return l.call(t, "cublasGemmEx", h, uintptr(ta), uintptr(tb), uintptr(m), uintptr(n), uintptr(k), pa, a, uintptr(at),
			uintptr(lda), b, uintptr(bt), uintptr(ldb), pb, c, uintptr(ct), uintptr(ldc), uintptr(compute), uintptr(algo))
	}
	p := A.ptr
	for _, c := range []struct {
		name string
		got  int
		want int
	}{
		{"ok", gemm(h, opN, opN, 4, 4, 4, p, r32F, 4, p, r32F, 4, p, r32F, 4, compute32F, -1), 0},
		{"m < 0", gemm(h, opN, opN, -1, 4, 4, p, r32F, 4, p, r32F, 4, p, r32F, 4, compute32F, -1), blasInvalidValue},
		{"k < 0", gemm(h, opN, opN, 4, 4, -4, p, r32F, 4, p, r32F, 4, p, r32F, 4, compute32F, -1), blasInvalidValue},
		{"lda < m", gemm(h, opN, opN, 4, 4, 4, p, r32F, 3, p, r32F, 4, p, r32F, 4, compute32F, -1), blasInvalidValue},
		{"lda < k (A transposed)", gemm(h, opT, opN, 2, 4, 4, p, r32F, 3, p, r32F, 4, p, r32F, 4, compute32F, -1), blasInvalidValue},
		{"ldb < n (B transposed)", gemm(h, opN, opT, 4, 4, 2, p, r32F, 4, p, r32F, 3, p, r32F, 4, compute32F, -1), blasInvalidValue},
		{"ldc < m", gemm(h, opN, opN, 4, 4, 4, p, r32F, 4, p, r32F, 4, p, r32F, 2, compute32F, -1), blasInvalidValue},
		{"op 3", gemm(h, 3, opN, 4, 4, 4, p, r32F, 4, p, r32F, 4, p, r32F, 4, compute32F, -1), blasInvalidValue},
		{"unknown type", gemm(h, opN, opN, 4, 4, 4, p, 5, 4, p, 5, 4, p, r32F, 4, compute32F, -1), blasInvalidValue},
		{"unknown compute type", gemm(h, opN, opN, 4, 4, 4, p, r32F, 4, p, r32F, 4, p, r32F, 4, 1234, -1), blasInvalidValue},
		{"unknown algo", gemm(h, opN, opN, 4, 4, 4, p, r32F, 4, p, r32F, 4, p, r32F, 4, compute32F, 50), blasInvalidValue},
		{"A f16, B f32", gemm(h, opN, opN, 2, 2, 2, p, r16F, 2, p, r32F, 2, p, r32F, 2, compute32F, -1), blasNotSupported},
		{"f16 in, bf16 out", gemm(h, opN, opN, 2, 2, 2, p, r16F, 2, p, r16F, 2, p, r16BF, 2, compute32F, -1), blasNotSupported},
		{"tf32 with f16", gemm(h, opN, opN, 2, 2, 2, p, r16F, 2, p, r16F, 2, p, r32F, 2, compute32FTF32, -1), blasNotSupported},
		{"C past the end", gemm(h, opN, opN, 4, 5, 4, p, r32F, 4, p, r32F, 4, p, r32F, 4, compute32F, -1), blasExecutionFailed},
		{"A in host memory", gemm(h, opN, opN, 4, 4, 4, uintptr(unsafe.Pointer(alpha)), r32F, 4, p, r32F, 4, p, r32F, 4, compute32F, -1), blasExecutionFailed},
		{"bad handle", gemm(h+8, opN, opN, 4, 4, 4, p, r32F, 4, p, r32F, 4, p, r32F, 4, compute32F, -1), blasNotInitialized},
		{"empty", gemm(h, opN, opN, 0, 4, 4, 0, r32F, 4, 0, r32F, 4, 0, r32F, 4, compute32F, -1), 0},
	} {
		if c.got != c.want {
			t.Errorf("%s: status %d, want %d (%s)", c.name, c.got, c.want, l.lastError(t))
		}
	}
	l.expect(t, blasInvalidValue, "cublasGemmEx", h, opN, opN, 4, 4, 4, 0, p, r32F, 4, p, r32F, 4, pb, p, r32F, 4, compute32F, ^uintptr(0))
	l.expect(t, blasInvalidValue, "cublasGemmStridedBatchedEx", h, opN, opN, 4, 4, 4, pa, p, r32F, 4, 0, p, r32F, 4, 0,
		pb, p, r32F, 4, 0, ^uintptr(0), compute32F, ^uintptr(0)) // batch -1
	l.expect(t, blasExecutionFailed, "cublasGemmStridedBatchedEx", h, opN, opN, 2, 2, 2, pa, p, r32F, 2, 4, p, r32F, 2, 4,
		pb, p, r32F, 2, 4, 5, compute32F, ^uintptr(0)) // the 5th matrix runs past the end
	l.expect(t, blasInvalidValue, "cublasSetStream_v2", h, 12345)
	l.expect(t, blasInvalidValue, "cublasSetMathMode", h, 7)
	l.expect(t, blasInvalidValue, "cublasSetWorkspace_v2", h, p+4, 64)
	l.must(t, "cublasSetWorkspace_v2", h, p, 64)
	l.expect(t, blasInvalidValue, "cublasSetWorkspace_v2", h, p, 1<<20)
	var v int32
	l.must(t, "cublasGetVersion_v2", h, uintptr(unsafe.Pointer(&v)))
	if v != 111103 {
		t.Errorf("version %d", v)
	}
	var h2 uintptr
	l.must(t, "cublasCreate_v2", uintptr(unsafe.Pointer(&h2)))
	l.must(t, "cublasDestroy_v2", h2)
	l.expect(t, blasNotInitialized, "cublasDestroy_v2", h2)
	l.expect(t, blasNotInitialized, "cublasSetStream_v2", h2, 0)
}

func TestNVML(t *testing.T) {
	l := setup(t)
	l.must(t, "nvmlInit_v2")
	defer l.must(t, "nvmlShutdown")
	var n uint32
	l.must(t, "nvmlDeviceGetCount_v2", uintptr(unsafe.Pointer(&n)))
	var dev uintptr
	l.must(t, "nvmlDeviceGetHandleByIndex_v2", 0, uintptr(unsafe.Pointer(&dev)))
	l.expect(t, 2, "nvmlDeviceGetHandleByIndex_v2", 1, uintptr(unsafe.Pointer(&dev)))
	name := make([]byte, 96)
	l.must(t, "nvmlDeviceGetName", dev, uintptr(unsafe.Pointer(&name[0])), 96)
	l.expect(t, 7, "nvmlDeviceGetName", dev, uintptr(unsafe.Pointer(&name[0])), 8)
	var u [2]uint32
	l.must(t, "nvmlDeviceGetUtilizationRates", dev, uintptr(unsafe.Pointer(&u[0])))
	var m0, m1 [3]uint64
	l.must(t, "nvmlDeviceGetMemoryInfo", dev, uintptr(unsafe.Pointer(&m0[0])))
	l.alloc(t, 3<<20)
	l.must(t, "nvmlDeviceGetMemoryInfo", dev, uintptr(unsafe.Pointer(&m1[0])))
	if n != 1 || cstring(name) != "gorun CUDA emulator (CPU)" || u != [2]uint32{} || m1[0] != 8<<30 ||
		m1[2]-m0[2] != 3<<20 || m1[0] != m1[1]+m1[2] {
		t.Errorf("count %d, name %q, utilization %v, memory %v then %v", n, cstring(name), u, m0, m1)
	}
	if s := goString(l.callPtr(t, "nvmlErrorString", 7)); s != "Insufficient Size" {
		t.Errorf("nvmlErrorString(7) = %q", s)
	}
}
