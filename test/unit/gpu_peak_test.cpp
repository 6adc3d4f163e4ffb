#include "runtime/gpu_peak.h"

#include <gtest/gtest.h>

namespace {

double tflops(const std::string& name, bool bf16) {
  const auto p = kiln::nominal_gpu_peak(name, bf16);
  return p ? p->flops / 1e12 : -1;
}

// Names as cudaGetDeviceProperties reports them.
TEST(GpuPeak, DatasheetRatesByName) {
  EXPECT_EQ(tflops("NVIDIA H200", true), 989);
  EXPECT_EQ(tflops("NVIDIA H100 80GB HBM3", true), 989);
  EXPECT_EQ(tflops("NVIDIA H100 PCIe", true), 756);
  EXPECT_EQ(tflops("NVIDIA H100 NVL", true), 835);
  EXPECT_EQ(tflops("NVIDIA A100-SXM4-80GB", true), 312);
  EXPECT_EQ(tflops("NVIDIA A100 80GB PCIe", false), 19.5);
  EXPECT_EQ(tflops("NVIDIA A10", true), 125);   // not A100's
  EXPECT_EQ(tflops("NVIDIA L40S", true), 362);  // not L40's or L4's
  EXPECT_EQ(tflops("NVIDIA L4", false), 30.3);
  EXPECT_EQ(tflops("NVIDIA GeForce RTX 4090", true), -1);
  EXPECT_EQ(tflops("a CUDA emulation on the CPU", true), -1);
  EXPECT_EQ(kiln::nominal_gpu_peak("NVIDIA A100-PCIE-40GB (sm_80, 40 GiB)", true)->how,
            "the A100's datasheet dense bf16 tensor-core rate");
  // A model is a whole word: "H200" is not in "GH200" (though the rates agree, the note names the part).
  EXPECT_EQ(kiln::nominal_gpu_peak("NVIDIA GH200 480GB", true)->how, "the GH200's datasheet dense bf16 tensor-core rate");
}

}  // namespace
