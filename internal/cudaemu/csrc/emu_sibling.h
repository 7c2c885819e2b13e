// gorun CUDA emulator (CPU): how the emulated cuBLAS and NVML reach the
// emulated driver's state. They look up libcuda.so.1 in their own directory
// (emu.Build puts the three libraries side by side; if the driver is loaded
// already, dlopen returns it), so they always pair with their own emulator.
#ifndef GORUN_EMU_SIBLING_H
#define GORUN_EMU_SIBLING_H

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static void* gorun_emu_cuda_lib(void) {
  static void* h = nullptr;
  static bool tried = false;
  if (tried) return h;
  tried = true;
  Dl_info info;
  if (dladdr((void*)&gorun_emu_cuda_lib, &info) && info.dli_fname) {
    char path[4096];
    snprintf(path, sizeof path, "%s", info.dli_fname);
    char* slash = strrchr(path, '/');
    if (slash) {
      snprintf(slash + 1, sizeof path - (size_t)(slash + 1 - path), "libcuda.so.1");
      h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    }
  }
  return h;
}

// The emulated driver's function name, or null.
static void* gorun_emu_cuda_sym(const char* name) {
  void* h = gorun_emu_cuda_lib();
  void* p = h ? dlsym(h, name) : nullptr;
  if (!p) {  // the emulated driver loaded from elsewhere (only ours exports gorunEmu*)
    p = dlsym(RTLD_DEFAULT, name);
    if (p && strncmp(name, "gorunEmu", 8) != 0 && !dlsym(RTLD_DEFAULT, "gorunEmuLock")) p = nullptr;
  }
  return p;
}

#endif
