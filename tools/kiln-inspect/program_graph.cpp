#include "tools/kiln-inspect/program_graph.h"

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/error.h"
#include "runtime/shape.h"

namespace kiln {
namespace {

// A DOT string literal's contents: quotes and backslashes escaped, newlines as \n.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') out += "\\n";
    else out += c;
  }
  return out + "\"";
}

// A long kernel name broken after underscores into lines of about `width` characters (every
// character kept: the lines joined give the name back).
std::string wrapped(const std::string& name, size_t width = 30) {
  std::string out, line;
  size_t at = 0;
  while (at < name.size()) {
    size_t next = name.find('_', at);
    next = next == std::string::npos ? name.size() : next + 1;  // a piece ends with its underscore
    const std::string piece = name.substr(at, next - at);
    if (!line.empty() && line.size() + piece.size() > width) out += line + "\n", line.clear();
    line += piece;
    at = next;
  }
  return out + line;
}

const char* fill_of_kind(const std::string& kind) {
  if (kind == "matmul") return "#cfe2ff";
  if (kind.rfind("attention", 0) == 0 || kind == "decode_attention") return "#ffe0b3";
  if (kind.rfind("layer_norm", 0) == 0) return "#d9f2d9";
  if (kind == "classifier") return "#f8d7da";
  if (kind == "optimizer") return "#e2d9f3";
  return "#f2f2f2";
}

const char* fill_of_buffer(fb::BufferKind k) {
  switch (k) {
    case fb::BufferKind::Parameter: case fb::BufferKind::ComputeCopy: return "#cfe2ff";
    case fb::BufferKind::Gradient: return "#f8d7da";
    case fb::BufferKind::AdamM: case fb::BufferKind::AdamV: return "#e2d9f3";
    case fb::BufferKind::Input: return "#fff3cd";
    case fb::BufferKind::Hyper: return "#ffffff";
    default: return "#f2f2f2";
  }
}

const char* phase_name(fb::Phase p) {
  switch (p) {
    case fb::Phase::Forward: return "forward";
    case fb::Phase::Backward: return "backward";
    case fb::Phase::Recompute: return "recompute";
    case fb::Phase::Optimizer: return "optimizer";
  }
  return "other";
}

std::string buffer_label(const Module& m, uint32_t b) {
  const fb::Buffer& buf = m.buffer(b);
  std::vector<int64_t> shape;
  if (buf.shape())
    for (int64_t d : *buf.shape()) shape.push_back(d);
  return (buf.name() ? buf.name()->str() : "buffer " + std::to_string(b)) + "\n" + shape_str(shape) + " " +
         fb::EnumNameDType(buf.dtype());
}

// Instructions apart within which an activation is drawn as an edge (farther: a note).
constexpr int64_t kLocal = 8;
// State buffers of one instruction drawn one by one; more are summed up by kind.
constexpr size_t kMaxStateNodes = 16;

// How an instruction uses a state buffer.
enum class Use { Read, Written, Updated };
const char* use_name(Use u) { return u == Use::Read ? "read" : u == Use::Written ? "written" : "updated"; }

}  // namespace

std::string place(const flatbuffers::String* loc) {
  if (!loc) return "";
  const std::string s = loc->str();
  const size_t a = s.find('"');
  const size_t b = a == std::string::npos ? a : s.find('"', a + 1);
  return b == std::string::npos ? "" : s.substr(a + 1, b - a - 1);
}

const fb::Program& named_program(const Module& m, const std::string& program) {
  if (const fb::Program* p = m.program(program)) return *p;
  std::string names;
  for (const fb::Program* p : *m.fb().programs()) names += (names.empty() ? "" : ", ") + p->name()->str();
  throw Error(m.source() + ": no program '" + program + "' (it has " + names + ")");
}

std::string program_dot(const Module& m, const std::string& program, GraphState state) {
  const fb::Program* prog = &named_program(m, program);
  const auto* kernels = m.fb().kernels();
  const int64_t n = prog->instrs()->size();
  std::string out = "digraph " + quoted(program) + " {\n";
  out += "  graph [rankdir=TB, fontname=\"Helvetica\", fontsize=12, label=" +
         quoted(m.source() + ": program " + program + ", " + std::to_string(n) +
                " instructions (boxes, in order), the buffers between them (edges; notes for distant ones)" +
                (state == GraphState::All ? " and the state they read or write (ellipses)" : "")) +
         ", labelloc=t];\n";
  out += "  node [fontname=\"Helvetica\", fontsize=10, style=filled];\n  edge [fontname=\"Helvetica\", fontsize=8];\n";

  // Instruction nodes, clustered by phase: consecutive instructions of one phase share a cluster.
  int cluster = 0;
  fb::Phase open_phase = fb::Phase::Forward;
  bool open = false;
  for (int64_t k = 0; k < n; ++k) {
    const fb::Instr& ins = *prog->instrs()->Get(uint32_t(k));
    if (!open || ins.phase() != open_phase) {
      if (open) out += "  }\n";
      out += "  subgraph cluster_" + std::to_string(cluster++) + " {\n    label=" + quoted(phase_name(ins.phase())) +
             "; style=rounded; color=\"#999999\";\n";
      open = true, open_phase = ins.phase();
    }
    std::string label = "#" + std::to_string(k) + " ", fill = "#ffffff", style = "filled";
    bool whole_model = false;  // the optimizer kernel and the hooks: no one place in the model
    if (ins.op() == fb::OpCode::Kernel && kernels && uint32_t(ins.ints()->Get(0)) < kernels->size()) {
      const fb::Kernel& kr = *kernels->Get(uint32_t(ins.ints()->Get(0)));
      const std::string kind = kr.kind() ? kr.kind()->str() : "";
      // The symbol (k<N>_<name>), not the name alone: several kernels share a name (the same ops on
      // other shapes), and the symbol is what --kernel-source, --cuda-resources and kernels.tsv list.
      label += wrapped(kr.symbol() ? kr.symbol()->str() : kr.name()->str()) + "\n(" + kind;
      if (kr.cublaslt() && kr.cublaslt()->size()) label += ", cuBLASLt";
      if (kr.launches() > 1) label += ", " + std::to_string(kr.launches()) + " launches";
      label += ")";
      fill = fill_of_kind(kind);
      whole_model = kind == "optimizer";
    } else {
      const bool hook = ins.op() == fb::OpCode::ReduceGradients || ins.op() == fb::OpCode::WaitGradients;
      label += std::string(fb::EnumNameOpCode(ins.op())) + (hook ? "\n(built-in, ranks)" : "\n(built-in)");
      if (hook) style = "filled,dashed", fill = "#fff3cd", whole_model = true;  // its location: one gradient's
    }
    if (const std::string where = place(ins.loc()); !where.empty() && !whole_model) label += "\n" + where;
    out += "    i" + std::to_string(k) + " [shape=box, style=" + quoted(style) + ", fillcolor=" + quoted(fill) +
           ", label=" + quoted(label) + "];\n";
  }
  if (open) out += "  }\n";
  // Program order, top to bottom, whatever the data: a hook reading only state stays in its place.
  for (int64_t k = 0; k + 1 < n; ++k)
    out += "  i" + std::to_string(k) + " -> i" + std::to_string(k + 1) + " [style=invis, weight=4];\n";

  // Edges: an activation from the instruction that last wrote it to each that reads it; a state
  // buffer (with GraphState::All, or an input or hyperparameter) as a node of its own.
  std::map<uint32_t, int64_t> writer;
  std::set<uint32_t> kept;  // decode's key/value caches: activations that outlive a run
  for (uint32_t b : m.kept_buffers(*prog)) kept.insert(b);
  auto shown = [&](uint32_t b) {
    const fb::BufferKind kind = m.buffer(b).kind();
    return state == GraphState::All || kind == fb::BufferKind::Input || kind == fb::BufferKind::Hyper || kept.count(b);
  };
  // Updated in place, so read as well as written: a gradient accumulates, AdamW updates a
  // parameter and its moments (the module lists them as outputs), decode attention writes its
  // cache (listed as an input).
  auto in_place = [&](uint32_t b) {
    const fb::BufferKind kind = m.buffer(b).kind();
    return kept.count(b) || kind == fb::BufferKind::Gradient || kind == fb::BufferKind::Parameter ||
           kind == fb::BufferKind::AdamM || kind == fb::BufferKind::AdamV;
  };
  auto kind_name = [&](uint32_t b) -> std::string {
    return kept.count(b) ? "kept between runs" : fb::EnumNameBufferKind(m.buffer(b).kind());
  };
  for (int64_t k = 0; k < n; ++k) {
    const fb::Instr& ins = *prog->instrs()->Get(uint32_t(k));
    const std::string to = "i" + std::to_string(k);
    const std::set<uint32_t> written(ins.outputs()->begin(), ins.outputs()->end());
    std::vector<std::pair<uint32_t, Use>> uses;  // the state buffers shown
    for (uint32_t b : std::set<uint32_t>(ins.inputs()->begin(), ins.inputs()->end())) {
      if (m.buffer(b).kind() == fb::BufferKind::Activation && !kept.count(b)) {
        auto w = writer.find(b);
        const std::string note = "s" + std::to_string(b) + "_" + std::to_string(k);
        if (w == writer.end()) {  // the plan verifier refuses this; drawn rather than hidden
          out += "  " + note + " [shape=note, fillcolor=\"#f8d7da\", label=" +
                 quoted(buffer_label(m, b) + "\nnot written before here") + "];\n  " + note + " -> " + to + ";\n";
        } else if (k - w->second > kLocal) {
          // Read far from its writer (the backward pass's saved values): a note naming the
          // writer, as an edge across the picture would hide the local ones (and take Graphviz
          // minutes to route for GPT-2 124M).
          out += "  " + note + " [shape=note, fillcolor=\"#ffffff\", label=" +
                 quoted(buffer_label(m, b) + "\nfrom #" + std::to_string(w->second)) + "];\n  " + note + " -> " + to + ";\n";
        } else {
          out += "  i" + std::to_string(w->second) + " -> " + to + " [label=" + quoted(buffer_label(m, b)) + "];\n";
        }
      } else if (shown(b) && !written.count(b)) {
        uses.push_back({b, kept.count(b) ? Use::Updated : Use::Read});
      }
    }
    for (uint32_t b : written) {
      if ((m.buffer(b).kind() != fb::BufferKind::Activation || kept.count(b)) && shown(b))
        uses.push_back({b, in_place(b) ? Use::Updated : Use::Written});
      writer[b] = k;
    }
    // A node beside each instruction for each state buffer it uses (one node for all uses would
    // pull a parameter read by the forward and the backward pass across the picture); past
    // kMaxStateNodes (the optimizer, the gradient hooks), one node per kind and use.
    std::map<std::tuple<fb::BufferKind, bool, Use>, int> summary;  // (kind, kept, use)
    auto edge = [&](const std::string& id, Use use) {
      if (use == Use::Read) out += "  " + id + " -> " + to + ";\n";
      else if (use == Use::Written) out += "  " + to + " -> " + id + ";\n";
      else out += "  " + to + " -> " + id + " [dir=both, style=bold, label=\"updates\"];\n";
    };
    for (auto [b, use] : uses) {
      if (uses.size() > kMaxStateNodes) {
        summary[{m.buffer(b).kind(), kept.count(b) > 0, use}]++;
        continue;
      }
      const std::string id = "b" + std::to_string(b) + "_" + std::to_string(k);
      out += "  " + id + " [shape=ellipse, fillcolor=" + quoted(fill_of_buffer(m.buffer(b).kind())) +
             ", label=" + quoted(buffer_label(m, b) + "\n" + kind_name(b)) + "];\n";
      edge(id, use);
    }
    int group = 0;
    for (const auto& [key, count] : summary) {
      const auto& [kind, is_kept, use] = key;
      const std::string id = "g" + std::to_string(k) + "_" + std::to_string(group++);
      const std::string what = is_kept ? "kept" : fb::EnumNameBufferKind(kind);
      out += "  " + id + " [shape=ellipse, peripheries=2, fillcolor=" + quoted(fill_of_buffer(kind)) + ", label=" +
             quoted(std::to_string(count) + " " + what + " buffers\n" + use_name(use)) + "];\n";
      edge(id, use);
    }
  }
  // What the caller reads back.
  const uint32_t result = prog->result();
  out += "  result [shape=plaintext, style=\"\", label=" + quoted("result: " + buffer_label(m, result)) + "];\n";
  if (auto w = writer.find(result); w != writer.end()) out += "  i" + std::to_string(w->second) + " -> result;\n";

  out += "}\n";
  return out;
}

}  // namespace kiln
