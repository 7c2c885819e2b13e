// gorun CUDA emulator (CPU): float32 <-> float16 / bfloat16 bit conversions.
//
// Bit for bit the converters of the Go package github.com/gorun/gorun/half
// (round to nearest even; Inf keeps its sign; a NaN stays a NaN of the same
// sign, made quiet, keeping the top bits of its payload; float16 subnormals
// exact; too large for float16 -> Inf). Used by the cuda_fp16.h and
// cuda_bf16.h stubs (kernels) and by the emulated cuBLAS.
//
// Note: a real GPU's __float2half_rn returns the canonical NaN 0x7fff for
// every NaN, so NaN payload bits are the one place the emulator and a GPU
// differ.
#ifndef GORUN_EMU_HALF_H
#define GORUN_EMU_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t gorun_emu_f32_bits(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return b;
}

static inline float gorun_emu_bits_f32(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}

static inline uint16_t gorun_emu_f32_to_f16(float f) {
  uint32_t b = gorun_emu_f32_bits(f);
  uint16_t sign = (uint16_t)((b >> 16) & 0x8000);
  int exp = (int)((b >> 23) & 0xff);
  uint32_t man = b & 0x7fffff;
  if (exp == 0xff) {
    if (man != 0) return (uint16_t)(sign | 0x7e00 | (man >> 13));  // quiet NaN, top payload
    return (uint16_t)(sign | 0x7c00);
  }
  if (exp > 127 + 15) return (uint16_t)(sign | 0x7c00);  // overflow
  if (exp >= 127 - 14) {                                 // normal range of float16
    uint32_t v = ((uint32_t)(exp - 127 + 15) << 10) | (man >> 13);
    uint32_t rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (v & 1))) v++;  // carry into exponent is right
    return (uint16_t)(sign | v);
  }
  if (exp >= 127 - 25) {  // float16 subnormal (or rounds up to the smallest one)
    uint32_t m = man | 0x800000;
    unsigned shift = (unsigned)(-14 - (exp - 127)) + 13;
    uint32_t v = m >> shift;
    uint32_t rest = m & ((1u << shift) - 1);
    uint32_t h = 1u << (shift - 1);
    if (rest > h || (rest == h && (v & 1))) v++;
    return (uint16_t)(sign | v);
  }
  return sign;  // underflow to a signed zero
}

static inline float gorun_emu_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  if (exp == 0x1f) {
    if (man != 0) return gorun_emu_bits_f32(sign | 0x7fc00000 | (man << 13));
    return gorun_emu_bits_f32(sign | 0x7f800000);
  }
  if (exp == 0) {
    if (man == 0) return gorun_emu_bits_f32(sign);
    uint32_t e = 127 - 15 + 1;  // subnormal: normalise
    while ((man & 0x400) == 0) {
      man <<= 1;
      e--;
    }
    return gorun_emu_bits_f32(sign | (e << 23) | ((man & 0x3ff) << 13));
  }
  return gorun_emu_bits_f32(sign | ((exp + 127 - 15) << 23) | (man << 13));
}

static inline uint16_t gorun_emu_f32_to_bf16(float f) {
  uint32_t b = gorun_emu_f32_bits(f);
  if ((b & 0x7fffffff) > 0x7f800000) return (uint16_t)((b | 0x400000) >> 16);  // quiet NaN
  return (uint16_t)((b + 0x7fff + ((b >> 16) & 1)) >> 16);
}

static inline float gorun_emu_bf16_to_f32(uint16_t h) { return gorun_emu_bits_f32((uint32_t)h << 16); }

#endif
