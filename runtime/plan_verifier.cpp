#include "runtime/plan_verifier.h"

#include <algorithm>
#include <map>

#include "runtime/error.h"

namespace kiln {
namespace {

// Kernels that may write an output over an input: built-in elementwise ones, generated
// elementwise kernels and the fused classifier (each finishes reading an element or row first).
bool in_place_kernel(const Module& m, const fb::Instr& ins) {
  const fb::OpCode op = ins.op();
  if (op == fb::OpCode::Kernel) {
    const auto* ks = m.fb().kernels();
    if (!ks || ins.ints()->size() != 1 || ins.ints()->Get(0) < 0 || ins.ints()->Get(0) >= int64_t(ks->size()))
      return false;
    const auto* kind = ks->Get(uint32_t(ins.ints()->Get(0)))->kind();
    return kind && (kind->str() == "elementwise" || kind->str() == "classifier");
  }
  return op == fb::OpCode::Add || op == fb::OpCode::Mul || op == fb::OpCode::Scale ||
         op == fb::OpCode::Gelu || op == fb::OpCode::GeluGrad;
}

struct Live {
  uint32_t buffer;
  int64_t first, last;
};

std::string describe(const Module& m, uint32_t i) {
  const fb::Buffer& b = m.buffer(i);
  return "buffer " + std::to_string(i) + " '" + (b.name() ? b.name()->str() : "") + "' [" +
         std::to_string(b.offset()) + ", " + std::to_string(b.offset() + b.size()) + ")";
}

}  // namespace

void verify_plan(const Module& m) {
  const fb::Module& f = m.fb();
  const std::string where = m.source() + ": memory plan: ";
  const uint64_t state = f.state_size();

  // The state region holds every non-activation buffer, without overlaps.
  std::vector<uint32_t> region;
  for (uint32_t i = 0; i < f.buffers()->size(); ++i) {
    const fb::Buffer& b = m.buffer(i);
    const bool is_state = b.kind() != fb::BufferKind::Activation;
    if (is_state && b.offset() + b.size() > state)
      throw Error(where + describe(m, i) + " is state but lies outside the state region [0, " + std::to_string(state) + ")");
    if (!is_state && b.size() && b.offset() < state)
      throw Error(where + describe(m, i) + " is an activation inside the state region [0, " + std::to_string(state) + ")");
    if (is_state) region.push_back(i);
  }
  std::sort(region.begin(), region.end(), [&](uint32_t a, uint32_t b) { return m.buffer(a).offset() < m.buffer(b).offset(); });
  for (size_t k = 1; k < region.size(); ++k) {
    const fb::Buffer &prev = m.buffer(region[k - 1]), &cur = m.buffer(region[k]);
    if (prev.size() && cur.size() && cur.offset() < prev.offset() + prev.size())
      throw Error(where + describe(m, region[k - 1]) + " and " + describe(m, region[k]) + " overlap in the state region");
  }

  for (const fb::Program* prog : *f.programs()) {
    const std::string pname = prog->name()->str();
    const int64_t n = prog->instrs()->size();
    std::map<uint32_t, Live> live;
    // What earlier runs left: live from before the first instruction to after the last (activations,
    // by Module::verify).
    for (uint32_t b : m.kept_buffers(*prog)) live[b] = Live{b, -1, n};
    for (int64_t k = 0; k < n; ++k) {
      const fb::Instr& ins = *prog->instrs()->Get(k);
      for (uint32_t b : *ins.inputs()) {
        if (m.buffer(b).kind() != fb::BufferKind::Activation) continue;
        auto it = live.find(b);
        if (it == live.end())
          throw Error(where + "program " + pname + ", instr " + std::to_string(k) + " reads " +
                      describe(m, b) + " before any kernel writes it");
        it->second.last = std::max(it->second.last, k);  // (a kept buffer stays live to the end)
      }
      for (uint32_t b : *ins.outputs()) {
        if (m.buffer(b).kind() != fb::BufferKind::Activation) continue;
        auto [it, fresh] = live.try_emplace(b, Live{b, k, k});
        if (!fresh) it->second.last = std::max(it->second.last, k);
      }
    }
    if (auto it = live.find(prog->result()); it != live.end()) it->second.last = n;  // read after the call
    else if (m.buffer(prog->result()).kind() == fb::BufferKind::Activation)
      throw Error(where + "program " + pname + " returns " + describe(m, prog->result()) + ", which it never writes");
    // An executor that runs only this program allocates the state and this much more.
    const uint64_t limit = state + prog->activation_size();
    if (limit > f.arena_size())
      throw Error(where + "program " + pname + " needs " + std::to_string(prog->activation_size()) +
                  " activation bytes, more than the arena holds");
    for (auto& [b, l] : live)
      if (m.buffer(b).offset() + m.buffer(b).size() > limit)
        throw Error(where + "program " + pname + ": " + describe(m, b) + " lies beyond its " +
                    std::to_string(prog->activation_size()) + " planned activation bytes");

    // A sweep over time: `active` holds the buffers live at the current instruction, by offset.
    // They are disjoint, so their ends rise with their offsets and the ones a new buffer overlaps
    // are those just below its end. An input that an in-place kernel writes over leaves `active`
    // for `replaced`, which holds such inputs until the sweep passes their last instruction.
    std::vector<Live> spans;
    for (auto& [b, l] : live)
      if (m.buffer(b).size()) spans.push_back(l);
    std::stable_sort(spans.begin(), spans.end(), [](const Live& a, const Live& b) { return a.first < b.first; });
    std::map<std::pair<uint64_t, size_t>, size_t> active;  // (offset, index in spans) -> index
    std::multimap<int64_t, std::pair<uint64_t, size_t>> ending;  // last instr -> key in active
    std::vector<size_t> replaced;
    auto overlap = [&](size_t i, size_t j) {
      const fb::Buffer &a = m.buffer(spans[i].buffer), &b = m.buffer(spans[j].buffer);
      return a.offset() < b.offset() + b.size() && b.offset() < a.offset() + a.size();
    };
    // Whether buffer j, first written by instr k, may overlap live buffer i: only an elementwise
    // kernel writing its output exactly over an input it reads last.
    auto in_place = [&](size_t i, size_t j, int64_t k) {
      if (spans[i].last != k || k >= n || m.buffer(spans[i].buffer).offset() != m.buffer(spans[j].buffer).offset())
        return false;
      const fb::Instr& ins = *prog->instrs()->Get(k);
      auto has = [](const flatbuffers::Vector<uint32_t>* v, uint32_t x) {
        return std::find(v->begin(), v->end(), x) != v->end();
      };
      return in_place_kernel(m, ins) && has(ins.inputs(), spans[i].buffer) && has(ins.outputs(), spans[j].buffer);
    };
    // A buffer's live instructions, and where the first of them came from (an IR file's line,
    // when the module was compiled from one).
    auto lived = [&](size_t i) {
      std::string text = " (instrs " + std::to_string(spans[i].first) + ".." + std::to_string(spans[i].last);
      const int64_t k = spans[i].first;
      if (const auto* loc = k >= 0 && k < n ? prog->instrs()->Get(k)->loc() : nullptr; loc && loc->size())
        text += ", the first at " + loc->str();
      return text + ")";
    };
    auto fail = [&](size_t i, size_t j) {
      throw Error(where + "program " + pname + ": " + describe(m, spans[i].buffer) + lived(i) + " and " +
                  describe(m, spans[j].buffer) + lived(j) + " overlap while both are live");
    };
    for (size_t j = 0; j < spans.size(); ++j) {
      const int64_t k = spans[j].first;
      while (!ending.empty() && ending.begin()->first < k) {
        active.erase(ending.begin()->second);
        ending.erase(ending.begin());
      }
      replaced.erase(std::remove_if(replaced.begin(), replaced.end(), [&](size_t i) { return spans[i].last < k; }),
                     replaced.end());
      for (size_t i : replaced)
        if (overlap(i, j) && !in_place(i, j, k)) fail(i, j);
      const fb::Buffer& b = m.buffer(spans[j].buffer);
      const uint64_t lo = b.offset(), hi = b.offset() + b.size();
      std::vector<std::pair<uint64_t, size_t>> written_over;
      for (auto it = active.lower_bound({hi, 0}); it != active.begin();) {
        --it;
        const size_t i = it->second;
        if (!overlap(i, j)) break;
        if (!in_place(i, j, k)) fail(i, j);
        written_over.push_back(it->first);
      }
      for (const auto& key : written_over) {
        replaced.push_back(active[key]);
        active.erase(key);
      }
      active.emplace(std::make_pair(lo, j), j);
      ending.emplace(spans[j].last, std::make_pair(lo, j));
    }
  }
}

}  // namespace kiln
