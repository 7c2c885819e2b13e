// Kernels of the CUDA backend (package kernels/cuda). The contract with the
// Go side is the table "Kernel ABI" in docs/cuda.md: every kernel here is
// declared in kernels/cuda/launch.go with exactly these parameter types, and
// a test checks the compiled PTX against that declaration. The reference for
// every op's semantics is the CPU backend (kernels/cpu/backend.go, ops.go).
//
// `make ptx` compiles this file with nvcc to PTX for compute_70 and
// compute_80 (kernels/cuda/ptx, embedded by Go). The same file is also
// compiled by g++ against a CPU emulator of the CUDA runtime, so it keeps to
// a small subset of CUDA C++:
//   - extern "C" __global__ kernels, static __device__ helpers; templates
//     (the activation kernels' bodies) are not static: nvcc names the
//     __shared__ arrays of a static function after the source file's path,
//     and the PTX must not depend on where it was built;
//   - threadIdx/blockIdx/blockDim/gridDim .x/.y, __syncthreads(),
//     __shfl_xor_sync(0xffffffffu, v, mask) on float and double, every
//     thread of the block reaching every barrier and shuffle (a block
//     returns early only as a whole, e.g. for a padding row);
//   - __shared__ arrays of static size at function scope (for up to 1024
//     threads = 32 warps), no dynamic shared memory;
//   - atomicAdd on float* and double*, atomicCAS on int* (the index
//     checks' error record); expf, logf, sqrtf, sqrt; the half types
//     only through __float2half_rn, __half2float, __float2bfloat16_rn and
//     __bfloat162float, and copied (two at a time as a 4-byte struct or a
//     32-bit word: "Pairs" below); Inf/NaN tests as v - v != 0 and v != v.
//
// Launch shapes (docs/cuda.md): "flat" kernels loop with a grid stride over
// their n elements and are correct for any 1-D grid and block; "row"
// kernels take one block (a multiple of 32 threads, up to 1024) per row;
// "col" kernels take blocks of 32x32 threads in a grid of (ceil(d/32), S)
// splits of the rows, thread (x, y) summing column 32*blockIdx.x+x over its
// split's rows y, y+32, ..., the 32 partial sums of a column combined in a
// fixed order and the splits' sums added in split order (gr_col_sum_f32),
// so their results do not vary from run to run.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

// The most negative finite float: the start of a running maximum.
#define GR_NEG_MAX (-3.402823466e+38f)

// The largest block each kernel is launched with, by launch shape (the Go
// side's flatThreads, rowMaxThreads, colThreads and matMaxThreads in
// blocks.go; a test checks the PTX's .maxntid against them): every kernel
// declares its shape's number as its __launch_bounds__, so ptxas keeps its
// registers within 65536 / that many threads and the driver refuses a
// larger block. make ptx-check reads the registers and spills (ptxas -v).
#define GR_FLAT_THREADS 256
#define GR_ROW_THREADS 512
#define GR_COL_THREADS 1024
#define GR_MAT_THREADS 1024

// ---------------------------------------------------------------------------
// Indexing helpers

// First index and stride of a grid-stride loop.
static __device__ __forceinline__ long long flat_start() {
    return (long long)blockIdx.x * (long long)blockDim.x + (long long)threadIdx.x;
}

static __device__ __forceinline__ long long flat_stride() {
    return (long long)gridDim.x * (long long)blockDim.x;
}

// One digit of a mixed-radix number advanced by a fixed step: digit and
// step are < radix, so one subtraction brings the sum back below radix
// (the sum stays below 2^32 for any radix up to 2^31). carry goes in and
// out.
static __device__ __forceinline__ void mr_step(unsigned& digit, unsigned step, unsigned radix, unsigned& carry) {
    digit += step + carry;
    carry = digit >= radix ? 1u : 0u;
    if (carry) {
        digit -= radix;
    }
}

// RowCol follows the row and column of a flat index into a row-major
// array of rows of d elements while the index advances by a fixed stride,
// so a grid-stride loop divides only once per thread, not per element.
struct RowCol {
    long long r;   // row
    unsigned c;    // column, < d
    long long sr;  // stride / d
    unsigned sc;   // stride % d
    unsigned d;
};

static __device__ __forceinline__ void rc_init(RowCol& w, long long i, long long stride, int d) {
    w.d = (unsigned)d;
    w.r = i / d;
    w.c = (unsigned)(i - w.r * d);
    w.sr = stride / d;
    w.sc = (unsigned)(stride - w.sr * d);
}

static __device__ __forceinline__ void rc_next(RowCol& w) {
    unsigned carry = 0;
    mr_step(w.c, w.sc, w.d, carry);
    w.r += w.sr + carry;
}

// ---------------------------------------------------------------------------
// Index checks. Every index a kernel reads from data (an id, a target, a
// row number) is checked against its bound before it addresses memory. A
// bad one is not used (the kernel writes what it writes for padding, or
// nothing) and is recorded in err, the backend's error record of four ints:
// the op (GR_OP_*, kernels/cuda/launch.go's indexOps), the index, the bound
// and the row of the data it was read at. The first bad index wins (a
// compare-and-swap on err[0]); the host reads the record at its next
// synchronisation and reports it in one line. err may be 0 (no record).
#define GR_OP_EMBEDDING 1
#define GR_OP_EMBEDDING_BWD 2
#define GR_OP_XENT 3
#define GR_OP_ADAM_ROWS 4
#define GR_OP_GATHER_ROWS 5

static __device__ __forceinline__ bool index_ok(int* err, int op, int idx, int bound, long long row) {
    if (idx >= 0 && idx < bound) {
        return true;
    }
    if (err != 0 && atomicCAS(err, 0, op) == 0) {
        err[1] = idx;
        err[2] = bound;
        err[3] = (int)row;
    }
    return false;
}

// ---------------------------------------------------------------------------
// Reductions. A warp reduces with a butterfly of shuffles, after which every
// lane holds the same bits (each step adds the same two values, in either
// order); a block reduces the warps' results through shared memory, every
// warp reading all of them, so every thread of the block gets the result.

template <typename T>
static __device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

// block_sum: the sum of v over the block (1-D, blockDim.x a multiple of
// 32). sh holds 32 values; it may be reused by the next call at once.
template <typename T>
static __device__ __forceinline__ T block_sum(T v, T* sh) {
    const int lane = threadIdx.x & 31;
    const int w = threadIdx.x >> 5;
    const int nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); // every thread is done reading sh from a previous call
    if (lane == 0) {
        sh[w] = v;
    }
    __syncthreads();
    T r = lane < nw ? sh[lane] : (T)0;
    return warp_sum(r);
}

// block_sum2: two sums at once (one pair of barriers); sh holds 64 values.
static __device__ __forceinline__ void block_sum2(float& a, float& b, float* sh) {
    const int lane = threadIdx.x & 31;
    const int w = threadIdx.x >> 5;
    const int nw = blockDim.x >> 5;
    a = warp_sum(a);
    b = warp_sum(b);
    __syncthreads();
    if (lane == 0) {
        sh[w] = a;
        sh[32 + w] = b;
    }
    __syncthreads();
    a = warp_sum(lane < nw ? sh[lane] : 0.0f);
    b = warp_sum(lane < nw ? sh[32 + lane] : 0.0f);
}

// Online softmax statistics: m is a running maximum, s the sum of
// exp(z - m) over the values seen.
static __device__ __forceinline__ void sm_push(float& m, float& s, float z) {
    if (z > m) {
        s = s * expf(m - z) + 1.0f;
        m = z;
    } else {
        s += expf(z - m);
    }
}

// sm_merge merges (mo, so) into (m, s). The two are put in a fixed order
// first (larger maximum first, then larger sum), so the two lanes of a
// shuffle compute the same expression and hold the same bits after it.
static __device__ __forceinline__ void sm_merge(float& m, float& s, float mo, float so) {
    float m1 = m, s1 = s, m2 = mo, s2 = so;
    if (m2 > m1 || (m2 == m1 && s2 > s1)) {
        m1 = mo;
        s1 = so;
        m2 = m;
        s2 = s;
    }
    m = m1;
    s = s1 + s2 * expf(m2 - m1);
}

static __device__ __forceinline__ void warp_softmax(float& m, float& s) {
    for (int o = 16; o > 0; o >>= 1) {
        float mo = __shfl_xor_sync(0xffffffffu, m, o);
        float so = __shfl_xor_sync(0xffffffffu, s, o);
        sm_merge(m, s, mo, so);
    }
}

// block_softmax: the maximum and the sum of exp(z - max) over the block
// from each thread's running (m, s); shm and shs hold 32 values each.
static __device__ __forceinline__ void block_softmax(float& m, float& s, float* shm, float* shs) {
    const int lane = threadIdx.x & 31;
    const int w = threadIdx.x >> 5;
    const int nw = blockDim.x >> 5;
    warp_softmax(m, s);
    __syncthreads();
    if (lane == 0) {
        shm[w] = m;
        shs[w] = s;
    }
    __syncthreads();
    m = lane < nw ? shm[lane] : GR_NEG_MAX;
    s = lane < nw ? shs[lane] : 0.0f;
    warp_softmax(m, s);
}

// ---------------------------------------------------------------------------
// Element-wise kernels (flat)

extern "C" __global__ void __launch_bounds__(GR_FLAT_THREADS) gr_scale_f32(float* x, float s, long long n) {
    const long long stride = flat_stride();
    for (long long i = flat_start(); i < n; i += stride) {
        x[i] *= s;
    }
}

extern "C" __global__ void __launch_bounds__(GR_FLAT_THREADS) gr_axpy_f32(float* y, float a, const float* x, long long n) {
    const long long stride = flat_stride();
    for (long long i = flat_start(); i < n; i += stride) {
        y[i] += a * x[i];
    }
}

// *flag = 1 if any element is Inf or NaN (v - v is NaN exactly then).
extern "C" __global__ void __launch_bounds__(GR_FLAT_THREADS) gr_infnan_f32(int* flag, const float* __restrict__ x, long long n) {
    const long long stride = flat_stride();
    int bad = 0;
    for (long long i = flat_start(); i < n; i += stride) {
        const float v = x[i];
        bad |= (v - v != 0.0f) ? 1 : 0;
    }
    if (bad) {
        *flag = 1;
    }
}

// *out += sum of x*x in double: one atomic add per block. Every thread
// reaches the reduction.
extern "C" __global__ void __launch_bounds__(GR_FLAT_THREADS) gr_sumsq_f32(double* out, const float* __restrict__ x, long long n) {
    __shared__ double sh[32];
    const long long stride = flat_stride();
    double s = 0.0;
    for (long long i = flat_start(); i < n; i += stride) {
        const double v = (double)x[i];
        s += v * v; // exact product of two floats
    }
    s = block_sum(s, sh);
    if (threadIdx.x == 0 && s != 0.0) {
        atomicAdd(out, s);
    }
}

// ---------------------------------------------------------------------------
// Activations. The kernels below are templates over the type A of the
// activations they read and write: float, __half or __nv_bfloat16 (mixed
// precision). Parameters, their gradients, LayerNorm's mean and rstd stay
// float, and all arithmetic is in float: ld converts an element to float,
// st rounds a float to the element's type (to nearest even). Each is
// instantiated three times at the end of the file, as gr_<op>_f32,
// gr_<op>_f16 and gr_<op>_bf16.

static __device__ __forceinline__ float ld(const float* p, long long i) { return p[i]; }
static __device__ __forceinline__ float ld(const __half* p, long long i) { return __half2float(p[i]); }
static __device__ __forceinline__ float ld(const __nv_bfloat16* p, long long i) { return __bfloat162float(p[i]); }
static __device__ __forceinline__ void st(float* p, long long i, float v) { p[i] = v; }
static __device__ __forceinline__ void st(__half* p, long long i, float v) { p[i] = __float2half_rn(v); }
static __device__ __forceinline__ void st(__nv_bfloat16* p, long long i, float v) { p[i] = __float2bfloat16_rn(v); }
// rnd: v rounded to the type of p's elements, as st stores it and ld reads
// it back (a fused kernel goes on with what it stored).
static __device__ __forceinline__ float rnd(const float*, float v) { return v; }
static __device__ __forceinline__ float rnd(const __half*, float v) { return __half2float(__float2half_rn(v)); }
static __device__ __forceinline__ float rnd(const __nv_bfloat16*, float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// Pairs. The flat kernels over activations move two adjacent elements at a
// time where they can: two 16-bit values are one 32-bit load or store, half
// the memory instructions of one at a time (two floats are two loads). A
// pair starts at an even index i, so its 32-bit word needs the tensor's
// address 4-byte aligned (pair_ok: every tensor the kernel takes from
// Alloc is; a view at an odd offset is not). A kernel runs its pair loop
// when every activation tensor it touches is pair_ok and, for kernels over
// rows of d, d is even (no pair straddles two rows); else its element
// loop. With an odd count the last element is the tail, done by the grid's
// first thread. Element i is the low half of the word (little-endian).
#ifndef GR_CHECK_ALIGNED // the emulator checks (cuda_emu.h); a GPU faults
#define GR_CHECK_ALIGNED(p, n) ((void)0)
#endif

// word: the 32-bit word at p, which holds two 16-bit values.
static __device__ __forceinline__ unsigned* word(void* p) {
    GR_CHECK_ALIGNED(p, 4);
    return (unsigned*)p;
}
static __device__ __forceinline__ const unsigned* word(const void* p) {
    GR_CHECK_ALIGNED(p, 4);
    return (const unsigned*)p;
}

static __device__ __forceinline__ bool pair_ok(const float*) { return true; }
static __device__ __forceinline__ bool pair_ok(const __half* p) { return ((unsigned long long)p & 3ull) == 0; }
static __device__ __forceinline__ bool pair_ok(const __nv_bfloat16* p) { return ((unsigned long long)p & 3ull) == 0; }

// Pair: two adjacent 16-bit values as one 4-byte-aligned 4-byte object, so
// that nvcc moves it with one 32-bit load or store; pair_at checks the
// alignment where the emulator runs (a GPU faults).
template <typename A>
struct __align__(4) Pair {
    A lo, hi;
};
template <typename A>
static __device__ __forceinline__ Pair<A>* pair_at(A* p) {
    GR_CHECK_ALIGNED(p, 4);
    return (Pair<A>*)p;
}
template <typename A>
static __device__ __forceinline__ const Pair<A>* pair_at(const A* p) {
    GR_CHECK_ALIGNED(p, 4);
    return (const Pair<A>*)p;
}

// ld2: elements i and i+1 (i even, the tensor pair_ok) as floats; st2
// rounds two floats into them.
static __device__ __forceinline__ void ld2(const float* p, long long i, float& a, float& b) {
    a = p[i];
    b = p[i + 1];
}
static __device__ __forceinline__ void ld2(const __half* p, long long i, float& a, float& b) {
    const Pair<__half> v = *pair_at(p + i);
    a = __half2float(v.lo);
    b = __half2float(v.hi);
}
static __device__ __forceinline__ void ld2(const __nv_bfloat16* p, long long i, float& a, float& b) {
    const Pair<__nv_bfloat16> v = *pair_at(p + i);
    a = __bfloat162float(v.lo);
    b = __bfloat162float(v.hi);
}
static __device__ __forceinline__ void st2(float* p, long long i, float a, float b) {
    p[i] = a;
    p[i + 1] = b;
}
static __device__ __forceinline__ void st2(__half* p, long long i, float a, float b) {
    Pair<__half> v;
    v.lo = __float2half_rn(a);
    v.hi = __float2half_rn(b);
    *pair_at(p + i) = v;
}
static __device__ __forceinline__ void st2(__nv_bfloat16* p, long long i, float a, float b) {
    Pair<__nv_bfloat16> v;
    v.lo = __float2bfloat16_rn(a);
    v.hi = __float2bfloat16_rn(b);
    *pair_at(p + i) = v;
}

// cp2: dst[i], dst[i+1] = src[j], src[j+1], bits unchanged (i, j even).
static __device__ __forceinline__ void cp2(float* dst, long long i, const float* src, long long j) {
    dst[i] = src[j];
    dst[i + 1] = src[j + 1];
}
static __device__ __forceinline__ void cp2(__half* dst, long long i, const __half* src, long long j) {
    *word(dst + i) = *word(src + j);
}
static __device__ __forceinline__ void cp2(__nv_bfloat16* dst, long long i, const __nv_bfloat16* src, long long j) {
    *word(dst + i) = *word(src + j);
}

// relu_bwd2: dx[i], dx[i+1] = 0 where y[i], y[i+1] == 0 (either sign),
// untouched bits elsewhere (i even).
static __device__ __forceinline__ void relu_bwd2(float* dx, const float* y, long long i) {
    if (y[i] == 0.0f) {
        dx[i] = 0.0f;
    }
    if (y[i + 1] == 0.0f) {
        dx[i + 1] = 0.0f;
    }
}
// A 16-bit value (fp16 or bf16) is zero when its bits but the sign are.
static __device__ __forceinline__ void relu_bwd2_16(unsigned* dx, const unsigned* y) {
    const unsigned u = *y;
    const unsigned keep = ((u & 0x7fffu) != 0 ? 0x0000ffffu : 0u) | ((u & 0x7fff0000u) != 0 ? 0xffff0000u : 0u);
    if (keep != 0xffffffffu) {
        *dx &= keep;
    }
}
static __device__ __forceinline__ void relu_bwd2(__half* dx, const __half* y, long long i) {
    relu_bwd2_16(word(dx + i), word(y + i));
}
static __device__ __forceinline__ void relu_bwd2(__nv_bfloat16* dx, const __nv_bfloat16* y, long long i) {
    relu_bwd2_16(word(dx + i), word(y + i));
}

// Casts between float32, float16 and bfloat16, rounding to nearest even
// (flat). Half to half goes through float32, which holds either exactly,
// so it rounds once.
template <typename D, typename S>
__device__ __forceinline__ void cast_flat(D* __restrict__ dst, const S* __restrict__ src, long long n) {
    const long long stride = flat_stride();
    if (pair_ok(dst) && pair_ok(src)) {
        const long long np = n >> 1;
        for (long long k = flat_start(); k < np; k += stride) {
            float a, b;
            ld2(src, 2 * k, a, b);
            st2(dst, 2 * k, a, b);
        }
        if ((n & 1) != 0 && flat_start() == 0) {
            st(dst, n - 1, ld(src, n - 1));
        }
        return;
    }
    for (long long i = flat_start(); i < n; i += stride) {
        st(dst, i, ld(src, i));
    }
}

#define GR_CAST(name, D, S)                                                                                            \
    extern "C" __global__ void __launch_bounds__(GR_FLAT_THREADS) name(D* __restrict__ dst, const S* __restrict__ src, long long n) { \
        cast_flat(dst, src, n);                                                                                           \
    }

GR_CAST(gr_cast_f32_f16, __half, float)
GR_CAST(gr_cast_f32_bf16, __nv_bfloat16, float)
GR_CAST(gr_cast_f16_f32, float, __half)
GR_CAST(gr_cast_bf16_f32, float, __nv_bfloat16)
GR_CAST(gr_cast_f16_bf16, __nv_bfloat16, __half)
GR_CAST(gr_cast_bf16_f16, __half, __nv_bfloat16)

// x[r,j] += bias[j] (flat).
template <typename A>
__device__ __forceinline__ void add_bias(A* x, const float* __restrict__ bias, long long rows, int d) {
    const long long n = rows * (long long)d;
    const long long stride = flat_stride();
    long long i = flat_start();
    if ((d & 1) == 0 && pair_ok(x)) { // pairs (k: elements 2k, 2k+1 of a row)
        const long long np = n >> 1;
        if (i >= np) {
            return;
        }
        RowCol w;
        rc_init(w, i, stride, d >> 1);
        for (long long k = i; k < np; k += stride) {
            const int j = 2 * (int)w.c;
            float a, b;
            ld2(x, 2 * k, a, b);
            st2(x, 2 * k, a + bias[j], b + bias[j + 1]);
            rc_next(w);
        }
        return;
    }
    if (i >= n) {
        return;
    }
    RowCol w;
    rc_init(w, i, stride, d);
    for (; i < n; i += stride) {
        st(x, i, ld(x, i) + bias[w.c]);
        rc_next(w);
    }
}

// ReLU as the CPU's max(v, 0): NaN stays NaN, -0 becomes +0.
static __device__ __forceinline__ float relu(float v) {
    return (v > 0.0f || v != v) ? v : 0.0f;
}

// dx = 0 where y == 0 (either sign); dx is read only where it stays.
template <typename A>
__device__ __forceinline__ void relu_bwd(A* dx, const A* y, long long n) {
    const long long stride = flat_stride();
    if (pair_ok(dx) && pair_ok(y)) {
        const long long np = n >> 1;
        for (long long k = flat_start(); k < np; k += stride) {
            relu_bwd2(dx, y, 2 * k);
        }
        if ((n & 1) != 0 && flat_start() == 0 && ld(y, n - 1) == 0.0f) {
            st(dx, n - 1, 0.0f);
        }
        return;
    }
    for (long long i = flat_start(); i < n; i += stride) {
        if (ld(y, i) == 0.0f) {
            st(dx, i, 0.0f);
        }
    }
}

// Column reductions (col: block 32x32, grid (ceil(d/32), S)). Block
// (bx, by) sums its 32 columns over rows [by*per, min(rows, (by+1)*per));
// with one split (S = 1) it adds the sums to out[c], with several it
// writes them to out[by*d + c], partial sums that gr_col_sum_f32 then adds
// to the result in split order. The splits keep a GPU's multiprocessors
// busy when d/32 blocks would not (d = 512: 16 blocks for 132 SMs), and
// their number comes from the shape alone, so the sums do not vary from
// run to run or GPU to GPU. 1024 threads a block: __launch_bounds__ on
// their instances keeps the driver's JIT within 64 registers a thread.

// col_store puts column c's sum s of this block's rows where the launch
// says (above).
static __device__ __forceinline__ void col_store(float* out, int c, int d, float s) {
    if (gridDim.y == 1) {
        out[c] += s;
    } else {
        out[(long long)blockIdx.y * d + c] = s;
    }
}

// out[j] += sum over rows of dy[r, j] (split as above).
template <typename A>
__device__ __forceinline__ void bias_grad(float* __restrict__ out, const A* __restrict__ dy, int rows, int d, int per) {
    __shared__ float sh[32][33];
    const int x = threadIdx.x;
    const int y = threadIdx.y;
    const int c = blockIdx.x * 32 + x;
    const long long r0 = (long long)blockIdx.y * per;
    const long long r1 = r0 + per < rows ? r0 + per : (long long)rows;
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    if (c < d) {
        const A* p = dy + c;
        const long long ld_ = d;
        long long r = r0 + y;
        for (; r + 96 < r1; r += 128) {
            a0 += ld(p, r * ld_);
            a1 += ld(p, (r + 32) * ld_);
            a2 += ld(p, (r + 64) * ld_);
            a3 += ld(p, (r + 96) * ld_);
        }
        for (; r < r1; r += 32) {
            a0 += ld(p, r * ld_);
        }
    }
    sh[y][x] = (a0 + a1) + (a2 + a3);
    __syncthreads();
    if (y == 0 && c < d) {
        float s = 0.0f;
        for (int k = 0; k < 32; k++) {
            s += sh[k][x];
        }
        col_store(out, c, d, s);
    }
}

// dgamma[j] += sum_r dy[r,j]*n[r,j], dbeta[j] += sum_r dy[r,j], with
// n = (x - mean[r])*rstd[r] (split as above, each output on its own).
template <typename A>
__device__ __forceinline__ void layernorm_bwd_params(float* __restrict__ dgamma, float* __restrict__ dbeta,
                                                            const A* __restrict__ dy, const A* __restrict__ x,
                                                            const float* __restrict__ mean,
                                                            const float* __restrict__ rstd, int rows, int d, int per) {
    __shared__ float shg[32][33];
    __shared__ float shb[32][33];
    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    const int c = blockIdx.x * 32 + tx;
    const long long r0 = (long long)blockIdx.y * per;
    const long long r1 = r0 + per < rows ? r0 + per : (long long)rows;
    float g0 = 0.0f, g1 = 0.0f, b0 = 0.0f, b1 = 0.0f;
    if (c < d) {
        const long long ld_ = d;
        long long r = r0 + ty;
        for (; r + 32 < r1; r += 64) {
            const long long o0 = r * ld_ + c, o1 = (r + 32) * ld_ + c;
            const float d0 = ld(dy, o0), d1 = ld(dy, o1);
            const float n0 = (ld(x, o0) - mean[r]) * rstd[r];
            const float n1 = (ld(x, o1) - mean[r + 32]) * rstd[r + 32];
            g0 += d0 * n0;
            g1 += d1 * n1;
            b0 += d0;
            b1 += d1;
        }
        for (; r < r1; r += 32) {
            const long long o = r * ld_ + c;
            const float dv = ld(dy, o);
            g0 += dv * ((ld(x, o) - mean[r]) * rstd[r]);
            b0 += dv;
        }
    }
    shg[ty][tx] = g0 + g1;
    shb[ty][tx] = b0 + b1;
    __syncthreads();
    if (ty == 0 && c < d) {
        float sg = 0.0f, sb = 0.0f;
        for (int k = 0; k < 32; k++) {
            sg += shg[k][tx];
            sb += shb[k][tx];
        }
        col_store(dgamma, c, d, sg);
        col_store(dbeta, c, d, sb);
    }
}

// out[j] += part[0*d + j] + part[1*d + j] + ... + part[(S-1)*d + j], in
// that order: the splits' partial sums of a column reduction (flat over d).
extern "C" __global__ void __launch_bounds__(GR_FLAT_THREADS) gr_col_sum_f32(float* __restrict__ out, const float* __restrict__ part, int splits, int d) {
    const long long stride = flat_stride();
    for (long long j = flat_start(); j < d; j += stride) {
        float s = 0.0f;
        for (int k = 0; k < splits; k++) {
            s += part[(long long)k * d + j];
        }
        out[j] += s;
    }
}

// LayerNorm (row: one block per row)

// normalize_row ends a layer norm of one row r (this block's): with s this
// thread's share of the row's sum (elements t, t+bs, ...), the mean, then
// the variance as the mean of squared deviations (two passes, as the CPU
// backend), both kept, and y = (r - mean)*rstd*gamma + beta. Each thread
// reads only its own elements of r.
template <typename A>
__device__ __forceinline__ void normalize_row(A* yr, const A* r, float s, float* mean, float* rstd, int row,
                                              const float* gamma, const float* beta, int d, float eps, float* sh) {
    const int t = threadIdx.x;
    const int bs = blockDim.x;
    s = block_sum(s, sh);
    const float m = s / (float)d;
    float vs = 0.0f;
    for (int j = t; j < d; j += bs) {
        const float dv = ld(r, j) - m;
        vs += dv * dv;
    }
    vs = block_sum(vs, sh);
    const float rs = 1.0f / sqrtf(vs / (float)d + eps);
    if (t == 0) {
        mean[row] = m;
        rstd[row] = rs;
    }
    for (int j = t; j < d; j += bs) {
        st(yr, j, (ld(r, j) - m) * rs * gamma[j] + beta[j]);
    }
}

// y = (x - mean)*rstd*gamma + beta (normalize_row).
template <typename A>
__device__ __forceinline__ void layernorm(A* y, float* mean, float* rstd, const A* x, const float* gamma,
                                                 const float* beta, int rows, int d, float eps) {
    __shared__ float sh[32];
    const int row = blockIdx.x;
    if (row >= rows) {
        return; // the whole block
    }
    const A* xr = x + (long long)row * d;
    A* yr = y + (long long)row * d;
    const int t = threadIdx.x;
    const int bs = blockDim.x;
    float s = 0.0f;
    for (int j = t; j < d; j += bs) {
        s += ld(xr, j);
    }
    normalize_row(yr, xr, s, mean, rstd, row, gamma, beta, d, eps, sh);
}

// dx += rstd*(dy*g - mean_j(dy*g) - n*mean_j(dy*g*n)), n = (x - mean)*rstd.
template <typename A>
__device__ __forceinline__ void layernorm_bwd(A* dx, const A* dy, const A* x, const float* mean,
                                                     const float* rstd, const float* gamma, int rows, int d) {
    __shared__ float sh[64];
    const int row = blockIdx.x;
    if (row >= rows) {
        return; // the whole block
    }
    const long long off = (long long)row * d;
    const A* xr = x + off;
    const A* dyr = dy + off;
    A* dxr = dx + off;
    const float m = mean[row];
    const float rs = rstd[row];
    const int t = threadIdx.x;
    const int bs = blockDim.x;
    // dy*g is rounded once (__fmul_rn: never contracted into an FMA) and
    // the same value enters the mean and the difference, so a row of one
    // element gets dx = 0 exactly, as the CPU backend: contracted,
    // dy*g - mean came out as dy*g's rounding error (found on an H200).
    float sdn = 0.0f, sdnn = 0.0f;
    for (int j = t; j < d; j += bs) {
        const float n = (ld(xr, j) - m) * rs;
        const float dn = __fmul_rn(ld(dyr, j), gamma[j]);
        sdn += dn;
        sdnn += dn * n;
    }
    block_sum2(sdn, sdnn, sh);
    sdn /= (float)d;
    sdnn /= (float)d;
    for (int j = t; j < d; j += bs) {
        const float n = (ld(xr, j) - m) * rs;
        const float dn = __fmul_rn(ld(dyr, j), gamma[j]);
        st(dxr, j, ld(dxr, j) + rs * (dn - sdn - n * sdnn));
    }
}

// Dropout

// splitmix64's finalizer: the dropout randomness of elements 4g..4g+3 is
// mix64(seed + g*0x9E3779B97F4A7C15), 16 bits each (cpu.maskWord).
static __device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The random bits of the 4 elements 4g..4g+3.
static __device__ __forceinline__ unsigned long long drop_word(unsigned long long seed, long long g) {
    return mix64(seed + (unsigned long long)g * 0x9E3779B97F4A7C15ull);
}

// drop_keep: element i is kept (its 16 bits of the word z of its group are
// >= thresh).
static __device__ __forceinline__ bool drop_keep(unsigned long long z, long long i, unsigned thresh) {
    return ((unsigned)(z >> (16 * (unsigned)(i & 3))) & 0xffffu) >= thresh;
}

// One element of dropout: res[i] + (keep(i) ? x[i]*scale : 0), res 0: none.
template <typename A>
__device__ __forceinline__ float dropout_one(const A* res, const A* x, long long i, unsigned long long seed,
                                             unsigned thresh, float scale) {
    float v = drop_keep(drop_word(seed, i >> 2), i, thresh) ? ld(x, i) * scale : 0.0f;
    if (res != 0) {
        v = ld(res, i) + v;
    }
    return v;
}

// y[i] = res[i] + (keep(i) ? x[i]*scale : 0); res 0: no residual. Each
// element is read and written by one thread, so y may alias x or res. In
// pairs, pair k's bits are half of the word of group k/2.
template <typename A>
__device__ __forceinline__ void dropout(A* y, const A* res, const A* x, long long n, unsigned long long seed,
                                               unsigned thresh, float scale) {
    const long long stride = flat_stride();
    if (pair_ok(y) && pair_ok(x) && (res == 0 || pair_ok(res))) {
        const long long np = n >> 1;
        for (long long k = flat_start(); k < np; k += stride) {
            const unsigned long long z = drop_word(seed, k >> 1);
            float a, b;
            ld2(x, 2 * k, a, b);
            a = drop_keep(z, 2 * k, thresh) ? a * scale : 0.0f;
            b = drop_keep(z, 2 * k + 1, thresh) ? b * scale : 0.0f;
            if (res != 0) {
                float ra, rb;
                ld2(res, 2 * k, ra, rb);
                a = ra + a;
                b = rb + b;
            }
            st2(y, 2 * k, a, b);
        }
        if ((n & 1) != 0 && flat_start() == 0) {
            st(y, n - 1, dropout_one(res, x, n - 1, seed, thresh, scale));
        }
        return;
    }
    for (long long i = flat_start(); i < n; i += stride) {
        st(y, i, dropout_one(res, x, i, seed, thresh, scale));
    }
}

// Fused ops: two ops of the backend in one kernel, as the Transformer
// runs them one after the other.

// x[r,j] = relu(x[r,j] + bias[j]) and y = dropout(x) (dropout, no
// residual) in one pass (flat): each element read once, both written; y
// may be x (then only y is written: BiasReLU is this with y = x, p = 0).
template <typename A>
__device__ __forceinline__ void bias_relu_dropout(A* y, A* x, const float* __restrict__ bias, long long rows, int d,
                                                  unsigned long long seed, unsigned thresh, float scale) {
    const long long n = rows * (long long)d;
    const long long stride = flat_stride();
    long long i = flat_start();
    if ((d & 1) == 0 && pair_ok(x) && pair_ok(y)) { // pairs
        const long long np = n >> 1;
        if (i >= np) {
            return;
        }
        RowCol w;
        rc_init(w, i, stride, d >> 1);
        for (long long k = i; k < np; k += stride) {
            const int j = 2 * (int)w.c;
            float a, b;
            ld2(x, 2 * k, a, b);
            a = rnd(x, relu(a + bias[j]));
            b = rnd(x, relu(b + bias[j + 1]));
            if (y != x) {
                st2(x, 2 * k, a, b);
            }
            const unsigned long long z = drop_word(seed, k >> 1);
            st2(y, 2 * k, drop_keep(z, 2 * k, thresh) ? a * scale : 0.0f, drop_keep(z, 2 * k + 1, thresh) ? b * scale : 0.0f);
            rc_next(w);
        }
        return;
    }
    if (i >= n) {
        return;
    }
    RowCol w;
    rc_init(w, i, stride, d);
    for (; i < n; i += stride) {
        const float v = rnd(x, relu(ld(x, i) + bias[w.c]));
        if (y != x) {
            st(x, i, v);
        }
        st(y, i, drop_keep(drop_word(seed, i >> 2), i, thresh) ? v * scale : 0.0f);
        rc_next(w);
    }
}

// out = res + dropout(x) (dropout; res 0: none), then y = LayerNorm(out)
// with the row's mean and rstd (layernorm), one block a row (row). The
// layer norm goes on with out as stored (rounded to A), as the two kernels
// one after the other would: each thread reads back only the elements it
// wrote, the same j as layernorm's, so its sums are those of layernorm's
// threads, bit for bit. out may alias res or x; y aliases neither.
template <typename A>
__device__ __forceinline__ void residual_dropout_layernorm(A* out, A* y, float* mean, float* rstd, const A* res,
                                                           const A* x, const float* gamma, const float* beta,
                                                           int rows, int d, unsigned long long seed, unsigned thresh,
                                                           float scale, float eps) {
    __shared__ float sh[32];
    const int row = blockIdx.x;
    if (row >= rows) {
        return; // the whole block
    }
    const long long off = (long long)row * d;
    A* o = out + off;
    A* yr = y + off;
    const int t = threadIdx.x;
    const int bs = blockDim.x;
    float s = 0.0f;
    for (int j = t; j < d; j += bs) {
        const float v = rnd(o, dropout_one(res, x, off + j, seed, thresh, scale));
        st(o, j, v);
        s += v;
    }
    normalize_row(yr, o, s, mean, rstd, row, gamma, beta, d, eps, sh);
}

// Embeddings and positions (flat)

// out[i,:] = table[ids[i],:]*scale; zero rows for pad and for ids outside
// [0, vocab), which are recorded in err.
template <typename A>
__device__ __forceinline__ void embedding(A* __restrict__ out, const float* __restrict__ table,
                                                 const int* __restrict__ ids, int n, int d, int vocab, float scale,
                                                 int pad, int* err) {
    const long long total = (long long)n * d;
    const long long stride = flat_stride();
    long long e = flat_start();
    if ((d & 1) == 0 && pair_ok(out)) { // pairs
        const long long np = total >> 1;
        if (e >= np) {
            return;
        }
        RowCol w;
        rc_init(w, e, stride, d >> 1);
        for (long long k = e; k < np; k += stride) {
            const int id = ids[w.r];
            float a = 0.0f, b = 0.0f;
            if (id != pad && index_ok(err, GR_OP_EMBEDDING, id, vocab, w.r)) {
                const float* t = table + (long long)id * d + 2 * w.c;
                a = t[0] * scale;
                b = t[1] * scale;
            }
            st2(out, 2 * k, a, b);
            rc_next(w);
        }
        return;
    }
    if (e >= total) {
        return;
    }
    RowCol w;
    rc_init(w, e, stride, d);
    for (; e < total; e += stride) {
        const int id = ids[w.r];
        float v = 0.0f;
        if (id != pad && index_ok(err, GR_OP_EMBEDDING, id, vocab, w.r)) {
            v = table[(long long)id * d + w.c] * scale;
        }
        st(out, e, v);
        rc_next(w);
    }
}

// dtable[ids[i],:] += dout[i,:]*scale with atomic adds (repeated ids),
// skipping pad and ids outside [0, vocab) (recorded in err).
template <typename A>
__device__ __forceinline__ void embedding_bwd(float* __restrict__ dtable, const A* __restrict__ dout,
                                                     const int* __restrict__ ids, int n, int d, int vocab, float scale,
                                                     int pad, int* err) {
    const long long total = (long long)n * d;
    const long long stride = flat_stride();
    long long e = flat_start();
    if (e >= total) {
        return;
    }
    RowCol w;
    rc_init(w, e, stride, d);
    for (; e < total; e += stride) {
        const int id = ids[w.r];
        if (id != pad && index_ok(err, GR_OP_EMBEDDING_BWD, id, vocab, w.r)) {
            atomicAdd(dtable + (long long)id * d + w.c, ld(dout, e) * scale);
        }
        rc_next(w);
    }
}

// x[r,:] += pe[r%T + t0, :].
template <typename A>
__device__ __forceinline__ void add_pos(A* __restrict__ x, const float* __restrict__ pe, long long rows, int T,
                                               int d, int t0) {
    const long long n = rows * (long long)d;
    const long long stride = flat_stride();
    long long i = flat_start();
    if ((d & 1) == 0 && pair_ok(x)) { // pairs
        const long long np = n >> 1;
        if (i >= np) {
            return;
        }
        RowCol w;
        rc_init(w, i, stride, d >> 1);
        unsigned q = (unsigned)(w.r % T); // row % T
        const unsigned sq = (unsigned)(w.sr % T);
        for (long long k = i; k < np; k += stride) {
            const float* p = pe + ((long long)q + t0) * d + 2 * w.c;
            float a, b;
            ld2(x, 2 * k, a, b);
            st2(x, 2 * k, a + p[0], b + p[1]);
            unsigned carry = 0;
            mr_step(w.c, w.sc, w.d, carry);
            mr_step(q, sq, (unsigned)T, carry);
        }
        return;
    }
    if (i >= n) {
        return;
    }
    RowCol w;
    rc_init(w, i, stride, d);
    unsigned q = (unsigned)(w.r % T);   // row % T
    const unsigned sq = (unsigned)(w.sr % T);
    for (; i < n; i += stride) {
        st(x, i, ld(x, i) + pe[((long long)q + t0) * d + w.c]);
        unsigned carry = 0;
        mr_step(w.c, w.sc, w.d, carry);
        mr_step(q, sq, (unsigned)T, carry);
    }
}

// Attention

// Heads4 follows the digits (e, s, h, b) of a flat index over [B, H, S, Dh]
// as it advances by a fixed stride.
struct Heads4 {
    unsigned e, s, h;
    long long b;
    unsigned se, ss, sh;
    long long sb;
};

static __device__ __forceinline__ void h4_split(long long i, int S, int H, int Dh, unsigned& e, unsigned& s,
                                                unsigned& h, long long& b) {
    long long t = i / Dh;
    e = (unsigned)(i - t * Dh);
    long long u = t / S;
    s = (unsigned)(t - u * S);
    b = u / H;
    h = (unsigned)(u - b * H);
}

static __device__ __forceinline__ void h4_init(Heads4& w, long long i, long long stride, int S, int H, int Dh) {
    h4_split(i, S, H, Dh, w.e, w.s, w.h, w.b);
    h4_split(stride, S, H, Dh, w.se, w.ss, w.sh, w.sb);
}

static __device__ __forceinline__ void h4_next(Heads4& w, int S, int H, int Dh) {
    unsigned carry = 0;
    mr_step(w.e, w.se, (unsigned)Dh, carry);
    mr_step(w.s, w.ss, (unsigned)S, carry);
    mr_step(w.h, w.sh, (unsigned)H, carry);
    w.b += w.sb + carry;
}

// dst[b,h,s,:] = src[b,s,h*Dh:(h+1)*Dh]; src has srcS rows per b.
template <typename A>
__device__ __forceinline__ void split_heads(A* __restrict__ dst, const A* __restrict__ src, int B, int S, int H,
                                                   int Dh, int srcS) {
    const long long n = (long long)B * H * S * Dh;
    const long long stride = flat_stride();
    long long i = flat_start();
    if ((Dh & 1) == 0 && pair_ok(dst) && pair_ok(src)) { // pairs (k: elements 2k, 2k+1 of a head's row)
        const int Dp = Dh >> 1;
        const long long np = n >> 1;
        if (i >= np) {
            return;
        }
        Heads4 w;
        h4_init(w, i, stride, S, H, Dp);
        for (long long k = i; k < np; k += stride) {
            cp2(dst, 2 * k, src, ((w.b * srcS + w.s) * H + w.h) * Dh + 2 * w.e);
            h4_next(w, S, H, Dp);
        }
        return;
    }
    if (i >= n) {
        return;
    }
    Heads4 w;
    h4_init(w, i, stride, S, H, Dh);
    for (; i < n; i += stride) {
        dst[i] = src[((w.b * srcS + w.s) * H + w.h) * Dh + w.e];
        h4_next(w, S, H, Dh);
    }
}

// dst[b,s,h*Dh:(h+1)*Dh] = src[b,h,s,:]; dst has dstS rows per b, and its
// rows s >= S are not written.
template <typename A>
__device__ __forceinline__ void merge_heads(A* __restrict__ dst, const A* __restrict__ src, int B, int S, int H,
                                                   int Dh, int dstS) {
    const long long n = (long long)B * H * S * Dh;
    const long long stride = flat_stride();
    long long i = flat_start();
    if ((Dh & 1) == 0 && pair_ok(dst) && pair_ok(src)) { // pairs
        const int Dp = Dh >> 1;
        const long long np = n >> 1;
        if (i >= np) {
            return;
        }
        Heads4 w;
        h4_init(w, i, stride, S, H, Dp);
        for (long long k = i; k < np; k += stride) {
            cp2(dst, ((w.b * dstS + w.s) * H + w.h) * Dh + 2 * w.e, src, 2 * k);
            h4_next(w, S, H, Dp);
        }
        return;
    }
    if (i >= n) {
        return;
    }
    Heads4 w;
    h4_init(w, i, stride, S, H, Dh);
    for (; i < n; i += stride) {
        dst[((w.b * dstS + w.s) * H + w.h) * Dh + w.e] = src[i];
        h4_next(w, S, H, Dh);
    }
}

// Row r = (b, h, i) of P[B, H, Sq, Sk]: the first n keys get the softmax of
// their scores, the others 0, n = min(Sk, keyLen[b], i+Sk-Sq+1 if causal).
template <typename A>
__device__ __forceinline__ void attn_softmax(A* P, const int* keyLen, int B, int H, int Sq, int Sk, int causal) {
    __shared__ float shm[32];
    __shared__ float shs[32];
    const int row = blockIdx.x;
    if (row >= B * H * Sq) {
        return; // the whole block
    }
    const int b = row / (H * Sq);
    const int i = row % Sq;
    int n = Sk;
    if (keyLen != 0 && keyLen[b] < n) {
        n = keyLen[b];
    }
    if (causal && i + Sk - Sq + 1 < n) {
        n = i + Sk - Sq + 1;
    }
    A* p = P + (long long)row * Sk;
    const int t = threadIdx.x;
    const int bs = blockDim.x;
    if (n <= 0) { // the whole block
        for (int j = t; j < Sk; j += bs) {
            st(p, j, 0.0f);
        }
        return;
    }
    float m = GR_NEG_MAX, s = 0.0f;
    for (int j = t; j < n; j += bs) {
        sm_push(m, s, ld(p, j));
    }
    block_softmax(m, s, shm, shs);
    const float inv = 1.0f / s;
    for (int j = t; j < Sk; j += bs) {
        st(p, j, j < n ? expf(ld(p, j) - m) * inv : 0.0f);
    }
}

// dP = P*(dP - sum_j P*dP), row by row.
template <typename A>
__device__ __forceinline__ void attn_softmax_bwd(A* dP, const A* P, int rows, int Sk) {
    __shared__ float sh[32];
    const int row = blockIdx.x;
    if (row >= rows) {
        return; // the whole block
    }
    const long long off = (long long)row * Sk;
    A* dr = dP + off;
    const A* pr = P + off;
    const int t = threadIdx.x;
    const int bs = blockDim.x;
    float dot = 0.0f;
    for (int j = t; j < Sk; j += bs) {
        dot += ld(pr, j) * ld(dr, j);
    }
    dot = block_sum(dot, sh);
    for (int j = t; j < Sk; j += bs) {
        st(dr, j, ld(pr, j) * (ld(dr, j) - dot));
    }
}

// Losses (row)

// Label-smoothed cross-entropy, as cpu.CrossEntropy: the target gets 1-ls,
// every other id ls/(V-1). Row loss = lse - (conf*z_y + low*(sum z - z_y))
// in double, added to acc[0], and acc[1] += 1. Rows whose target is pad or
// outside [0, V) do not count and their dlogits rows are zeroed; a target
// outside [0, V) is recorded in err. dlogits =
// (softmax - low)*gradScale, minus (conf-low)*gradScale at the target;
// dlogits may be 0 (none) or alias logits.
template <typename A>
__device__ __forceinline__ void xent(A* dlogits, const A* logits, const int* targets, double* acc, int N, int V,
                                            float ls, int pad, float gradScale, int* err) {
    __shared__ float shm[32];
    __shared__ float shs[32];
    __shared__ double shz[32];
    const int row = blockIdx.x;
    if (row >= N) {
        return; // the whole block
    }
    const long long off = (long long)row * V;
    const A* z = logits + off;
    A* d = dlogits != 0 ? dlogits + off : 0;
    const int t = threadIdx.x;
    const int bs = blockDim.x;
    const int y = targets[row];
    if (y == pad || !index_ok(t == 0 ? err : 0, GR_OP_XENT, y, V, row)) { // the whole block
        if (d != 0) {
            for (int j = t; j < V; j += bs) {
                st(d, j, 0.0f);
            }
        }
        return;
    }
    const float zy = ld(z, y); // read before any thread overwrites it (d may alias z)
    float m = GR_NEG_MAX, s = 0.0f, sz = 0.0f;
    for (int j = t; j < V; j += bs) {
        const float v = ld(z, j);
        sm_push(m, s, v);
        sz += v;
    }
    const double szd = block_sum((double)sz, shz);
    block_softmax(m, s, shm, shs);
    const float conf = 1.0f - ls;
    const float low = V > 1 ? ls / (float)(V - 1) : 0.0f;
    if (t == 0) {
        const double lse = (double)m + (double)logf(s);
        const double zyd = (double)zy;
        const double loss = lse - ((double)conf * zyd + (double)low * (szd - zyd));
        atomicAdd(acc, loss);
        atomicAdd(acc + 1, 1.0);
    }
    if (d != 0) {
        const float inv = 1.0f / s;
        const float hit = (conf - low) * gradScale;
        for (int j = t; j < V; j += bs) {
            float g = (expf(ld(z, j) - m) * inv - low) * gradScale;
            if (j == y) {
                g -= hit;
            }
            st(d, j, g);
        }
    }
}

// out = x - logsumexp(x) row by row; out may alias x.
template <typename A>
__device__ __forceinline__ void log_softmax(A* out, const A* x, int N, int V) {
    __shared__ float shm[32];
    __shared__ float shs[32];
    const int row = blockIdx.x;
    if (row >= N) {
        return; // the whole block
    }
    const long long off = (long long)row * V;
    const A* xr = x + off;
    A* o = out + off;
    const int t = threadIdx.x;
    const int bs = blockDim.x;
    float m = GR_NEG_MAX, s = 0.0f;
    for (int j = t; j < V; j += bs) {
        sm_push(m, s, ld(xr, j));
    }
    block_softmax(m, s, shm, shs);
    const float l = m + logf(s);
    for (int j = t; j < V; j += bs) {
        st(o, j, ld(xr, j) - l);
    }
}

// Copies of decoding (flat)

// dst[i*dstRow + c] = src[idx[i]*srcRow + c] for c < cols; src has
// srcRows rows, and a row of dst whose idx[i] is outside [0, srcRows) is
// left alone (recorded in err).
template <typename A>
__device__ __forceinline__ void gather_rows(A* __restrict__ dst, const A* __restrict__ src,
                                                   const int* __restrict__ idx, int n, int cols, long long srcRow,
                                                   long long dstRow, int srcRows, int* err) {
    const long long total = (long long)n * cols;
    const long long stride = flat_stride();
    long long e = flat_start();
    if (e >= total) {
        return;
    }
    RowCol w;
    rc_init(w, e, stride, cols);
    for (; e < total; e += stride) {
        const int r = idx[w.r];
        if (index_ok(err, GR_OP_GATHER_ROWS, r, srcRows, w.r)) {
            dst[w.r * dstRow + w.c] = src[(long long)r * srcRow + w.c];
        }
        rc_next(w);
    }
}

// cache[(r*Tc + t)*D + j] = x[r*D + j]: step t of R rows of a [R, Tc, D]
// cache.
template <typename A>
__device__ __forceinline__ void write_step(A* __restrict__ cache, const A* __restrict__ x, int R, int Tc, int D,
                                                  int t) {
    const long long n = (long long)R * D;
    const long long stride = flat_stride();
    long long e = flat_start();
    if (e >= n) {
        return;
    }
    RowCol w;
    rc_init(w, e, stride, D);
    for (; e < n; e += stride) {
        cache[(w.r * Tc + t) * D + w.c] = x[e];
        rc_next(w);
    }
}

// ---------------------------------------------------------------------------
// Optimizer (flat)

static __device__ __forceinline__ void adam_one(float* __restrict__ p, const float* __restrict__ g,
                                                float* __restrict__ m, float* __restrict__ v, long long i, float lr,
                                                float b1, float b2, float c1, float c2, float eps) {
    const float gi = g[i];
    const float mi = b1 * m[i] + c1 * gi;
    const float vi = b2 * v[i] + c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= lr * mi / (sqrtf(vi) + eps);
}

// m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g; p -= lr*m/(sqrt(v)+eps);
// nothing when skip (may be 0: none) points to a raised flag (an overflow
// found on the device: the step's update is cancelled without the host).
extern "C" __global__ void __launch_bounds__(GR_FLAT_THREADS) gr_adam_f32(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                                       float* __restrict__ v, long long n, float lr, float b1, float b2, float eps,
                                       const int* skip) {
    if (skip != 0 && *skip != 0) {
        return;
    }
    const float c1 = 1.0f - b1, c2 = 1.0f - b2;
    const long long stride = flat_stride();
    for (long long i = flat_start(); i < n; i += stride) {
        adam_one(p, g, m, v, i, lr, b1, b2, c1, c2, eps);
    }
}

// Adam on the rows rows[k] (k < nrows) of d elements only, of the prows
// rows of p (g, m, v); a row number outside [0, prows) is skipped and
// recorded in err. Nothing when skip points to a raised flag (gr_adam_f32).
extern "C" __global__ void __launch_bounds__(GR_FLAT_THREADS) gr_adam_rows_f32(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                                            float* __restrict__ v, const int* __restrict__ rows, int nrows, int d,
                                            int prows, float lr, float b1, float b2, float eps, int* err,
                                            const int* skip) {
    if (skip != 0 && *skip != 0) {
        return;
    }
    const float c1 = 1.0f - b1, c2 = 1.0f - b2;
    const long long n = (long long)nrows * d;
    const long long stride = flat_stride();
    long long e = flat_start();
    if (e >= n) {
        return;
    }
    RowCol w;
    rc_init(w, e, stride, d);
    for (; e < n; e += stride) {
        const int r = rows[w.r];
        if (index_ok(err, GR_OP_ADAM_ROWS, r, prows, w.r)) {
            adam_one(p, g, m, v, (long long)r * d + w.c, lr, b1, b2, c1, c2, eps);
        }
        rc_next(w);
    }
}


// ---------------------------------------------------------------------------
// Orthonormalize (PowerSGD): one block per [rows, cols] matrix of the batch.

// Must equal kernels.OrthoDropTol and kernels.OrthoMaxCols (a Go test
// reads them here).
#define GR_ORTHO_DROP_TOL 1e-4
#define GR_ORTHO_MAX_COLS 64

// Modified Gram-Schmidt in place, columns left to right, as
// kernels.Backend.Orthonormalize documents and kernels/cpu does it: one
// pass over the rows per column. Pass j divides column j by its norm plus
// eps (times 0 when the column has lost all but GR_ORTHO_DROP_TOL of its
// input norm), subtracts (p_j.p_k / |p_j|^2) p_j from every column k > j,
// and then sums, over the updated rows, column j+1's squared norm and its
// dot products with the later columns. Thread t owns rows t, t+bs, ...,
// so a pass needs no barrier between its update and its sums; the sums are
// in double, each warp's reduced by shuffles into a row of sh and the
// warps' added in warp order by thread k, so the result depends on the
// block size alone (the Go side picks it from the shape). cols <=
// GR_ORTHO_MAX_COLS, blockDim.x a multiple of 32 up to 1024.
extern "C" __global__ void __launch_bounds__(GR_MAT_THREADS) gr_orthonormalize_f32(float* p, int rows, int cols, float eps) {
    __shared__ double sh[32][GR_ORTHO_MAX_COLS]; // per-warp partial sums
    __shared__ double tot[GR_ORTHO_MAX_COLS];    // the block's sums
    __shared__ double innorm[GR_ORTHO_MAX_COLS]; // input column norms
    __shared__ double coef[GR_ORTHO_MAX_COLS];   // projection coefficients of the pass
    float* P = p + (long long)blockIdx.x * rows * cols;
    const int t = threadIdx.x;
    const int bs = blockDim.x;
    const int lane = t & 31;
    const int w = t >> 5;
    const int nw = bs >> 5;
    // The input norms (innorm), then column 0's dot products with every
    // column (tot; tot[0] its squared norm).
    for (int k = 0; k < cols; k++) {
        double ss = 0.0;
        for (int r = t; r < rows; r += bs) {
            const double x = (double)P[(long long)r * cols + k];
            ss += x * x;
        }
        ss = warp_sum(ss);
        if (lane == 0) {
            sh[w][k] = ss;
        }
    }
    __syncthreads();
    if (t < cols) {
        double s = 0.0;
        for (int i = 0; i < nw; i++) {
            s += sh[i][t];
        }
        innorm[t] = sqrt(s);
    }
    __syncthreads();
    for (int k = 0; k < cols; k++) {
        double g = 0.0;
        for (int r = t; r < rows; r += bs) {
            const float* row = P + (long long)r * cols;
            g += (double)row[0] * (double)row[k];
        }
        g = warp_sum(g);
        if (lane == 0) {
            sh[w][k] = g;
        }
    }
    __syncthreads();
    if (t < cols) {
        double s = 0.0;
        for (int i = 0; i < nw; i++) {
            s += sh[i][t];
        }
        tot[t] = s;
    }
    __syncthreads();
    for (int j = 0; j < cols; j++) {
        // tot[j]: column j's squared norm; tot[k > j]: its dot products.
        const double nrm = sqrt(tot[j]);
        const bool keep = nrm > GR_ORTHO_DROP_TOL * innorm[j];
        const double inv = keep ? 1.0 / (nrm + (double)eps) : 0.0;
        if (t > j && t < cols) {
            coef[t] = keep ? tot[t] / (nrm * nrm) : 0.0;
        }
        __syncthreads();
        for (int r = t; r < rows; r += bs) {
            float* row = P + (long long)r * cols;
            const double pj = (double)row[j];
            row[j] = (float)(pj * inv);
            for (int k = j + 1; k < cols; k++) {
                row[k] = (float)((double)row[k] - coef[k] * pj);
            }
        }
        if (j + 1 == cols) {
            break; // the whole block
        }
        for (int k = j + 1; k < cols; k++) {
            double g = 0.0;
            for (int r = t; r < rows; r += bs) {
                const float* row = P + (long long)r * cols;
                g += (double)row[j + 1] * (double)row[k];
            }
            g = warp_sum(g);
            if (lane == 0) {
                sh[w][k] = g;
            }
        }
        __syncthreads();
        if (t > j && t < cols) {
            double s = 0.0;
            for (int i = 0; i < nw; i++) {
                s += sh[i][t];
            }
            tot[t] = s;
        }
        __syncthreads();
    }
}

// ---------------------------------------------------------------------------
// The activation kernels, once per activation type A with suffix S.
#define GR_ACTIVATION_KERNELS(A, S)                                                                                    \
    extern "C" __global__ void __launch_bounds__(GR_FLAT_THREADS) gr_add_bias_##S(A* x, const float* __restrict__ bias, long long rows, int d) { \
        add_bias(x, bias, rows, d);                                                                                    \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(GR_FLAT_THREADS) gr_relu_bwd_##S(A* dx, const A* y, long long n) { relu_bwd(dx, y, n); } \
    extern "C" __global__ void __launch_bounds__(GR_FLAT_THREADS) gr_bias_relu_dropout_##S(A* y, A* x, const float* __restrict__ bias, \
                                                        long long rows, int d, unsigned long long seed, unsigned thresh, float scale) { \
        bias_relu_dropout(y, x, bias, rows, d, seed, thresh, scale);                                                  \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(GR_COL_THREADS)                                                       \
        gr_bias_grad_##S(float* __restrict__ db, const A* __restrict__ dy, int rows, int d, int per) {                 \
        bias_grad(db, dy, rows, d, per);                                                                               \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(GR_COL_THREADS) gr_layernorm_bwd_params_##S(                          \
        float* __restrict__ dgamma, float* __restrict__ dbeta, const A* __restrict__ dy, const A* __restrict__ x,      \
        const float* __restrict__ mean, const float* __restrict__ rstd, int rows, int d, int per) {                    \
        layernorm_bwd_params(dgamma, dbeta, dy, x, mean, rstd, rows, d, per);                                          \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(GR_ROW_THREADS) gr_layernorm_##S(A* y, float* mean, float* rstd, const A* x, const float* gamma, \
                                                const float* beta, int rows, int d, float eps) {                       \
        layernorm(y, mean, rstd, x, gamma, beta, rows, d, eps);                                                        \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(GR_ROW_THREADS) gr_layernorm_bwd_##S(A* dx, const A* dy, const A* x, const float* mean, \
                                                    const float* rstd, const float* gamma, int rows, int d) {          \
        layernorm_bwd(dx, dy, x, mean, rstd, gamma, rows, d);                                                          \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(GR_FLAT_THREADS) gr_dropout_##S(A* y, const A* res, const A* x, long long n, unsigned long long seed, \
                                              unsigned thresh, float scale) {                                          \
        dropout(y, res, x, n, seed, thresh, scale);                                                                    \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(GR_ROW_THREADS) gr_residual_dropout_layernorm_##S(A* out, A* y, float* mean, float* rstd, \
        const A* res, const A* x, const float* gamma, const float* beta, int rows, int d, unsigned long long seed,     \
        unsigned thresh, float scale, float eps) {                                                                     \
        residual_dropout_layernorm(out, y, mean, rstd, res, x, gamma, beta, rows, d, seed, thresh, scale, eps);       \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(GR_FLAT_THREADS) gr_embedding_##S(A* __restrict__ out, const float* __restrict__ table, \
                                                const int* __restrict__ ids, int n, int d, int vocab, float scale,     \
                                                int pad, int* err) {                                                   \
        embedding(out, table, ids, n, d, vocab, scale, pad, err);                                                      \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(GR_FLAT_THREADS) gr_embedding_bwd_##S(float* __restrict__ dtable, const A* __restrict__ dout, \
                                                    const int* __restrict__ ids, int n, int d, int vocab, float scale, \
                                                    int pad, int* err) {                                               \
        embedding_bwd(dtable, dout, ids, n, d, vocab, scale, pad, err);                                                \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(GR_FLAT_THREADS) gr_add_pos_##S(A* __restrict__ x, const float* __restrict__ pe, long long rows, int T, \
                                              int d, int t0) {                                                         \
        add_pos(x, pe, rows, T, d, t0);                                                                                \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(GR_FLAT_THREADS) gr_split_heads_##S(A* __restrict__ dst, const A* __restrict__ src, int B, int S_, int H, \
                                                  int Dh, int srcS) {                                                  \
        split_heads(dst, src, B, S_, H, Dh, srcS);                                                                     \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(GR_FLAT_THREADS) gr_merge_heads_##S(A* __restrict__ dst, const A* __restrict__ src, int B, int S_, int H, \
                                                  int Dh, int dstS) {                                                  \
        merge_heads(dst, src, B, S_, H, Dh, dstS);                                                                     \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(GR_ROW_THREADS) gr_attn_softmax_##S(A* P, const int* keyLen, int B, int H, int Sq, int Sk, int causal) { \
        attn_softmax(P, keyLen, B, H, Sq, Sk, causal);                                                                 \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(GR_ROW_THREADS) gr_attn_softmax_bwd_##S(A* dP, const A* P, int rows, int Sk) { \
        attn_softmax_bwd(dP, P, rows, Sk);                                                                             \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(GR_ROW_THREADS) gr_xent_##S(A* dlogits, const A* logits, const int* targets, double* acc, int N, int V, \
                                           float ls, int pad, float gradScale, int* err) {                             \
        xent(dlogits, logits, targets, acc, N, V, ls, pad, gradScale, err);                                            \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(GR_ROW_THREADS) gr_log_softmax_##S(A* out, const A* x, int N, int V) { log_softmax(out, x, N, V); } \
    extern "C" __global__ void __launch_bounds__(GR_FLAT_THREADS) gr_gather_rows_##S(A* __restrict__ dst, const A* __restrict__ src, \
                                                  const int* __restrict__ idx, int n, int cols, long long srcRow,      \
                                                  long long dstRow, int srcRows, int* err) {                           \
        gather_rows(dst, src, idx, n, cols, srcRow, dstRow, srcRows, err);                                             \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(GR_FLAT_THREADS) gr_write_step_##S(A* __restrict__ cache, const A* __restrict__ x, int R, int Tc, int D, \
                                                 int t) {                                                              \
        write_step(cache, x, R, Tc, D, t);                                                                             \
    }

GR_ACTIVATION_KERNELS(float, f32)
GR_ACTIVATION_KERNELS(__half, f16)
GR_ACTIVATION_KERNELS(__nv_bfloat16, bf16)
