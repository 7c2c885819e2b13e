// gorun CUDA emulator (CPU): makes CUDA C kernel source compile and run
// under g++. NOT a GPU: it exists so that kernels/cuda/kernels.cu and the Go
// backend can be tested end to end on machines without one.
//
// Force-included (g++ -std=c++20 -include cuda_emu.h) into every kernel
// file by emu.Build. The kernels of one launch run on the launching OS
// thread, one block after another; the threads of a block are fibers
// (user-level context switches) that switch only at __syncthreads and warp
// collectives (__shfl_*_sync, __ballot_sync, __any_sync, __all_sync,
// __syncwarp). Consequences a kernel author must know:
//
//   - __shared__ is `static`: a function-scope (or file-scope) static array
//     is exactly one block's shared memory, since blocks never overlap.
//     Dynamic shared memory (extern __shared__) does not compile.
//   - every thread of a block must reach every __syncthreads, and every lane
//     named in a warp collective's mask must reach it, or the launch fails
//     with CUDA_ERROR_LAUNCH_FAILED and a message naming the stuck threads
//     (a GPU would hang or compute garbage).
//   - atomics are plain read-modify-writes (no two emulated threads ever run
//     at once), so they are trivially atomic.
//   - there is no warp-synchronous execution: code that relies on the lanes
//     of a warp running in lockstep without __syncwarp / a *_sync intrinsic
//     (pre-Volta style "volatile" warp reductions) sees one lane run ahead.
//   - math is the host's libm (expf, logf, ... correctly rounded or nearly),
//     no FMA contraction: results differ from a GPU in the last bits.
#ifndef GORUN_CUDA_EMU_H
#define GORUN_CUDA_EMU_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define GORUN_CUDA_EMULATOR 1

// ---- qualifiers ----------------------------------------------------------
#ifdef GORUN_EMU_SCAN
// emu.Build preprocesses each kernel file once with these markers to find
// the extern "C" kernels and their __launch_bounds__.
#define __global__ __gorun_global__
#define __launch_bounds__(...) __gorun_lb__(__VA_ARGS__)
#else
#define __global__
#define __launch_bounds__(...)
#endif
#define __device__
#define __host__
#define __constant__
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
// __restrict__ is a g++ keyword already.

// ---- thread coordinates ----------------------------------------------------
struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

// Set by the emulator before a thread runs or resumes. __thread (not
// thread_local: no TLS wrapper calls) with the initial-exec model: one
// %fs-relative load per use.
#define GORUN_EMU_TLS __attribute__((tls_model("initial-exec")))
extern __thread uint3 threadIdx GORUN_EMU_TLS;
extern __thread uint3 blockIdx GORUN_EMU_TLS;
extern __thread uint3 blockDim GORUN_EMU_TLS;
extern __thread uint3 gridDim GORUN_EMU_TLS;
static constexpr int warpSize = 32;

// ---- runtime entry points (libcuda.so.1 of the emulator) -----------------
// Opaque calls: the compiler must assume they read and write any memory,
// shared (static) arrays included.
extern "C" int __gorun_emu_barrier(int op, int pred);
extern "C" unsigned long long __gorun_emu_warp(unsigned mask, unsigned long long v, int op, int arg, int width);
extern "C" void __gorun_emu_trap(void) __attribute__((noreturn));
extern "C" void __gorun_emu_misaligned(const void* p, int n) __attribute__((noreturn));

// GR_CHECK_ALIGNED(p, n): kernels.cu's hook before an access of n bytes
// that the GPU requires n-byte aligned (32-bit words of two 16-bit
// values); without it x86 would do a misaligned access silently, where a
// GPU stops the kernel with CUDA_ERROR_MISALIGNED_ADDRESS. nvcc builds
// leave the hook empty.
#define GR_CHECK_ALIGNED(p, n)                                                     \
  do {                                                                             \
    if (((uintptr_t)(const void*)(p) & (uintptr_t)((n) - 1)) != 0) __gorun_emu_misaligned((const void*)(p), (n)); \
  } while (0)

enum { GORUN_EMU_BAR = 0, GORUN_EMU_BAR_COUNT = 1, GORUN_EMU_BAR_AND = 2, GORUN_EMU_BAR_OR = 3 };
enum {
  GORUN_EMU_SHFL_IDX = 0,
  GORUN_EMU_SHFL_UP = 1,
  GORUN_EMU_SHFL_DOWN = 2,
  GORUN_EMU_SHFL_XOR = 3,
  GORUN_EMU_BALLOT = 4,
  GORUN_EMU_ANY = 5,
  GORUN_EMU_ALL = 6,
  GORUN_EMU_SYNCWARP = 7
};

static inline void __syncthreads(void) { __gorun_emu_barrier(GORUN_EMU_BAR, 0); }
static inline int __syncthreads_count(int p) { return __gorun_emu_barrier(GORUN_EMU_BAR_COUNT, p); }
static inline int __syncthreads_and(int p) { return __gorun_emu_barrier(GORUN_EMU_BAR_AND, p); }
static inline int __syncthreads_or(int p) { return __gorun_emu_barrier(GORUN_EMU_BAR_OR, p); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { __gorun_emu_warp(mask, 0, GORUN_EMU_SYNCWARP, 0, 32); }
static inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __trap(void) { __gorun_emu_trap(); }

// ---- warp collectives -------------------------------------------------------
template <class T>
static inline unsigned long long __gorun_emu_tobits(T v) {
  static_assert(sizeof(T) <= 8, "warp shuffles of types over 8 bytes are not emulated");
  unsigned long long b = 0;
  memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
static inline T __gorun_emu_frombits(unsigned long long b) {
  T v;
  memcpy(&v, &b, sizeof(T));
  return v;
}
template <class T>
static inline T __shfl_sync(unsigned mask, T v, int srcLane, int width = warpSize) {
  return __gorun_emu_frombits<T>(__gorun_emu_warp(mask, __gorun_emu_tobits(v), GORUN_EMU_SHFL_IDX, srcLane, width));
}
template <class T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
  return __gorun_emu_frombits<T>(__gorun_emu_warp(mask, __gorun_emu_tobits(v), GORUN_EMU_SHFL_UP, (int)delta, width));
}
template <class T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
  return __gorun_emu_frombits<T>(__gorun_emu_warp(mask, __gorun_emu_tobits(v), GORUN_EMU_SHFL_DOWN, (int)delta, width));
}
template <class T>
static inline T __shfl_xor_sync(unsigned mask, T v, int laneMask, int width = warpSize) {
  return __gorun_emu_frombits<T>(__gorun_emu_warp(mask, __gorun_emu_tobits(v), GORUN_EMU_SHFL_XOR, laneMask, width));
}
static inline unsigned __ballot_sync(unsigned mask, int p) {
  return (unsigned)__gorun_emu_warp(mask, p != 0, GORUN_EMU_BALLOT, 0, 32);
}
static inline int __any_sync(unsigned mask, int p) { return (int)__gorun_emu_warp(mask, p != 0, GORUN_EMU_ANY, 0, 32); }
static inline int __all_sync(unsigned mask, int p) { return (int)__gorun_emu_warp(mask, p != 0, GORUN_EMU_ALL, 0, 32); }

// ---- atomics (no two emulated threads run at once) -------------------------
#define GORUN_EMU_RMW(T, NAME, EXPR)      \
  static inline T NAME(T* p, T v) {       \
    T old = *p;                           \
    *p = (EXPR);                          \
    return old;                           \
  }
GORUN_EMU_RMW(float, atomicAdd, old + v)
GORUN_EMU_RMW(double, atomicAdd, old + v)
GORUN_EMU_RMW(int, atomicAdd, (int)((unsigned)old + (unsigned)v))
GORUN_EMU_RMW(unsigned int, atomicAdd, old + v)
GORUN_EMU_RMW(unsigned long long, atomicAdd, old + v)
GORUN_EMU_RMW(float, atomicExch, v)
GORUN_EMU_RMW(int, atomicExch, v)
GORUN_EMU_RMW(unsigned int, atomicExch, v)
GORUN_EMU_RMW(unsigned long long, atomicExch, v)
GORUN_EMU_RMW(int, atomicMax, old > v ? old : v)
GORUN_EMU_RMW(unsigned int, atomicMax, old > v ? old : v)
GORUN_EMU_RMW(int, atomicMin, old < v ? old : v)
GORUN_EMU_RMW(unsigned int, atomicMin, old < v ? old : v)
GORUN_EMU_RMW(int, atomicSub, (int)((unsigned)old - (unsigned)v))
GORUN_EMU_RMW(unsigned int, atomicSub, old - v)
GORUN_EMU_RMW(int, atomicOr, old | v)
GORUN_EMU_RMW(unsigned int, atomicOr, old | v)
GORUN_EMU_RMW(int, atomicAnd, old & v)
GORUN_EMU_RMW(unsigned int, atomicAnd, old & v)
#undef GORUN_EMU_RMW
#define GORUN_EMU_CAS(T)                        \
  static inline T atomicCAS(T* p, T cmp, T v) { \
    T old = *p;                                 \
    if (old == cmp) *p = v;                     \
    return old;                                 \
  }
GORUN_EMU_CAS(int)
GORUN_EMU_CAS(unsigned int)
GORUN_EMU_CAS(unsigned long long)
#undef GORUN_EMU_CAS

// ---- a few device intrinsics (__expf and __logf: glibc has them) ----------
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float __fdividef(float a, float b) { return a / b; }
// a product rounded on its own: never contracted into an FMA with what
// follows (the emulator's kernels are compiled with FMA contraction on, as
// nvcc compiles them; the empty asm keeps the rounded value)
static inline float __fmul_rn(float a, float b) {
    float r = a * b;
    __asm__("" : "+m"(r));
    return r;
}
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
static inline int __float_as_int(float x) { return __gorun_emu_frombits<int>(__gorun_emu_tobits(x)); }
static inline unsigned __float_as_uint(float x) { return __gorun_emu_frombits<unsigned>(__gorun_emu_tobits(x)); }
static inline float __int_as_float(int x) { return __gorun_emu_frombits<float>(__gorun_emu_tobits(x)); }
static inline float __uint_as_float(unsigned x) { return __gorun_emu_frombits<float>(__gorun_emu_tobits(x)); }
static inline long long __double_as_longlong(double x) { return __gorun_emu_frombits<long long>(__gorun_emu_tobits(x)); }
static inline double __longlong_as_double(long long x) { return __gorun_emu_frombits<double>(__gorun_emu_tobits(x)); }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
template <class T>
static inline T __ldg(const T* p) { return *p; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }

#endif
