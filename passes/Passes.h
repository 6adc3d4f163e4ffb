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

// The passes take a function as straight-line code: one block, its ops in order. A second block
// (unreachable, or reached by a branch of another dialect) would be left out silently.
inline mlir::LogicalResult requireOneBlock(mlir::func::FuncOp f, llvm::StringRef pass) {
  if (f.isExternal() || f.getBody().hasOneBlock()) return mlir::success();
  return f.emitError() << pass << ": @" << f.getName() << " must have one block (straight-line code)";
}
inline mlir::LogicalResult requireOneBlock(mlir::ModuleOp module, llvm::StringRef pass) {
  for (auto f : module.getOps<mlir::func::FuncOp>())
    if (mlir::failed(requireOneBlock(f, pass))) return mlir::failure();
  return mlir::success();
}

}  // namespace kiln
