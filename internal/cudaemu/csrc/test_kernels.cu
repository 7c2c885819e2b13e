// Kernels that test the gorun CUDA emulator itself (emu_test.go). Plain
// CUDA C: they compile with nvcc too.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define FULL 0xffffffffu

static __device__ __forceinline__ float warp_sum(float v) {
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(FULL, v, m);
  return v;
}

// out[b] = sum of x[b*n : (b+1)*n]: a shared-memory tree down to one warp,
// then shuffles. Any block size that is a multiple of 32, up to 1024.
extern "C" __global__ void __launch_bounds__(1024) emu_test_block_sum(float* out, const float* x, int n) {
  __shared__ float s[1024];
  const float* row = x + (long long)blockIdx.x * n;
  float v = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) v += row[i];
  s[threadIdx.x] = v;
  __syncthreads();
  for (int k = blockDim.x / 2; k >= 32; k >>= 1) {
    if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x < 32) {
    v = warp_sum(s[threadIdx.x]);
    if (threadIdx.x == 0) out[blockIdx.x] = v;
  }
}

// The same with one shuffle reduction per warp, then one over the warp sums.
extern "C" __global__ void __launch_bounds__(1024) emu_test_block_sum_warps(float* out, const float* x, int n) {
  __shared__ float ws[32];
  const float* row = x + (long long)blockIdx.x * n;
  float v = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) v += row[i];
  v = warp_sum(v);
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) ws[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < (int)(blockDim.x / 32) ? ws[lane] : 0.0f;
    v = warp_sum(v);
    if (lane == 0) out[blockIdx.x] = v;
  }
}

// out[tid] = the shuffle op (0 idx, 1 up, 2 down, 3 xor) of tid*7+3.
extern "C" __global__ void emu_test_shfl(int* out, int op, int arg, int width) {
  int t = threadIdx.x + blockDim.x * blockIdx.x;
  int v = (int)threadIdx.x * 7 + 3, r = 0;
  switch (op) {
    case 0: r = __shfl_sync(FULL, v, arg, width); break;
    case 1: r = __shfl_up_sync(FULL, v, arg, width); break;
    case 2: r = __shfl_down_sync(FULL, v, arg, width); break;
    case 3: r = __shfl_xor_sync(FULL, v, arg, width); break;
  }
  out[t] = r;
}

// __shfl_xor_sync of float, double and unsigned.
extern "C" __global__ void emu_test_shfl_types(float* of, double* od, unsigned* ou, int m) {
  int t = threadIdx.x;
  of[t] = __shfl_xor_sync(FULL, t + 0.5f, m);
  od[t] = __shfl_xor_sync(FULL, t * 1e10 + 0.25, m);
  ou[t] = __shfl_xor_sync(FULL, 0x80000000u + (unsigned)t, m);
}

// out[4*t..]: ballot, any, all of (lane % 3 == 0), and __syncthreads_count
// of (t % 5 == 0).
extern "C" __global__ void emu_test_vote(unsigned* out) {
  int t = threadIdx.x, lane = t % 32;
  out[4 * t] = __ballot_sync(FULL, lane % 3 == 0);
  out[4 * t + 1] = __any_sync(FULL, lane == 31);
  out[4 * t + 2] = __all_sync(FULL, lane < 31);
  out[4 * t + 3] = __syncthreads_count(t % 5 == 0);
}

// atomicAdd on float, double, int and unsigned; every returned int is
// distinct (slot[old] = 1 exactly once).
extern "C" __global__ void emu_test_atomic(float* f, double* d, int* i, unsigned* u, int* slot, long long n) {
  for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < n; k += (long long)gridDim.x * blockDim.x) {
    atomicAdd(f, 1.0f);
    atomicAdd(d, 0.5);
    int old = atomicAdd(i, 1);
    atomicAdd(u, 2u);
    slot[old] += 1;
  }
}

// Every thread writes its coordinates: 6 ints at its global index.
extern "C" __global__ void emu_test_coords(int* out, int* dims) {
  int tpb = blockDim.x * blockDim.y * blockDim.z;
  int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  int* o = out + 6 * ((long long)b * tpb + t);
  o[0] = threadIdx.x;
  o[1] = threadIdx.y;
  o[2] = threadIdx.z;
  o[3] = blockIdx.x;
  o[4] = blockIdx.y;
  o[5] = blockIdx.z;
  if (b == 0 && t == 0) {
    dims[0] = blockDim.x;
    dims[1] = blockDim.y;
    dims[2] = blockDim.z;
    dims[3] = gridDim.x;
    dims[4] = gridDim.y;
    dims[5] = gridDim.z;
  }
}

extern "C" __global__ void emu_test_f32_to_f16(__half* dst, const float* src, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    dst[i] = __float2half_rn(src[i]);
}
extern "C" __global__ void emu_test_f16_to_f32(float* dst, const __half* src, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    dst[i] = __half2float(src[i]);
}
extern "C" __global__ void emu_test_f32_to_bf16(__nv_bfloat16* dst, const float* src, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    dst[i] = __float2bfloat16_rn(src[i]);
}
extern "C" __global__ void emu_test_bf16_to_f32(float* dst, const __nv_bfloat16* src, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    dst[i] = __bfloat162float(src[i]);
}

// Bugs the emulator must report instead of hanging.
extern "C" __global__ void emu_test_exit_before_barrier(float* x) {
  if (threadIdx.x >= 16) return;  // the others wait forever
  __syncthreads();
  x[threadIdx.x] = 1;
}
extern "C" __global__ void emu_test_exit_before_shfl(float* x) {
  if (threadIdx.x == 5) return;
  x[threadIdx.x] = __shfl_xor_sync(FULL, 1.0f, 1);
}
extern "C" __global__ void emu_test_trap(float* x) {
  if (blockIdx.x == 1 && threadIdx.x == 3) __trap();
  x[0] = 1;
}
// A 32-bit word at byte off of x: a GPU faults when off is not a multiple
// of 4, and the emulator, told by GR_CHECK_ALIGNED, fails the launch too.
extern "C" __global__ void emu_test_misaligned(float* x, int off) {
  unsigned* w = (unsigned*)((char*)x + off);
  GR_CHECK_ALIGNED(w, 4);
  if (threadIdx.x == 0) *w = 1u;
}

// __launch_bounds__ through a macro, and kernels made by a macro: the
// build's scan must see both.
#define EMU_MAX_THREADS 128
extern "C" __global__ void __launch_bounds__(EMU_MAX_THREADS, 1) emu_test_bounded(int* out) { out[threadIdx.x] = 1; }

#define EMU_FILL(T, NAME)                                                                           \
  extern "C" __global__ void NAME(T* p, T v, long long n) {                                         \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;                     \
         i += (long long)gridDim.x * blockDim.x)                                                    \
      p[i] = v;                                                                                     \
  }
EMU_FILL(float, emu_test_fill_f32)
EMU_FILL(int, emu_test_fill_i32)

// Timing: a grid-stride axpy (no barrier), and a kernel with four barriers
// per block (a shared-memory reduction per block of 256).
extern "C" __global__ void emu_test_axpy(float* y, float a, const float* x, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    y[i] += a * x[i];
}

extern "C" __global__ void __launch_bounds__(256) emu_test_barriers(float* out, const float* x) {
  __shared__ float s[256];
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  s[threadIdx.x] = x[i];
  __syncthreads();
  if (threadIdx.x < 128) s[threadIdx.x] += s[threadIdx.x + 128];
  __syncthreads();
  if (threadIdx.x < 64) s[threadIdx.x] += s[threadIdx.x + 64];
  __syncthreads();
  if (threadIdx.x < 32) s[threadIdx.x] += s[threadIdx.x + 32];
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = warp_sum(s[threadIdx.x]);
    if (threadIdx.x == 0) out[blockIdx.x] = v;
  }
}

// The order things run in (sched_test.go): every thread takes a ticket
// (the counter's old value) before and after a barrier, stored at its
// global index.
extern "C" __global__ void emu_test_ticket(int* counter, int* before, int* after) {
  int tpb = blockDim.x * blockDim.y * blockDim.z;
  long long b = blockIdx.x + gridDim.x * (blockIdx.y + (long long)gridDim.y * blockIdx.z);
  long long g = b * tpb + threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  before[g] = atomicAdd(counter, 1);
  __syncthreads();
  after[g] = atomicAdd(counter, 1);
}
