#include "runtime/gpu_peak.h"

#include <cctype>
#include <cstdio>

namespace kiln {
namespace {

struct Part {
  const char* model;  // a word (or words) of the name: "H100 PCIe" before "H100"
  double bf16_tflops, fp32_tflops;
};

// NVIDIA's datasheet figures, dense (no sparsity). The first row whose model is a whole word (or
// words) of the name wins, so the more specific names come first.
constexpr Part kParts[] = {
    {"H100 PCIe", 756, 51},  {"H100 NVL", 835, 60}, {"H100", 989, 67}, {"H800 PCIe", 756, 51},
    {"H800", 989, 67},       {"H200 NVL", 835, 60}, {"H200", 989, 67}, {"GH200", 989, 67},
    {"A100", 312, 19.5},     {"A800", 312, 19.5},   {"A30", 165, 10.3}, {"A10", 125, 31.2},
    {"L40S", 362, 91.6},     {"L40", 181, 90.5},    {"L4", 121, 30.3},
};

// Whether `word` occurs in `name` with no letter or digit just before or after it: "A10" is not
// in "NVIDIA A100-SXM4-80GB", nor "L4" in "NVIDIA L40S".
bool has_word(const std::string& name, const std::string& word) {
  for (size_t at = name.find(word); at != std::string::npos; at = name.find(word, at + 1)) {
    const size_t end = at + word.size();
    const bool before = at == 0 || !std::isalnum(static_cast<unsigned char>(name[at - 1]));
    const bool after = end == name.size() || !std::isalnum(static_cast<unsigned char>(name[end]));
    if (before && after) return true;
  }
  return false;
}

}  // namespace

std::optional<GpuPeak> nominal_gpu_peak(const std::string& device_name, bool bf16) {
  for (const Part& p : kParts) {
    if (!has_word(device_name, p.model)) continue;
    char how[96];
    std::snprintf(how, sizeof how, "the %s's datasheet %s rate", p.model, bf16 ? "dense bf16 tensor-core" : "fp32");
    return GpuPeak{(bf16 ? p.bf16_tflops : p.fp32_tflops) * 1e12, how};
  }
  return std::nullopt;
}

}  // namespace kiln
