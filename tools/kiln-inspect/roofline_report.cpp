#include "tools/kiln-inspect/roofline_report.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>

#include "runtime/error.h"

namespace kiln {
namespace {

// One kernel name's work in one launch of it (a Kernel instruction, its clearing, the norm).
struct Work {
  double tensor_flops = 0, vector_flops = 0, bytes = 0;
};

struct Row {
  std::string name, kind;
  Work per_step;                        // summed over the programs' launches
  std::map<std::string, int64_t> runs;  // program -> instructions
  int64_t launches = 0;                 // GPU launches in all programs
  double tensor_s = 0, vector_s = 0, memory_s = 0, bound_s = 0;
};

double operand_bytes(const fb::Kernel& k, uint32_t i) {
  return double(k.operand_numel()->Get(i)) * double(dtype_bytes(static_cast<fb::DType>(k.operand_dtype()->Get(i))));
}

// The kernel's own work: its tensor-core products at the tensor rate, the rest of its arithmetic
// at the CUDA-core rate (tensor-core attention's softmax aside: its `flops` is the convention's
// count of the products; SIMT attention runs all of `flops` on the CUDA cores), and every operand
// (and its workspace) read or written once; state the kernel updates in place (a gradient it
// accumulates into; a parameter's value and AdamW moments) is read and written: twice. Its
// operands are the instruction's inputs, then its outputs (runtime/device/device_executor.cpp).
Work kernel_work(const Module& m, const fb::Kernel& k, const fb::Instr& ins) {
  Work w;
  w.tensor_flops = k.tensor_flops();
  const std::string kind = k.kind() ? k.kind()->str() : "";
  if (kind.rfind("attention", 0) != 0) w.vector_flops = std::max(0.0, k.flops() - k.tensor_flops());
  else if (w.tensor_flops == 0) w.vector_flops = k.flops();
  const uint32_t n_in = ins.inputs()->size();
  for (uint32_t i = 0; i < k.operand_numel()->size(); ++i) {
    w.bytes += operand_bytes(k, i);
    if (i < n_in || i - n_in >= ins.outputs()->size()) continue;
    const uint32_t b = ins.outputs()->Get(i - n_in);
    const fb::BufferKind bk = m.buffer(b).kind();
    const bool updated = bk == fb::BufferKind::Gradient || bk == fb::BufferKind::Parameter ||
                         bk == fb::BufferKind::AdamM || bk == fb::BufferKind::AdamV;
    if (updated && std::find(ins.inputs()->begin(), ins.inputs()->end(), b) == ins.inputs()->end())
      w.bytes += operand_bytes(k, i);
  }
  w.bytes += double(k.cuda_scratch_bytes());
  return w;
}

}  // namespace

void add_roofline_report(const Module& m, const RooflineRates& rates, nlohmann::ordered_json& j) {
  const fb::Module& f = m.fb();
  const auto* kernels = f.kernels();
  const std::string target = f.model()->target() ? f.model()->target()->str() : "";
  if (target != "cuda" || !kernels) return;
  // A bf16 module from an older kilnc has no tensor FLOPs; an fp32 one has none to record (its
  // products and SIMT attention run on the CUDA cores).
  const std::string precision = f.model()->precision() ? f.model()->precision()->str() : "";
  bool recorded = precision != "bf16";
  for (const fb::Kernel* k : *kernels) recorded |= k->tensor_flops() > 0;

  std::map<std::string, Row> rows;
  nlohmann::ordered_json programs = nlohmann::ordered_json::object();
  // A step: the runtime clears the gradients (train's zero_grads, before the first micro-step,
  // within the step's time), then micro_step and optimizer_step.
  for (const char* program : {"zero_grads", "micro_step", "optimizer_step"}) {
    const bool zero = std::string(program) == "zero_grads";
    const fb::Program* p = m.program(zero ? "optimizer_step" : program);
    if (!p) continue;
    double tensor = 0, memory = 0, bound = 0, memory_bound = 0, vector_bound = 0;  // this program's sums, seconds
    auto add = [&](const std::string& name, const std::string& kind, const Work& w, int64_t launches) {
      Row& r = rows[name];
      r.name = name, r.kind = kind;
      r.per_step.tensor_flops += w.tensor_flops;
      r.per_step.vector_flops += w.vector_flops;
      r.per_step.bytes += w.bytes;
      r.runs[program]++;
      r.launches += launches;
      const double t = w.tensor_flops / (rates.tensor_tflops * 1e12),
                   v = w.vector_flops / (rates.vector_tflops * 1e12), b = w.bytes / (rates.bandwidth_gbs * 1e9);
      const double least = std::max({t, v, b});
      r.tensor_s += t, r.vector_s += v, r.memory_s += b, r.bound_s += least;
      tensor += t, memory += b, bound += least;
      if (b >= t && b >= v) memory_bound += least;
      else if (v > t) vector_bound += least;  // (the rows' limit: memory, then tensor, then vector)
    };
    if (zero) {  // every gradient written once, a clear each
      Work w;
      int64_t clears = 0;
      for (const fb::Buffer* b : *f.buffers())
        if (b->kind() == fb::BufferKind::Gradient) w.bytes += double(b->size()), ++clears;
      add("zero_grads", "clear", w, clears);
    }
    for (const fb::Instr* ins : *p->instrs()) {
      if (zero) break;
      if (ins->op() == fb::OpCode::Kernel) {
        const fb::Kernel& k = *kernels->Get(uint32_t(ins->ints()->Get(0)));
        const std::string name = k.symbol()->str();  // as --profile names it (names repeat over shapes)
        if (k.zero_operands() && k.zero_operands()->size()) {  // the runtime's clearing: its own row
          Work clear;
          for (uint32_t z : *k.zero_operands()) clear.bytes += operand_bytes(k, z);
          add(name + " (clear)", "clear", clear, k.zero_operands()->size());
        }
        add(name, k.kind() ? k.kind()->str() : "", kernel_work(m, k, *ins), k.launches());
      } else if (ins->op() == fb::OpCode::GlobalNorm) {  // the runtime's norm: reads every gradient
        Work w;
        for (uint32_t b : *ins->inputs()) {
          w.bytes += double(m.buffer(b).size());
          w.vector_flops += 2.0 * double(numel(m.buffer(b)));
        }
        add("global_norm", "norm", w, 2);  // partial sums of squares, then their total
      }
    }
    programs[program] = {{"bound_ms", bound * 1e3}, {"tensor_ms", tensor * 1e3}, {"memory_ms", memory * 1e3},
                         {"memory_bound_kernels_ms", memory_bound * 1e3},
                         {"vector_bound_kernels_ms", vector_bound * 1e3}};
  }

  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  std::vector<const Row*> order;
  for (const auto& [name, r] : rows) order.push_back(&r);
  std::stable_sort(order.begin(), order.end(), [](const Row* a, const Row* b) { return a->bound_s > b->bound_s; });
  for (const Row* r : order) {
    const char* limit = r->memory_s >= r->tensor_s && r->memory_s >= r->vector_s ? "memory"
                        : r->tensor_s >= r->vector_s                              ? "tensor"
                                                                                  : "vector";
    list.push_back({{"name", r->name}, {"kind", r->kind}, {"runs", r->runs}, {"launches", r->launches},
                    {"tensor_flops", r->per_step.tensor_flops}, {"vector_flops", r->per_step.vector_flops},
                    {"bytes", r->per_step.bytes}, {"limit", limit}, {"bound_ms", r->bound_s * 1e3}});
  }
  // The MFU a step of one micro-step could reach: model FLOPs (the trainer's rule, which counts
  // attention in full) over (bound time x tensor rate); and how busy the tensor cores could be
  // with the products the kernels execute (causal attention as run).
  const double model_flops = j["flops"]["rule_6nd_plus_attention"].get<double>();
  double executed = 0;
  for (const auto& [name, r] : rows) executed += r.per_step.tensor_flops;
  double step_s = 0;
  for (const auto& [name, p] : programs.items()) step_s += p["bound_ms"].get<double>() * 1e-3;
  const double micro_s = programs.contains("micro_step") ? programs["micro_step"]["bound_ms"].get<double>() * 1e-3 : 0;
  j["roofline"] = {
      {"rates", {{"tensor_tflops", rates.tensor_tflops}, {"vector_tflops", rates.vector_tflops},
                 {"bandwidth_gbs", rates.bandwidth_gbs}, {"source", rates.source}}},
      {"recorded", recorded},
      {"programs", programs},
      {"model_flops_per_micro_step", model_flops},
      {"step_bound_ms", step_s * 1e3},
      {"mfu_ceiling", step_s > 0 ? model_flops / (step_s * rates.tensor_tflops * 1e12) : 0.0},
      {"mfu_ceiling_micro_step_only", micro_s > 0 ? model_flops / (micro_s * rates.tensor_tflops * 1e12) : 0.0},
      {"tensor_busy_ceiling", step_s > 0 ? executed / (step_s * rates.tensor_tflops * 1e12) : 0.0},
      {"kernels", list}};
}

void print_roofline_summary(const nlohmann::ordered_json& j) {
  if (!j.contains("roofline") || !j["roofline"]["recorded"].get<bool>()) return;
  const auto& r = j["roofline"];
  std::printf("roofline   a step of one micro-step takes at least %.4g ms (rates: %s): MFU at most %.1f%% "
              "(kiln-inspect --roofline lists every kernel)\n",
              r["step_bound_ms"].get<double>(), r["rates"]["source"].get<std::string>().c_str(),
              100 * r["mfu_ceiling"].get<double>());
}

void check_roofline_view(const nlohmann::ordered_json& j) {
  if (!j.contains("roofline"))
    throw Error(j["module"].get<std::string>() + ": --roofline is for cuda modules (its rates are a GPU's); this one's "
                "target is " + j["model"]["target"].get<std::string>());
  const auto& r = j["roofline"];
  if (!r["recorded"].get<bool>())
    throw Error(j["module"].get<std::string>() + ": the module records no tensor FLOPs (an older kilnc); recompile it "
                "for --roofline");
}

void print_roofline(const nlohmann::ordered_json& j) {
  check_roofline_view(j);
  const auto& r = j["roofline"];
  const auto& rates = r["rates"];
  std::printf("roofline   least time per kernel at %.0f TFLOP/s for matrix products, %.0f TFLOP/s for other "
              "arithmetic, %.0f GB/s of memory (%s)\n",
              rates["tensor_tflops"].get<double>(), rates["vector_tflops"].get<double>(),
              rates["bandwidth_gbs"].get<double>(), rates["source"].get<std::string>().c_str());
  std::printf("           (the slowest of the three per kernel; memory: every operand read or written once from "
              "HBM, state updated in place both, which a kernel finding its input in L2 can beat)\n");
  for (const auto& [name, p] : r["programs"].items()) {
    const double bound = p["bound_ms"].get<double>();
    // "matrix products": the tensor-core time of every kernel, some of it inside kernels that
    // memory bounds, so it overlaps the shares after it; those are of the program's time, by what
    // bounds each kernel: memory, or other arithmetic (SIMT attention, fp32 products).
    const double vector = p.value("vector_bound_kernels_ms", 0.0);
    std::printf("  %-15s %.4g ms: matrix products %.4g ms, memory-bound kernels %.4g ms (%.0f%%)", name.c_str(),
                bound, p["tensor_ms"].get<double>(), p["memory_bound_kernels_ms"].get<double>(),
                bound > 0 ? 100 * p["memory_bound_kernels_ms"].get<double>() / bound : 0.0);
    if (vector > 0) std::printf(", kernels bound by other arithmetic %.4g ms (%.0f%%)", vector, 100 * vector / bound);
    std::printf("\n");
  }
  std::printf("  a step of one micro-step takes at least %.4g ms: MFU at most %.1f%% of %.0f TFLOP/s "
              "(%.1f%% for the micro-step alone)\n",
              r["step_bound_ms"].get<double>(), 100 * r["mfu_ceiling"].get<double>(),
              rates["tensor_tflops"].get<double>(), 100 * r["mfu_ceiling_micro_step_only"].get<double>());
  std::printf("  (MFU: %.4g model FLOPs per micro-step by the trainer's rule, attention counted in full; the "
              "products the kernels execute keep the tensor cores at most %.1f%% busy)\n",
              r["model_flops_per_micro_step"].get<double>(), 100 * r["tensor_busy_ceiling"].get<double>());
  const double total = r["step_bound_ms"].get<double>();
  std::printf("\n  %-52s %8s %12s %11s %10s %7s %10s %6s\n", "kernel (as train --profile names it)", "launches",
              "matrix GFLOP", "other GFLOP", "moved MB", "limit", "bound us", "share");
  for (const auto& k : r["kernels"]) {
    std::string name = k["name"].get<std::string>();
    if (name.size() > 52) name = name.substr(0, 49) + "...";
    const double ms = k["bound_ms"].get<double>();
    std::printf("  %-52s %8lld %12.3f %11.3f %10.3f %7s %10.2f %5.1f%%\n", name.c_str(),
                (long long)k["launches"].get<int64_t>(), k["tensor_flops"].get<double>() / 1e9,
                k["vector_flops"].get<double>() / 1e9, k["bytes"].get<double>() / 1e6,
                k["limit"].get<std::string>().c_str(), ms * 1e3, total > 0 ? 100 * ms / total : 0.0);
  }
}

}  // namespace kiln
