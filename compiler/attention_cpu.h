// C++ source for causal self-attention on the CPU, forward and backward: the template the fused
// path uses (the runtime's built-in kernels serve --no-fusion). Plain C++ (no MLIR): text for the
// host compiler, appended after kernelPrelude(Target::Cpu) (bf16, ld/st, exp_f).
//
// Semantics are those of runtime/cpu/kernels.cpp attention_fwd / attention_bwd. The head size
// and every extent are constants, and the reductions are `omp simd` reductions, so the compiler
// vectorises the dot products and the softmax. One row of scores per query is kept (the T x T
// matrix is never stored).
#pragma once

#include <string>

#include "compiler/attention_cuda.h"  // AttentionShape

namespace kiln {

// `extern "C" void SYMBOL(void* const* b, const int64_t* range)`:
//   b[0] = qkv [B, T, 3C], b[1] = out [B, T, C], b[2] = lse [B, H, T] (fp32)
std::string cpuAttentionForward(const std::string& symbol, const AttentionShape& s);
//   b[0] = dout [B, T, C], b[1] = qkv, b[2] = out, b[3] = lse, b[4] = dqkv [B, T, 3C] (all written)
std::string cpuAttentionBackward(const std::string& symbol, const AttentionShape& s);

}  // namespace kiln
