// The kiln graph dialect: ops on whole tensors that describe a GPT training step.
#pragma once

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace kiln {
// A static shape of at most 2^48 elements (the ODS types' bound; kiln.parameter says it itself).
bool fitsArena(mlir::Type type);
}  // namespace kiln

#include "Kiln/KilnDialect.h.inc"
#include "Kiln/KilnInterfaces.h.inc"

#define GET_OP_CLASSES
#include "Kiln/KilnOps.h.inc"

namespace kiln {
// The ops that stand for state the module keeps outside the arena (parameters, gradients, inputs,
// hyperparameters): their values are the state's own buffers, planned at offset -1.
inline bool isStateOp(mlir::Operation* op) { return mlir::isa<ParamOp, GradOp, InputOp, HyperOp>(op); }
}  // namespace kiln
