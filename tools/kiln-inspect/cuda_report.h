// The CUDA report: per generated function of a cuda module, what ptxas reported when kilnc
// compiled it (registers, shared memory, spills) and the occupancy that allows on the GPU
// generation of the image, so that a kernel's limits can be read without a GPU.
#pragma once

#include <nlohmann/json.hpp>

#include "runtime/module.h"

namespace kiln {

// Adds "cuda" (arch of the newest image, and per function: block size where the module launches
// it, the resources, resident blocks and warps per SM) to the report; nothing for cpu modules.
void add_cuda_report(const Module& m, nlohmann::ordered_json& j);
// One summary line (in the default report).
void print_cuda_summary(const nlohmann::ordered_json& j);
// The table of every function (--cuda-resources).
void print_cuda_resources(const nlohmann::ordered_json& j);
// kiln::Error where the report has no cuda section (a cpu module): print_cuda_resources's, and
// --cuda-resources --json's, refusal.
void check_cuda_resources_view(const nlohmann::ordered_json& j);

}  // namespace kiln
