// The device executor: a cuda module's programs as planned steps on one stream.
//
// At load every Kernel instruction becomes its steps: the clears of its partial-sum operands
// (zero_operands), its cuBLASLt product (MatmulCall, planned once with the arena addresses) and
// its generated functions (cuda_functions), each launched with the address of a table holding
// its operands' addresses, plus [begin, end) ranges for the optimizer. GlobalNorm becomes two
// launches of the support kernels every cuda module carries (kiln_sum_squares, kiln_norm_finish),
// with ZeRO-1's sum over ranks between them.
// All tables live in one device block, uploaded once (ZeRO-1 then rewrites the optimizer's
// ranges in place, before the first step): replaying a program needs no host work but the upload
// of the inputs and hyperparameters, so from its second run a program is a CUDA graph
// (KILN_CUDA_GRAPHS=0 runs every step eagerly instead, for debugging).
#include "runtime/device/device_executor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/error.h"

namespace kiln {
namespace {

using O = fb::OpCode;

// Launch shape of kiln_sum_squares: at least 8 elements per thread, and at most enough blocks
// to fill a large GPU (132 SMs) four times over; the grid-stride loop covers any size.
constexpr unsigned kNormMaxGrid = 528, kNormBlock = 256;

float first_float(const std::vector<uint8_t>& bytes, fb::DType t) {
  if (bytes.size() < 2) return 0.0f;
  uint32_t u = 0;
  if (t == fb::DType::BF16) {
    uint16_t h;
    std::memcpy(&h, bytes.data(), 2);
    u = uint32_t(h) << 16;
  } else if (bytes.size() >= 4) {
    std::memcpy(&u, bytes.data(), 4);
    if (t == fb::DType::I32) return float(int32_t(u));
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

DeviceExecutor::DeviceExecutor(const Module& module, const ArenaLayout& layout, const std::vector<std::string>& programs)
    : module_(module), layout_(layout) {
  const char* g = std::getenv("KILN_CUDA_GRAPHS");
  graphs_ = !(g && std::string(g) == "0");
  const char* poison = std::getenv("KILN_CUDA_POISON");
  poison_ = poison && std::string(poison) == "1";
  // KILN_CUBLASLT_EPILOGUES=0 keeps cuBLASLt to plain products and runs each epilogue (bias, GELU,
  // its gradient) in Kiln's own kernel after it: a difference in the results then points at
  // cuBLASLt's fused epilogue (its own GELU) rather than at Kiln's kernels.
  const char* epilogues = std::getenv("KILN_CUBLASLT_EPILOGUES");
  fused_epilogues_ = !(epilogues && std::string(epilogues) == "0");
  try {
    device_ = make_device();
  } catch (const Error& e) {
    throw Error(module.source() + ": " + e.what());
  }
  device_name_ = device_->describe();
  uint64_t activations = 0;
  for (const std::string& name : programs) activations = std::max(activations, module.program(name)->activation_size());
  const uint64_t bytes = std::max<uint64_t>(layout.state_bytes + activations, 256);
  arena_ = device_->alloc(bytes, module.source() + "'s arena (" + std::to_string(layout.state_bytes) +
                                     " bytes of state, " + std::to_string(activations) + " of activations)");
  activation_bytes_ = activations;
  scratch_ = device_->alloc(256, "the gradient-norm accumulator");
  device_->zero(scratch_, 256);
  // Kernels run one after another on the stream, so one workspace serves them all.
  uint64_t workspace = 0;
  if (const auto* kernels = module.fb().kernels())
    for (const fb::Kernel* k : *kernels) workspace = std::max<uint64_t>(workspace, k->cuda_scratch_bytes());
  if (workspace) workspace_ = device_->alloc(workspace, module.source() + "'s kernel workspace (its largest cuda_scratch_bytes)");
  device_->load_kernels(module);
  // Planning times cuBLASLt's candidate algorithms on the arena's buffers: zeros rather than
  // whatever cudaMalloc left (NaNs and denormals would skew which one wins).
  device_->zero(arena_, bytes);

  for (const std::string& name : programs) {
    Program& p = programs_[name];
    p.fb = module.program(name);
    plan(p);
    // Decode's key/value caches keep their contents between runs (KILN_CUDA_POISON spares them).
    for (uint32_t i : module.kept_buffers(*p.fb))
      p.kept.push_back({layout.at[i], layout.at[i] + module.buffer(i).size()});
    std::sort(p.kept.begin(), p.kept.end());
  }
  // After planning, which may have run products on the arena: the state starts as zeros (the
  // host uploads its own before the first run); activations are written by kernels before they
  // are read.
  device_->zero(arena_, layout.state_bytes);
  if (!table_words_.empty()) {
    tables_ = device_->alloc(table_words_.size() * 8, "the kernels' operand tables");
    device_->upload(tables_, table_words_.data(), table_words_.size() * 8);
  }

  // The buffers the host writes before every run (token ids, hyperparameters), merged into
  // runs of neighbours with nothing else between them, so a step uploads a few spans.
  std::vector<uint32_t> by_offset;
  for (uint32_t i = 0; i < module.fb().buffers()->size(); ++i)
    if (module.buffer(i).kind() != fb::BufferKind::Activation) by_offset.push_back(i);
  // By where they are stored (a sliced moment's element 0 lies before its storage).
  std::sort(by_offset.begin(), by_offset.end(),
            [&](uint32_t a, uint32_t b) { return layout.storage(module, a) < layout.storage(module, b); });
  bool open = false;
  for (uint32_t i : by_offset) {
    const fb::BufferKind kind = module.buffer(i).kind();
    const bool host = kind == fb::BufferKind::Input || kind == fb::BufferKind::Hyper;
    const auto [begin, end] = layout.storage(module, i);
    if (host && open) host_written_.back().second = std::max(host_written_.back().second, end);
    else if (host) host_written_.push_back({begin, end});
    open = host;
  }
  device_->synchronize();
  if (const std::string note = device_->planning_note(); !note.empty())
    std::fprintf(stderr, "note: %s: %s\n", module.source().c_str(), note.c_str());
  if (unfused_epilogues_ && !fused_epilogues_)
    std::fprintf(stderr, "note: %s: %d matrix products run their epilogue as a separate kernel "
                 "(KILN_CUBLASLT_EPILOGUES=0)\n", module.source().c_str(), unfused_epilogues_);
  else if (unfused_epilogues_)
    std::fprintf(stderr, "note: %s: %d matrix products run their epilogue as a separate kernel; cuBLASLt "
                 "refused it fused, e.g. %s\n", module.source().c_str(), unfused_epilogues_, unfused_reason_.c_str());
}

// The device frees what is left when it goes (after a fault every CUDA call fails: nothing here
// may throw while an error unwinds).
DeviceExecutor::~DeviceExecutor() = default;

size_t DeviceExecutor::add_words(const std::vector<uint64_t>& words) {
  const size_t at = table_words_.size();
  table_words_.insert(table_words_.end(), words.begin(), words.end());
  return at;
}

void DeviceExecutor::plan(Program& p) {
  const fb::Program& prog = *p.fb;
  for (uint32_t i = 0; i < prog.instrs()->size(); ++i) {
    const fb::Instr& ins = *prog.instrs()->Get(i);
    const std::string where = module_.source() + ": program " + prog.name()->str() + ", instr " + std::to_string(i) +
                              " (" + fb::EnumNameOpCode(ins.op()) + ")";
    switch (ins.op()) {
      case O::Kernel: plan_kernel(p, ins, where); break;
      case O::GlobalNorm: plan_norm(p, ins, where); break;
      // Host hooks of data parallelism (nothing to do on one GPU).
      case O::ReduceGradients: {
        Step s{Step::Reduce, "reduce_gradients"};
        s.bucket = ins.ints()->Get(0);
        p.steps.push_back(s);
        p.host_hooks = true;
        break;
      }
      case O::WaitGradients:
        p.steps.push_back(Step{Step::Wait, "wait_gradients"});
        p.host_hooks = true;
        break;
      default:
        throw Error(where + ": a cuda module runs generated kernels only; recompile it with this kilnc "
                    "(its cuda target fuses every op)");
    }
  }
}

void DeviceExecutor::plan_kernel(Program& p, const fb::Instr& ins, const std::string& where) {
  const fb::Kernel& k = *module_.fb().kernels()->Get(uint32_t(ins.ints()->Get(0)));
  // Steps are named by the kernel's symbol (k<N>_<ops>): several kernels share a name, the same ops on
  // other shapes, and --profile's rows, the roofline and --kernel-source tell them apart by it.
  const std::string name = k.symbol()->str();
  const size_t first_step = p.steps.size();
  std::vector<uint64_t> operands;
  std::vector<uint32_t> bufs;
  for (uint32_t b : *ins.inputs()) bufs.push_back(b);
  for (uint32_t b : *ins.outputs()) bufs.push_back(b);
  for (uint32_t b : bufs) operands.push_back(at(b));
  if (k.cuda_scratch_bytes()) operands.push_back(workspace_);  // b[operands]

  if (k.zero_operands())
    for (uint32_t z : *k.zero_operands()) {
      if (z >= bufs.size()) throw Error(where + ": kernel " + k.symbol()->str() + " clears operand " + std::to_string(z) + " of " + std::to_string(bufs.size()));
      const auto t = static_cast<fb::DType>(k.operand_dtype()->Get(z));
      Step s{Step::Zero, name + " (clear)"};
      s.ptr = operands[z];
      s.bytes = size_t(k.operand_numel()->Get(z)) * dtype_bytes(t);
      p.steps.push_back(s);
    }

  if (const fb::MatmulCall* c = k.matmul()) {
    MatmulSpec m;
    m.where = where + ": kernel " + name;
    m.m = c->m(), m.n = c->n(), m.k = c->k();
    m.trans_a = c->trans_a(), m.trans_b = c->trans_b();
    m.epilogue = c->epilogue() ? c->epilogue()->str() : "DEFAULT";
    m.beta = c->beta();
    // The call's operands are positions in the instruction's operands; each must hold what the
    // product reads or writes.
    auto operand = [&](int i, int64_t need, const char* role, fb::DType* type) -> DevicePtr {
      if (i < 0) return 0;
      if (size_t(i) >= bufs.size())
        throw Error(m.where + ": cuBLASLt " + role + " is operand " + std::to_string(i) + " of " + std::to_string(bufs.size()));
      if (k.operand_numel()->Get(uint32_t(i)) < need)
        throw Error(m.where + ": cuBLASLt " + role + " holds " + std::to_string(k.operand_numel()->Get(uint32_t(i))) +
                    " elements, the product needs " + std::to_string(need));
      const auto t = static_cast<fb::DType>(k.operand_dtype()->Get(uint32_t(i)));
      if (t == fb::DType::I32) throw Error(m.where + ": cuBLASLt " + role + " is an I32 buffer");
      if (type) *type = t;
      return operands[size_t(i)];
    };
    m.a = operand(c->a(), m.m * m.k, "A", &m.a_type);
    m.b = operand(c->b(), m.k * m.n, "B", &m.b_type);
    m.d = operand(c->d(), m.m * m.n, "D", &m.d_type);
    fb::DType c_type = m.d_type;
    m.c = operand(c->c(), m.m * m.n, "C", &c_type);
    m.bias = operand(c->bias(), m.n, "bias", &m.bias_type);
    m.aux = operand(c->aux(), m.m * m.n, "aux", &m.aux_type);
    if (!m.a || !m.b || !m.d) throw Error(m.where + ": a cuBLASLt call needs A, B and D");
    if ((m.beta != 0.0f) != (m.c != 0)) throw Error(m.where + ": cuBLASLt beta and C disagree");
    if (m.c && c_type != m.d_type) throw Error(m.where + ": cuBLASLt C and D differ in type");
    const EpilogueFlags f = epilogue_flags(m.epilogue, m.where);
    if (f.bias != (m.bias != 0)) throw Error(m.where + ": epilogue " + m.epilogue + " and the bias operand disagree");
    if (f.reads_aux() != (m.aux != 0)) throw Error(m.where + ": epilogue " + m.epilogue + " and the aux operand disagree");
    if (!fused_epilogues_ && m.epilogue != "DEFAULT") {
      plan_unfused_epilogue(p, m, name, "KILN_CUBLASLT_EPILOGUES=0");
    } else {
      Step s{Step::Matmul, name + " (cuBLASLt)"};
      try {
        s.matmul = device_->plan_matmul(m);
        p.steps.push_back(s);
      } catch (const MatmulUnsupported& e) {
        if (m.epilogue == "DEFAULT") throw;
        plan_unfused_epilogue(p, m, name, e.what());
      }
    }
  }

  if (k.cuda_functions() && k.cuda_functions()->size()) {
    Step s{Step::Launch, name};
    s.operands = add_words(operands);
    if (k.adamw_params()) {
      // The optimizer's [begin, end) per parameter: all of it, until ZeRO-1 sets slices.
      std::vector<uint64_t> ranges;
      for (uint32_t v : *k.adamw_params()) ranges.insert(ranges.end(), {0, uint64_t(numel(module_.buffer(v)))});
      s.ranges = add_words(ranges);
      s.has_ranges = true;
      for (uint32_t j = 0; j < k.adamw_params()->size(); ++j)
        slice_words_.push_back({s.ranges + 2 * j, k.adamw_params()->Get(j)});
    }
    for (const fb::CudaFunction* f : *k.cuda_functions()) {  // (grid and block checked by Module::verify)
      s.fn = device_->function(f->symbol()->str());
      s.grid = f->grid(), s.block = f->block();
      p.steps.push_back(s);
    }
  } else if (!k.matmul()) {
    throw Error(where + ": kernel " + k.symbol()->str() + " has neither a cuBLASLt call nor a cuda function");
  }

  // The profile's FLOPs: the product's 2MNK to its cuBLASLt step, the rest of the kernel's count
  // to its first launch (the product's, where the kernel launches nothing).
  const fb::MatmulCall* c = k.matmul();
  const double product = c ? 2.0 * double(c->m()) * double(c->n()) * double(c->k()) : 0.0;
  Step* rest = nullptr;
  for (size_t i = first_step; i < p.steps.size(); ++i) {
    Step& s = p.steps[i];
    if (s.kind == Step::Matmul) s.flops = product;
    if (s.kind == Step::Launch && !rest) rest = &s;
  }
  if (!rest)
    for (size_t i = first_step; i < p.steps.size(); ++i)
      if (p.steps[i].kind == Step::Matmul) rest = &p.steps[i];
  if (rest) rest->flops += std::max(0.0, k.flops() - product);
}

// When cuBLASLt has no algorithm for a product with its epilogue (a type combination it does
// not fuse), the plain product and then the support kernel kiln_matmul_epilogue: the product
// goes to the auxiliary output when there is one to write (it is the pre-GELU value), else to D.
void DeviceExecutor::plan_unfused_epilogue(Program& p, MatmulSpec m, const std::string& name, const std::string& why) {
  const EpilogueFlags e = epilogue_flags(m.epilogue, m.where);
  const int64_t flags = (e.bias ? 1 : 0) | (e.gelu ? 2 : 0) | (e.aux_out ? 4 : 0) | (e.dgelu ? 8 : 0);
  const DevicePtr bias_ptr = m.bias, aux = m.aux, d = m.d;
  const fb::DType bias_type = m.bias_type, aux_type = m.aux_type, d_type = m.d_type;
  MatmulSpec plain = m;
  plain.epilogue = "DEFAULT";
  plain.bias = plain.aux = 0;
  if (e.aux_out) plain.d = aux, plain.d_type = aux_type;
  if (plain.d_type != d_type && plain.c) throw Error(why);  // C is typed like D
  Step s{Step::Matmul, name + " (cuBLASLt)"};
  try {
    s.matmul = device_->plan_matmul(plain);
  } catch (const Error& plain_error) {
    throw Error(std::string(plain_error.what()) + "; fused, " + why);
  }
  p.steps.push_back(s);
  Step f{Step::Launch, name + " (epilogue)"};
  f.operands = add_words({plain.d, bias_ptr, aux, d});
  f.ranges = add_words({uint64_t(m.m * m.n), uint64_t(m.n), uint64_t(flags), uint64_t(d_type), uint64_t(bias_type),
                        uint64_t(aux_type)});
  f.has_ranges = true;
  f.fn = device_->function("kiln_matmul_epilogue");
  f.grid = unsigned(std::clamp<int64_t>((m.m * m.n + 255) / 256, 1, 4096)), f.block = 256;
  p.steps.push_back(f);
  if (unfused_epilogues_++ == 0) unfused_reason_ = why;
}

// The global norm over the gradients: b = {g_0 .. g_n-1, accumulator, norm}, range = {n,
// begin_0, end_0, ...} for the support kernels (compiler/kernel_codegen.cpp, kernelPrelude).
void DeviceExecutor::plan_norm(Program& p, const fb::Instr& ins, const std::string& where) {
  const uint32_t n = ins.inputs()->size();
  std::vector<uint64_t> operands, ranges = {n};
  uint64_t total = 0;
  for (uint32_t i = 0; i < n; ++i) total += uint64_t(ins.ints()->Get(i));
  for (uint32_t i = 0; i < n; ++i) {
    const fb::Buffer& g = module_.buffer(ins.inputs()->Get(i));
    if (g.dtype() != fb::DType::F32) throw Error(where + ": gradient " + g.name()->str() + " is not F32");
    operands.push_back(at(ins.inputs()->Get(i)));
    ranges.insert(ranges.end(), {0, uint64_t(ins.ints()->Get(i))});
  }
  const fb::Buffer& out = module_.buffer(ins.outputs()->Get(0));
  if (out.dtype() != fb::DType::F32) throw Error(where + ": the norm's buffer is not F32");
  operands.push_back(scratch_);
  operands.push_back(at(ins.outputs()->Get(0)));
  Step s{Step::Launch, "global_norm"};
  s.operands = add_words(operands);
  s.ranges = add_words(ranges);
  s.has_ranges = true;
  for (uint32_t i = 0; i < n; ++i) slice_words_.push_back({s.ranges + 1 + 2 * i, ins.inputs()->Get(i)});
  s.fn = device_->function("kiln_sum_squares");
  s.grid = unsigned(std::clamp<uint64_t>(total / (8 * kNormBlock), 1, kNormMaxGrid)), s.block = kNormBlock;
  p.steps.push_back(s);
  p.steps.push_back(Step{Step::Norm, "global_norm (sum over ranks)"});  // ZeRO-1's hook
  p.norm_step = true;
  s.fn = device_->function("kiln_norm_finish");
  s.grid = 1, s.block = 32;
  p.steps.push_back(s);
}

void DeviceExecutor::issue(const Step& s) {
  switch (s.kind) {
    case Step::Zero: device_->zero(s.ptr, s.bytes); break;
    case Step::Matmul: device_->matmul(s.matmul); break;
    case Step::Launch:
      device_->launch(s.fn, s.grid, s.block, (s.table ? s.table : tables_) + 8 * s.operands,
                      s.has_ranges ? (s.table ? s.table : tables_) + 8 * s.ranges : 0);
      break;
    case Step::Norm: {  // ZeRO-1: the sum of this rank's squares, summed over the ranks
      if (!norm_hook_) break;
      double sum = 0;
      device_->download(&sum, scratch_, sizeof sum);  // waits for kiln_sum_squares
      in_hook_ = true;
      norm_sum_ = norm_hook_(sum);
      in_hook_ = false;
      device_->upload(scratch_, &norm_sum_, sizeof norm_sum_);  // before kiln_norm_finish, in stream order
      break;
    }
    case Step::Reduce:
    case Step::Wait:
      if (s.kind == Step::Reduce ? !reduce_hook_ : !wait_hook_) break;
      in_hook_ = true;
      if (s.kind == Step::Reduce) reduce_hook_(s.bucket);
      else wait_hook_();
      in_hook_ = false;
      break;
  }
}

void DeviceExecutor::issue(const Program& p) {
  for (const Step& s : p.steps) issue(s);
}

float DeviceExecutor::run(const std::string& name, Profile* profile) {
  try {
    return run_program(programs_.at(name), profile);
  } catch (const Error& e) {
    if (in_hook_) {  // the communicator's error (a peer failed, a timeout): its words
      in_hook_ = false;
      throw;
    }
    // Kernels run asynchronously: a fault shows at the next synchronising call, whatever it is.
    throw Error(module_.source() + ": program " + name + " on " + device_name_ + ": " + e.what() +
                 " (CUDA_LAUNCH_BLOCKING=1 KILN_CUDA_GRAPHS=0 stops at the kernel at fault)");
  }
}

float DeviceExecutor::run_program(Program& p, Profile* profile) {
  for (auto [begin, end] : host_written_) device_->upload(arena_ + begin, host_state_ + begin, end - begin);
  if (poison_) {  // around the caches that must outlive the run
    uint64_t at = layout_.state_bytes;
    const uint64_t end = at + activation_bytes_;
    for (auto [b, e] : p.kept) {
      if (b > at) device_->fill(arena_ + at, 0xff, std::min(b, end) - at);
      at = std::max(at, e);
    }
    if (end > at) device_->fill(arena_ + at, 0xff, end - at);
  }
  if (profile) {  // eagerly, a timing mark between steps; read once the program is done (below)
    device_->start_timing(p.steps.size() + 1);
    device_->mark(0);
    for (size_t i = 0; i < p.steps.size(); ++i) {
      issue(p.steps[i]);
      device_->mark(i + 1);
    }
  } else {
    replay(p);
  }
  // Collectives a hook started (on the stream, after the kernels) are waited for here, under the
  // communicator's timeout, rather than inside the download below, which could wait forever for a
  // peer that died.
  if (p.host_hooks && drain_hook_) {
    in_hook_ = true;
    drain_hook_();
    in_hook_ = false;
  }
  if (profile)
    for (size_t i = 0; i < p.steps.size(); ++i) {
      if (p.steps[i].kind == Step::Norm && !norm_hook_) continue;  // one GPU: nothing done there
      KernelTime& t = (*profile)[p.steps[i].name];
      t.seconds += device_->seconds(i, i + 1);
      t.flops += p.steps[i].flops;
      ++t.calls;
    }
  // The result's first element: the loss or the gradient norm (the logits are read() by rows).
  const fb::Buffer& rb = module_.buffer(p.fb->result());
  std::vector<uint8_t> first(std::min<uint64_t>(rb.size(), 4));
  device_->download(first.data(), at(p.fb->result()), first.size());
  return first_float(first, rb.dtype());
}

void DeviceExecutor::push_state() {
  device_->upload(arena_, host_state_, layout_.state_bytes);
  device_->synchronize();
}

void DeviceExecutor::pull_state() { device_->download(host_state_, arena_, layout_.state_bytes); }

void DeviceExecutor::set_gradient_hooks(std::function<void(int64_t)> reduce, std::function<void()> wait,
                                        std::function<void()> drain) {
  reduce_hook_ = std::move(reduce);
  wait_hook_ = std::move(wait);
  drain_hook_ = std::move(drain);
  for (auto& [name, p] : programs_)
    if (p.host_hooks) p.graph_ready = false;  // runs eagerly from now on (replay)
}

void DeviceExecutor::set_parameter_slice(uint32_t value, uint32_t grad, int64_t begin, int64_t end) {
  // The gathered values' bf16 copies need kiln_round_copies, which modules of an older kilnc
  // lack: say so now rather than after the first step.
  const auto* params = module_.fb().parameters();
  if (!round_fn_ && std::any_of(params->begin(), params->end(), [](auto* p) { return p->compute_copy() >= 0; })) {
    try {
      round_fn_ = device_->function("kiln_round_copies");
    } catch (const Error& e) {
      throw Error(module_.source() + ": --zero 1 needs the support kernel kiln_round_copies, which this module "
                  "lacks (" + e.what() + "); recompile it with this kilnc");
    }
  }
  // The tables are in device memory, read by the kernels as they run (a captured graph too):
  // rewriting a pair there changes what every later launch updates.
  for (auto [word, buffer] : slice_words_)
    if (buffer == value || buffer == grad) {
      table_words_[word] = uint64_t(begin), table_words_[word + 1] = uint64_t(end);
      device_->upload(tables_ + 8 * word, &table_words_[word], 16);
    }
  slices_[value] = {begin, end};
  round_planned_ = false;  // replanned at the next round_other_compute_copies()
}

void DeviceExecutor::set_norm_reducer(std::function<double(double)> reduce) {
  norm_hook_ = std::move(reduce);
  for (auto& [name, p] : programs_)
    if (p.norm_step) p.graph_ready = false;  // runs eagerly from now on (replay)
}

void DeviceExecutor::round_other_compute_copies() {
  if (!round_planned_) {
    round_planned_ = true;
    round_copies_.steps.clear();
    std::vector<uint64_t> operands, ranges = {0};
    for (const fb::Parameter* p : *module_.fb().parameters()) {
      if (p->compute_copy() < 0) continue;
      const int64_t n = numel(module_.buffer(p->value()));
      auto it = slices_.find(p->value());
      const auto [lo, hi] = it == slices_.end() ? std::pair<int64_t, int64_t>{0, 0} : it->second;
      for (auto [b, e] : {std::pair{int64_t(0), lo}, std::pair{hi, n}}) {  // the elements outside [lo, hi)
        if (b >= e) continue;
        operands.insert(operands.end(), {at(p->value()), at(uint32_t(p->compute_copy()))});
        ranges.insert(ranges.end(), {uint64_t(b), uint64_t(e)});
        ++ranges[0];
      }
    }
    if (ranges[0] == 0) return;  // fp32 weights, or this rank owns every element: nothing to round
    round_words_ = operands;
    round_words_.insert(round_words_.end(), ranges.begin(), ranges.end());
    if (round_tables_) device_->free(round_tables_);
    round_tables_ = device_->alloc(round_words_.size() * 8, "the compute copies' table of ZeRO-1");
    device_->upload(round_tables_, round_words_.data(), round_words_.size() * 8);
    Step s{Step::Launch, "round_compute_copies"};
    s.fn = round_fn_ ? round_fn_ : device_->function("kiln_round_copies");
    s.grid = unsigned(kNormMaxGrid), s.block = kNormBlock;
    s.table = round_tables_, s.operands = 0, s.ranges = operands.size(), s.has_ranges = true;
    round_copies_.steps.push_back(s);
  }
  issue(round_copies_);  // nothing when there is nothing to round
}

// Issues a program's steps, as a CUDA graph from its second run on (the first runs eagerly:
// libraries finish their lazy set-up outside a capture).
void DeviceExecutor::replay(Program& p) {
  const bool hooks = (p.host_hooks && (reduce_hook_ || wait_hook_)) || (p.norm_step && norm_hook_);
  if (hooks) {  // host work between the kernels: a graph would replay none of it
    issue(p);
    ++p.runs;
    return;
  }
  if (graphs_ && p.runs > 0 && !p.graph_ready) {
    // Nothing runs while a stream is captured, so a capture that fails has done nothing: the
    // program runs eagerly below, and every program does from now on (said once).
    std::string failed;
    if (!device_->begin_capture()) {
      failed = "the stream cannot be captured";
    } else {
      try {
        issue(p);
        p.graph = device_->end_capture();
        p.graph_ready = true;
      } catch (const Error& e) {
        device_->abort_capture();
        failed = e.what();
      } catch (...) {  // not the capture's doing: the stream must still leave capture mode
        device_->abort_capture();
        throw;
      }
    }
    if (!failed.empty()) {
      graphs_ = false;
      std::fprintf(stderr, "note: %s: capturing program %s as a CUDA graph failed (%s); every program runs eagerly "
                   "from now on\n", module_.source().c_str(), p.fb && p.fb->name() ? p.fb->name()->c_str() : "zero_grads", failed.c_str());
    }
  }
  if (graphs_ && p.graph_ready) device_->launch_graph(p.graph);
  else issue(p);
  ++p.runs;
}

// One clear per gradient buffer (as the module lays them out, between the values and moments;
// a data-parallel rank's lie together, in bucket order): a graph of them.
void DeviceExecutor::zero_grads() {
  if (zero_grads_.steps.empty())
    for (const fb::Parameter* p : *module_.fb().parameters()) {
      Step s{Step::Zero, "zero_grads"};
      s.ptr = at(p->grad());
      s.bytes = module_.buffer(p->grad()).size();
      zero_grads_.steps.push_back(s);
    }
  replay(zero_grads_);
}


}  // namespace kiln
