// Shared by kiln-schedule and kiln-plan-buffers: which values occupy arena memory, their sizes,
// and which results may share an operand's storage.
#pragma once

#include "Kiln/KilnDialect.h"

namespace kiln {

// Values that live outside the arena: parameter values and gradients, inputs, hyperparameters.
inline bool isPersistent(mlir::Value v) {
  mlir::Operation* def = v.getDefiningOp();
  return def && mlir::isa<ParamOp, GradOp, InputOp, HyperOp>(def);
}

inline uint64_t byteSize(mlir::Value v) {
  auto t = mlir::cast<mlir::RankedTensorType>(v.getType());
  return uint64_t(t.getNumElements()) * ((t.getElementTypeBitWidth() + 7) / 8);
}

// Elementwise ops whose kernels may write their result over operand 0 or 1.
inline bool mayWriteInPlace(mlir::Operation* op) {
  return mlir::isa<AddOp, MulOp, ScaleOp, GeluOp, GeluGradOp>(op);
}

}  // namespace kiln
