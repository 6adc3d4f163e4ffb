// The compilation pipeline: spec -> graph IR -> training step IR -> module -> executable.
#pragma once

#include "compiler/module_spec.h"
#include "compiler/spec.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/PassManager.h"

namespace kiln {

// Adds the passes that turn graph IR (@forward) into the training step (@micro_step,
// @optimizer_step), simplified; with precision "bf16" the mixed-precision pass runs first.
// Registered for kiln-opt as `kiln-step-pipeline`.
void buildStepPipeline(mlir::OpPassManager& pm, const std::string& precision = "fp32");
// Adds recomputation (`recompute`: none | cheap), scheduling, gradient buckets (`bucket_mb`),
// kernel fusion (unless `fusion` is false) and buffer planning: the IR the module writer needs.
// Registered for kiln-opt as `kiln-plan-pipeline`.
// `singleOps` (for targets without built-in kernels) gives lone ops generated kernels too.
void buildPlanPipeline(mlir::OpPassManager& pm, const std::string& recompute = "none",
                       double bucket_mb = 25.0, bool fusion = true, bool singleOps = false);
void registerKilnPipelines();

}  // namespace kiln
