// The fusion report: how many graph ops the step's kernels compute, launches per micro-step and
// per optimizer step, and every generated kernel with the ops it fuses.
#pragma once

#include <nlohmann/json.hpp>

#include "runtime/module.h"

namespace kiln {

// Adds "fusion", "ops_before_fusion", "kernels_per_micro_step", "optimizer_kernels" and
// "kernels" to the report.
void add_fusion_report(const Module& m, nlohmann::ordered_json& j);
// The human-readable table of the same.
void print_fusion_report(const nlohmann::ordered_json& j);

}  // namespace kiln
