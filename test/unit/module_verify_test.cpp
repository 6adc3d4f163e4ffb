// Module::verify's checks one field at a time: a small valid module described by a struct, one
// field of it changed, and the exact error the loader gives (or none, at a bound that is allowed).
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "runtime/module.h"

namespace kiln {
namespace {

using K = fb::BufferKind;
using D = fb::DType;
using O = fb::OpCode;

struct BufSpec {
  std::string name;
  K kind;
  D dtype;
  std::vector<int64_t> shape;
  std::optional<uint64_t> offset = {}, size = {};  // unset: packed (state first), numel x dtype
  bool has_shape = true;
};
struct InstrSpec {
  O op;
  std::vector<uint32_t> in, out;
  std::vector<int64_t> ints;
  bool has_ints = true;
};
struct ProgSpec {
  std::string name;
  std::vector<InstrSpec> instrs;
  uint32_t result;
};
struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  uint32_t value, grad, adam_m, adam_v;
  int32_t compute_copy = -1;
  float init_std = 0.02f;
};
struct FnSpec {
  std::string symbol;
  uint32_t grid = 1, block = 1;
};
struct KernelSpec {
  std::string symbol = "k0_f", kind = "elementwise";
  std::vector<int64_t> operand_numel;
  std::vector<D> operand_dtype;
  std::optional<std::vector<uint32_t>> zero_operands = {};
  std::vector<FnSpec> functions;
  uint64_t cuda_scratch_bytes = 0;
};
struct Spec {
  // n_layer, n_head, n_embd, vocab_size, block_size, batch_size, seq_len
  int L = 1, H = 1, C = 4, V = 16, Tmax = 8, B = 1, T = 8;
  std::string precision = "fp32", target = "cpu";
  // out = a + b, as runtime_test's add_module
  std::vector<BufSpec> bufs = {{"a", K::Input, D::F32, {4}}, {"b", K::Input, D::F32, {4}},
                               {"out", K::Activation, D::F32, {4}}};
  std::vector<ParamSpec> params;
  std::vector<ProgSpec> progs = {{"forward", {{O::Add, {0, 1}, {2}, {4}}}, 2}};
  std::vector<KernelSpec> kernels;
  std::vector<std::pair<uint32_t, uint32_t>> resources;  // a cuda image's (registers, shared bytes)
  bool has_programs = true;
  uint64_t crc32 = 1;  // 0: the field left out
};

std::vector<uint8_t> build(const Spec& s) {
  flatbuffers::FlatBufferBuilder fbb;
  // The state region first, then the activations, each 256-byte aligned.
  std::vector<uint64_t> offset(s.bufs.size()), size(s.bufs.size());
  uint64_t at = 0, state = 0, end = 0;
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) state = at;
    for (size_t i = 0; i < s.bufs.size(); ++i) {
      const BufSpec& b = s.bufs[i];
      if ((b.kind == K::Activation) != (pass == 1)) continue;
      int64_t n = 1;
      for (int64_t d : b.shape) n *= d;
      size[i] = b.size.value_or(uint64_t(n) * dtype_bytes(b.dtype));
      offset[i] = b.offset.value_or(at);
      at = offset[i] + (size[i] + 255) / 256 * 256;
      end = std::max(end, at);
    }
  }
  std::vector<flatbuffers::Offset<fb::Buffer>> bufs;
  for (size_t i = 0; i < s.bufs.size(); ++i)
    bufs.push_back(fb::CreateBufferDirect(fbb, s.bufs[i].name.c_str(), s.bufs[i].kind, s.bufs[i].dtype,
                                          s.bufs[i].has_shape ? &s.bufs[i].shape : nullptr, offset[i], size[i]));
  std::vector<flatbuffers::Offset<fb::Parameter>> params;
  for (const ParamSpec& p : s.params)
    params.push_back(fb::CreateParameterDirect(fbb, p.name.c_str(), &p.shape, fb::Init::Normal, p.init_std, true, p.value,
                                               p.grad, p.adam_m, p.adam_v, p.compute_copy));
  std::vector<flatbuffers::Offset<fb::Program>> progs;
  for (const ProgSpec& p : s.progs) {
    std::vector<flatbuffers::Offset<fb::Instr>> instrs;
    for (const InstrSpec& i : p.instrs)
      instrs.push_back(fb::CreateInstrDirect(fbb, i.op, &i.in, &i.out, i.has_ints ? &i.ints : nullptr, nullptr, "test"));
    progs.push_back(fb::CreateProgramDirect(fbb, p.name.c_str(), &instrs, p.result, end - state));
  }
  std::vector<flatbuffers::Offset<fb::Kernel>> kernels;
  for (const KernelSpec& k : s.kernels) {
    std::vector<flatbuffers::Offset<flatbuffers::String>> ops = {fbb.CreateString("add")};
    std::vector<flatbuffers::Offset<fb::CudaFunction>> fns;
    for (const FnSpec& f : k.functions) fns.push_back(fb::CreateCudaFunctionDirect(fbb, f.symbol.c_str(), f.grid, f.block));
    std::vector<int8_t> dtypes;
    for (D d : k.operand_dtype) dtypes.push_back(int8_t(d));
    kernels.push_back(fb::CreateKernel(
        fbb, fbb.CreateString(k.symbol), fbb.CreateString("add"), fbb.CreateString(k.kind), fbb.CreateVector(ops), 0,
        fbb.CreateVector(k.operand_numel), fbb.CreateVector(reinterpret_cast<const fb::DType*>(dtypes.data()), dtypes.size()),
        0, 0, 0, 0, 1, 0, true, k.functions.empty() ? 0 : fbb.CreateVector(fns),
        k.zero_operands ? fbb.CreateVector(*k.zero_operands) : 0, k.cuda_scratch_bytes));
  }
  std::vector<flatbuffers::Offset<fb::CudaImage>> images;
  if (!s.resources.empty()) {
    std::vector<flatbuffers::Offset<fb::FunctionResources>> res;
    for (auto [regs, shared] : s.resources) res.push_back(fb::CreateFunctionResourcesDirect(fbb, "k0_f", regs, shared));
    images.push_back(fb::CreateCudaImageDirect(fbb, "sm_90", nullptr, &res));
  }
  auto model = fb::CreateModelDirect(fbb, s.L, s.H, s.C, s.V, s.Tmax, s.B, s.T, s.precision.c_str(), s.target.c_str(),
                                     "test.toml");
  fb::FinishModuleBuffer(
      fbb, fb::CreateModuleDirect(fbb, kModuleFormatVersion, "test", model, end, &bufs, &params,
                                  s.has_programs ? &progs : nullptr, state, end - state, end - state, "none",
                                  s.kernels.empty() ? nullptr : &kernels, nullptr, nullptr,
                                  images.empty() ? nullptr : &images, true, uint32_t(s.crc32)));
  std::vector<uint8_t> bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
  if (s.crc32) seal_module(bytes);
  return bytes;
}

// The loader's error for the module, "" when it loads.
std::string error_of(const Spec& s) {
  try {
    Module::from_bytes(build(s), "m.kiln");
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

// A module with one parameter and its four state buffers (2..5; out is 6).
Spec with_param(const std::string& name, const std::vector<int64_t>& shape) {
  Spec s;
  for (K k : {K::Parameter, K::Gradient, K::AdamM, K::AdamV})
    s.bufs.insert(s.bufs.end() - 1, BufSpec{name + "." + fb::EnumNameBufferKind(k), k, D::F32, shape});
  s.progs = {{"forward", {{O::Add, {0, 1}, {6}, {4}}}, 6}};
  s.params = {{name, shape, 2, 3, 4, 5}};
  return s;
}
Spec with_wte() { return with_param("wte.weight", {16, 4}); }  // V x C

TEST(ModuleVerify, TheBaseModulesLoad) {
  EXPECT_EQ(error_of(Spec{}), "");
  EXPECT_EQ(error_of(with_wte()), "");
}

TEST(ModuleVerify, BufferFields) {
  Spec s;
  s.bufs[1].has_shape = false;
  EXPECT_EQ(error_of(s), "m.kiln: buffers[1]: has no shape");
  s = {};
  s.bufs[1].size = 12;
  EXPECT_EQ(error_of(s), "m.kiln: buffers[1]: size 12 does not match its shape and dtype");
  s = {};
  s.bufs[1].offset = 384;  // inside the arena, but not 256-aligned
  EXPECT_EQ(error_of(s), "m.kiln: buffers[1]: offset 384 is misaligned or outside the arena");
  // A buffer may end exactly where the arena does: out [64] fills its 256 bytes.
  s = {};
  s.bufs[2].shape = {64};
  s.progs[0].instrs[0].ints = {64};
  s.bufs[0].shape = s.bufs[1].shape = {64};
  EXPECT_EQ(error_of(s), "");
}

TEST(ModuleVerify, ABufferIndexOnePastTheLast) {
  Spec s;
  s.progs[0].result = 3;
  EXPECT_EQ(error_of(s), "m.kiln: program forward: result: buffer index 3 out of range");
}

TEST(ModuleVerify, ParameterNamesAndInitStd) {
  Spec s = with_wte();
  s.params[0].name = "";
  EXPECT_EQ(error_of(s), "m.kiln: parameters[0]: has an empty name");
  s = with_wte();
  s.params[0].name = "wte\x7fweight";  // DEL, a control byte past the C0 ones
  EXPECT_EQ(error_of(s), "m.kiln: parameters[0]: name 'wte\\x7Fweight' holds a control byte");
  s = with_wte();
  s.params[0].init_std = -1;
  EXPECT_EQ(error_of(s), "m.kiln: parameters[0]: init_std -1.000000 is not a finite number >= 0");
  s.params[0].init_std = 0;  // a Zeros or Ones parameter's
  EXPECT_EQ(error_of(s), "");
}

// A parameter named h.<digits>.* is of that layer (leading zeros too); "h..w" is of none.
TEST(ModuleVerify, ParameterLayers) {
  Spec s = with_param("h.1.w", {4});
  EXPECT_EQ(error_of(s), "m.kiln: parameters 'h.1.w': is no layer of the model's n_layer 1");
  s = with_param("h.00.w", {4});
  EXPECT_EQ(error_of(s), "");
  s = with_param("h..w", {4});
  s.L = 2;
  EXPECT_EQ(error_of(s), "");
  s = with_param("h.0.w", {4});
  s.L = 2;
  EXPECT_EQ(error_of(s), "m.kiln: model: n_layer is 2 but the parameters (h.N.*) are of 1 layer");
}

TEST(ModuleVerify, ParameterStateBuffers) {
  Spec s = with_wte();
  s.params[0].grad = s.params[0].value;
  EXPECT_EQ(error_of(s), "m.kiln: parameters[0]: buffer 2 is two of its state buffers");
  // A compute copy in fp32 (mixed precision keeps bf16 copies only).
  s = with_wte();
  s.bufs.insert(s.bufs.end() - 1, BufSpec{"wte.copy", K::ComputeCopy, D::F32, {16, 4}});
  s.progs = {{"forward", {{O::Add, {0, 1}, {7}, {4}}}, 7}};
  s.params[0].compute_copy = 6;
  EXPECT_EQ(error_of(s), "m.kiln: parameters[0]: compute copy must be a BF16 ComputeCopy buffer");
}

TEST(ModuleVerify, KernelInstructionIndexOnePastTheLast) {
  Spec s;
  s.progs[0].instrs[0] = {O::Kernel, {0, 1}, {2}, {0}};
  EXPECT_EQ(error_of(s), "m.kiln: program forward, instr 0: kernel index 0 out of range (0 kernels)");
}

TEST(ModuleVerify, InstructionOpcodesAndInts) {
  Spec s;
  s.progs[0].instrs[0].op = O(uint16_t(O::MAX) + 1);
  EXPECT_EQ(error_of(s), "m.kiln: program forward, instr 0: unknown opcode");
  s = {};
  s.progs[0].instrs[0].has_ints = false;
  EXPECT_EQ(error_of(s), "m.kiln: program forward, instr 0: missing operands");
  s = {};
  s.progs[0].instrs[0] = {O::Concat, {0, 1}, {2}, {4, 4}};  // at least 3
  EXPECT_EQ(error_of(s), "m.kiln: program forward, instr 0: Concat carries 2 ints, not at least 3");
}

TEST(ModuleVerify, KernelTables) {
  Spec s;
  KernelSpec k;
  k.operand_numel = {4, 4}, k.operand_dtype = {D::F32, D::F32}, k.zero_operands = std::vector<uint32_t>{2};
  s.kernels = {k};
  EXPECT_EQ(error_of(s), "m.kiln: kernels[0]: zero_operands names operand 2 of its 2");
  s.kernels[0].zero_operands = {{1}};
  EXPECT_EQ(error_of(s), "");
  // A launch of 1024 threads a block is the most a GPU takes; a workspace of 1 TiB the most it has.
  s.kernels[0].functions = {{"k0_f", 1, 1024}};
  s.kernels[0].cuda_scratch_bytes = uint64_t(1) << 40;
  EXPECT_EQ(error_of(s), "");
  s.kernels[0].functions = {{"k0_f", 1, 1025}};
  EXPECT_EQ(error_of(s), "m.kiln: kernels[0]: k0_f launches with grid 1 and block 1025 (a grid of 1 to 2^31 - 1 "
                         "blocks of 1 to 1024 threads)");
  s.kernels[0].functions = {{"k0_f", 1, 1}};
  s.kernels[0].cuda_scratch_bytes = (uint64_t(1) << 40) + 1;
  EXPECT_EQ(error_of(s), "m.kiln: kernels[0]: cuda_scratch_bytes 1099511627777 is more than a GPU has (1 TiB)");
}

// ptxas's figures: 255 registers a thread and 256 KiB of shared memory pass (to the next check,
// the images' target), one more does not.
TEST(ModuleVerify, CudaImageResources) {
  Spec s;
  s.resources = {{255, 256 * 1024}};
  EXPECT_EQ(error_of(s), "m.kiln: model: target is cpu but the module's kernels are compiled for cuda");
  s.resources = {{256, 0}};
  EXPECT_EQ(error_of(s), "m.kiln: cuda_images: k0_f: 256 registers a thread and 0 shared bytes are more than a GPU has");
  s.resources = {{0, 256 * 1024 + 1}};
  EXPECT_EQ(error_of(s), "m.kiln: cuda_images: k0_f: 0 registers a thread and 262145 shared bytes are more than a GPU has");
}

TEST(ModuleVerify, ModelRecord) {
  Spec s;
  s.has_programs = false;
  EXPECT_EQ(error_of(s), "m.kiln: module: missing model, buffers, parameters or programs");
  s = {};
  s.bufs[0].dtype = D::BF16;
  EXPECT_EQ(error_of(s), "m.kiln: model: precision is fp32 but the module has bf16 buffers");
  s = {};
  s.B = 0;
  EXPECT_EQ(error_of(s), "m.kiln: model: B=0 T=8 V=16 L=1 H=1 C=4 Tmax=8: sizes must be positive, with T <= Tmax");
}

// A decode program's key/value cache [2, B, n_head, T, C / n_head] is read and written by its
// one DecodeAttention only.
Spec decode_spec() {
  Spec s;
  s.bufs = {{"qkv", K::Input, D::F32, {1, 12}},   {"token", K::Input, D::F32, {1}},
            {"position", K::Input, D::I32, {1}}, {"h.0.attn/kv_cache", K::Activation, D::F32, {2, 1, 1, 8, 4}},
            {"out", K::Activation, D::F32, {1, 4}}};
  s.bufs[1].dtype = D::I32;
  s.progs = {{"decode", {{O::DecodeAttention, {0, 3, 2}, {4}, {1, 4, 1, 8, 1}}}, 4}};
  return s;
}

// decode reads one token per row: B of them.
TEST(ModuleVerify, DecodeTokenPerRow) {
  Spec s = decode_spec();
  s.B = 2;
  s.bufs[3].shape = {2, 2, 1, 8, 4};
  EXPECT_EQ(error_of(s), "m.kiln: buffers[1] 'token': holds 1 I32, not 2 I32");
  s.bufs[1].shape = {2};
  EXPECT_EQ(error_of(s), "");
}

TEST(ModuleVerify, KeyValueCacheIsItsDecodeAttentionsOwn) {
  Spec s = decode_spec();
  EXPECT_EQ(error_of(s), "");
  s.progs[0].instrs.push_back(s.progs[0].instrs[0]);
  EXPECT_EQ(error_of(s), "m.kiln: program decode: key/value cache buffers[3]: serves two decode attentions");
  s = decode_spec();
  s.progs[0].instrs.insert(s.progs[0].instrs.begin(), {O::Copy, {0}, {3}, {4}});
  EXPECT_EQ(error_of(s), "m.kiln: program decode: key/value cache buffers[3]: is an instruction's output (only its "
                         "decode attention may write it)");
}

// A prefill program fills the caches decode reads: one with none fills nothing.
// M = T positions a call are the most it may read (those below T).
TEST(ModuleVerify, PrefillWithoutCaches) {
  const std::string no_caches = "m.kiln: program prefill: its 0 key/value caches are not the ones program decode reads "
                                "(0 caches, at the same offsets: plan both with kiln-plan-buffers)";
  for (int64_t M : {1, 8, 9}) {
    Spec s;
    s.bufs.push_back({"prefill_tokens", K::Input, D::I32, {1, M}});
    s.bufs.push_back({"prefill_positions", K::Input, D::I32, {M}});
    s.bufs.push_back({"position", K::Input, D::I32, {1}});
    s.progs[0].name = "prefill";
    EXPECT_EQ(error_of(s), M <= 8 ? no_caches
                                  : "m.kiln: program prefill: reads 9 tokens at 9 positions: it needs B x M tokens at M "
                                    "positions, 1 <= M <= T = 8");
  }
}

TEST(ModuleVerify, BytesAfterTheTables) {
  std::vector<uint8_t> bytes = build(Spec{});
  const size_t end = bytes.size();
  bytes.push_back(0);
  try {
    Module::from_bytes(bytes, "m.kiln");
    FAIL() << "accepted a byte after the module";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "m.kiln: 1 byte after the module's end at byte " + std::to_string(end) +
                                         " (a damaged Kiln module: compile it again with kilnc)");
  }
}

TEST(ModuleVerify, SealNeedsTheCrcField) {
  Spec s;
  s.crc32 = 0;
  std::vector<uint8_t> bytes = build(s);
  try {
    seal_module(bytes);
    FAIL() << "sealed a module without a crc32 field";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "seal_module: the module was built without its crc32 field");
  }
}

TEST(HumanBytes, UnitsFromBytesToTiB) {
  EXPECT_EQ(human_bytes(1023), "1023 B");
  EXPECT_EQ(human_bytes(1024), "1.00 KiB");
  EXPECT_EQ(human_bytes(1536.0 * 1024), "1.50 MiB");
  EXPECT_EQ(human_bytes(1024.0 * 1024 * 1024 * 1024 * 1024), "1024.00 TiB");  // no unit past TiB
}

}  // namespace
}  // namespace kiln
