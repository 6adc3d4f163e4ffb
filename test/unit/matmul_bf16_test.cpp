// bf16 matrix products by oneDNN (runtime/cpu/matmul_bf16): every transpose, fp32 and bf16
// results, against float64 sums of the same bf16 values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "runtime/cpu/bf16.h"
#include "runtime/cpu/matmul_bf16.h"

namespace kiln::cpu {
namespace {

struct Case {
  int64_t M, N, K;
};

// Row-major op(X)[r, c] of X stored [rows, cols] (transposed: stored [cols, rows]).
double at(const std::vector<uint16_t>& x, bool trans, int64_t r, int64_t c, int64_t rows, int64_t cols) {
  return from_bf16(x[trans ? c * rows + r : r * cols + c]);
}

TEST(MatmulBf16, MatchesFloat64SumsForEveryTransposeAndResultType) {
  {
    // oneDNN has bf16 matmuls on AVX-512 CPUs even without BF16 units (converting): skipped only
    // where it has none, never where this CPU's AMX or AVX-512 BF16 should run them.
    const uint16_t one = to_bf16(1.0f);
    float probe = 0.0f;
    if (!matmul_bf16(&probe, false, &one, &one, 1, 1, 1, false, false)) {
      ASSERT_EQ(bf16_flops_per_cycle(), 0) << "oneDNN refused a bf16 matmul on a CPU with bf16 units";
      GTEST_SKIP() << "no oneDNN in this build, or no bf16 matmul in it for this CPU";
    }
    ASSERT_EQ(probe, 1.0f);
  }
  for (Case s : {Case{37, 53, 300}, Case{128, 96, 512}, Case{1, 7, 1}})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (int out_bf16 = 0; out_bf16 < 2; ++out_bf16) {
          SCOPED_TRACE(::testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K << " trans_a=" << ta
                                            << " trans_b=" << tb << " bf16 out=" << out_bf16);
          std::vector<uint16_t> a(size_t(s.M * s.K)), b(size_t(s.K * s.N));
          for (size_t i = 0; i < a.size(); ++i) a[i] = to_bf16(std::sin(0.37f * float(i) + 1.0f));
          for (size_t i = 0; i < b.size(); ++i) b[i] = to_bf16(std::cos(0.11f * float(i)) * 2.0f);
          std::vector<float> out32(size_t(s.M * s.N), -1.0f);
          std::vector<uint16_t> out16(size_t(s.M * s.N), 0xffff);
          void* out = out_bf16 ? static_cast<void*>(out16.data()) : static_cast<void*>(out32.data());
          ASSERT_TRUE(matmul_bf16(out, out_bf16, a.data(), b.data(), s.M, s.N, s.K, ta, tb));
          for (int64_t i = 0; i < s.M; ++i)
            for (int64_t j = 0; j < s.N; ++j) {
              double ref = 0, mag = 0;
              for (int64_t k = 0; k < s.K; ++k) {
                const double p = at(a, ta, i, k, s.M, s.K) * at(b, tb, k, j, s.K, s.N);
                ref += p, mag += std::fabs(p);
              }
              const double got = out_bf16 ? from_bf16(out16[size_t(i * s.N + j)]) : out32[size_t(i * s.N + j)];
              // fp32 sums of exact bf16 products: K roundings of 2^-24 of the running magnitude;
              // a bf16 result adds one rounding of 2^-9 of the value.
              const double tol = double(s.K) * 0x1p-24 * mag + (out_bf16 ? 0x1p-8 * std::fabs(ref) : 0.0) + 1e-30;
              ASSERT_NEAR(got, ref, tol) << "at [" << i << ", " << j << "]";
            }
        }
}

TEST(MatmulBf16, DegenerateShapesAreLeftToTheCaller) {
  uint16_t a = 0, b = 0;
  float out = 7.0f;
  EXPECT_FALSE(matmul_bf16(&out, false, &a, &b, 1, 1, 0, false, false));
  EXPECT_FALSE(matmul_bf16(&out, false, &a, &b, 0, 1, 1, false, false));
  EXPECT_EQ(out, 7.0f);  // nothing written
}

}  // namespace
}  // namespace kiln::cpu
