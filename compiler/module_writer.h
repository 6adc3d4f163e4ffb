// Lowers a compiled kiln IR module (after the step pipeline) to the runtime's FlatBuffers module.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/spec.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Support/Timing.h"

namespace kiln {

struct WriteOptions {
  std::string recompute = "none";  // recorded for reports
  bool fusion = true;              // recorded: false for --no-fusion
  std::string dumpKernelsDir;      // when set, the generated kernel sources are written here
  bool simtAttention = false;      // cuda: never the tensor-core attention kernels
  int attentionRows = 0;           // cuda: query rows per warp of the tensor-core forward (0: its choice)
  bool cudaLineInfo = false;       // cuda: NVRTC --generate-line-info (the cubins say so: kiln-inspect)
  mlir::TimingScope* timing = nullptr;  // kilnc --timing: the writer's phases are nested under it
};

// One instruction per op: a built-in kernel for a graph op, a generated kernel for a kiln.fusion
// region (its source is generated for the spec's target and compiled: by the host compiler for
// the CPU, by NVRTC for CUDA). The IR must be planned (kiln-plan-buffers): each result's buffer
// takes its planned offset (reshapes alias their input). Reports unsupported IR as an error at
// the op's location and returns failure.
mlir::FailureOr<std::vector<uint8_t>> writeModule(mlir::ModuleOp module, const ModelSpec& spec,
                                                  const WriteOptions& options = {});

}  // namespace kiln
