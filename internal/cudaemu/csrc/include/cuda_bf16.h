// gorun CUDA emulator (CPU): stub of cuda_bf16.h. Storage type and the
// conversions only (no bfloat16 arithmetic): see gorun_emu_half.h.
#ifndef GORUN_EMU_CUDA_BF16_H
#define GORUN_EMU_CUDA_BF16_H

#include "gorun_emu_half.h"

struct __align__(2) __nv_bfloat16 {
  unsigned short __x;
};
typedef struct __nv_bfloat16 nv_bfloat16;
struct __nv_bfloat16_raw {
  unsigned short x;
};

static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  __nv_bfloat16 h;
  h.__x = gorun_emu_f32_to_bf16(f);
  return h;
}
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline float __bfloat162float(__nv_bfloat16 h) { return gorun_emu_bf16_to_f32(h.__x); }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short x) {
  __nv_bfloat16 h;
  h.__x = x;
  return h;
}

#endif
