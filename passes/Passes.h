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

// Passes that add, move or regroup ops refuse a module that already has a buffer plan: kilnc and
// the module writer take a function's `kiln.offsets` as they are, so a stale plan would give
// buffers that are live together the same memory.
inline mlir::LogicalResult refusePlanned(mlir::ModuleOp module, llvm::StringRef pass) {
  for (auto f : module.getOps<mlir::func::FuncOp>())
    if (f->hasAttr("kiln.arena_size"))
      return f.emitError() << pass << ": @" << f.getName()
                           << " already has a buffer plan (kiln.arena_size); run " << pass
                           << " before kiln-plan-buffers";
  return mlir::success();
}

}  // namespace kiln
