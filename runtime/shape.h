// Small shape helpers shared by the file readers (safetensors, checkpoints, weights).
#pragma once
#include <algorithm>
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
// A zero dimension makes it 0 whatever the others are (a product that overflows on the way to
// that 0 is not an overflow).
inline bool checked_numel(const std::vector<int64_t>& shape, uint64_t* numel) {
  if (std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 0; })) return false;
  uint64_t n = 1;
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) n = 0;
  else
    for (int64_t d : shape)
      if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  *numel = n;
  return true;
}

}  // namespace kiln
