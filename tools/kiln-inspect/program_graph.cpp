#include "tools/kiln-inspect/program_graph.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
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

// A long kernel name broken at underscores into lines of about `width` characters.
std::string wrapped(const std::string& name, size_t width = 30) {
  std::string out, line;
  size_t at = 0;
  while (at <= name.size()) {
    size_t next = name.find('_', at);
    if (next == std::string::npos) next = name.size();
    const std::string word = name.substr(at, next - at);
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      out += line + "_\n";
      line.clear();
    }
    line += (line.empty() ? "" : "_") + word;
    at = next + 1;
  }
  return out + line;
}

// The op's place in the model from its location: loc("h.0.mlp"(...)) gives h.0.mlp.
std::string place(const flatbuffers::String* loc) {
  if (!loc) return "";
  const std::string s = loc->str();
  const size_t a = s.find('"');
  const size_t b = a == std::string::npos ? a : s.find('"', a + 1);
  return b == std::string::npos ? "" : s.substr(a + 1, b - a - 1);
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

}  // namespace

std::string program_dot(const Module& m, const std::string& program, GraphState state) {
  const fb::Program* prog = m.program(program);
  if (!prog) {
    std::string names;
    for (const fb::Program* p : *m.fb().programs()) names += (names.empty() ? "" : ", ") + p->name()->str();
    throw Error(m.source() + ": no program '" + program + "' (it has " + names + ")");
  }
  const auto* kernels = m.fb().kernels();
  const int64_t n = prog->instrs()->size();
  std::string out = "digraph " + quoted(program) + " {\n";
  out += "  graph [rankdir=TB, fontname=\"Helvetica\", fontsize=12, label=" +
         quoted(m.source() + ": program " + program + ", " + std::to_string(n) +
                " instructions (boxes, in order), the buffers between them (edges)" +
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
    bool whole_model = false;  // the optimizer kernel: its location is its first parameter's
    if (ins.op() == fb::OpCode::Kernel && kernels && uint32_t(ins.ints()->Get(0)) < kernels->size()) {
      const fb::Kernel& kr = *kernels->Get(uint32_t(ins.ints()->Get(0)));
      const std::string kind = kr.kind() ? kr.kind()->str() : "";
      label += wrapped(kr.name() ? kr.name()->str() : kr.symbol()->str()) + "\n" + kind;
      if (kr.cublaslt() && kr.cublaslt()->size()) label += ", cuBLASLt";
      if (kr.launches() > 1) label += ", " + std::to_string(kr.launches()) + " launches";
      fill = fill_of_kind(kind);
      whole_model = kind == "optimizer";
    } else {
      label += std::string(fb::EnumNameOpCode(ins.op())) + "\nbuilt-in";
      const bool hook = ins.op() == fb::OpCode::ReduceGradients || ins.op() == fb::OpCode::WaitGradients;
      if (hook) label += " (ranks)", style = "filled,dashed", fill = "#fff3cd";
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
  auto state_shown = [&](uint32_t b) {
    const fb::BufferKind kind = m.buffer(b).kind();
    return state == GraphState::All || kind == fb::BufferKind::Input || kind == fb::BufferKind::Hyper;
  };
  std::set<uint32_t> kept;  // decode's key/value caches: activations that outlive a run
  for (uint32_t b : m.kept_buffers(*prog)) kept.insert(b);
  // A state buffer gets a node beside each instruction that uses it (one node for all its uses
  // would pull a parameter read by the forward and the backward pass across the whole picture).
  auto state_node = [&](uint32_t b, int64_t k) {
    const std::string id = "b" + std::to_string(b) + "_" + std::to_string(k);
    const std::string kind = kept.count(b) ? "kept between runs" : fb::EnumNameBufferKind(m.buffer(b).kind());
    out += "  " + id + " [shape=ellipse, fillcolor=" + quoted(fill_of_buffer(m.buffer(b).kind())) +
           ", label=" + quoted(buffer_label(m, b) + "\n" + kind) + "];\n";
    return id;
  };
  for (int64_t k = 0; k < n; ++k) {
    const fb::Instr& ins = *prog->instrs()->Get(uint32_t(k));
    const std::string to = "i" + std::to_string(k);
    std::set<uint32_t> written(ins.outputs()->begin(), ins.outputs()->end());
    for (uint32_t b : std::set<uint32_t>(ins.inputs()->begin(), ins.inputs()->end())) {
      if (m.buffer(b).kind() == fb::BufferKind::Activation && !kept.count(b)) {
        auto w = writer.find(b);
        if (w == writer.end()) continue;
        // An activation kept for a distant reader (the backward pass's saved values) arrives
        // as a note naming its writer: an edge across the picture would hide the local ones (and
        // take Graphviz minutes to route for GPT-2 124M).
        const fb::Instr& from = *prog->instrs()->Get(uint32_t(w->second));
        if (from.phase() != ins.phase() || k - w->second > kLocal) {
          const std::string id = "s" + std::to_string(b) + "_" + std::to_string(k);
          out += "  " + id + " [shape=note, fillcolor=\"#ffffff\", label=" +
                 quoted(buffer_label(m, b) + "\nfrom #" + std::to_string(w->second)) + "];\n  " + id + " -> " + to + ";\n";
        } else {
          out += "  i" + std::to_string(w->second) + " -> " + to + " [label=" + quoted(buffer_label(m, b)) + "];\n";
        }
      } else if ((kept.count(b) || state_shown(b)) && !written.count(b)) {
        out += "  " + state_node(b, k) + " -> " + to + ";\n";
      }
    }
    for (uint32_t b : written) {
      const bool is_state = m.buffer(b).kind() != fb::BufferKind::Activation || kept.count(b);
      if (is_state && (kept.count(b) || state_shown(b))) {
        const bool reads = std::find(ins.inputs()->begin(), ins.inputs()->end(), b) != ins.inputs()->end();
        out += "  " + to + " -> " + state_node(b, k) + (reads ? " [style=bold, label=\"updates\"]" : "") + ";\n";
      }
      writer[b] = k;
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
