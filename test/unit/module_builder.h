// A module built in memory from a list of buffers, programs and parameters, laid out as kilnc
// would lay it out (no reuse of activations), for tests of the runtime that need an Executor.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "runtime/module.h"

namespace kiln::testing {

using O = fb::OpCode;
using K = fb::BufferKind;

struct Buf {
  const char* name;
  K kind;
  fb::DType dtype;
  std::vector<int64_t> shape;
};
struct Ins {
  O op;
  std::vector<uint32_t> in, out;
  std::vector<int64_t> ints;
  std::vector<float> floats = {};
  bool has_floats = false;
};
struct Prog {
  const char* name;
  std::vector<Ins> instrs;
  uint32_t result;
};
struct Param {  // buffer indices
  const char* name;
  uint32_t value, grad, m, v;
  bool decay = true;
};

// A module of the given buffers (the state region's first, then the activations, each 256-byte
// aligned), parameters and programs, as kilnc would lay it out (no reuse of activations).
inline std::vector<uint8_t> build(const std::vector<Buf>& bufs, const std::vector<Prog>& progs,
                           const std::vector<Param>& params = {}) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<fb::Buffer>> fbufs;
  uint64_t offset = 0, state = 0;
  bool seen_activation = false;
  for (const Buf& b : bufs) {
    if (b.kind == K::Activation && !seen_activation) seen_activation = true, state = offset;
    int64_t n = 1;
    for (int64_t d : b.shape) n *= d;
    const uint64_t size = uint64_t(n) * dtype_bytes(b.dtype);
    fbufs.push_back(fb::CreateBufferDirect(fbb, b.name, b.kind, b.dtype, &b.shape, offset, size));
    offset += (size + 255) / 256 * 256;
  }
  if (!seen_activation) state = offset;
  std::vector<flatbuffers::Offset<fb::Parameter>> fparams;
  for (const Param& p : params)
    fparams.push_back(fb::CreateParameterDirect(fbb, p.name, &bufs[p.value].shape, fb::Init::Normal, 0.02f, p.decay,
                                                p.value, p.grad, p.m, p.v, -1));
  std::vector<flatbuffers::Offset<fb::Program>> fprogs;
  for (const Prog& p : progs) {
    std::vector<flatbuffers::Offset<fb::Instr>> instrs;
    for (const Ins& i : p.instrs)
      instrs.push_back(fb::CreateInstrDirect(fbb, i.op, &i.in, &i.out, &i.ints, i.has_floats ? &i.floats : nullptr, "test"));
    fprogs.push_back(fb::CreateProgramDirect(fbb, p.name, &instrs, p.result, offset - state));
  }
  const bool bf16 = std::any_of(bufs.begin(), bufs.end(), [](const Buf& b) { return b.dtype == fb::DType::BF16; });
  auto model = fb::CreateModelDirect(fbb, 1, 1, 4, 16, 8, 1, 8, bf16 ? "bf16" : "fp32", "cpu", "test.toml");
  fb::FinishModuleBuffer(fbb, fb::CreateModuleDirect(fbb, kModuleFormatVersion, "test", model, offset, &fbufs, &fparams,
                                                      &fprogs, state, offset - state, offset - state, "none", nullptr,
                                                      nullptr, nullptr, nullptr, true, /*crc32=*/1));
  std::vector<uint8_t> bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
  seal_module(bytes);
  return bytes;
}

}  // namespace kiln::testing
