// gorun CUDA emulator (CPU): stub of cuda_fp16.h. Storage type and the
// conversions only (no half arithmetic): see gorun_emu_half.h.
#ifndef GORUN_EMU_CUDA_FP16_H
#define GORUN_EMU_CUDA_FP16_H

#include "gorun_emu_half.h"

struct __align__(2) __half {
  unsigned short __x;
};
typedef struct __half half;
struct __half_raw {
  unsigned short x;
};

static inline __half __float2half_rn(float f) {
  __half h;
  h.__x = gorun_emu_f32_to_f16(f);
  return h;
}
static inline __half __float2half(float f) { return __float2half_rn(f); }
static inline float __half2float(__half h) { return gorun_emu_f16_to_f32(h.__x); }
static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
static inline __half __ushort_as_half(unsigned short x) {
  __half h;
  h.__x = x;
  return h;
}

#endif
