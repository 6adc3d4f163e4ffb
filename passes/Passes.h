// Kiln's compiler passes (declared in Passes.td; one file per pass).
#pragma once

#include "Kiln/KilnDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/Pass.h"

namespace kiln {

#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"

}  // namespace kiln
