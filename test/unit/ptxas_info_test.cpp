// The ptxas report parser (compiler/ptxas_info.h) on a log as NVRTC gives it with
// --ptxas-options=-v: entry functions, a device function's properties between them, and the
// smem / spill fields that appear only when nonzero on some architectures.
#include "compiler/ptxas_info.h"

#include <gtest/gtest.h>

namespace kiln {
namespace {

const char* kLog =
    "ptxas info    : 24 bytes gmem, 680 bytes cmem[3], 32 bytes cmem[4]\n"
    "ptxas info    : Compiling entry function 'k49_clip_coef_adamw' for 'sm_80'\n"
    "ptxas info    : Function properties for k49_clip_coef_adamw\n"
    "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 38 registers, used 0 barriers, 368 bytes cmem[0], 176 bytes cmem[2]\n"
    "ptxas info    : Compile time = 43.482 ms\n"
    "ptxas info    : Function properties for __internal_accurate_pow\n"
    "ptxas         .     16 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n"
    "ptxas info    : Compiling entry function 'k27_attention_grad_dkv' for 'sm_90'\n"
    "ptxas info    : Function properties for k27_attention_grad_dkv\n"
    "ptxas         .     168 bytes stack frame, 308 bytes spill stores, 248 bytes spill loads\n"
    "ptxas info    : Used 255 registers, used 1 barriers, 168 bytes cumulative stack size, 35328 bytes smem\n";

TEST(PtxasInfo, EntryFunctionsWithTheirOwnProperties) {
  const auto r = parsePtxasInfo(kLog);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].symbol, "k49_clip_coef_adamw");
  EXPECT_EQ(r[0].registers, 38u);
  EXPECT_EQ(r[0].sharedBytes, 0u);
  // __internal_accurate_pow's spills are its own, not the entry function's before it.
  EXPECT_EQ(r[0].stackBytes, 0u);
  EXPECT_EQ(r[0].spillStoreBytes, 0u);
  EXPECT_EQ(r[1].symbol, "k27_attention_grad_dkv");
  EXPECT_EQ(r[1].registers, 255u);
  EXPECT_EQ(r[1].sharedBytes, 35328u);
  EXPECT_EQ(r[1].stackBytes, 168u);
  EXPECT_EQ(r[1].spillStoreBytes, 308u);
  EXPECT_EQ(r[1].spillLoadBytes, 248u);
}

TEST(PtxasInfo, NothingToReport) {
  EXPECT_TRUE(parsePtxasInfo("").empty());
  EXPECT_TRUE(parsePtxasInfo("ptxas info    : 24 bytes gmem\n").empty());
}

}  // namespace
}  // namespace kiln
