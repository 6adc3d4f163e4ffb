// bf16 matrix products by oneDNN (runtime/cpu/matmul_bf16): every transpose, fp32 and bf16
// results, against float64 sums of the same bf16 values; the bf16 FLOPs per cycle;
// callers on several threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
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
  EXPECT_FALSE(matmul_bf16(&out, false, &a, &b, 1, 0, 1, false, false));
  EXPECT_EQ(out, 7.0f);  // nothing written
}

// The rate the MFU estimate uses, against the CPU's own flags (/proc/cpuinfo): AMX tiles 1024
// FLOPs a cycle, AVX-512 BF16 128 (not AMX's where the CPU has only AVX-512 BF16). Skipped where
// ONEDNN_MAX_CPU_ISA (or DNNL_MAX_CPU_ISA) may hold oneDNN below the CPU, or with no oneDNN.
TEST(MatmulBf16, FlopsPerCycleFollowTheCpuFlags) {
  if (std::getenv("ONEDNN_MAX_CPU_ISA") || std::getenv("DNNL_MAX_CPU_ISA")) GTEST_SKIP() << "oneDNN's ISA capped";
  const uint16_t one = to_bf16(1.0f);
  float probe = 0.0f;
  if (!matmul_bf16(&probe, false, &one, &one, 1, 1, 1, false, false)) GTEST_SKIP() << "no oneDNN bf16 matmul";
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(cpuinfo, line))
    if (line.rfind("flags", 0) == 0) {
      flags = line + " ";
      break;
    }
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags";
  const bool amx = flags.find(" amx_bf16 ") != std::string::npos, avx512bf16 = flags.find(" avx512_bf16 ") != std::string::npos;
  const int rate = bf16_flops_per_cycle();
  if (amx)  // a kernel may refuse a process AMX's tile state; oneDNN then runs AVX-512 BF16
    EXPECT_TRUE(rate == 1024 || rate == 128) << rate;
  else
    EXPECT_EQ(rate, avx512bf16 ? 128 : 0) << flags;
}

// Callers on several threads share each shape's primitive and the memory objects pointed at
// their operands (under matmul_bf16's mutex): each must get the product of its own operands.
// Small shapes, many calls, so that an unguarded hand-over would show (a wrong product or a
// crash). Small integers, exact in bf16 and in fp32 sums: compared exactly.
TEST(MatmulBf16, ConcurrentCallersGetTheirOwnProducts) {
  const uint16_t one = to_bf16(1.0f);
  float probe = 0.0f;
  if (!matmul_bf16(&probe, false, &one, &one, 1, 1, 1, false, false)) GTEST_SKIP() << "no oneDNN bf16 matmul";
  const int64_t M = 4, N = 4, K = 8;
  std::vector<int> bad(8, 0), refused(8, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      // a[i, k] = t + 1 (k even) or 0, b[k, j] = j + 1: out[i, j] = (t + 1) (j + 1) K / 2.
      std::vector<uint16_t> a(size_t(M * K)), b(size_t(K * N));
      for (int64_t i = 0; i < M * K; ++i) a[size_t(i)] = to_bf16(i % 2 ? 0.0f : float(t + 1));
      for (int64_t i = 0; i < K * N; ++i) b[size_t(i)] = to_bf16(float(i % N + 1));
      std::vector<float> out(size_t(M * N));
      for (int it = 0; it < 20000; ++it) {
        std::fill(out.begin(), out.end(), -1.0f);
        if (!matmul_bf16(out.data(), false, a.data(), b.data(), M, N, K, false, false)) {
          ++refused[size_t(t)];
          continue;
        }
        for (int64_t i = 0; i < M * N; ++i)
          if (out[size_t(i)] != float((t + 1) * (i % N + 1) * K / 2)) {
            ++bad[size_t(t)];
            break;
          }
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t) {
    EXPECT_EQ(refused[size_t(t)], 0) << "thread " << t;
    EXPECT_EQ(bad[size_t(t)], 0) << "thread " << t << ": products of another thread's operands";
  }
}

}  // namespace
}  // namespace kiln::cpu
