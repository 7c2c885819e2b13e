// gorun CUDA emulator (CPU): device memory with guard regions, and the
// AddressSanitizer build. Included once, by libcuda.cc, inside its
// anonymous namespace (after g_allocs and find_alloc).
//
// Every cuMemAlloc is laid out as
//
//   [256 guard bytes][the bytes asked for][guard to the next 256 + 256 more]
//
// with the data 256-aligned as on a GPU, and the guards filled with
// kGuardByte. After a kernel has run, the guards of every allocation that
// one of its pointer parameters points into are checked: a changed byte
// fails the launch with CUDA_ERROR_ILLEGAL_ADDRESS, naming the kernel, the
// parameter, the allocation and the first byte written outside it (the
// guard is then restored, so it is reported once). The backend's
// allocator rounds requests up to size classes, whose slack no guard sees;
// with GORUN_CUDA_EXACT_ALLOC=1 (kernels/cuda/mem.go) every allocation is
// its tensor, and a kernel that writes even one element past its output
// fails its launch. Guards see writes only, and only up to 256 bytes
// beyond the rounding (a write further off lands in other memory: the
// index checks of kernels.cu are for that).
//
// The AddressSanitizer build (emu.go: BuildASan) defines GORUN_EMU_ASAN and
// compiles the kernel files with -fsanitize=address: an allocation is then
// exactly the bytes asked for, from malloc, and ASan's own redzones and
// shadow memory catch every read or write outside it (and of freed
// memory) in the kernel that makes it, with a report on stderr that ends
// the process. libcuda.cc itself is not instrumented: its fibers switch
// stacks behind ASan's back.
#ifndef GORUN_EMU_GUARD_H
#define GORUN_EMU_GUARD_H

constexpr size_t kGuardFront = 256;
constexpr size_t kGuardBack = 256;
constexpr unsigned char kGuardByte = 0xfd;

inline size_t round256(size_t n) { return (n + 255) & ~(size_t)255; }

#ifdef GORUN_EMU_ASAN

// n bytes of device memory (n > 0), filled with 0xff, or null.
void* dev_alloc(size_t n) {
  void* p = nullptr;
  if (posix_memalign(&p, 256, n) != 0) return nullptr;
  memset(p, 0xff, n);
  return p;
}
void dev_free(void* p) { free(p); }
CUresult check_guards(const gorun_emu::KernelDef*, void**) { return CUDA_SUCCESS; }

#else

void* dev_alloc(size_t n) {
  size_t body = round256(n);
  if (body < n) return nullptr;
  char* base = (char*)aligned_alloc(256, kGuardFront + body + kGuardBack);
  if (!base) return nullptr;
  memset(base, kGuardByte, kGuardFront);
  memset(base + kGuardFront, 0xff, n);
  memset(base + kGuardFront + n, kGuardByte, body - n + kGuardBack);
  return base + kGuardFront;
}
void dev_free(void* p) { free((char*)p - kGuardFront); }

// The offset from p of the first byte in [p+from, p+to) that is not
// kGuardByte, or to.
long first_changed(const unsigned char* p, long from, long to) {
  for (long i = from; i < to; i++)
    if (p[i] != kGuardByte) return i;
  return to;
}

CUresult check_guards(const gorun_emu::KernelDef* d, void** params) {
  for (int i = 0; i < d->nparams; i++) {
    if (!d->params[i].pointer) continue;
    uintptr_t p, base;
    memcpy(&p, params[i], sizeof p);
    const Alloc* a = p ? find_alloc(p, 0, &base) : nullptr;
    if (!a || a->host) continue;
    unsigned char* data = (unsigned char*)base;
    long n = (long)a->size, end = (long)(round256(a->size) + kGuardBack);
    long before = first_changed(data, -(long)kGuardFront, 0);
    long after = first_changed(data, n, end);
    if (before == 0 && after == end) continue;
    long at = before < 0 ? before : after;
    memset(data - kGuardFront, kGuardByte, kGuardFront);
    memset(data + n, kGuardByte, (size_t)(end - n));
    return fail(CUDA_ERROR_ILLEGAL_ADDRESS,
                "cuLaunchKernel %s: wrote byte %ld of the %zu-byte allocation at %#lx that pointer parameter %d "
                "(%#lx) points into: outside it, in its guard region; a kernel must stay inside its tensors "
                "(GORUN_CUDA_EXACT_ALLOC=1 makes every allocation its tensor's exact size)",
                d->name, at, a->size, (unsigned long)base, i, (unsigned long)p);
  }
  return CUDA_SUCCESS;
}

#endif  // GORUN_EMU_ASAN

#endif  // GORUN_EMU_GUARD_H
