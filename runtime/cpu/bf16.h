// bfloat16 storage: the top 16 bits of an fp32, rounded to nearest even.
#pragma once
#include <cstdint>
#include <cstring>

namespace kiln::cpu {

inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                          // round half to even
  return uint16_t(u >> 16);
}

inline float from_bf16(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Bulk conversions (OpenMP above a size where it pays).
void widen_bf16(float* out, const uint16_t* in, int64_t n);
void narrow_bf16(uint16_t* out, const float* in, int64_t n);

}  // namespace kiln::cpu
