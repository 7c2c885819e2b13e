// gorun CUDA emulator (CPU): libnvidia-ml.so.1.
//
// NOT NVIDIA's NVML: GORUN_CUDA_EMU_DEVICES devices (default 1),
// utilization always 0, memory as the emulated driver of this process has
// allocated it (the same for every device). See
// kernels/cuda/internal/emu/emu.go.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>

#include "emu_sibling.h"

#define API extern "C" __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
};

struct nvmlUtilization_t {
  unsigned int gpu, memory;
};
struct nvmlMemory_t {
  unsigned long long total, free, used;
};

namespace {
std::mutex g_mu;
int g_refs;
struct Device {
  int index;
} g_devices[64];

// GORUN_CUDA_EMU_DEVICES, as the emulated driver counts them.
unsigned device_count() {
  const char* v = getenv("GORUN_CUDA_EMU_DEVICES");
  int n = v ? atoi(v) : 1;
  return (unsigned)(n < 1 ? 1 : n > 64 ? 64 : n);
}

bool valid(Device* d) { return d >= g_devices && d < g_devices + device_count(); }

bool ready() {
  std::lock_guard<std::mutex> l(g_mu);
  return g_refs > 0;
}
}  // namespace

API const char* nvmlErrorString(nvmlReturn_t r) {
  switch (r) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupted by GPU";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
  }
  return "Unknown Error";
}

API nvmlReturn_t nvmlInit_v2(void) {
  std::lock_guard<std::mutex> l(g_mu);
  g_refs++;
  return NVML_SUCCESS;
}

API nvmlReturn_t nvmlShutdown(void) {
  std::lock_guard<std::mutex> l(g_mu);
  if (g_refs <= 0) return NVML_ERROR_UNINITIALIZED;
  g_refs--;
  return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  if (!ready()) return NVML_ERROR_UNINITIALIZED;
  if (!count) return NVML_ERROR_INVALID_ARGUMENT;
  *count = device_count();  // NVML ignores CUDA_VISIBLE_DEVICES
  return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, Device** device) {
  if (!ready()) return NVML_ERROR_UNINITIALIZED;
  if (index >= device_count() || !device) return NVML_ERROR_INVALID_ARGUMENT;
  g_devices[index].index = (int)index;
  *device = &g_devices[index];
  return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetName(Device* device, char* name, unsigned int length) {
  if (!ready()) return NVML_ERROR_UNINITIALIZED;
  if (!valid(device) || !name) return NVML_ERROR_INVALID_ARGUMENT;
  const char* n = "gorun CUDA emulator (CPU)";
  if (length < strlen(n) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
  memcpy(name, n, strlen(n) + 1);
  return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetUtilizationRates(Device* device, nvmlUtilization_t* u) {
  if (!ready()) return NVML_ERROR_UNINITIALIZED;
  if (!valid(device) || !u) return NVML_ERROR_INVALID_ARGUMENT;
  u->gpu = 0;
  u->memory = 0;
  return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(Device* device, nvmlMemory_t* m) {
  if (!ready()) return NVML_ERROR_UNINITIALIZED;
  if (!valid(device) || !m) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned long long total = 8ull << 30, used = 0;
  static std::once_flag once;
  static void (*info)(unsigned long long*, unsigned long long*);
  std::call_once(once, [] {
    info = (void (*)(unsigned long long*, unsigned long long*))gorun_emu_cuda_sym("gorunEmuMemInfo");
  });
  if (info) info(&total, &used);
  m->total = total;
  m->used = used;
  m->free = total > used ? total - used : 0;
  return NVML_SUCCESS;
}
