// FLOPs per instruction (runtime/instr_flops): each built-in opcode's count, worked out by hand
// from the convention in instr_flops.cpp, with attributes of distinct primes so that a factor
// or an attribute read from the wrong slot gives another number.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "module_builder.h"
#include "runtime/instr_flops.h"
#include "runtime/module.h"

namespace kiln {
namespace {

using namespace kiln::testing;

// instr_flops of a lone instruction `op` with attributes `ints` (its operands play no part).
double flops_of(const Module& m, O op, const std::vector<int64_t>& ints) {
  flatbuffers::FlatBufferBuilder fbb;
  const std::vector<uint32_t> none;
  fbb.Finish(fb::CreateInstrDirect(fbb, op, &none, &none, &ints, nullptr, "test"));
  return instr_flops(m, *flatbuffers::GetRoot<fb::Instr>(fbb.GetBufferPointer()));
}

TEST(InstrFlops, BuiltInOpsCountByTheConvention) {
  const auto F = fb::DType::F32;
  const Module m = Module::from_bytes(
      build({{"a", K::Input, F, {2}}, {"o", K::Activation, F, {2}}}, {{"forward", {{O::Copy, {0}, {1}, {2}}}, 1}}),
      "flops.kiln");
  struct Case {
    O op;
    std::vector<int64_t> ints;
    double flops;
  };
  const Case cases[] = {
      // Elementwise ops and casts: 1 per element (n = 11).
      {O::Add, {11}, 11},
      {O::Mul, {11}, 11},
      {O::Scale, {11}, 11},
      {O::GeluGrad, {11}, 11},
      {O::Cast, {11}, 11},
      {O::AccumulateGrad, {11}, 11},
      // ReduceSum x[R=3, K=5]: 1 per element read, 15.
      {O::ReduceSum, {3, 5}, 15},
      // EmbeddingGrad n=3, V=7, C=5: one add per row element scattered, n C = 15 (not n V = 21).
      {O::EmbeddingGrad, {3, 7, 5}, 15},
      // LayerNormGrad N=3, C=5: 14 per element, 210.
      {O::LayerNormGrad, {3, 5}, 210},
      // CrossEntropy and its gradient N=3, Vp=8, V=5: 3 per logit of the padded row, 3*3*8 = 72.
      {O::CrossEntropy, {3, 8, 5}, 72},
      {O::CrossEntropyGrad, {3, 8, 5}, 72},
      // AdamW n=11: 12 per element, 132.
      {O::AdamW, {11, 1}, 132},
      // Gelu n=11: 8 per element, 88; LayerNorm N=3, C=5: 8 per element, 120.
      {O::Gelu, {11}, 88},
      {O::LayerNorm, {3, 5}, 120},
      // Matmul M=3, N=5, K=7 (transposes aside): 2 M N K = 210.
      {O::Matmul, {3, 5, 7, 1, 0}, 210},
      // Attention B=2, T=3, C=5, H=7: 4 B T T C = 360 forward, 8 B T T C = 720 backward (H no part).
      {O::Attention, {2, 3, 5, 7}, 360},
      {O::AttentionGrad, {2, 3, 5, 7}, 720},
      // Moving data is free.
      {O::Copy, {11}, 0},
      {O::Transpose, {3, 5}, 0},
      {O::Embedding, {3, 7, 5}, 0},
  };
  for (const Case& c : cases) EXPECT_EQ(flops_of(m, c.op, c.ints), c.flops) << fb::EnumNameOpCode(c.op);
}

}  // namespace
}  // namespace kiln
