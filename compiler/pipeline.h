// The compilation pipeline: spec -> graph IR -> training step IR -> module -> executable.
#pragma once

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

// The spec a module was built from, kept as the module attribute `kiln.spec` so that an
// edited .mlir file can be compiled on its own.
void setModuleSpec(mlir::ModuleOp module, const ModelSpec& spec);
// Reads `kiln.spec` with the checks of a TOML spec, and checks the IR against it where the
// runtime relies on both (the token inputs are [batch_size, seq_len], wte covers the vocabulary).
mlir::FailureOr<ModelSpec> getModuleSpec(mlir::ModuleOp module);

// The functions the module writer turns into programs, in this order.
inline constexpr llvm::StringLiteral kProgramNames[] = {"forward", "logits",     "prefill",       "prefill_short",
                                                        "decode",  "micro_step", "optimizer_step"};

// The programs the runtime calls (@forward, @logits, @micro_step, @optimizer_step), where present,
// have a body, take no arguments and return one tensor (a tensor<f32>, except @logits). For IR
// input, before any pass or the module writer reads their results.
mlir::LogicalResult verifyEntryPoints(mlir::ModuleOp module);

}  // namespace kiln
