// The CPU executor's built-in paths that small in-process modules reach: bf16 widening and
// rounding around a kernel, the operand checks' messages, the id and position guards, profiling,
// and the data-parallel hooks (slices, the norm reducer, the gradient hooks).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/cpu/bf16.h"
#include "runtime/error.h"
#include "runtime/executor.h"
#include "runtime/module.h"
#include "module_builder.h"
#include "test/unit/error_of.h"

namespace kiln {
namespace {

using namespace kiln::testing;

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

uint16_t* bf16_at(Executor& ex, uint32_t b) { return reinterpret_cast<uint16_t*>(ex.f32(b)); }

// out = a + b, then out2 = out + b, every operand bf16: each is widened into scratch by its slot,
// and each output rounded back once, after its own instruction.
TEST(Executor, Bf16OperandsAreWidenedAndRoundedPerInstruction) {
  const auto BF = fb::DType::BF16;
  Module m = Module::from_bytes(build({{"a", K::Input, BF, {5}},
                                       {"b", K::Input, BF, {5}},
                                       {"out", K::Activation, BF, {5}},
                                       {"out2", K::Activation, BF, {5}}},
                                      {{"forward", {{O::Add, {0, 1}, {2}, {5}}, {O::Add, {2, 1}, {3}, {5}}}, 3}}),
                                "bf16.kiln");
  Executor ex(m);
  EXPECT_EQ(ex.host_scratch_bytes(), 0);  // no kernel library, nothing widened yet
  for (int i = 0; i < 5; ++i)
    bf16_at(ex, 0)[i] = cpu::to_bf16(float(i) + 0.5f), bf16_at(ex, 1)[i] = cpu::to_bf16(256.0f);
  ex.run("forward");
  for (int i = 0; i < 5; ++i) {
    // Near 256, bf16 holds even numbers only: 256.5 rounds down, 257.5 up (to nearest even).
    EXPECT_EQ(cpu::from_bf16(bf16_at(ex, 2)[i]), cpu::from_bf16(cpu::to_bf16(256.0f + float(i) + 0.5f))) << i;
    EXPECT_EQ(cpu::from_bf16(bf16_at(ex, 3)[i]),
              cpu::from_bf16(cpu::to_bf16(cpu::from_bf16(bf16_at(ex, 2)[i]) + 256.0f))) << i;
  }
  // Three slots (two inputs, one output) of 5 floats, kept after the run.
  EXPECT_EQ(ex.host_scratch_bytes(), 3 * 5 * 4);
}

// A bf16 input beside an fp32 one: the fp32 kernel on the widened copy, not oneDNN's bf16 path.
TEST(Executor, MatmulOfMixedDtypesWidensTheBf16Operand) {
  Module m = Module::from_bytes(build({{"a", K::Input, fb::DType::BF16, {2, 2}},
                                       {"b", K::Input, fb::DType::F32, {2, 2}},
                                       {"c", K::Activation, fb::DType::F32, {2, 2}}},
                                      {{"forward", {{O::Matmul, {0, 1}, {2}, {2, 2, 2, 0, 0}}}, 2}}),
                                "mm.kiln");
  Executor ex(m);
  const float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
  for (int i = 0; i < 4; ++i) bf16_at(ex, 0)[i] = cpu::to_bf16(a[i]), ex.f32(1)[i] = b[i];
  ex.run("forward");
  const float want[4] = {19, 22, 43, 50};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(ex.f32(2)[i], want[i]) << i;
}

TEST(Executor, RefusesProgramsItDidNotLoad) {
  auto bytes = build({{"a", K::Input, fb::DType::F32, {2}}, {"out", K::Activation, fb::DType::F32, {2}}},
                     {{"forward", {{O::Copy, {0}, {1}, {2}}}, 1}, {"other", {{O::Copy, {0}, {1}, {2}}}, 1}});
  Module m = Module::from_bytes(bytes, "two.kiln");
  Executor ex(m, {"forward"});
  EXPECT_TRUE(ex.has_program("forward"));
  EXPECT_FALSE(ex.has_program("other"));
  EXPECT_EQ(error_of([&] { ex.run("other"); }), "two.kiln: program 'other' is not loaded in this executor");
  EXPECT_EQ(error_of([&] { Executor bad(m, {"nope"}); }), "two.kiln: the module has no program 'nope'");
  EXPECT_EQ(error_of([&] { ex.input("x"); }), "two.kiln: the module has no input named 'x'");
  EXPECT_FALSE(ex.has_hyper("lr"));
  ex.set_hyper("lr", 1.0f);  // no slot: nothing to set
}

// The operand checks' messages, each for one wrong instruction.
TEST(Executor, ChecksEachInstructionsOperands) {
  const auto F = fb::DType::F32;
  auto refusal = [&](const std::vector<Buf>& bufs, const Ins& ins, uint32_t result) {
    Module m = Module::from_bytes(build(bufs, {{"forward", {ins}, result}}), "chk.kiln");
    return error_of([&] { Executor ex(m); });
  };
  const std::vector<Buf> mm = {{"a", K::Input, F, {2, 2}}, {"b", K::Input, F, {2, 2}}, {"c", K::Activation, F, {2, 2}}};
  EXPECT_EQ(refusal(mm, {O::Matmul, {0, 1}, {2}, {2, 2, 2, 0, 2}}, 2),
            "chk.kiln: program forward, instr 0 (Matmul): transpose flags 0, 2 are not 0 or 1");
  EXPECT_EQ(refusal(mm, {O::Matmul, {0, 1}, {2}, {2, 2, 2, 1, 1}}, 2), "(no error)");
  // A negative size is no size (-2 * -2 would otherwise fit the 4 elements).
  EXPECT_EQ(refusal(mm, {O::Matmul, {0, 1}, {2}, {-2, -2, 1, 0, 0}}, 2),
            "chk.kiln: program forward, instr 0 (Matmul): wrong number of operands or size attributes");
  const std::vector<Buf> ln = {{"x", K::Input, F, {2, 2}}, {"w", K::Input, F, {2}},      {"b", K::Input, F, {2}},
                               {"y", K::Activation, F, {2, 2}}, {"mean", K::Activation, F, {2}},
                               {"rstd", K::Activation, F, {2}}};
  EXPECT_EQ(refusal(ln, {O::LayerNorm, {0, 1, 2}, {3, 4, 5}, {2, 2}}, 3),
            "chk.kiln: program forward, instr 0 (LayerNorm): needs its epsilon");
  EXPECT_EQ(refusal(ln, {O::LayerNorm, {0, 1, 2}, {3, 4, 5}, {2, 2}, {1e-5f}, true}, 3), "(no error)");
  // Token ids are I32.
  const std::vector<Buf> emb = {{"t", K::Input, F, {4, 2}}, {"ids", K::Input, F, {3}}, {"o", K::Activation, F, {3, 2}}};
  EXPECT_EQ(refusal(emb, {O::Embedding, {0, 1}, {2}, {3, 4, 2}}, 2),
            "chk.kiln: program forward, instr 0 (Embedding): input buffer 1 holds 3 F32, needs 3 I32");
}

// AdamW's operands: fp32 state, and a compute copy that must be BF16.
std::vector<Buf> adamw_buffers(fb::DType copy) {
  const auto F = fb::DType::F32;
  return {{"p", K::Parameter, F, {4}}, {"g", K::Gradient, F, {4}}, {"m", K::AdamM, F, {4}},  {"v", K::AdamV, F, {4}},
          {"coef", K::Input, F, {}},   {"lr", K::Input, F, {}},    {"b1", K::Input, F, {}},  {"b2", K::Input, F, {}},
          {"eps", K::Input, F, {}},    {"wd", K::Input, F, {}},    {"step", K::Input, F, {}}, {"copy", K::Input, copy, {4}},
          {"norm", K::Activation, F, {}}};
}
Ins adamw(bool decay, bool copy) {
  Ins i{O::AdamW, {1, 4, 5, 6, 7, 8, 9, 10}, {0, 2, 3}, {4, decay ? 1 : 0}};
  if (copy) i.out.push_back(11);
  return i;
}

TEST(Executor, AdamWComputeCopyMustBeBf16) {
  Module m = Module::from_bytes(build(adamw_buffers(fb::DType::F32), {{"opt", {adamw(true, true)}, 0}},
                                      {{"w", 0, 1, 2, 3}}),
                                "copy.kiln");
  EXPECT_EQ(error_of([&] { Executor ex(m); }), "copy.kiln: program opt, instr 0 (AdamW): the compute copy must be BF16");
}

// With a zero gradient the update is the weight decay alone: p * (1 - lr * wd), only where the
// instruction's decay flag is set, only in the parameter's slice, and the bf16 copy follows.
TEST(Executor, AdamWDecaysOnlyByItsFlagAndOnlyItsSlice) {
  for (bool decay : {false, true}) {
    Module m = Module::from_bytes(build(adamw_buffers(fb::DType::BF16), {{"opt", {adamw(decay, true)}, 0}},
                                        {{"w", 0, 1, 2, 3}}),
                                  "adamw.kiln");
    Executor ex(m);
    const float scalars[7] = {1.0f, 0.5f, 0.9f, 0.95f, 1e-8f, 1.0f, 1.0f};  // coef, lr, b1, b2, eps, wd, step
    for (int i = 0; i < 7; ++i) ex.f32(uint32_t(4 + i))[0] = scalars[i];
    for (int i = 0; i < 4; ++i) ex.f32(0)[i] = float(i + 1);
    ex.set_parameter_slice(0, 1, 3);
    ex.run("opt");
    for (int i = 0; i < 4; ++i) {
      const float want = decay && i >= 1 && i < 3 ? float(i + 1) * 0.5f : float(i + 1);
      EXPECT_EQ(ex.f32(0)[i], want) << decay << " " << i;
      EXPECT_EQ(cpu::from_bf16(bf16_at(ex, 11)[i]), want) << decay << " " << i;
    }
  }
}

// Parameter w (value 0, gradient 1, moments 2 and 3; 4 elements) and a program "opt" of its
// gradient's norm.
Module norm_module(const std::string& source) {
  return Module::from_bytes(build(adamw_buffers(fb::DType::BF16), {{"opt", {{O::GlobalNorm, {1}, {12}, {4}}}, 12}},
                                  {{"w", 0, 1, 2, 3}}),
                            source);
}

// GlobalNorm sums a sliced gradient's slice only, and passes the sum through the reducer.
TEST(Executor, GlobalNormSumsTheSliceThroughTheReducer) {
  Module m = norm_module("norm.kiln");
  Executor ex(m);
  for (int i = 0; i < 4; ++i) ex.f32(1)[i] = float(i + 1);
  EXPECT_FLOAT_EQ(ex.run("opt"), std::sqrt(30.0f));
  ex.set_parameter_slice(0, 1, 3);
  EXPECT_FLOAT_EQ(ex.run("opt"), std::sqrt(13.0f));
  double seen = 0;
  ex.set_norm_reducer([&](double s) { return (seen = s) * 4; });
  EXPECT_FLOAT_EQ(ex.run("opt"), std::sqrt(52.0f));
  EXPECT_EQ(seen, 13.0);
}

TEST(Executor, ParameterSliceBounds) {
  Module m = norm_module("slice.kiln");
  Executor ex(m);
  EXPECT_EQ(error_of([&] { ex.set_parameter_slice(0, 2, 2); }), "(no error)");  // left to other ranks
  EXPECT_EQ(error_of([&] { ex.set_parameter_slice(0, 0, 4); }), "(no error)");
  EXPECT_EQ(error_of([&] { ex.set_parameter_slice(0, 0, 5); }),
            "slice.kiln: set_parameter_slice: [0, 5) is not within parameter w of 4 elements");
  EXPECT_EQ(error_of([&] { ex.set_parameter_slice(0, 3, 2); }),
            "slice.kiln: set_parameter_slice: [3, 2) is not within parameter w of 4 elements");
  EXPECT_EQ(error_of([&] { ex.set_parameter_slice(0, -1, 2); }),
            "slice.kiln: set_parameter_slice: [-1, 2) is not within parameter w of 4 elements");
  EXPECT_EQ(error_of([&] { ex.set_parameter_slice(1, 0, 1); }), "slice.kiln: set_parameter_slice: parameter 1 of 1");
}

TEST(Executor, ReadAndCopyElementsBounds) {
  Module m = norm_module("io.kiln");
  Executor ex(m);
  for (int i = 0; i < 4; ++i) ex.f32(1)[i] = float(i + 1);
  float got[4] = {};
  ex.read(1, 4, 12, got);
  EXPECT_EQ(got[0], 2.0f);
  EXPECT_EQ(got[2], 4.0f);
  EXPECT_EQ(error_of([&] { ex.read(1, 4, 13, got); }), "io.kiln: read of bytes [4, 17) of buffer g, which has 16");
  EXPECT_EQ(error_of([&] { ex.read(1, 17, 0, got); }), "io.kiln: read of bytes [17, 17) of buffer g, which has 16");
  ex.copy_elements(1, 1, 3, got);
  EXPECT_EQ(got[0], 2.0f);
  EXPECT_EQ(got[2], 4.0f);
  const std::string refused = " are not fp32 elements this rank holds";
  EXPECT_EQ(error_of([&] { ex.copy_elements(1, 1, 4, got); }), "io.kiln: elements [1, 5) of g" + refused);
  EXPECT_EQ(error_of([&] { ex.copy_elements(1, -1, 1, got); }), "io.kiln: elements [-1, 0) of g" + refused);
  EXPECT_EQ(error_of([&] { ex.copy_elements(11, 0, 1, got); }), "io.kiln: elements [0, 1) of copy" + refused);  // bf16
  ex.zero_grads();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(ex.f32(1)[i], 0.0f) << i;
}

// ReduceGradients hands its bucket to the hook; WaitGradients calls the other.
TEST(Executor, GradientHooksGetTheirBucket) {
  Module m = Module::from_bytes(
      build(adamw_buffers(fb::DType::BF16),
            {{"opt", {{O::ReduceGradients, {1}, {}, {7, 4}}, {O::WaitGradients, {}, {}, {}}, {O::GlobalNorm, {1}, {12}, {4}}}, 12}},
            {{"w", 0, 1, 2, 3}}),
      "hooks.kiln");
  Executor ex(m);
  ex.run("opt");  // unset: nothing
  std::vector<int64_t> buckets;
  int waits = 0;
  ex.set_gradient_hooks([&](int64_t b) { buckets.push_back(b); }, [&] { ++waits; });
  ex.run("opt");
  EXPECT_EQ(buckets, std::vector<int64_t>{7});
  EXPECT_EQ(waits, 1);
}

// Ids past the instruction's V (the classes, not the padded row) are refused before the kernel.
TEST(Executor, RefusesIdsOutsideTheInstructionsRange) {
  const auto F = fb::DType::F32, I = fb::DType::I32;
  Module emb = Module::from_bytes(build({{"t", K::Input, F, {4, 2}}, {"ids", K::Input, I, {3}}, {"o", K::Activation, F, {3, 2}}},
                                        {{"forward", {{O::Embedding, {0, 1}, {2}, {3, 4, 2}}}, 2}}),
                                  "emb.kiln");
  Executor ex(emb);
  ex.i32(1)[0] = 3, ex.i32(1)[1] = 0, ex.i32(1)[2] = 1;
  EXPECT_EQ(error_of([&] { ex.run("forward"); }), "(no error)");
  ex.i32(1)[2] = 4;
  EXPECT_EQ(error_of([&] { ex.run("forward"); }),
            "emb.kiln: Embedding (test): id 4 at element 2 is not in [0, 4) (a damaged module, or one whose sizes "
            "disagree with the model's)");
  // CrossEntropy over 2 rows of Vp = 4 columns, V = 3 classes.
  Module ce = Module::from_bytes(build({{"logits", K::Input, F, {2, 4}}, {"tgt", K::Input, I, {2}},
                                        {"loss", K::Activation, F, {}}, {"lse", K::Activation, F, {2}}},
                                       {{"forward", {{O::CrossEntropy, {0, 1}, {2, 3}, {2, 4, 3}}}, 2}}),
                                 "ce.kiln");
  Executor ex2(ce);
  ex2.i32(1)[0] = 2, ex2.i32(1)[1] = 3;  // 3: a padding column
  EXPECT_HAS(error_of([&] { ex2.run("forward"); }), "ce.kiln: CrossEntropy (test): id 3 at element 1 is not in [0, 3)");
}

// Profiling counts each instruction's calls and flops under its opcode; off, nothing is recorded.
TEST(Executor, ProfilesByOpcodeOnlyWhenEnabled) {
  const auto F = fb::DType::F32;
  Module m = Module::from_bytes(build({{"a", K::Input, F, {6}}, {"o", K::Activation, F, {6}}, {"o2", K::Activation, F, {6}}},
                                      {{"forward", {{O::Add, {0, 0}, {1}, {6}}, {O::Gelu, {1}, {2}, {6}}}, 2}}),
                                "prof.kiln");
  Executor ex(m);
  ex.run("forward");
  EXPECT_TRUE(ex.profile_rows().empty());
  ex.enable_profiling(true);
  ex.run("forward");
  ex.run("forward");
  auto rows = ex.profile_rows();
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& [name, t] : rows) {
    EXPECT_EQ(t.calls, 2) << name;
    EXPECT_EQ(t.flops, name == "Add" ? 12.0 : 96.0) << name;
  }
  EXPECT_GE(rows[0].second.seconds, rows[1].second.seconds);  // the longest first
  ex.reset_profile();
  EXPECT_TRUE(ex.profile_rows().empty());
  ex.enable_profiling(false);
  ex.run("forward");
  EXPECT_TRUE(ex.profile_rows().empty());
}

// Split cuts each piece at its own column offset; GeluGrad is dout * gelu'(x), in that order.
TEST(Executor, SplitAndGeluGradTakeTheirOperandsInOrder) {
  const auto F = fb::DType::F32;
  Module m = Module::from_bytes(build({{"x", K::Input, F, {2, 3}}, {"dout", K::Input, F, {2}},
                                       {"y0", K::Activation, F, {2, 1}}, {"y1", K::Activation, F, {2, 2}},
                                       {"dx", K::Activation, F, {2}}},
                                      {{"forward",
                                        {{O::Split, {0}, {2, 3}, {2, 3, 1, 2}}, {O::GeluGrad, {1, 2}, {4}, {2}}},
                                        4}}),
                                "split.kiln");
  Executor ex(m);
  const float x[6] = {0, 1, 2, 0, 4, 5};  // y0 = {0, 0}, where gelu'(0) = 0.5 exactly
  for (int i = 0; i < 6; ++i) ex.f32(0)[i] = x[i];
  ex.f32(1)[0] = 2.0f, ex.f32(1)[1] = 4.0f;
  ex.run("forward");
  EXPECT_EQ(ex.f32(2)[0], 0.0f);
  EXPECT_EQ(ex.f32(2)[1], 0.0f);
  const float y1[4] = {1, 2, 4, 5};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(ex.f32(3)[i], y1[i]) << i;
  EXPECT_FLOAT_EQ(ex.f32(4)[0], 1.0f);
  EXPECT_FLOAT_EQ(ex.f32(4)[1], 2.0f);
}

// AdamW's moments are fp32 optimizer state: a bf16 one is refused, as is (under ZeRO-1, which
// keeps a slice of them) a moment in another slot than its own.
TEST(Executor, AdamWMomentsAreFp32AndInTheirOwnSlots) {
  std::vector<Buf> bufs = adamw_buffers(fb::DType::BF16);
  bufs[2].dtype = fb::DType::BF16;
  Module bf = Module::from_bytes(build(bufs, {{"opt", {adamw(true, false)}, 0}}), "bfm.kiln");
  EXPECT_EQ(error_of([&] { Executor ex(bf); }),
            "bfm.kiln: program opt, instr 0 (AdamW): output buffer 2 holds 4 BF16, needs 4 F32");
  Ins swapped = adamw(true, false);
  swapped.out = {0, 3, 2};
  Module m = Module::from_bytes(build(adamw_buffers(fb::DType::BF16), {{"opt", {adamw(true, false)}, 0}, {"bad", {swapped}, 0}},
                                      {{"w", 0, 1, 2, 3}}),
                                "zero.kiln");
  EXPECT_EQ(error_of([&] { Executor ex(m, {"opt"}, {{}, {{1, 3}}}); }), "(no error)");
  EXPECT_EQ(error_of([&] { Executor ex(m, {"bad"}); }), "(no error)");  // whole moments: any slot fits
  EXPECT_EQ(error_of([&] { Executor ex(m, {"bad"}, {{}, {{1, 3}}}); }),
            "zero.kiln: program bad, instr 0 (AdamW): --zero 1 keeps a slice of the AdamW moments, and this "
            "instruction uses one other than as its parameter's AdamW update");
}

}  // namespace
}  // namespace kiln
