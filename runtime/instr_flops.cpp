#include "runtime/instr_flops.h"

namespace kiln {

// Matrix products as 2MNK; attention with the full T x T convention of the 6ND + 12LCT rule;
// GELU and layer norm (what recomputation repeats) as 8 FLOPs per element. A generated kernel
// counts what the compiler computed for it, and a built-in op as the kernel templates count it
// (kernel_codegen.cpp), so that --no-fusion's total is comparable: an elementwise op or a cast
// 1 per element, a row sum 1 per element read, layer norm's gradient 14 and AdamW 12 per
// element, the cross-entropy 3 per logit each way. Moving data (copies, splits) is free.
double instr_flops(const Module& m, const fb::Instr& ins) {
  const auto& v = *ins.ints();
  switch (ins.op()) {
    case fb::OpCode::Kernel: return m.fb().kernels()->Get(uint32_t(v[0]))->flops();
    case fb::OpCode::Add:
    case fb::OpCode::Mul:
    case fb::OpCode::Scale:
    case fb::OpCode::GeluGrad:
    case fb::OpCode::Cast:
    case fb::OpCode::AccumulateGrad: return double(v[0]);
    case fb::OpCode::ReduceSum: return double(v[0]) * double(v[1]);
    case fb::OpCode::EmbeddingGrad: return double(v[0]) * double(v[2]);
    case fb::OpCode::LayerNormGrad: return 14.0 * double(v[0]) * double(v[1]);
    case fb::OpCode::CrossEntropy:
    case fb::OpCode::CrossEntropyGrad: return 3.0 * double(v[0]) * double(v[1]);
    case fb::OpCode::AdamW: return 12.0 * double(v[0]);
    case fb::OpCode::Gelu: return 8.0 * double(v[0]);
    case fb::OpCode::LayerNorm: return 8.0 * double(v[0]) * double(v[1]);
    case fb::OpCode::Matmul: return 2.0 * double(v[0]) * double(v[1]) * double(v[2]);
    case fb::OpCode::Attention: return 4.0 * double(v[0]) * double(v[1]) * double(v[1]) * double(v[2]);
    case fb::OpCode::AttentionGrad: return 8.0 * double(v[0]) * double(v[1]) * double(v[1]) * double(v[2]);
    default: return 0.0;
  }
}

}  // namespace kiln
