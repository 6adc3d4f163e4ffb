// Module loading. Verification happens in two layers: the FlatBuffers verifier proves every
// offset lies inside the file, then verify() checks what the executor relies on (buffer
// indices, sizes inside the arena, one instruction's operands against its opcode).
#include "runtime/module.h"
#include "runtime/hyper_names.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "runtime/crc32.h"
#include "runtime/embedded.h"
#include "runtime/error.h"
#include "runtime/file_io.h"
#include "runtime/params.h"
#include "runtime/plan_verifier.h"
#include "runtime/shape.h"

namespace kiln {

size_t dtype_bytes(fb::DType t) { return t == fb::DType::BF16 ? 2 : 4; }
std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  char s[32];
  std::snprintf(s, sizeof s, u ? "%.2f %s" : "%.0f %s", bytes, units[u]);
  return s;
}

const char* dtype_name(fb::DType t) {
  const char* name = fb::EnumNameDType(t);  // "" past the enum (FlatBuffers does not check enums)
  return *name ? name : "unknown-dtype";
}
int64_t numel(const fb::Buffer& b) {
  int64_t n = 1;
  if (b.shape())
    for (int64_t d : *b.shape()) n *= d;
  return n;
}

Module Module::load(const std::string& path) {
  if (auto embedded = read_embedded_module(path)) return from_bytes(std::move(*embedded), path);
  // A regular file is told by its first bytes before it is read whole: a large file that is no
  // module (a data set, a disk image) is refused without reading it into memory first.
  std::vector<uint8_t> bytes;
  if (const std::string head = read_head(path, 256);
      head.size() >= 8 && !fb::ModuleBufferHasIdentifier(head.data()))
    bytes.assign(head.begin(), head.end());  // enough for the checks below, which all refuse it
  else
    bytes = read_file(path);
  if (bytes.size() < 8 || !fb::ModuleBufferHasIdentifier(bytes.data())) {
    // Another file Kiln knows, or text (a spec or IR given for the module kilnc compiles from
    // it), is named. (A JSON log, which starts with '{', is left to the tools that read logs.)
    const std::string kind = file_kind(path);
    if (!kind.empty() && kind != kModuleKind && kind != kExecutableKind)
      throw Error(path + ": is " + kind + ", not a Kiln module (kilnc compiles a spec into one)");
    const size_t n = std::min<size_t>(bytes.size(), 256);
    const bool text = n > 0 && bytes[0] != '{' && looks_like_text(bytes.data(), n);
    const std::string ext = std::filesystem::path(path).extension().string();
    if (text)
      throw Error(path + ": is text, not a Kiln module (kilnc compiles a .toml spec or .mlir IR into one" +
                  (ext == ".toml" || ext == ".mlir" ? ": kilnc " + path + " -o gpt2)" : std::string(")")));
    throw Error(path + ": not a Kiln module (no 'KILN' identifier; compile one with kilnc)");
  }
  return from_bytes(std::move(bytes), path);
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
  m.verify(verifier.GetComputedSize());  // first: a newer format's fields would lie past the tables this build knows
  // kilnc writes nothing after the tables; bytes past them are a damaged file (one appended
  // to, or two run together), not part of the module.
  if (const size_t end = verifier.GetComputedSize(); end != m.bytes_.size())
    throw Error(m.source_ + ": " + std::to_string(m.bytes_.size() - end) +
                (m.bytes_.size() - end == 1 ? " byte" : " bytes") + " after the module's end at byte " +
                std::to_string(end) + " (a damaged Kiln module: compile it again with kilnc)");
  verify_plan(m);
  return m;
}

std::vector<uint32_t> Module::kept_buffers(const fb::Program& program) const {
  std::vector<uint32_t> kept;
  const auto* kernels = fb_->kernels();
  for (const fb::Instr* ins : *program.instrs()) {
    if (ins->op() == fb::OpCode::DecodeAttention && ins->inputs()->size() > 1) kept.push_back(ins->inputs()->Get(1));
    if (ins->op() != fb::OpCode::Kernel || !kernels || ins->ints()->size() != 1 || ins->inputs()->size() < 2) continue;
    const int64_t k = ins->ints()->Get(0);
    if (k < 0 || k >= int64_t(kernels->size())) continue;
    const auto* kind = kernels->Get(uint32_t(k))->kind();
    if (kind && kind->str() == "decode_attention") kept.push_back(ins->inputs()->Get(1));
  }
  return kept;
}

const fb::Program* Module::program(const std::string& name) const {
  if (fb_->programs())
    for (const fb::Program* p : *fb_->programs())
      if (p->name() && p->name()->str() == name) return p;
  return nullptr;
}

namespace {
// Where the crc32 field's four bytes lie in a verified module; null if it has none.
const uint8_t* crc32_field(const uint8_t* bytes) {
  return reinterpret_cast<const flatbuffers::Table*>(fb::GetModule(bytes))->GetAddressOf(fb::Module::VT_CRC32);
}
}  // namespace

uint32_t module_crc32(const uint8_t* bytes, size_t size) {
  const uint8_t* field = crc32_field(bytes);
  if (!field) return crc32_update(0, bytes, size);
  const uint8_t zeros[4] = {};
  const size_t at = size_t(field - bytes);
  uint32_t crc = crc32_update(0, bytes, at);
  crc = crc32_update(crc, zeros, 4);
  return crc32_update(crc, field + 4, size - at - 4);
}

void seal_module(std::vector<uint8_t>& bytes) {
  const uint8_t* field = crc32_field(bytes.data());
  if (!field) throw Error("seal_module: the module was built without its crc32 field");
  const uint32_t crc = module_crc32(bytes.data(), bytes.size());
  std::memcpy(bytes.data() + (field - bytes.data()), &crc, 4);  // FlatBuffers scalars are little-endian
}

namespace {
// "A, B or C": an enum's names, for messages.
std::string list_enum(const char* const* names) {
  std::vector<std::string> all;
  for (; *names; ++names) all.push_back(*names);
  std::string text;
  for (size_t i = 0; i < all.size(); ++i) text += (i ? (i + 1 == all.size() ? " or " : ", ") : "") + all[i];
  return text;
}
}  // namespace

int instr_int_count(fb::OpCode op) {
  using O = fb::OpCode;
  switch (op) {
    case O::Embedding: case O::EmbeddingGrad: return 3;
    case O::Matmul: return 5;
    case O::Broadcast: case O::ReduceSum: case O::Transpose: case O::LayerNorm: case O::LayerNormGrad:
    case O::AdamW: return 2;
    case O::CrossEntropy: case O::CrossEntropyGrad: return 3;
    case O::Split: case O::Concat: return -3;
    case O::Attention: case O::AttentionGrad: return 4;
    case O::DecodeAttention: return 5;
    case O::GlobalNorm: return -1;
    case O::ReduceGradients: return -2;
    case O::ClipCoef: case O::WaitGradients: return 0;
    default: return 1;
  }
}

// What every reader of a module relies on (the executor, the sampler, kiln-inspect's reports):
// indices in range, the names and counts the reports print, and the model's sizes agreeing with
// the buffers the runtime fills from them. The executor checks each instruction's operands further.
void Module::verify(size_t tables_end) const {
  auto bad = [&](const std::string& where, const std::string& what) {
    throw Error(source_ + ": " + where + ": " + what);
  };
  if (fb_->format_version() != kModuleFormatVersion)
    bad("format_version", std::to_string(fb_->format_version()) + " is not " +
                              std::to_string(kModuleFormatVersion) + " (recompile with this kilnc)");
  // Before anything else is trusted: a flipped bit in an instruction's attributes, a buffer's
  // name or the machine code (loaded and run) would otherwise train on silently, or crash.
  // (Bytes past the tables are said next, by from_bytes.)
  if (module_crc32(bytes_.data(), tables_end) != fb_->crc32())
    bad("crc32", "the module's checksum does not match its bytes (a damaged module: compile it again with kilnc)");
  if (!fb_->model() || !fb_->buffers() || !fb_->parameters() || !fb_->programs())
    bad("module", "missing model, buffers, parameters or programs");
  const uint32_t nbuf = fb_->buffers()->size();
  std::set<std::string> hypers_seen;
  for (uint32_t i = 0; i < nbuf; ++i) {
    const fb::Buffer& b = buffer(i);
    std::string where = "buffers[" + std::to_string(i) + "]";
    if (!b.shape() || !b.name()) bad(where, !b.shape() ? "has no shape" : "has no name");
    if (b.dtype() < fb::DType::MIN || b.dtype() > fb::DType::MAX)
      bad(where, "dtype " + std::to_string(int(b.dtype())) + " is none of F32, I32, BF16");
    // (FlatBuffers checks no enum: a kind past it would be state that nothing fills, e.g. a
    // hyperparameter the trainer never sets, which the kernels then read as 0.)
    if (b.kind() < fb::BufferKind::MIN || b.kind() > fb::BufferKind::MAX)
      bad(where, "kind " + std::to_string(int(b.kind())) + " is none of " + list_enum(fb::EnumNamesBufferKind()));
    // Overflow-checked: a crafted shape must not wrap around to a small size.
    uint64_t elements = 0, bytes = 0;
    if (!checked_numel({b.shape()->begin(), b.shape()->end()}, &elements) ||
        __builtin_mul_overflow(elements, uint64_t(dtype_bytes(b.dtype())), &bytes) || elements > uint64_t(INT64_MAX))
      bad(where, "shape " + shape_str({b.shape()->begin(), b.shape()->end()}) + " is negative or too large");
    if (b.size() != bytes)
      bad(where, "size " + std::to_string(b.size()) + " does not match its shape and dtype");
    if (b.size() > fb_->arena_size() || b.offset() > fb_->arena_size() - b.size() || b.offset() % 256 != 0)
      bad(where, "offset " + std::to_string(b.offset()) + " is misaligned or outside the arena");
    // The trainer sets hyperparameters by name, and one it does not know would keep whatever the
    // arena held: the names kiln.hyper's verifier accepts.
    if (b.kind() == fb::BufferKind::Hyper && !is_hyper_name(b.name()->str()))
      bad(where, "hyperparameter '" + b.name()->str() + "' is none of " + hyper_names_listed());
    if (b.kind() == fb::BufferKind::Hyper && !hypers_seen.insert(b.name()->str()).second)
      bad(where, "hyperparameter '" + b.name()->str() + "' has a buffer already (the trainer sets only one)");
  }
  auto check_index = [&](uint32_t idx, const std::string& where) {
    if (idx >= nbuf) bad(where, "buffer index " + std::to_string(idx) + " out of range");
  };
  std::map<std::string, uint32_t> parameter_names;
  std::map<uint32_t, uint32_t> state_owner;  // buffer -> the parameter whose state it is
  for (uint32_t i = 0; i < fb_->parameters()->size(); ++i) {
    const fb::Parameter* p = fb_->parameters()->Get(i);
    std::string where = "parameters[" + std::to_string(i) + "]";
    if (!p->name() || !p->shape()) bad(where, "missing name or shape");
    // Weights files and checkpoints name tensors by it, and --save writes the shape.
    if (p->name()->size() == 0) bad(where, "has an empty name");
    // (and messages print it: no control bytes, as kiln.parameter's verifier requires)
    if (std::any_of(p->name()->begin(), p->name()->end(), [](char c) { return uint8_t(c) < 0x20 || c == 0x7f; }))
      bad(where, "name '" + one_line(p->name()->str()) + "' holds a control byte");
    if (auto [it, fresh] = parameter_names.emplace(p->name()->str(), i); !fresh)
      bad(where, "name '" + it->first + "' is parameters[" + std::to_string(it->second) + "]'s too");
    // (The checkpoint and --save take a parameter's bytes by this shape.)
    const std::vector<int64_t> shape(p->shape()->begin(), p->shape()->end());
    if (p->value() < nbuf) {
      const std::vector<int64_t> value(buffer(p->value()).shape()->begin(), buffer(p->value()).shape()->end());
      if (shape != value) bad(where, "shape " + shape_str(shape) + " is not its value buffer's " + shape_str(value));
    }
    if (p->init() < fb::Init::MIN || p->init() > fb::Init::MAX)
      bad(where, "init " + std::to_string(int(p->init())) + " is none of " + list_enum(fb::EnumNamesInit()));
    if (!std::isfinite(p->init_std()) || p->init_std() < 0)
      bad(where, "init_std " + std::to_string(p->init_std()) + " is not a finite number >= 0");
    // Each parameter's value, gradient, moments and compute copy are its own: two parameters on one
    // buffer would train (and load, and save) as one, silently.
    {
      std::vector<uint32_t> owned = {p->value(), p->grad(), p->adam_m(), p->adam_v()};
      if (p->compute_copy() >= 0) owned.push_back(uint32_t(p->compute_copy()));
      for (uint32_t idx : owned)
        if (auto [it, fresh] = state_owner.emplace(idx, i); !fresh)
          bad(where, "buffer " + std::to_string(idx) + " is " +
                         (it->second == i ? std::string("two of its state buffers")
                                          : "parameters[" + std::to_string(it->second) + "]'s already"));
    }
    if (p->compute_copy() >= 0) {
      check_index(uint32_t(p->compute_copy()), where);
      const fb::Buffer& copy = buffer(uint32_t(p->compute_copy()));
      if (copy.dtype() != fb::DType::BF16 || copy.kind() != fb::BufferKind::ComputeCopy)
        bad(where, "compute copy must be a BF16 ComputeCopy buffer");
    }
    using K = fb::BufferKind;
    const std::pair<uint32_t, K> fields[] = {{p->value(), K::Parameter}, {p->grad(), K::Gradient},
                                             {p->adam_m(), K::AdamM}, {p->adam_v(), K::AdamV}};
    for (const auto& [idx, kind] : fields) {
      check_index(idx, where);
      const fb::Buffer& b = buffer(idx);
      if (b.dtype() != fb::DType::F32 || uint64_t(numel(b)) != uint64_t(numel(buffer(p->value()))))
        bad(where, "state buffers must be fp32 and of the parameter's size");
      if (b.kind() != kind || b.offset() + b.size() > fb_->state_size())
        bad(where, "buffer " + std::to_string(idx) + " is not of kind " + fb::EnumNameBufferKind(kind) +
                       " in the state region");
    }
  }
  const uint32_t nkernels = fb_->kernels() ? fb_->kernels()->size() : 0;
  const std::string target = fb_->model()->target() ? fb_->model()->target()->str() : "";
  if (target != "cpu" && target != "cuda") bad("model", "target '" + one_line(target) + "' is neither cpu nor cuda");
  const bool cuda = target == "cuda";
  std::set<std::string> program_names;
  for (const fb::Program* prog : *fb_->programs()) {
    if (!prog->name() || !prog->instrs()) bad("programs", "a program lacks a name or code");
    // Programs are found by name (the first of it): a second "micro_step" before the real one
    // would train with another program's code.
    if (!program_names.insert(prog->name()->str()).second)
      bad("programs", "two programs are named '" + one_line(prog->name()->str()) + "'");
    check_index(prog->result(), "program " + prog->name()->str() + ": result");
    // The trainer reads what micro_step returns as the loss and optimizer_step's as the gradient
    // norm, and evaluation forward's as the loss (of a training module: kilnc's programs): one fp32
    // value that the program itself writes. Any other buffer would be reported as the loss, silently.
    const std::string& pname = prog->name()->str();
    if (pname == "micro_step" || pname == "optimizer_step" || (pname == "forward" && program("micro_step"))) {
      const std::string where = "program " + pname + ": result";
      const uint32_t r = prog->result();
      const fb::Buffer& rb = buffer(r);
      bool written = false;
      for (const fb::Instr* ins : *prog->instrs())
        if (ins->outputs() && std::find(ins->outputs()->begin(), ins->outputs()->end(), r) != ins->outputs()->end())
          written = true;
      if (!written) bad(where, "buffer " + std::to_string(r) + " '" + one_line(rb.name()->str()) + "' is no instruction's output");
      if (rb.dtype() != fb::DType::F32 || numel(rb) != 1)
        bad(where, "buffer " + std::to_string(r) + " '" + one_line(rb.name()->str()) + "' holds " +
                       std::to_string(numel(rb)) + " " + dtype_name(rb.dtype()) + ", not one F32 value");
    }
    for (uint32_t k = 0; k < prog->instrs()->size(); ++k) {
      const fb::Instr* ins = prog->instrs()->Get(k);
      std::string where = "program " + prog->name()->str() + ", instr " + std::to_string(k);
      if (ins->op() < fb::OpCode::MIN || ins->op() > fb::OpCode::MAX) bad(where, "unknown opcode");
      if (ins->phase() < fb::Phase::MIN || ins->phase() > fb::Phase::MAX)
        bad(where, "phase " + std::to_string(int(ins->phase())) + " is none of " + list_enum(fb::EnumNamesPhase()));
      if (!ins->inputs() || !ins->outputs() || !ins->ints()) bad(where, "missing operands");
      for (uint32_t idx : *ins->inputs()) check_index(idx, where);
      for (uint32_t idx : *ins->outputs()) check_index(idx, where);
      const int want = instr_int_count(ins->op());
      const int have = int(ins->ints()->size());
      if (want >= 0 ? have != want : have < -want)
        bad(where, std::string(fb::EnumNameOpCode(ins->op())) + " carries " + std::to_string(have) + " ints, not " +
                       (want >= 0 ? "" : "at least ") + std::to_string(want >= 0 ? want : -want));
      // The device executor (runtime/device) runs these only: kilnc fuses every other op of a
      // cuda module into a generated kernel.
      using O = fb::OpCode;
      if (cuda && ins->op() != O::Kernel && ins->op() != O::GlobalNorm && ins->op() != O::ReduceGradients &&
          ins->op() != O::WaitGradients)
        bad(where, std::string(fb::EnumNameOpCode(ins->op())) +
                       ": a cuda module runs generated kernels only (kilnc fuses every op when it plans a cuda module: compile the spec or its step IR)");
      if (ins->op() == fb::OpCode::Kernel) {
        const int64_t kernel = ins->ints()->Get(0);
        if (kernel < 0 || kernel >= int64_t(nkernels))
          bad(where, "kernel index " + std::to_string(kernel) + " out of range (" + std::to_string(nkernels) + " kernels)");
        const fb::Kernel* kp = fb_->kernels()->Get(uint32_t(kernel));
        const size_t n = ins->inputs()->size() + ins->outputs()->size();
        if (!kp->operand_numel() || !kp->operand_dtype() || kp->operand_numel()->size() != n ||
            kp->operand_dtype()->size() != n)
          bad(where, "kernel " + std::to_string(kernel) + " does not describe the instruction's " + std::to_string(n) +
                         " operands");
      }
    }
  }
  // The region sizes kilnc writes: the state region, then room for the largest program's
  // activations (and for every activation buffer). Reports (kiln-inspect) and executors read
  // them, so a crafted size must not pass.
  // The state region ends where its last buffer does (kilnc packs it from 0).
  uint64_t needed = 0, state_end = 0;
  for (const fb::Program* prog : *fb_->programs()) needed = std::max(needed, prog->activation_size());
  for (uint32_t i = 0; i < nbuf; ++i) {
    const uint64_t end = (buffer(i).offset() + buffer(i).size() + 255) / 256 * 256;
    if (buffer(i).kind() != fb::BufferKind::Activation) state_end = std::max(state_end, end);
    else if (buffer(i).offset() >= fb_->state_size()) needed = std::max(needed, end - fb_->state_size());
  }
  if (fb_->state_size() != state_end)
    bad("state_size", std::to_string(fb_->state_size()) + " bytes is not where the state buffers end (" +
                          std::to_string(state_end) + ")");
  uint64_t total = 0;
  if (fb_->state_size() % 256 != 0 || fb_->activation_size() != needed ||
      __builtin_add_overflow(fb_->state_size(), fb_->activation_size(), &total) || total != fb_->arena_size())
    bad("arena_size", std::to_string(fb_->arena_size()) + " bytes is not the state region's " +
                          std::to_string(fb_->state_size()) + " (a multiple of 256) plus the " + std::to_string(needed) +
                          " activation bytes its programs and buffers need (the module says " +
                          std::to_string(fb_->activation_size()) + ")");

  for (uint32_t i = 0; i < nkernels; ++i) {
    const fb::Kernel* k = fb_->kernels()->Get(i);
    const std::string where = "kernels[" + std::to_string(i) + "]";
    if (!k->symbol() || !k->name() || !k->kind() || !k->ops()) bad(where, "missing symbol, name, kind or ops");
    // The kind says what the kernel does to its operands (the plan verifier lets elementwise
    // kernels and the classifier write over an input): kiln.fusion's kinds, or an attention op.
    static const std::set<std::string> kKernelKinds = {
        "elementwise", "matmul",    "layer_norm", "layer_norm_grad", "classifier",      "embedding_grad",
        "optimizer",   "reduce_sum", "attention", "attention_grad",  "decode_attention"};
    if (!kKernelKinds.count(k->kind()->str())) bad(where, "kind '" + one_line(k->kind()->str()) + "' is no kernel kind of kilnc's");
    // The operands the device executor clears before a launch, and kiln-inspect --roofline
    // counts: positions in the kernel's operand table.
    if (k->zero_operands()) {
      const uint32_t n = k->operand_numel() ? k->operand_numel()->size() : 0;
      if (!k->operand_dtype() || k->operand_dtype()->size() != n)
        bad(where, "has zero_operands but no table of its operands' sizes and dtypes");
      for (uint32_t z : *k->zero_operands())
        if (z >= n) bad(where, "zero_operands names operand " + std::to_string(z) + " of its " + std::to_string(n));
    }
    // A cuda kernel's cuBLASLt product: the device executor checks each operand against m k, k n
    // and m n elements, which must not wrap around (m = 2^62, k = 4 "needs" 0 elements).
    if (const fb::MatmulCall* c = k->matmul()) {
      int64_t product = 0;
      if (c->m() <= 0 || c->n() <= 0 || c->k() <= 0 || __builtin_mul_overflow(c->m(), c->k(), &product) ||
          __builtin_mul_overflow(c->k(), c->n(), &product) || __builtin_mul_overflow(c->m(), c->n(), &product))
        bad(where, "cuBLASLt product m=" + std::to_string(c->m()) + " n=" + std::to_string(c->n()) + " k=" +
                       std::to_string(c->k()) + ": sizes must be positive, with m k, k n and m n below 2^63");
    }
    // (kiln-inspect's FLOP counts and roofline, and the trainer's MFU, add them up)
    if (!std::isfinite(k->flops()) || k->flops() < 0 || !std::isfinite(k->tensor_flops()) || k->tensor_flops() < 0)
      bad(where, "flops " + std::to_string(k->flops()) + " and tensor_flops " + std::to_string(k->tensor_flops()) +
                     " must be finite numbers >= 0");
    // The executors find a kernel's code by its symbol: one of another kernel's would run that
    // code on this kernel's operands. kilnc names kernel i's symbols "k<i>_...".
    const std::string prefix = "k" + std::to_string(i) + "_";
    if (k->symbol()->str().compare(0, prefix.size(), prefix) != 0)
      bad(where, "symbol '" + k->symbol()->str() + "' does not begin with " + prefix);
    if (k->cuda_functions())
      for (const fb::CudaFunction* f : *k->cuda_functions()) {
        if (!f->symbol() || f->symbol()->str().compare(0, prefix.size(), prefix) != 0)
          bad(where, "a CUDA function's symbol does not begin with " + prefix);
        if (f->grid() == 0 || f->grid() > INT32_MAX || f->block() == 0 || f->block() > 1024)
          bad(where, f->symbol()->str() + " launches with grid " + std::to_string(f->grid()) + " and block " +
                         std::to_string(f->block()) + " (a grid of 1 to 2^31 - 1 blocks of 1 to 1024 threads)");
      }
    // The one workspace every kernel shares (the device allocates the largest).
    if (k->cuda_scratch_bytes() > (uint64_t(1) << 40))
      bad(where, "cuda_scratch_bytes " + std::to_string(k->cuda_scratch_bytes()) + " is more than a GPU has (1 TiB)");
    // An optimizer kernel's ranges are built from adamw_params, one per adamw op it fuses.
    if (k->adamw_params()) {
      size_t adamw = 0;
      for (const flatbuffers::String* op : *k->ops()) adamw += op->str() == "adamw";
      if (k->adamw_params()->size() != adamw)
        bad(where, std::to_string(k->adamw_params()->size()) + " adamw_params for " + std::to_string(adamw) +
                       " adamw ops");
      std::set<uint32_t> seen;
      for (uint32_t v : *k->adamw_params()) {
        check_index(v, where + ": adamw_params");
        if (buffer(v).kind() != fb::BufferKind::Parameter || !seen.insert(v).second)
          bad(where, "adamw_params: buffer " + std::to_string(v) + " is not a parameter, or repeats");
      }
    }
  }

  // What ptxas reported (kiln-inspect's occupancy): within what any GPU has.
  if (fb_->cuda_images())
    for (const fb::CudaImage* im : *fb_->cuda_images())
      if (im->resources())
        for (const fb::FunctionResources* r : *im->resources())
          if (r->registers() > 255 || r->shared_bytes() > 256 * 1024)
            bad("cuda_images", (r->symbol() ? r->symbol()->str() : "a function") + ": " +
                                   std::to_string(r->registers()) + " registers a thread and " +
                                   std::to_string(r->shared_bytes()) + " shared bytes are more than a GPU has");

  // The sizes the trainer and the sampler take from the model, against the buffers they fill.
  const fb::Model& md = *fb_->model();
  const int64_t B = md.batch_size(), T = md.seq_len(), V = md.vocab_size();
  if (B <= 0 || T <= 0 || V <= 0 || md.n_layer() <= 0 || md.n_head() <= 0 || md.n_embd() <= 0 || T > md.block_size())
    bad("model", "B=" + std::to_string(B) + " T=" + std::to_string(T) + " V=" + std::to_string(V) + " L=" +
                     std::to_string(md.n_layer()) + " H=" + std::to_string(md.n_head()) + " C=" +
                     std::to_string(md.n_embd()) + " Tmax=" + std::to_string(md.block_size()) +
                     ": sizes must be positive, with T <= Tmax");
  if (md.n_embd() % md.n_head() != 0)
    bad("model", "n_embd " + std::to_string(md.n_embd()) + " is not a multiple of n_head " + std::to_string(md.n_head()));
  // The model's record of itself, against what the module holds (as kilnc checks the IR against
  // its spec): reports, the MFU estimate, checkpoints and llm.c files go by these fields.
  const std::string precision = md.precision() ? md.precision()->str() : "";
  if (precision != "fp32" && precision != "bf16")
    bad("model", "precision '" + one_line(precision) + "' is neither fp32 nor bf16");
  // Kernels compiled for the other target: a cpu library in a cuda module, or GPU images in a cpu one.
  const bool has_cpu_code = fb_->cpu_library() && fb_->cpu_library()->size();
  const bool has_cuda_code = fb_->cuda_images() && fb_->cuda_images()->size();
  if ((!cuda && has_cuda_code) || (cuda && has_cpu_code))
    bad("model", "target is " + target + " but the module's kernels are compiled for " + (has_cuda_code ? "cuda" : "cpu"));
  bool any_bf16 = false;
  for (uint32_t i = 0; i < nbuf; ++i) any_bf16 |= buffer(i).dtype() == fb::DType::BF16;
  // A bf16 buffer is an op's bf16 result, which kilnc refuses under precision fp32. The converse
  // holds only without generated kernels: a fusion region may compute in bf16 and keep the values
  // to itself (a kiln.cast pair in step IR), which kilnc requires precision bf16 for.
  if (any_bf16 && precision != "bf16")
    bad("model", "precision is " + precision + " but the module has bf16 buffers");
  if (!any_bf16 && precision == "bf16" && program("micro_step") && nkernels == 0)
    bad("model", "precision is bf16 but the module has no bf16 buffers and no generated kernels that could compute in bf16");
  std::set<int64_t> layers;  // of the parameters named h.N.*
  for (const fb::Parameter* p : *fb_->parameters()) {
    const std::string name = p->name() ? p->name()->str() : "";
    const std::vector<int64_t> shape = p->shape() ? std::vector<int64_t>(p->shape()->begin(), p->shape()->end())
                                                  : std::vector<int64_t>{};
    // A layer's parameter is named h.<layer>.* (kilnc's layerOf); other names belong to none.
    const size_t dot = name.rfind("h.", 0) == 0 ? name.find_first_not_of("0123456789", 2) : std::string::npos;
    // Read as kilnc's layerOf does (StringRef::getAsInteger): any number of digits, leading zeros
    // too ("h.0000000000000000001.x" is layer 1); only a value past int64 belongs to no layer.
    int64_t layer = 0;
    bool fits = dot != std::string::npos && dot > 2 && name[dot] == '.';
    for (size_t j = 2; fits && j < dot; ++j)
      fits = !__builtin_mul_overflow(layer, int64_t(10), &layer) && !__builtin_add_overflow(layer, int64_t(name[j] - '0'), &layer);
    if (fits) {
      if (layer >= md.n_layer())
        bad("parameters '" + one_line(name) + "'", "is no layer of the model's n_layer " + std::to_string(md.n_layer()));
      layers.insert(layer);
    }
    if ((name == "wte.weight" && (shape.size() != 2 || shape[0] < V || shape[1] != md.n_embd())) ||
        (name == "wpe.weight" && shape != std::vector<int64_t>{md.block_size(), md.n_embd()}))
      bad("parameters '" + name + "'", "is " + shape_str(shape) + ", not of the model's V=" + std::to_string(V) +
                                           " Tmax=" + std::to_string(md.block_size()) + " C=" + std::to_string(md.n_embd()));
  }
  if (!layers.empty() && int64_t(layers.size()) != md.n_layer())
    bad("model", "n_layer is " + std::to_string(md.n_layer()) + " but the parameters (h.N.*) are of " +
                     std::to_string(layers.size()) + (layers.size() == 1 ? " layer" : " layers"));
  // The trainer fills idx and targets before every micro-step, the sampler idx before logits and
  // token and position before decode.
  bool has_idx = false, has_targets = false, has_token = false, has_position = false;
  std::map<std::string, int64_t> prefill_inputs;  // element counts of prefill[_short]_tokens (B x M), _positions (M)
  for (uint32_t i = 0; i < nbuf; ++i) {
    const fb::Buffer& b = buffer(i);
    const std::string name = b.name()->str();
    if (b.kind() == fb::BufferKind::Input) {
      has_idx |= name == "idx", has_targets |= name == "targets";
      has_token |= name == "token", has_position |= name == "position";
      for (const char* prefill : kPrefillPrograms)
        if (name == std::string(prefill) + "_tokens" || name == std::string(prefill) + "_positions") {
          if (b.dtype() != fb::DType::I32) bad("buffers[" + std::to_string(i) + "] '" + name + "'", "is not I32");
          prefill_inputs[name] = numel(b);
        }
    }
    const int64_t want = name == "token" ? B : 1;
    if (b.kind() == fb::BufferKind::Input && (name == "token" || name == "position") &&
        (b.dtype() != fb::DType::I32 || numel(b) != want))
      bad("buffers[" + std::to_string(i) + "] '" + name + "'",
          "holds " + std::to_string(numel(b)) + " " + dtype_name(b.dtype()) + ", not " + std::to_string(want) + " I32");
    if (b.kind() == fb::BufferKind::Input && (name == "idx" || name == "targets") &&
        (b.dtype() != fb::DType::I32 || numel(b) != B * T))
      bad("buffers[" + std::to_string(i) + "] '" + name + "'", "holds " + std::to_string(numel(b)) + " " +
                                                               dtype_name(b.dtype()) + ", the model's B*T is " +
                                                               std::to_string(B * T) + " I32");
  }
  if (program("micro_step") && !(has_idx && has_targets))
    bad("program micro_step", "needs the inputs 'idx' and 'targets' (kiln.input ops of the IR)");
  if (program("logits") && !has_idx) bad("program logits", "needs the inputs 'idx' (kiln.input ops of the IR)");
  if (program("decode") && !(has_token && has_position))
    bad("program decode", "needs the inputs 'token' and 'position' (kiln.input ops of the IR)");
  // The sampler fills M tokens per row and their M positions (below T) before each prefill call.
  for (const std::string prefill : kPrefillPrograms) {
    if (!program(prefill)) continue;
    const std::string tokens = prefill + "_tokens", positions = prefill + "_positions";
    if (!prefill_inputs.count(tokens) || !prefill_inputs.count(positions) || !has_position)
      bad("program " + prefill, "needs the inputs '" + tokens + "', '" + positions + "' and 'position' (kiln.input ops of the IR)");
    const int64_t n = prefill_inputs[tokens], M = prefill_inputs[positions];
    if (M < 1 || M > T || n != B * M)
      bad("program " + prefill, "reads " + std::to_string(n) + " tokens at " + std::to_string(M) +
                                    " positions: it needs B x M tokens at M positions, 1 <= M <= T = " + std::to_string(T));
  }
  // A key/value cache is an fp32 activation of seq_len positions per row (the sampler decodes
  // positions below T), which only its own decode attention reads and writes.
  const int64_t C = md.n_embd();
  for (const fb::Program* prog : *fb_->programs()) {
    const std::vector<uint32_t> kept = kept_buffers(*prog);
    std::set<uint32_t> seen;
    for (uint32_t i : kept) {
      const std::string where = "program " + prog->name()->str() + ": key/value cache buffers[" + std::to_string(i) + "]";
      check_index(i, where);
      const fb::Buffer& b = buffer(i);
      const std::vector<int64_t> want{2, B, md.n_head(), T, C / md.n_head()};  // (kilnc's kiln.kv_cache)
      if (b.kind() != fb::BufferKind::Activation || b.dtype() != fb::DType::F32 ||
          std::vector<int64_t>(b.shape()->begin(), b.shape()->end()) != want)
        bad(where, "must be an F32 activation of 2 x B x n_head x T x C/n_head = " + shape_str(want));
      if (!seen.insert(i).second) bad(where, "serves two decode attentions");
      for (const fb::Instr* ins : *prog->instrs())
        if (std::find(ins->outputs()->begin(), ins->outputs()->end(), i) != ins->outputs()->end())
          bad(where, "is an instruction's output (only its decode attention may write it)");
    }
  }
  // @prefill and @prefill_short fill the caches @decode then reads: the same buffers' places,
  // layer by layer.
  for (const std::string name : kPrefillPrograms) {
    const fb::Program* prefill = program(name);
    if (!prefill) continue;
    const fb::Program* decode = program("decode");
    const std::vector<uint32_t> filled = kept_buffers(*prefill);
    const std::vector<uint32_t> read = decode ? kept_buffers(*decode) : std::vector<uint32_t>{};
    bool same = filled.size() == read.size() && !filled.empty();
    for (size_t k = 0; same && k < filled.size(); ++k)
      same = buffer(filled[k]).offset() == buffer(read[k]).offset() && buffer(filled[k]).size() == buffer(read[k]).size();
    if (!same)
      bad("program " + name, "its " + std::to_string(filled.size()) + " key/value caches are not the ones program decode reads (" +
                                 std::to_string(read.size()) + " caches, at the same offsets: plan both with kiln-plan-buffers)");
  }
}

}  // namespace kiln
