// Generates the source code of fused kernels from kiln.fusion regions (the fused-kernel IR):
// C++ for the CPU (compiled by the host compiler when kilnc runs) and CUDA C++ (compiled by
// NVRTC). Both targets share the element expressions; each kind of region has one loop skeleton
// per target.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "Kiln/KilnDialect.h"
#include "compiler/attention_cuda.h"
#include "compiler/kernel_prelude.h"

namespace kiln {

// The buffers a fused kernel reads and writes, in the order of its argument array: the region's
// inputs, its results, then the state its ops write in body order (the gradient accumulator of
// each kiln.accumulate_grad; the value, AdamW moments and, when the parameter has one, the bf16
// compute copy of each kiln.adamw). The module writer lays out the instruction's operands in the
// same order.
struct StateWrite {
  std::string param;  // parameter name
  enum Role { Grad, Value, AdamM, AdamV, ComputeCopy } role;
};
std::vector<StateWrite> stateWrites(FusionOp fusion,
                                    const std::function<bool(llvm::StringRef)>& hasComputeCopy);

// A CUDA matrix product by cuBLASLt: D = epilogue(op(A) op(B) + beta C) in row-major terms.
// Operands are indices into the kernel's argument array (-1: none).
struct MatmulCall {
  int64_t m = 0, n = 0, k = 0;
  bool transA = false, transB = false;
  int a = -1, b = -1, bias = -1, aux = -1, c = -1, d = -1;
  float beta = 0;
  std::string epilogue = "DEFAULT";  // DEFAULT, BIAS, GELU, GELU_AUX, GELU_BIAS, GELU_AUX_BIAS, DGELU
};

struct GeneratedKernel {
  std::string source;   // the kernel's function, readable (empty when the library does it all)
  double flops = 0;     // arithmetic per call, for reports
  double tensorFlops = 0;  // of it, the matrix product's 2 m n k (module.fbs: tensor_flops)
  unsigned cudaGrid = 0, cudaBlock = 0;  // launch shape of the generated function (CUDA)
  // CUDA matrix products: the cuBLASLt call ("epilogue=BIAS ..."), run before the generated
  // function (if any) for what cuBLASLt cannot do. Launches: both.
  std::string cublasLt;
  std::optional<MatmulCall> matmul;
  unsigned launches = 1;
  std::vector<unsigned> zeroOperands;  // cleared by the runtime before the launch (CUDA atomics)
  std::vector<CudaKernelLaunch> functions;  // CUDA: the generated functions, in launch order
  uint64_t cudaScratchBytes = 0;  // CUDA: workspace the functions use (b[operands]; module.fbs)
  bool cpuBf16Matmul = false;     // CPU: calls the prelude's bf16_matmul (oneDNN)
};

// Source of one kernel named `symbol`. Fails (with a diagnostic on the op) for a region its kind's
// template cannot generate.
mlir::FailureOr<GeneratedKernel> generateKernel(FusionOp fusion, const std::string& symbol, Target target,
                                                const std::function<bool(llvm::StringRef)>& hasComputeCopy);

}  // namespace kiln
