// bf16 storage: round to nearest even, exact widening, NaN kept.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "runtime/cpu/bf16.h"

namespace kiln::cpu {
namespace {

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(to_bf16(1.0f + 0x1p-8f), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: rounds up to the even one.
  EXPECT_EQ(to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  // Just above halfway rounds up.
  EXPECT_EQ(to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  EXPECT_EQ(to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  // The largest finite float rounds to infinity, as in PyTorch.
  EXPECT_EQ(to_bf16(std::numeric_limits<float>::max()), 0x7f80);
}

TEST(Bf16, WidensExactlyAndKeepsNaN) {
  for (uint32_t h = 0; h < 0x10000; h += 7) {
    float f = from_bf16(uint16_t(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(to_bf16(f), h);
  }
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(-std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Bf16, BulkConversionsMatchScalar) {
  std::vector<float> x(100000), back(x.size());
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i)) * 1e3f;
  narrow_bf16(h.data(), x.data(), int64_t(x.size()));
  widen_bf16(back.data(), h.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); i += 997) {
    EXPECT_EQ(h[i], to_bf16(x[i]));
    EXPECT_LE(std::abs(back[i] - x[i]), std::abs(x[i]) * 0x1p-8f);  // half an ulp of 8 bits
  }
}

}  // namespace
}  // namespace kiln::cpu
