// kiln-inspect: reports on a module or a training executable (text, or --json).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "runtime/module.h"

using namespace kiln;
using nlohmann::ordered_json;

namespace {

ordered_json report(const Module& m) {
  const fb::Module& f = m.fb();
  const fb::Model& model = *f.model();
  ordered_json j;
  j["module"] = m.source();
  j["format_version"] = f.format_version();
  j["compiler"] = f.compiler() ? f.compiler()->str() : "";
  j["model"] = {{"spec", model.spec() ? model.spec()->str() : ""},
                {"n_layer", model.n_layer()}, {"n_head", model.n_head()},
                {"n_embd", model.n_embd()}, {"vocab_size", model.vocab_size()},
                {"block_size", model.block_size()}, {"batch_size", model.batch_size()},
                {"seq_len", model.seq_len()},
                {"precision", model.precision() ? model.precision()->str() : ""},
                {"target", model.target() ? model.target()->str() : ""}};
  int64_t count = 0;
  ordered_json params = ordered_json::array();
  for (const fb::Parameter* p : *f.parameters()) {
    count += numel(m.buffer(p->value()));
    params.push_back({{"name", p->name()->str()},
                      {"shape", std::vector<int64_t>(p->shape()->begin(), p->shape()->end())},
                      {"decay", p->decay()}});
  }
  j["parameter_count"] = count;
  j["parameters"] = params;
  ordered_json programs = ordered_json::array();
  for (const fb::Program* p : *f.programs()) {
    std::map<std::string, int> ops;
    for (const fb::Instr* ins : *p->instrs()) ops[fb::EnumNameOpCode(ins->op())]++;
    programs.push_back({{"name", p->name()->str()}, {"kernels", p->instrs()->size()}, {"ops", ops}});
  }
  j["programs"] = programs;
  std::map<std::string, uint64_t> bytes;
  for (const fb::Buffer* b : *f.buffers()) bytes[fb::EnumNameBufferKind(b->kind())] += b->size();
  j["buffers"] = {{"count", f.buffers()->size()}, {"bytes_by_kind", bytes}};
  j["arena_bytes"] = f.arena_size();
  return j;
}

std::string human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  char s[32];
  std::snprintf(s, sizeof s, u ? "%.2f %s" : "%.0f %s", bytes, units[u]);
  return s;
}

void print_text(const ordered_json& j) {
  const auto& m = j["model"];
  std::printf("module     %s (format %d, %s)\n", j["module"].get<std::string>().c_str(),
              j["format_version"].get<int>(), j["compiler"].get<std::string>().c_str());
  std::printf("model      %s: L=%d H=%d C=%d V=%d Tmax=%d\n", m["spec"].get<std::string>().c_str(),
              m["n_layer"].get<int>(), m["n_head"].get<int>(), m["n_embd"].get<int>(),
              m["vocab_size"].get<int>(), m["block_size"].get<int>());
  std::printf("compiled   B=%d T=%d %s %s\n", m["batch_size"].get<int>(), m["seq_len"].get<int>(),
              m["precision"].get<std::string>().c_str(), m["target"].get<std::string>().c_str());
  std::printf("parameters %zu tensors, %lld values\n", j["parameters"].size(),
              (long long)j["parameter_count"].get<int64_t>());
  std::printf("arena      %s in %d buffers\n", human(j["arena_bytes"].get<double>()).c_str(),
              j["buffers"]["count"].get<int>());
  for (const auto& [kind, b] : j["buffers"]["bytes_by_kind"].items())
    std::printf("  %-12s %s\n", kind.c_str(), human(b.get<double>()).c_str());
  std::printf("\n%-16s %8s  ops\n", "program", "kernels");
  for (const auto& p : j["programs"]) {
    std::string ops;
    for (const auto& [op, n] : p["ops"].items()) ops += op + " x" + std::to_string(n.get<int>()) + ", ";
    if (!ops.empty()) ops.resize(ops.size() - 2);
    std::printf("%-16s %8d  %s\n", p["name"].get<std::string>().c_str(), p["kernels"].get<int>(), ops.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln-inspect: report on a Kiln module or training executable"};
  std::string path;
  bool json = false;
  app.add_option("module", path, "module (.kiln) or executable written by kilnc")->required();
  app.add_flag("--json", json, "print the report as one JSON object");
  CLI11_PARSE(app, argc, argv);
  try {
    Module m = Module::load(path);
    ordered_json j = report(m);
    if (json) std::printf("%s\n", j.dump(2).c_str());
    else print_text(j);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
