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
  // Resources before any entry function belong to none; a name cut off before its quote is none.
  EXPECT_TRUE(parsePtxasInfo("ptxas info    : Used 12 registers, 64 bytes smem\n"
                             "ptxas info    : Compiling entry function 'k1_cut\n")
                  .empty());
}

// A log with Windows line ends, and a field whose number is missing: the entry's name and
// properties still match, and the field stays 0 rather than stopping kilnc.
TEST(PtxasInfo, CarriageReturnsAndAFieldWithoutItsNumber) {
  const auto r = parsePtxasInfo(
      "ptxas info    : Compiling entry function 'k3_gelu' for 'sm_90'\r\n"
      "ptxas info    : Function properties for k3_gelu\r\n"
      "ptxas         .     40 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\r\n"
      "ptxas info    : Used 30 registers, used 0 barriers, bytes smem\r\n");
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].symbol, "k3_gelu");
  EXPECT_EQ(r[0].stackBytes, 40u);
  EXPECT_EQ(r[0].spillLoadBytes, 4u);
  EXPECT_EQ(r[0].registers, 30u);
  EXPECT_EQ(r[0].sharedBytes, 0u);
}

// Registers go to a warp 256 at a time, 64K to a block: 64 registers x 1024 threads just fit,
// and so do 255 (256 allocated) x 256 threads; 65 x 1024 or 255 x 288 do not.
TEST(PtxasInfo, LaunchResourceLimits) {
  CudaFunctionResources r;
  r.registers = 64;
  EXPECT_EQ(launchResourceProblem(r, 1024), "");
  r.registers = 65;
  EXPECT_EQ(launchResourceProblem(r, 1024),
            "a block of 1024 threads at 65 registers each needs 73728 registers, above the 65536 one block may hold");
  r.registers = 255;
  EXPECT_EQ(launchResourceProblem(r, 256), "");
  EXPECT_NE(launchResourceProblem(r, 288), "");
  // A partial warp takes a whole warp's registers: 257 threads are 9 warps.
  EXPECT_EQ(launchResourceProblem(r, 257),
            "a block of 257 threads at 255 registers each needs 73728 registers, above the 65536 one block may hold");
  EXPECT_EQ(launchResourceProblem(r, 0), "a block of 0 threads (1 to 1024 launch)");
  EXPECT_EQ(launchResourceProblem(r, 2048), "a block of 2048 threads (1 to 1024 launch)");
  r.registers = 32;
  r.sharedBytes = 48 * 1024;
  EXPECT_EQ(launchResourceProblem(r, 128), "");
  r.sharedBytes = 48 * 1024 + 4;
  EXPECT_EQ(launchResourceProblem(r, 128),
            "49156 bytes of static shared memory, above the 49152 a block may declare");
}

}  // namespace
}  // namespace kiln
