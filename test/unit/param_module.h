// A module with parameters only, for runtime tests: each parameter gets value, grad, adam_m and
// adam_v buffers in the state region (256-byte aligned, no overlaps; optionally a bf16 compute
// copy), plus one activation after it; no programs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/module.h"

namespace kiln::testing {

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool decay;
};

struct ModelSpec {
  std::vector<ParamSpec> params = {{"wte.weight", {16, 4}, true},
                                   {"h.0.attn.c_attn.weight", {4, 12}, true},
                                   {"ln_f.weight", {4}, false}};
  int n_embd = 4;
  int batch_size = 1;
  std::string precision = "fp32";
  bool reverse_layout = false;  // lay the state buffers out in the opposite order (a re-plan)
  bool compute_copy = false;    // give the first parameter a bf16 compute copy (mixed precision)
};

inline std::vector<uint8_t> param_module(const ModelSpec& spec = {}) {
  flatbuffers::FlatBufferBuilder fbb;
  const fb::BufferKind kinds[4] = {fb::BufferKind::Parameter, fb::BufferKind::Gradient, fb::BufferKind::AdamM,
                                   fb::BufferKind::AdamV};
  struct Buf {
    std::string name;
    fb::BufferKind kind;
    std::vector<int64_t> shape;
    fb::DType dtype = fb::DType::F32;
  };
  std::vector<Buf> bufs;
  for (const ParamSpec& p : spec.params)
    for (fb::BufferKind k : kinds) bufs.push_back({p.name + "." + fb::EnumNameBufferKind(k), k, p.shape});
  if (spec.compute_copy)
    bufs.push_back({spec.params[0].name + ".bf16", fb::BufferKind::ComputeCopy, spec.params[0].shape, fb::DType::BF16});
  std::vector<uint64_t> offsets(bufs.size());
  uint64_t offset = 0;
  for (size_t n = 0; n < bufs.size(); ++n) {
    const size_t i = spec.reverse_layout ? bufs.size() - 1 - n : n;
    int64_t numel = 1;
    for (int64_t d : bufs[i].shape) numel *= d;
    offsets[i] = offset;
    offset += (uint64_t(numel) * dtype_bytes(bufs[i].dtype) + 255) / 256 * 256;
  }
  const uint64_t state = offset;
  std::vector<flatbuffers::Offset<fb::Buffer>> fbufs;
  for (size_t i = 0; i < bufs.size(); ++i) {
    int64_t numel = 1;
    for (int64_t d : bufs[i].shape) numel *= d;
    fbufs.push_back(fb::CreateBufferDirect(fbb, bufs[i].name.c_str(), bufs[i].kind, bufs[i].dtype, &bufs[i].shape,
                                           offsets[i], uint64_t(numel) * dtype_bytes(bufs[i].dtype)));
  }
  std::vector<int64_t> act_shape = {8};
  fbufs.push_back(fb::CreateBufferDirect(fbb, "act", fb::BufferKind::Activation, fb::DType::F32, &act_shape, state, 32));
  std::vector<flatbuffers::Offset<fb::Parameter>> params;
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const uint32_t b = uint32_t(4 * i);
    params.push_back(fb::CreateParameterDirect(fbb, spec.params[i].name.c_str(), &spec.params[i].shape, fb::Init::Normal,
                                               0.02f, spec.params[i].decay, b, b + 1, b + 2, b + 3,
                                               spec.compute_copy && i == 0 ? int32_t(4 * spec.params.size()) : -1));
  }
  std::vector<flatbuffers::Offset<fb::Program>> progs;
  auto model = fb::CreateModelDirect(fbb, 1, 1, spec.n_embd, 16, 8, spec.batch_size, 8, spec.precision.c_str(), "cpu",
                                     "test.toml");
  fb::FinishModuleBuffer(fbb, fb::CreateModuleDirect(fbb, kModuleFormatVersion, "test", model, state + 256, &fbufs, &params, &progs,
                                                      state, 256, 256, "none", nullptr, nullptr, nullptr, nullptr, true, /*crc32=*/1));
  std::vector<uint8_t> bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
  seal_module(bytes);
  return bytes;
}

}  // namespace kiln::testing
