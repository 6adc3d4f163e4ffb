#include "tools/kiln-inspect/memory_report.h"

#include "runtime/arena_layout.h"
#include "runtime/data_parallel.h"
#include "runtime/error.h"
#include "runtime/instr_flops.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "tools/kiln-inspect/program_graph.h"
#include "tools/kiln-inspect/xml_text.h"

namespace kiln {

std::vector<Span> spans_of(const Module& m, const fb::Program& p) {
  std::map<uint32_t, Span> live;
  const int64_t n = p.instrs()->size();
  for (int64_t k = 0; k < n; ++k) {
    const fb::Instr* ins = p.instrs()->Get(k);
    for (auto* list : {ins->inputs(), ins->outputs()})
      for (uint32_t b : *list) {
        if (m.buffer(b).kind() != fb::BufferKind::Activation) continue;
        auto [it, fresh] = live.try_emplace(b, Span{b, k, k, ins});
        it->second.last = k;
      }
  }
  if (auto it = live.find(p.result()); it != live.end()) it->second.last = n;
  std::vector<Span> out;
  for (auto& [b, s] : live) out.push_back(s);
  return out;
}

namespace {

// Bytes live at each kernel; buffers sharing an offset at the same time (in place) count once, as
// the largest of them. One sweep over the spans' starts and ends: a per-kernel tally of every live
// buffer grew as kernels x buffers (a 1024-layer model's report took minutes and gigabytes).
// What wrote a buffer first, as the other views name it: the kernel's symbol (a built-in op's
// code), its instruction and its place in the model (h.0.mlp.c_fc), or its location where it has
// no place (IR without --debug-info).
std::string producer(const Module& m, const fb::Instr& ins, int64_t k) {
  const auto* kernels = m.fb().kernels();
  std::string what = ins.op() == fb::OpCode::Kernel && kernels && ins.ints() && ins.ints()->size() &&
                             uint32_t(ins.ints()->Get(0)) < kernels->size()
                         ? kernels->Get(uint32_t(ins.ints()->Get(0)))->symbol()->str()
                         : std::string(fb::EnumNameOpCode(ins.op()));
  what += " (instr " + std::to_string(k);
  if (const std::string where = place(ins.loc()); !where.empty()) return what + ", " + where + ")";
  return what + (ins.loc() && ins.loc()->size() ? ", " + ins.loc()->str() + ")" : ")");
}

std::vector<uint64_t> live_bytes(const Module& m, const fb::Program& p, const std::vector<Span>& spans) {
  const int64_t n = p.instrs()->size();
  std::vector<std::vector<const Span*>> starts(n + 1), ends(n + 1);
  for (const Span& s : spans) {
    starts[s.first].push_back(&s);
    ends[s.last].push_back(&s);
  }
  std::map<uint64_t, std::multiset<uint64_t>> at;  // offset -> the sizes of the buffers live there
  auto largest = [](const std::multiset<uint64_t>& sizes) { return sizes.empty() ? uint64_t(0) : *sizes.rbegin(); };
  uint64_t total = 0;
  std::vector<uint64_t> out(n + 1, 0);
  for (int64_t k = 0; k <= n; ++k) {
    for (const Span* s : starts[k]) {
      std::multiset<uint64_t>& sizes = at[m.buffer(s->buffer).offset()];
      total -= largest(sizes);
      sizes.insert(m.buffer(s->buffer).size());
      total += largest(sizes);
    }
    out[k] = total;
    for (const Span* s : ends[k]) {
      std::multiset<uint64_t>& sizes = at[m.buffer(s->buffer).offset()];
      total -= largest(sizes);
      sizes.erase(sizes.find(m.buffer(s->buffer).size()));
      total += largest(sizes);
    }
  }
  return out;
}

// The program whose planned activations are largest (the training micro-step).
const fb::Program* largest_program(const Module& m) {
  const fb::Program* best = nullptr;
  uint64_t best_peak = 0;
  for (const fb::Program* p : *m.fb().programs()) {
    auto spans = spans_of(m, *p);
    auto live = live_bytes(m, *p, spans);
    uint64_t peak = live.empty() ? 0 : *std::max_element(live.begin(), live.end());
    if (!best || peak > best_peak) best = p, best_peak = peak;
  }
  return best;
}

}  // namespace

void add_memory_report(const Module& m, nlohmann::ordered_json& j) {
  const fb::Module& f = m.fb();
  std::map<fb::BufferKind, uint64_t> by_kind;
  for (const fb::Buffer* b : *f.buffers()) by_kind[b->kind()] += b->size();
  j["activation_bytes"] = f.activation_size();
  j["naive_bytes"] = f.naive_activation_size();
  j["state_bytes"] = f.state_size();
  j["total_arena_bytes"] = f.arena_size();
  j["param_bytes"] = by_kind[fb::BufferKind::Parameter];
  j["accounting"] = {{"parameters", by_kind[fb::BufferKind::Parameter]},
                     {"gradients", by_kind[fb::BufferKind::Gradient]},
                     {"optimizer_state", by_kind[fb::BufferKind::AdamM] + by_kind[fb::BufferKind::AdamV]},
                     {"compute_copies", by_kind[fb::BufferKind::ComputeCopy]},
                     {"inputs", by_kind[fb::BufferKind::Input]},
                     {"hyperparameters", by_kind[fb::BufferKind::Hyper]},
                     {"activations", f.activation_size()}};

  // The peak of the largest program, and what is live then.
  const fb::Program* p = largest_program(m);
  nlohmann::ordered_json peak = {{"program", p ? p->name()->str() : ""}, {"instr", 0}, {"live_bytes", 0},
                                 {"largest", nlohmann::ordered_json::array()}};
  if (p) {
    auto spans = spans_of(m, *p);
    auto live = live_bytes(m, *p, spans);
    const int64_t k = std::max_element(live.begin(), live.end()) - live.begin();
    std::vector<Span> at;
    for (const Span& s : spans)
      if (s.first <= k && k <= s.last) at.push_back(s);
    std::sort(at.begin(), at.end(), [&](const Span& a, const Span& b) {
      return m.buffer(a.buffer).size() > m.buffer(b.buffer).size();
    });
    if (at.size() > 8) at.resize(8);
    peak["instr"] = k;
    peak["live_bytes"] = live[k];
    for (const Span& s : at)
      peak["largest"].push_back({{"buffer", m.buffer(s.buffer).name()->str()},
                                 {"bytes", m.buffer(s.buffer).size()},
                                 {"produced_by", producer(m, *s.producer, s.first)}});
  }
  j["peak"] = peak;

  // FLOPs of one micro-step by phase, against 6 * params * tokens + 12 * L * C * T * tokens.
  std::map<fb::Phase, double> by_phase;
  int recomputed = 0;
  if (const fb::Program* step = m.program("micro_step"))
    for (const fb::Instr* ins : *step->instrs()) {
      by_phase[ins->phase()] += instr_flops(m, *ins);
      recomputed += ins->phase() == fb::Phase::Recompute;
    }
  const fb::Model& model = *f.model();
  const double tokens = double(model.batch_size()) * model.seq_len();
  double params = 0;
  for (const fb::Parameter* q : *f.parameters()) params += double(numel(m.buffer(q->value())));
  const double rule = 6.0 * params * tokens + 12.0 * model.n_layer() * model.n_embd() * double(model.seq_len()) * tokens;
  const double counted = by_phase[fb::Phase::Forward] + by_phase[fb::Phase::Backward];
  j["flops"] = {{"tokens", int64_t(tokens)},
                {"forward", by_phase[fb::Phase::Forward]},
                {"backward", by_phase[fb::Phase::Backward]},
                {"recompute", by_phase[fb::Phase::Recompute]},
                {"rule_6nd_plus_attention", rule},
                {"counted_over_rule", rule > 0 ? counted / rule : 0.0}};
  // Data parallelism: the gradient buckets the compiler placed in the backward pass, with the
  // backward work still to run when each one starts (what its exchange can overlap with).
  nlohmann::ordered_json buckets = nlohmann::ordered_json::array();
  double comm_bytes = 0, overlappable = 0;
  if (const fb::Program* step = m.program("micro_step")) {
    const auto& code = *step->instrs();
    for (uint32_t k = 0; k < code.size(); ++k) {
      const fb::Instr* ins = code.Get(k);
      if (ins->op() != fb::OpCode::ReduceGradients) continue;
      double bytes = 0, after = 0;
      for (uint32_t i = 1; i < ins->ints()->size(); ++i) bytes += 4.0 * double(ins->ints()->Get(i));
      for (uint32_t n = k + 1; n < code.size(); ++n) after += instr_flops(m, *code.Get(n));
      comm_bytes += bytes;
      if (after > 0) overlappable += bytes;
      buckets.push_back({{"bucket", ins->ints()->Get(0)}, {"parameters", ins->inputs()->size()},
                         {"bytes", bytes}, {"backward_flops_after", after},
                         {"share_of_backward_after", by_phase[fb::Phase::Backward] > 0 ? after / by_phase[fb::Phase::Backward] : 0.0}});
    }
  }
  j["communication"] = {{"gradient_bytes_per_step", comm_bytes},
                        {"bytes_started_during_backward", overlappable},
                        {"buckets", buckets}};
  j["recompute"] = {{"mode", f.recompute() ? f.recompute()->str() : "none"},
                    {"kernels", recomputed},
                    {"flops", by_phase[fb::Phase::Recompute]}};
}

nlohmann::ordered_json data_parallel_report(const Module& m, int ranks, int zero, double bucket_mb) {
  std::vector<std::string> programs;  // what train runs (runtime/trainer.cpp)
  for (const char* p : {"micro_step", "optimizer_step", "forward"})
    if (m.program(p)) programs.push_back(p);
  if (!m.program("micro_step") || !m.program("optimizer_step"))
    throw Error(m.source() + ": --ranks: not a training module (no micro_step or optimizer_step program)");
  const uint64_t one = layout_arena(m).arena_bytes(m, programs);
  nlohmann::ordered_json per_rank = nlohmann::ordered_json::array(), state = nlohmann::ordered_json::array();
  const BucketPlan plan = module_buckets(m, ranks, int64_t(bucket_mb * 1e6));
  for (int r = 0; r < ranks; ++r) {
    const ArenaLayout l = layout_arena(m, data_parallel_state(plan, r, zero));
    per_rank.push_back(l.arena_bytes(m, programs));
    state.push_back(l.state_bytes);
  }
  return {{"ranks", ranks}, {"zero", zero}, {"arena_bytes_one_process", one},
          {"arena_bytes_per_rank", per_rank}, {"state_bytes_per_rank", state}};
}

std::string memory_timeline_svg(const Module& m, const std::string& program) {
  const fb::Program* p = program.empty() ? largest_program(m) : &named_program(m, program);
  const double W = 1200, H = 640, left = 70, top = 40, right = 20, bottom = 40;
  std::string out;
  auto add = [&](const char* fmt, auto... args) {  // sized to fit: a cut line would break the XML
    std::string line(size_t(std::snprintf(nullptr, 0, fmt, args...)), '\0');
    std::snprintf(line.data(), line.size() + 1, fmt, args...);
    out += line;
  };
  add("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
  add("<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
  if (!p) return out + "</svg>\n";
  auto spans = spans_of(m, *p);
  const double n = double(p->instrs()->size()) + 1;
  const double base = double(m.fb().state_size());
  const double arena = std::max(1.0, double(m.fb().activation_size()));
  const double sx = (W - left - right) / n, sy = (H - top - bottom) / arena;
  add("<text x=\"%.0f\" y=\"22\" font-size=\"15\">%s: memory timeline of program '%s' (%.1f MiB planned activations)</text>\n",
      left, xml_escaped(m.source()).c_str(), xml_escaped(p->name()->str()).c_str(), arena / 1048576.0);
  const char* colour[] = {"#4e79a7", "#f28e2b", "#59a14f", "#b07aa1"};  // by phase
  for (const Span& s : spans) {
    const fb::Buffer& b = m.buffer(s.buffer);
    add("<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\" fill-opacity=\"0.75\" stroke=\"#333\" stroke-width=\"0.2\"><title>%s: %llu bytes, live at instrs %lld..%lld</title></rect>\n",
        left + s.first * sx, top + (double(b.offset()) - base) * sy, std::max(1.0, (s.last - s.first + 1) * sx),
        std::max(0.5, double(b.size()) * sy), colour[int(s.producer->phase()) & 3], xml_escaped(b.name()->str()).c_str(),
        (unsigned long long)b.size(), (long long)s.first, (long long)s.last);
  }
  add("<text x=\"%.0f\" y=\"%.0f\">instruction index (time: kernels and built-in ops) &#8594;</text>\n", left, H - 12);
  add("<text x=\"14\" y=\"%.0f\" transform=\"rotate(-90 14 %.0f)\">arena offset &#8595;</text>\n", top + 200, top + 200);
  const char* names[] = {"forward", "backward", "recompute", "optimizer"};
  for (int i = 0; i < 4; ++i)
    add("<rect x=\"%.0f\" y=\"%.0f\" width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
        W - 420 + i * 100, H - 24, colour[i], W - 404 + i * 100, H - 14, names[i]);
  return out + "</svg>\n";
}

}  // namespace kiln
