// Small shape helpers shared by the file readers (safetensors, checkpoints, weights).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

// "[4, 32, 64]" for messages.
inline std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Element count, or false on overflow or a negative dimension (a hostile header can claim any).
inline bool checked_numel(const std::vector<int64_t>& shape, uint64_t* numel) {
  uint64_t n = 1;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  *numel = n;
  return true;
}

}  // namespace kiln
