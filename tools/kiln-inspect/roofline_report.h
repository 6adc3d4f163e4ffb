// The roofline report: for every kernel a program launches, the least time it can take on a GPU
// with the given rates (its matrix products at the tensor-core rate, its other arithmetic at the
// CUDA-core rate, every operand moved once at the memory bandwidth; whichever is slowest), and
// from their sum the highest MFU the step could reach. Names match kiln-run --profile's rows, so
// a measured profile divided by these bounds says how far each kernel is from its limit.
#pragma once

#include <nlohmann/json.hpp>

#include "runtime/module.h"

namespace kiln {

struct RooflineRates {
  // Defaults: NVIDIA H200 SXM's datasheet (dense bf16 tensor, fp32, HBM3e).
  double tensor_tflops = 989;
  double vector_tflops = 67;
  double bandwidth_gbs = 4800;
  std::string source = "H200 SXM datasheet";  // where the rates come from, for the report
};

// Adds "roofline" (the rates, per kernel name and per program the bounds, the MFU ceiling) to the
// report; needs the report's "flops" (add_memory_report) for the model FLOPs.
void add_roofline_report(const Module& m, const RooflineRates& rates, nlohmann::ordered_json& j);
// The table (--roofline).
void print_roofline(const nlohmann::ordered_json& j);
// kiln::Error where the report has no roofline to show (a cpu module, or one from a kilnc that
// recorded no tensor FLOPs): print_roofline's, and --roofline --json's, refusal.
void check_roofline_view(const nlohmann::ordered_json& j);
// One line (in the default report), nothing for a module without the roofline.
void print_roofline_summary(const nlohmann::ordered_json& j);

}  // namespace kiln
