// gorun CUDA emulator (CPU): libcublas.so.11.
//
// NOT NVIDIA's cuBLAS: the handful of calls gorun's CUDA backend makes,
// computed on the CPU (in double) against the emulated driver's memory. See
// kernels/cuda/internal/emu/emu.go.
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "emu_sibling.h"
#include "gorun_emu_half.h"

#define API extern "C" __attribute__((visibility("default")))

typedef int cublasStatus_t;
enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
enum {
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_PEDANTIC = 69,
  CUBLAS_COMPUTE_32F_FAST_16F = 74,
  CUBLAS_COMPUTE_32F_FAST_16BF = 75,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
};
enum { CUBLAS_TF32_TENSOR_OP_MATH = 3, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16 };

namespace {

struct Handle {
  void* stream;
  int math;
  void* workspace;
  size_t workspace_size;
  void* ctx;  // the context current when it was created (cuBLAS binds a handle to it)
};

std::mutex g_mu;  // the handle set
std::set<Handle*> g_handles;

struct Driver {
  int (*init)(unsigned);
  void (*lock)(void);
  void (*unlock)(void);
  int (*device_range)(unsigned long long, unsigned long long);
  int (*stream_valid)(void*);
  void (*report)(const char*, const char*, const char*);
  // runs or queues a GEMM on its stream (GORUN_CUDA_EMU_SCHED=async)
  int (*submit)(void*, void (*)(void*), void*, void (*)(void*));
  // the calling thread's current context as the CUDA runtime sees it (a
  // thread without one gets device 0's primary context), and its device
  void* (*runtime_ctx)(void);
  int (*ctx_device)(void*);
} g_drv;
bool g_drv_ok;

bool driver() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_drv.init = (int (*)(unsigned))gorun_emu_cuda_sym("cuInit");
    g_drv.lock = (void (*)(void))gorun_emu_cuda_sym("gorunEmuLock");
    g_drv.unlock = (void (*)(void))gorun_emu_cuda_sym("gorunEmuUnlock");
    g_drv.device_range = (int (*)(unsigned long long, unsigned long long))gorun_emu_cuda_sym("gorunEmuDeviceRange");
    g_drv.stream_valid = (int (*)(void*))gorun_emu_cuda_sym("gorunEmuStreamValid");
    g_drv.report = (void (*)(const char*, const char*, const char*))gorun_emu_cuda_sym("gorunEmuReport");
    g_drv.submit = (int (*)(void*, void (*)(void*), void*, void (*)(void*)))gorun_emu_cuda_sym("gorunEmuSubmit");
    g_drv.runtime_ctx = (void* (*)(void))gorun_emu_cuda_sym("gorunEmuRuntimeContext");
    g_drv.ctx_device = (int (*)(void*))gorun_emu_cuda_sym("gorunEmuContextDevice");
    g_drv_ok = g_drv.init && g_drv.lock && g_drv.unlock && g_drv.device_range && g_drv.stream_valid && g_drv.report;
  });
  return g_drv_ok;
}

const char* status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "cublasStatus";
}

__attribute__((format(printf, 2, 3))) cublasStatus_t fail(cublasStatus_t s, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (g_drv_ok)
    g_drv.report("libcublas", status_name(s), msg);
  else
    fprintf(stderr, "gorun CUDA emulator: libcublas: %s: %s\n", status_name(s), msg);
  return s;
}

bool valid_handle(Handle* h) {
  std::lock_guard<std::mutex> l(g_mu);
  return g_handles.count(h) != 0;
}

size_t type_size(int t) { return t == CUDA_R_32F ? 4 : 2; }

inline float load(const void* p, int t, size_t i) {
  switch (t) {
    case CUDA_R_16F: return gorun_emu_f16_to_f32(((const uint16_t*)p)[i]);
    case CUDA_R_16BF: return gorun_emu_bf16_to_f32(((const uint16_t*)p)[i]);
  }
  return ((const float*)p)[i];
}

inline void store(void* p, int t, size_t i, float v) {
  switch (t) {
    case CUDA_R_16F: ((uint16_t*)p)[i] = gorun_emu_f32_to_f16(v); return;
    case CUDA_R_16BF: ((uint16_t*)p)[i] = gorun_emu_f32_to_bf16(v); return;
  }
  ((float*)p)[i] = v;
}

enum Rounding { R_NONE, R_TF32, R_16F, R_16BF };

// The tensor cores' rounding of an input under the FAST compute types.
inline float round_input(float v, Rounding r) {
  switch (r) {
    case R_TF32: {  // to nearest, ties away from zero (cvt.rna.tf32.f32)
      uint32_t b = gorun_emu_f32_bits(v);
      if ((b & 0x7f800000) != 0x7f800000) b = (b + 0x1000) & 0xffffe000;
      return gorun_emu_bits_f32(b);
    }
    case R_16F: return gorun_emu_f16_to_f32(gorun_emu_f32_to_f16(v));
    case R_16BF: return gorun_emu_bf16_to_f32(gorun_emu_f32_to_bf16(v));
    default: return v;
  }
}

struct Gemm {
  bool ta, tb;
  int m, n, k;
  float alpha, beta;
  const void* A;
  int at, lda;
  long long sa;
  const void* B;
  int bt, ldb;
  long long sb;
  void* C;
  int ct, ldc;
  long long sc;
  int batch;
  Rounding round;
};

// One matrix of the batch: C = alpha*op(A)*op(B) + beta*C, column-major,
// accumulated in double; columns [j0, j1) of C.
void gemm_cols(const Gemm& g, const void* A, const void* B, void* C, const std::vector<double>& Ad, int j0, int j1) {
  std::vector<double> acc(g.m);
  for (int j = j0; j < j1; j++) {
    std::fill(acc.begin(), acc.end(), 0.0);
    if (g.alpha != 0) {
      for (int p = 0; p < g.k; p++) {
        size_t bi = g.tb ? (size_t)j + (size_t)p * g.ldb : (size_t)p + (size_t)j * g.ldb;
        double bv = round_input(load(B, g.bt, bi), g.round);
        const double* a = &Ad[(size_t)p * g.m];
        for (int i = 0; i < g.m; i++) acc[i] += a[i] * bv;
      }
    }
    for (int i = 0; i < g.m; i++) {
      size_t ci = (size_t)i + (size_t)j * g.ldc;
      double v = (double)g.alpha * acc[i];
      if (g.beta != 0) v += (double)g.beta * load(C, g.ct, ci);
      store(C, g.ct, ci, (float)v);
    }
  }
}

void run(const Gemm& g) {
  std::vector<double> Ad;
  double work = (double)g.m * g.n * g.k;
  int threads = 1;
  if (work > 4e6) threads = (int)std::min<unsigned>(std::max(1u, std::thread::hardware_concurrency()), 8);
  for (int b = 0; b < g.batch; b++) {
    const char* A = (const char*)g.A + (ptrdiff_t)(b * g.sa) * (ptrdiff_t)type_size(g.at);
    const char* B = (const char*)g.B + (ptrdiff_t)(b * g.sb) * (ptrdiff_t)type_size(g.bt);
    char* C = (char*)g.C + (ptrdiff_t)(b * g.sc) * (ptrdiff_t)type_size(g.ct);
    if (g.alpha != 0) {  // op(A), m x k, column-major, in double
      Ad.resize((size_t)g.m * g.k);
      for (int p = 0; p < g.k; p++)
        for (int i = 0; i < g.m; i++) {
          size_t ai = g.ta ? (size_t)p + (size_t)i * g.lda : (size_t)i + (size_t)p * g.lda;
          Ad[(size_t)p * g.m + i] = round_input(load(A, g.at, ai), g.round);
        }
    }
    if (threads <= 1) {
      gemm_cols(g, A, B, C, Ad, 0, g.n);
      continue;
    }
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; t++) {
      int j0 = (int)((long long)g.n * t / threads), j1 = (int)((long long)g.n * (t + 1) / threads);
      if (j0 < j1) ts.emplace_back([&, j0, j1] { gemm_cols(g, A, B, C, Ad, j0, j1); });
    }
    for (std::thread& t : ts) t.join();
  }
}

// The byte range an operand of rows x cols (leading dimension ld) spans
// over the batch must lie in one live device allocation.
bool operand_ok(const char* what, const void* p, int type, int rows, int cols, int ld, long long stride, int batch) {
  if (rows == 0 || cols == 0 || batch == 0) return true;
  long long last = (long long)(cols - 1) * ld + rows - 1;
  long long off = (long long)(batch - 1) * stride;
  long long lo = std::min(0LL, off), hi = std::max(0LL, off) + last;
  unsigned long long es = type_size(type);
  unsigned long long start = (unsigned long long)(uintptr_t)p + (unsigned long long)(lo * (long long)es);
  if (p && g_drv.device_range(start, (unsigned long long)(hi - lo + 1) * es)) return true;
  fail(CUBLAS_STATUS_EXECUTION_FAILED,
       "operand %s at %p (%d x %d, ld %d, stride %lld, batch %d, %llu-byte elements) is not inside one live device "
       "allocation",
       what, p, rows, cols, ld, stride, batch, es);
  return false;
}

bool known_type(int t) { return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF; }

cublasStatus_t gemm(const char* call, Handle* h, int transa, int transb, int m, int n, int k, const float* alpha,
                    const void* A, int at, int lda, long long sa, const void* B, int bt, int ldb, long long sb,
                    const float* beta, void* C, int ct, int ldc, long long sc, int batch, int compute, int algo) {
  if (!valid_handle(h)) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "%s: unknown handle %p", call, (void*)h);
  if (g_drv.runtime_ctx && g_drv.ctx_device) {
    void* cur = g_drv.runtime_ctx();
    if (cur != h->ctx)
      return fail(CUBLAS_STATUS_EXECUTION_FAILED,
                  "%s: the handle was created in device %d's context, but device %d's is current on this thread "
                  "(cuBLAS runs in the calling thread's current context, and on a thread without one the CUDA runtime "
                  "makes device 0's primary context current): make the handle's context current before each call",
                  call, g_drv.ctx_device(h->ctx), g_drv.ctx_device(cur));
  }
  if (transa < 0 || transa > 2 || transb < 0 || transb > 2)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: transa %d, transb %d", call, transa, transb);
  if (m < 0 || n < 0 || k < 0 || batch < 0)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: m %d, n %d, k %d, batch %d", call, m, n, k, batch);
  bool ta = transa != 0, tb = transb != 0;  // CUBLAS_OP_C is CUBLAS_OP_T for real types
  int rowsA = ta ? k : m, rowsB = tb ? n : k;
  if (lda < std::max(1, rowsA) || ldb < std::max(1, rowsB) || ldc < std::max(1, m))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: lda %d (A has %d rows as stored), ldb %d (B: %d), ldc %d (C: %d)",
                call, lda, rowsA, ldb, rowsB, ldc, m);
  if (!known_type(at) || !known_type(bt) || !known_type(ct))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: data types A %d, B %d, C %d (emulated: CUDA_R_32F 0, CUDA_R_16F 2, CUDA_R_16BF 14)",
                call, at, bt, ct);
  Rounding round = R_NONE;
  switch (compute) {
    case CUBLAS_COMPUTE_32F:
      if ((h->math & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION) == CUBLAS_TF32_TENSOR_OP_MATH) round = R_TF32;
      break;
    case CUBLAS_COMPUTE_32F_PEDANTIC: break;
    case CUBLAS_COMPUTE_32F_FAST_16F: round = R_16F; break;
    case CUBLAS_COMPUTE_32F_FAST_16BF: round = R_16BF; break;
    case CUBLAS_COMPUTE_32F_FAST_TF32: round = R_TF32; break;
    default:
      return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: compute type %d (emulated: 68, 69, 74, 75, 77)", call, compute);
  }
  if (!(algo == -1 || (algo >= 0 && algo <= 23) || (algo >= 99 && algo <= 115)))
    return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: algo %d", call, algo);
  // The combinations cuBLAS supports with a 32-bit float compute type.
  bool supported = at == bt && (at == ct || ct == CUDA_R_32F);
  if (round != R_NONE && (at != CUDA_R_32F || ct != CUDA_R_32F)) supported = false;
  if (!supported)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: A type %d, B type %d, C type %d with compute type %d", call, at, bt,
                ct, compute);
  if (!alpha || !beta) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: alpha or beta is null", call);
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
  Gemm g{ta, tb, m, n, k, *alpha, *beta, A, at, lda, sa, B, bt, ldb, sb, C, ct, ldc, sc, batch, round};
  g_drv.lock();
  bool ok = operand_ok("C", C, ct, m, n, ldc, sc, batch);
  if (ok && k > 0 && g.alpha != 0)
    ok = operand_ok("A", A, at, rowsA, ta ? m : k, lda, sa, batch) &&
         operand_ok("B", B, bt, rowsB, tb ? k : n, ldb, sb, batch);
  if (ok && g_drv.submit) {
    // on the handle's stream: now, or queued (GORUN_CUDA_EMU_SCHED=async;
    // alpha and beta were read from the host now, as cuBLAS does)
    int r = g_drv.submit(
        h->stream, [](void* p) { run(*(const Gemm*)p); }, new Gemm(g), [](void* p) { delete (Gemm*)p; });
    if (r) {
      fail(CUBLAS_STATUS_EXECUTION_FAILED, "%s on stream %p: CUresult %d (see the driver's error before)", call,
           h->stream, r);
      ok = false;
    }
  } else if (ok) {
    run(g);
  }
  g_drv.unlock();
  return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // namespace

API cublasStatus_t cublasCreate_v2(Handle** handle) {
  if (!handle) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasCreate: null pointer");
  if (!driver())
    return fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasCreate: the emulated libcuda.so.1 is not next to libcublas");
  if (int r = g_drv.init(0))
    return fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasCreate: cuInit failed with CUresult %d", r);
  Handle* h = new Handle{nullptr, 0, nullptr, 0, g_drv.runtime_ctx ? g_drv.runtime_ctx() : nullptr};
  std::lock_guard<std::mutex> l(g_mu);
  g_handles.insert(h);
  *handle = h;
  return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasDestroy_v2(Handle* h) {
  std::lock_guard<std::mutex> l(g_mu);
  if (!g_handles.erase(h)) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasDestroy: unknown handle %p", (void*)h);
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasSetStream_v2(Handle* h, void* stream) {
  if (!valid_handle(h)) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetStream: unknown handle %p", (void*)h);
  g_drv.lock();
  bool ok = g_drv.stream_valid(stream);
  g_drv.unlock();
  if (!ok) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasSetStream: unknown stream %p", stream);
  h->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasSetMathMode(Handle* h, int mode) {
  if (!valid_handle(h)) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetMathMode: unknown handle %p", (void*)h);
  if ((mode & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION) > 3 || mode < 0)
    return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasSetMathMode: mode %d", mode);
  h->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasGetVersion_v2(Handle* h, int* version) {
  if (h && !valid_handle(h)) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasGetVersion: unknown handle %p", (void*)h);
  if (!version) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGetVersion: null pointer");
  *version = 111103;  // 11.11.3, the cuBLAS of CUDA 11.8
  return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasSetWorkspace_v2(Handle* h, void* workspace, size_t bytes) {
  if (!valid_handle(h)) return fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetWorkspace: unknown handle %p", (void*)h);
  if (workspace && bytes > 0) {
    if ((uintptr_t)workspace % 256)
      return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasSetWorkspace: %p is not 256-byte aligned", workspace);
    g_drv.lock();
    bool ok = g_drv.device_range((uintptr_t)workspace, bytes);
    g_drv.unlock();
    if (!ok)
      return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasSetWorkspace: [%p, +%zu) is not inside a live device allocation",
                  workspace, bytes);
  }
  h->workspace = workspace;
  h->workspace_size = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

API cublasStatus_t cublasGemmEx(Handle* h, int transa, int transb, int m, int n, int k, const float* alpha,
                                const void* A, int Atype, int lda, const void* B, int Btype, int ldb, const float* beta,
                                void* C, int Ctype, int ldc, int computeType, int algo) {
  return gemm("cublasGemmEx", h, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0, beta, C, Ctype,
              ldc, 0, 1, computeType, algo);
}

API cublasStatus_t cublasGemmStridedBatchedEx(Handle* h, int transa, int transb, int m, int n, int k,
                                              const float* alpha, const void* A, int Atype, int lda, long long strideA,
                                              const void* B, int Btype, int ldb, long long strideB, const float* beta,
                                              void* C, int Ctype, int ldc, long long strideC, int batchCount,
                                              int computeType, int algo) {
  return gemm("cublasGemmStridedBatchedEx", h, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb,
              strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo);
}
