// gorun CUDA emulator (CPU): the registry of host-compiled kernels.
//
// emu.Build generates, for each kernel file, a .cc that includes this
// header and the kernel file and registers every extern "C" __global__
// function with gorun_emu::def, which deduces the parameter types from the
// function pointer: no hand-written signatures. cuLaunchKernel copies the
// kernelParams into a std::tuple of those types (pack) and calls the kernel
// with it once per emulated thread (invoke).
#ifndef GORUN_EMU_REGISTRY_H
#define GORUN_EMU_REGISTRY_H

#include <stddef.h>
#include <string.h>

#include <new>
#include <tuple>
#include <type_traits>
#include <utility>

namespace gorun_emu {

struct ParamInfo {
  unsigned size;
  bool pointer;
};

struct KernelDef {
  const char* name;
  void* fn;
  int nparams;
  const ParamInfo* params;
  size_t args_size;  // bytes of the packed tuple
  void (*pack)(void* dst, void* const* params);
  void (*invoke)(void* fn, const void* args);
  int max_threads;  // the first argument of __launch_bounds__, 0 without
  const char* file;
};

enum { kMaxArgBytes = 4096 };  // CUDA's limit on a kernel's parameters

template <class T>
static inline T load_param(void* p) {
  T v;
  memcpy(static_cast<void*>(&v), p, sizeof(T));
  return v;
}

template <class... A>
struct Thunk {
  using Tup = std::tuple<std::decay_t<A>...>;
  static_assert((std::is_trivially_copyable_v<std::decay_t<A>> && ...),
                "kernel parameters must be trivially copyable");
  static_assert(sizeof(Tup) <= kMaxArgBytes, "kernel parameters over 4 KiB");

  template <size_t... I>
  static void pack_i(void* dst, void* const* p, std::index_sequence<I...>) {
    new (dst) Tup(load_param<std::decay_t<A>>(p[I])...);
  }
  static void pack(void* dst, void* const* p) { pack_i(dst, p, std::index_sequence_for<A...>{}); }
  static void invoke(void* fn, const void* t) {
    std::apply(reinterpret_cast<void (*)(A...)>(fn), *static_cast<const Tup*>(t));
  }
  static constexpr ParamInfo info[sizeof...(A) + 1] = {
      {(unsigned)sizeof(std::decay_t<A>), std::is_pointer_v<std::decay_t<A>>}..., {0, false}};
};

template <class... A>
KernelDef def(const char* name, void (*fn)(A...), int max_threads, const char* file) {
  return KernelDef{name,
                   reinterpret_cast<void*>(fn),
                   (int)sizeof...(A),
                   Thunk<A...>::info,
                   sizeof(typename Thunk<A...>::Tup),
                   &Thunk<A...>::pack,
                   &Thunk<A...>::invoke,
                   max_threads,
                   file};
}

}  // namespace gorun_emu

extern "C" void __gorun_emu_register(const gorun_emu::KernelDef* defs, int n);

#endif
