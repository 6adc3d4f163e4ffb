#include "runtime/cpu/bf16.h"

namespace kiln::cpu {

void widen_bf16(float* out, const uint16_t* in, int64_t n) {
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) out[i] = from_bf16(in[i]);
}

void narrow_bf16(uint16_t* out, const float* in, int64_t n) {
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) out[i] = to_bf16(in[i]);
}

}  // namespace kiln::cpu
