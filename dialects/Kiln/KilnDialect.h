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

#include "Kiln/KilnDialect.h.inc"
#include "Kiln/KilnInterfaces.h.inc"

#define GET_OP_CLASSES
#include "Kiln/KilnOps.h.inc"
