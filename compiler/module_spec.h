// The spec a module was built from, kept in its IR, and what kilnc checks of IR given as input
// before any pass reads it: the spec's values, the IR against them, the entry points.
#pragma once

#include "compiler/spec.h"
#include "mlir/IR/BuiltinOps.h"

namespace kiln {

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
// @micro_step, where present, reads both inputs the trainer fills before each micro-step (a loss
// that depends on neither would train on nothing): for step IR given as input, and for the step
// kilnc derives from graph IR (where an input the loss does not read is dead, and gone).
mlir::LogicalResult verifyMicroStepInputs(mlir::ModuleOp module);

}  // namespace kiln
