#include "tools/kiln-inspect/fusion_report.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "runtime/op_list.h"

namespace kiln {
namespace {

// Instructions that launch no kernel: the communication hooks.
bool launches(const fb::Instr& ins) {
  return ins.op() != fb::OpCode::ReduceGradients && ins.op() != fb::OpCode::WaitGradients;
}

}  // namespace

void add_fusion_report(const Module& m, nlohmann::ordered_json& j) {
  const fb::Module& f = m.fb();
  const auto* kernels = f.kernels();
  j["fusion"] = f.fusion();
  int64_t ops = 0, step = 0, opt = 0, builtin = 0, instrs = 0;
  // Launches of each generated kernel per program.
  std::map<uint32_t, std::map<std::string, int>> uses;
  for (const char* name : {"micro_step", "optimizer_step"}) {
    const fb::Program* p = m.program(name);
    if (!p) continue;
    for (const fb::Instr* ins : *p->instrs()) {
      if (!launches(*ins)) continue;
      const bool step_program = std::string(name) == "micro_step";
      if (ins->op() == fb::OpCode::Kernel) {
        const uint32_t k = uint32_t(ins->ints()->Get(0));
        uses[k][name]++;
        (step_program ? step : opt) += kernels->Get(k)->launches();  // a cuBLASLt call and a function
        instrs += step_program;
        if (step_program) ops += kernels->Get(k)->ops()->size();
      } else {
        (step_program ? step : opt)++;
        if (step_program) ops += 1, builtin += 1, instrs += 1;
      }
    }
  }
  j["ops_before_fusion"] = ops;
  j["kernels_per_micro_step"] = step;  // launches: a cuda kernel may be a cuBLASLt call and a function
  j["builtin_kernels_per_micro_step"] = builtin;  // of them, the runtime's own (BLAS, layer norm, ...)
  j["optimizer_kernels"] = opt;
  const int layers = f.model()->n_layer();
  j["kernels_per_layer"] = layers > 0 ? double(step) / layers : 0.0;
  j["kernel_instructions_per_micro_step"] = instrs;
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  if (kernels)
    for (uint32_t k = 0; k < kernels->size(); ++k) {
      const fb::Kernel& kr = *kernels->Get(k);
      std::vector<std::string> fused;
      for (const auto* s : *kr.ops()) fused.push_back(s->str());
      list.push_back({{"symbol", kr.symbol()->str()}, {"name", kr.name()->str()}, {"kind", kr.kind()->str()},
                      {"ops", fused}, {"flops", kr.flops()}, {"launches", uses[k]},
                      {"launches_per_run", kr.launches()}, {"cublaslt", kr.cublaslt() ? kr.cublaslt()->str() : ""}});
    }
  j["kernels"] = list;
}

void print_fusion_report(const nlohmann::ordered_json& j) {
  const int64_t builtin = j.value("builtin_kernels_per_micro_step", int64_t(0));
  // On cuda a kernel may launch twice (its cuBLASLt call, then its function): both counts are given.
  const int64_t instrs = j.value("kernel_instructions_per_micro_step", j["kernels_per_micro_step"].get<int64_t>());
  // (kernels_per_layer counts launches there: said so, not put after the count of kernels.)
  const bool same = instrs == j["kernels_per_micro_step"].get<int64_t>();
  const std::string count =
      same ? std::to_string(instrs) + " kernels per micro-step ("
           : j["kernels_per_micro_step"].dump() + " kernel launches per micro-step (" + std::to_string(instrs) +
                 " kernels; launches: ";
  std::printf("\nfusion     %s: %s%.1f per layer, with the embedding and head; %lld of them the runtime's "
              "built-in ones) for %lld graph ops (%.2fx); optimizer step %lld kernels\n",
              j["fusion"].get<bool>() ? "on" : "off (kilnc --no-fusion, or kiln-opt fusion=false)", count.c_str(), j["kernels_per_layer"].get<double>(),
              (long long)builtin, (long long)j["ops_before_fusion"].get<int64_t>(),
              j["kernels_per_micro_step"].get<double>() / std::max(1.0, j["ops_before_fusion"].get<double>()),
              (long long)j["optimizer_kernels"].get<int64_t>());
  if (j["kernels"].empty()) return;
  // One row per distinct kernel name: how many kernels, launches and what they fuse.
  struct Row { int kernels = 0, launches = 0; std::string kind, ops; };
  std::map<std::string, Row> rows;
  for (const auto& k : j["kernels"]) {
    Row& r = rows[k["name"].get<std::string>()];
    r.kernels++;
    for (const auto& [prog, n] : k["launches"].items())
      if (prog == "micro_step" || prog == "optimizer_step") r.launches += n.get<int>() * k["launches_per_run"].get<int>();
    r.kind = k["kind"].get<std::string>();
    r.ops = op_list(k["ops"].get<std::vector<std::string>>(), " ");
  }
  // (Launches count one training step: a micro-step and the optimizer step. The sampler's
  // kernels, for prefill and decode, launch 0 times in it.)
  // kernels: the distinct kernels of that name the module holds (the same ops on other shapes,
  // k<N>_<name> each); launches: theirs in one training step.
  int width = 16;
  for (const auto& [name, r] : rows) width = std::max(width, int(name.size()));
  std::printf("  %-16s %-*s %9s %8s  fused ops (one kernel)\n", "kind", width, "generated kernel", "kernels", "launches");
  std::printf("  (launches: in one training step, a micro-step and the optimizer step; the other programs' kernels "
              "(forward, logits, the sampler's) show 0;\n"
              "   kernels: how many of that name, on other shapes: --kernel-source and --profile name each k<N>_<name>)\n");
  // A long list of fused ops goes on over the lines below, at word breaks, under its column.
  const int ops_column = 2 + 16 + 1 + width + 1 + 9 + 1 + 8 + 2;
  for (const auto& [name, r] : rows) {
    std::vector<std::string> lines{""};
    for (size_t at = 0; at < r.ops.size();) {
      const size_t end = std::min(r.ops.find(' ', at), r.ops.size());
      const std::string word = r.ops.substr(at, end - at);
      const bool count = word.size() > 1 && word[0] == 'x' && word.find_first_not_of("0123456789", 1) == std::string::npos;
      if (!count && !lines.back().empty() && lines.back().size() + 1 + word.size() > 70) lines.push_back("");  // ("adamw x28" stays whole)
      lines.back() += (lines.back().empty() ? "" : " ") + word;
      at = end + 1;
    }
    std::printf("  %-16s %-*s %9d %8d  %s\n", r.kind.c_str(), width, name.c_str(), r.kernels, r.launches, lines[0].c_str());
    for (size_t i = 1; i < lines.size(); ++i) std::printf("%*s%s\n", ops_column, "", lines[i].c_str());
  }
}

}  // namespace kiln
