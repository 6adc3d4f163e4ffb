// Module loading. Verification happens in two layers: the FlatBuffers verifier proves every
// offset lies inside the file, then verify() checks what the executor relies on (buffer
// indices, sizes inside the arena, one instruction's operands against its opcode).
#include "runtime/module.h"

#include <string>

#include "runtime/embedded.h"
#include "runtime/error.h"
#include "runtime/file_io.h"
#include "runtime/plan_verifier.h"
#include "runtime/shape.h"

namespace kiln {

size_t dtype_bytes(fb::DType t) { return t == fb::DType::BF16 ? 2 : 4; }
const char* dtype_name(fb::DType t) { return fb::EnumNameDType(t); }
int64_t numel(const fb::Buffer& b) {
  int64_t n = 1;
  if (b.shape())
    for (int64_t d : *b.shape()) n *= d;
  return n;
}

Module Module::load(const std::string& path) {
  if (auto embedded = read_embedded_module(path)) return from_bytes(std::move(*embedded), path);
  return from_bytes(read_file(path), path);
}

Module Module::from_bytes(std::vector<uint8_t> bytes, std::string source) {
  Module m;
  m.bytes_ = std::move(bytes);
  m.source_ = std::move(source);
  if (m.bytes_.size() < 8 || !fb::ModuleBufferHasIdentifier(m.bytes_.data()))
    throw Error(m.source_ + ": not a Kiln module (no 'KILN' identifier; compile one with kilnc)");
  flatbuffers::Verifier verifier(m.bytes_.data(), m.bytes_.size());
  if (!fb::VerifyModuleBuffer(verifier))
    throw Error(m.source_ + ": corrupt or truncated module (FlatBuffers verification failed)");
  m.fb_ = fb::GetModule(m.bytes_.data());
  m.verify();
  verify_plan(m);
  return m;
}

const fb::Program* Module::program(const std::string& name) const {
  if (fb_->programs())
    for (const fb::Program* p : *fb_->programs())
      if (p->name() && p->name()->str() == name) return p;
  return nullptr;
}

void Module::verify() const {
  auto bad = [&](const std::string& where, const std::string& what) {
    throw Error(source_ + ": " + where + ": " + what);
  };
  if (fb_->format_version() != kModuleFormatVersion)
    bad("format_version", std::to_string(fb_->format_version()) + " is not " +
                              std::to_string(kModuleFormatVersion) + " (recompile with this kilnc)");
  if (!fb_->model() || !fb_->buffers() || !fb_->parameters() || !fb_->programs())
    bad("module", "missing model, buffers, parameters or programs");
  const uint32_t nbuf = fb_->buffers()->size();
  for (uint32_t i = 0; i < nbuf; ++i) {
    const fb::Buffer& b = buffer(i);
    std::string where = "buffers[" + std::to_string(i) + "]";
    if (!b.shape()) bad(where, "has no shape");
    // Overflow-checked: a crafted shape must not wrap around to a small size.
    uint64_t elements = 0, bytes = 0;
    if (!checked_numel({b.shape()->begin(), b.shape()->end()}, &elements) ||
        __builtin_mul_overflow(elements, uint64_t(dtype_bytes(b.dtype())), &bytes) || elements > uint64_t(INT64_MAX))
      bad(where, "shape " + shape_str({b.shape()->begin(), b.shape()->end()}) + " is negative or too large");
    if (b.size() != bytes)
      bad(where, "size " + std::to_string(b.size()) + " does not match its shape and dtype");
    if (b.size() > fb_->arena_size() || b.offset() > fb_->arena_size() - b.size() || b.offset() % 256 != 0)
      bad(where, "offset " + std::to_string(b.offset()) + " is misaligned or outside the arena");
  }
  auto check_index = [&](uint32_t idx, const std::string& where) {
    if (idx >= nbuf) bad(where, "buffer index " + std::to_string(idx) + " out of range");
  };
  for (uint32_t i = 0; i < fb_->parameters()->size(); ++i) {
    const fb::Parameter* p = fb_->parameters()->Get(i);
    std::string where = "parameters[" + std::to_string(i) + "]";
    if (!p->name() || !p->shape()) bad(where, "missing name or shape");
    if (p->compute_copy() >= 0) {
      check_index(uint32_t(p->compute_copy()), where);
      const fb::Buffer& copy = buffer(uint32_t(p->compute_copy()));
      if (copy.dtype() != fb::DType::BF16 || copy.kind() != fb::BufferKind::ComputeCopy)
        bad(where, "compute copy must be a BF16 ComputeCopy buffer");
    }
    for (uint32_t idx : {p->value(), p->grad(), p->adam_m(), p->adam_v()}) {
      check_index(idx, where);
      if (buffer(idx).dtype() != fb::DType::F32 ||
          uint64_t(numel(buffer(idx))) != uint64_t(numel(buffer(p->value()))))
        bad(where, "state buffers must be fp32 and of the parameter's size");
    }
  }
  for (const fb::Program* prog : *fb_->programs()) {
    if (!prog->name() || !prog->instrs()) bad("programs", "a program lacks a name or code");
    check_index(prog->result(), "program " + prog->name()->str() + ": result");
    for (uint32_t k = 0; k < prog->instrs()->size(); ++k) {
      const fb::Instr* ins = prog->instrs()->Get(k);
      std::string where = "program " + prog->name()->str() + ", instr " + std::to_string(k);
      if (ins->op() < fb::OpCode::MIN || ins->op() > fb::OpCode::MAX) bad(where, "unknown opcode");
      if (!ins->inputs() || !ins->outputs() || !ins->ints()) bad(where, "missing operands");
      for (uint32_t idx : *ins->inputs()) check_index(idx, where);
      for (uint32_t idx : *ins->outputs()) check_index(idx, where);
    }
  }
}

}  // namespace kiln
