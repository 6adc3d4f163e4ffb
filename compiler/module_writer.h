// Lowers a compiled kiln IR module (after the step pipeline) to the runtime's FlatBuffers module.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/spec.h"
#include "mlir/IR/BuiltinOps.h"

namespace kiln {

// One kernel per graph op. The IR must be planned (kiln-plan-buffers): each result's buffer
// takes its planned offset (reshapes alias their input). `recompute` is recorded for reports.
// Reports unsupported IR as an error at the op's location and returns failure.
mlir::FailureOr<std::vector<uint8_t>> writeModule(mlir::ModuleOp module, const ModelSpec& spec,
                                                  const std::string& recompute = "none");

}  // namespace kiln
