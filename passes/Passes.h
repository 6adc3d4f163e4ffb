// Kiln's compiler passes (declared in Passes.td; one file per pass).
#pragma once

#include <optional>

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

// The planning passes (kiln-fuse-kernels, kiln-plan-buffers) run on the training step. A module
// built from a spec (kiln.spec) with @forward but no @micro_step is graph IR: planned, kilnc
// refuses it later (kiln-autodiff would differentiate fusion regions and copy stale offsets),
// so it is refused here, where the order is wrong. A module without kiln.spec (a pass's own
// test, forward-only functions) is planned as it is.
inline mlir::LogicalResult refuseGraphIR(mlir::ModuleOp module, llvm::StringRef pass) {
  if (!module->hasAttr("kiln.spec") || !module.lookupSymbol("forward") || module.lookupSymbol("micro_step"))
    return mlir::success();
  return module.emitError() << pass << ": no @micro_step (graph IR): the pass plans the training step; run "
                            << "kiln-autodiff first (kiln-opt -kiln-step-pipeline, or kilnc --emit=step)";
}

// The precision a module built from a spec records (its kiln.spec's "precision"; fp32 where the
// key is missing, as kilnc reads it), or none for a module without a kiln.spec.
inline std::optional<llvm::StringRef> specPrecision(mlir::ModuleOp module) {
  auto spec = module->getAttrOfType<mlir::DictionaryAttr>("kiln.spec");
  if (!spec) return std::nullopt;
  auto precision = spec.getAs<mlir::StringAttr>("precision");
  return precision ? precision.getValue() : llvm::StringRef("fp32");
}

// An op that computes in bf16: one of its results is a bf16 tensor.
inline bool computesInBf16(mlir::Operation* op) {
  return llvm::any_of(op->getResultTypes(), [](mlir::Type t) {
    auto r = mlir::dyn_cast<mlir::RankedTensorType>(t);
    return r && r.getElementType().isBF16();
  });
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

// Passes that size values (the scheduler's live bytes, the planner's offsets) take every value a
// function computes as a tensor of static shape, as the kiln ops' types are. A value of another
// dialect's op (a func.call's i32, a dynamic tensor) has no size in the arena: refused here.
inline mlir::LogicalResult requireStaticTensors(mlir::ModuleOp module, llvm::StringRef pass) {
  auto sized = [](mlir::Type t) {
    auto r = mlir::dyn_cast<mlir::RankedTensorType>(t);
    return r && r.hasStaticShape() && r.getElementType().isIntOrFloat();
  };
  // Another dialect's tensor (a func.call's result) has none of the kiln types' bounds: its byte
  // size could wrap (2^62 x 4 elements were sized 0) or make the plan's i64 arena size negative.
  auto tooLarge = [&](mlir::InFlightDiagnostic d, mlir::Type t) -> mlir::LogicalResult {
    d << pass << ": a value of type " << t
      << " has no element or more than 2^48 (every kiln value holds 1 to 2^48): its size in the arena would not fit";
    return mlir::failure();
  };
  for (auto f : module.getOps<mlir::func::FuncOp>()) {
    if (f.isExternal()) continue;
    for (mlir::BlockArgument a : f.getArguments()) {
      if (!sized(a.getType()))
        return f.emitError() << pass << ": @" << f.getName() << "'s argument #" << a.getArgNumber() << " has type "
                             << a.getType() << ", not a tensor of static shape: it has no size in the arena";
      if (!fitsArena(a.getType())) return tooLarge(f.emitError(), a.getType());
    }
    for (mlir::Operation& op : f.getBody().front())
      for (mlir::Value r : op.getResults()) {
        if (!sized(r.getType()))
          return op.emitError() << pass << ": a result of type " << r.getType()
                                << ", not a tensor of static shape: it has no size in the arena";
        if (!fitsArena(r.getType())) return tooLarge(op.emitError(), r.getType());
      }
  }
  return mlir::success();
}

}  // namespace kiln
