// Lowers a compiled kiln IR module (after the step pipeline) to the runtime's FlatBuffers module.
#pragma once

#include <cstdint>
#include <vector>

#include "compiler/spec.h"
#include "mlir/IR/BuiltinOps.h"

namespace kiln {

// One kernel per graph op; every value gets its own buffer in the arena (reshapes alias their
// input). Reports unsupported IR as an error at the op's location and returns failure.
mlir::FailureOr<std::vector<uint8_t>> writeModule(mlir::ModuleOp module, const ModelSpec& spec);

}  // namespace kiln
