// Turns a model spec into kiln graph IR: parameter declarations and @forward (loss).
#pragma once

#include "compiler/spec.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

namespace kiln {

// Builds GPT-2 exactly as ../shared/docs/training-semantics.md ("Forward"). Parameters use
// Hugging Face names without the "transformer." prefix ("h.0.attn.c_attn.weight").
mlir::OwningOpRef<mlir::ModuleOp> buildGPT2(mlir::MLIRContext& ctx, const ModelSpec& spec);

}  // namespace kiln
