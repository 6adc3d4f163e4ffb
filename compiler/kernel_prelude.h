// The prelude of every generated kernel file: bf16 conversions, exp and GELU, loads and stores,
// the warp reductions and tensor-core helpers (CUDA), and the oneDNN helper for bf16 products
// (CPU). Plain C++ (no MLIR).
#pragma once

#include <string>

namespace kiln {

enum class Target { Cpu, Cuda };

// Definitions every generated file starts with; with bf16Products (some CPU kernel's
// cpuBf16Matmul), the oneDNN helper for bf16 products.
std::string kernelPrelude(Target target, bool bf16Products = false);

}  // namespace kiln
