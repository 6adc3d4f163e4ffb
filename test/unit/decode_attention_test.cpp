// The decode attention templates' own checks (compiler/attention_decode.h), which kilnc's verifier
// keeps IR from reaching: each refused shape's exact message, the largest shapes still taken (M = S
// new positions, head size 1024, 2^31 - 1 CUDA blocks), the CUDA launch, and the flop count
// kiln-inspect reports (a call's last token at the last position: the most work).
#include "compiler/attention_decode.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace kiln {
namespace {

// What cpuDecodeAttention and cudaDecodeAttention throw for `s` ("(no error)" when they take it;
// the CUDA one's message when only it refuses).
std::string refusal(const DecodeAttentionShape& s) {
  std::string cpu = "(no error)", cuda = "(no error)";
  try {
    cpuDecodeAttention("k", s);
  } catch (const std::invalid_argument& e) {
    cpu = e.what();
  }
  try {
    CudaKernelLaunch launch;
    cudaDecodeAttention("k", s, launch);
  } catch (const std::invalid_argument& e) {
    cuda = e.what();
  }
  return cpu == cuda ? cpu : "cpu: " + cpu + "; cuda: " + cuda;
}

TEST(DecodeAttention, RefusesNonPositiveSizesAndHeadsNotDividingC) {
  // B, C, H, S, bf16, M
  EXPECT_EQ(refusal({0, 8, 2, 4, false, 1}), "decode attention: sizes must be positive");
  EXPECT_EQ(refusal({1, 0, 2, 4, false, 1}), "decode attention: sizes must be positive");
  EXPECT_EQ(refusal({1, 8, 0, 4, false, 1}), "decode attention: sizes must be positive");
  EXPECT_EQ(refusal({1, 8, 2, 0, false, 1}), "decode attention: sizes must be positive");
  EXPECT_EQ(refusal({1, 8, 2, 4, false, 0}), "decode attention: sizes must be positive");
  EXPECT_EQ(refusal({1, 8, 3, 4, false, 1}), "decode attention: H must divide C");
  EXPECT_EQ(refusal({1, 8, 2, 4, false, 1}), "(no error)");
}

// A call may fill the whole cache (M = S: @prefill of a prompt as long as the context), no more.
TEST(DecodeAttention, TakesAsManyNewPositionsAsTheCacheHolds) {
  EXPECT_EQ(refusal({2, 8, 2, 6, false, 6}), "(no error)");
  EXPECT_EQ(refusal({2, 8, 2, 6, false, 7}), "decode attention: more new positions than the cache holds");
}

// CUDA: one block per (row, head, new token), its threads striding a head of up to 1024 channels;
// blockIdx.x is an int, so fewer than 2^31 blocks.
TEST(DecodeAttention, CudaLimitsOfHeadSizeAndBlocks) {
  EXPECT_EQ(refusal({1, 1024, 1, 4, false, 1}), "(no error)");
  EXPECT_EQ(refusal({1, 1025, 1, 4, false, 1}), "cpu: (no error); cuda: decode attention: head size above 1024");
  EXPECT_EQ(refusal({2147483647, 1, 1, 1, false, 1}), "(no error)");
  EXPECT_EQ(refusal({1073741824, 1, 1, 2, false, 2}),
            "cpu: (no error); cuda: decode attention: shape too large");
}

TEST(DecodeAttention, CudaLaunchIsOneBlockPerRowHeadAndToken) {
  CudaKernelLaunch launch;
  const std::string src = cudaDecodeAttention("k7_decode", {3, 48, 3, 24, false, 5}, launch);
  EXPECT_EQ(launch.symbol, "k7_decode");
  EXPECT_EQ(launch.grid, 3u * 3u * 5u);
  EXPECT_EQ(launch.block, 128u);
  // Head size 300 over 128 threads: 3 channels a thread.
  cudaDecodeAttention("k8_decode", {1, 600, 2, 8, false, 1}, launch);
  EXPECT_EQ(launch.grid, 2u);
  EXPECT_NE(cudaDecodeAttention("k", {1, 600, 2, 8, false, 1}, launch).find("CPT = 3;"), std::string::npos);
  EXPECT_NE(cudaDecodeAttention("k", {1, 200, 2, 8, false, 1}, launch).find("CPT = 1;"), std::string::npos);  // head size 100
}

// 4 B C (S + (S - 1) + ... + (S - M + 1)): M = 3 new tokens of rows of S = 10, the last at 9,
// attend to 10 + 9 + 8 positions.
TEST(DecodeAttention, FlopsOfACallEndingAtTheLastPosition) {
  EXPECT_DOUBLE_EQ(decodeAttentionFlops({2, 8, 2, 10, false, 3}), 4.0 * 2 * 8 * (10 + 9 + 8));
  EXPECT_DOUBLE_EQ(decodeAttentionFlops({1, 64, 4, 32, true, 1}), 4.0 * 64 * 32);
}

// The generated source says its shape, and takes the softmax over chunks of min(S, 2048) cached
// positions (the scores of one chunk on the CPU stack or in CUDA shared memory).
TEST(DecodeAttention, SourceNamesItsShapeAndChunk) {
  const std::string one = cpuDecodeAttention("k", {2, 8, 2, 10, false, 1});
  EXPECT_NE(one.find("// Decode attention (B=2 C=8 H=2, head size 4, 10 cached positions, 1 new position per row)"),
            std::string::npos)
      << one.substr(0, 200);
  EXPECT_NE(one.find("float s[10],"), std::string::npos);
  const std::string three = cpuDecodeAttention("k", {1, 8, 1, 5000, true, 3});
  EXPECT_NE(three.find("(B=1 C=8 H=1, head size 8, 5000 cached positions, 3 new positions per row, bf16 qkv and out)"),
            std::string::npos)
      << three.substr(0, 200);
  EXPECT_NE(three.find("float s[2048],"), std::string::npos);
  CudaKernelLaunch launch;
  EXPECT_NE(cudaDecodeAttention("k", {1, 8, 1, 5000, false, 1}, launch).find("CHUNK = 2048,"), std::string::npos);
  EXPECT_NE(cudaDecodeAttention("k", {1, 8, 1, 100, false, 1}, launch).find("CHUNK = 100,"), std::string::npos);
}

}  // namespace
}  // namespace kiln
