// The datasheet peak of a known NVIDIA GPU, for the MFU column when --peak-tflops is not given.
#pragma once
#include <optional>
#include <string>

namespace kiln {

struct GpuPeak {
  double flops;     // per second
  std::string how;  // for the run's closing line: "the NVIDIA A100's datasheet dense bf16 rate"
};

// From the device's name as CUDA reports it ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 PCIe"): the
// dense tensor-core bf16 rate (fp32 accumulation) for a bf16 module, the CUDA cores' fp32 rate for
// an fp32 one (its products run in true fp32, not TF32). nullopt for a GPU the table lacks.
std::optional<GpuPeak> nominal_gpu_peak(const std::string& device_name, bool bf16);

}  // namespace kiln
