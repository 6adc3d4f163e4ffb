// An output replaces an existing file only when that file is of the kind the output writes (or
// empty): a mistyped -o must not turn a program, data, weights, a checkpoint or a user's notes
// into IR or an image.
#pragma once

#include <string>

namespace kiln {

// What an output writes.
enum class Writes {
  KilnExecutable,  // kilnc -o (a runtime with its module appended)
  KilnModule,      // kilnc --emit module
  MlirText,        // kilnc --emit graph|step|fused|..., kiln-opt -o
  DotGraph,        // kiln-inspect --dot
  Svg,             // kiln-inspect --svg, kiln-inspect plot -o
  KernelSource,    // kiln-inspect --kernel-source, kilnc --dump-kernels' kernels.cpp / kernels.cu
  KernelTable,     // kilnc --dump-kernels' kernels.tsv
  Safetensors,     // train --save, --dump-grads
  NumPy,           // sample --logits-out
};

// An existing regular file at `path` that is neither empty nor of the kind `writes` names is
// refused: kiln::Error "FLAG: PATH: exists and is WHAT; it would be replaced (remove it first, or
// name another file)", WHAT as file_kind names a kind Kiln knows, else "no <what it writes>".
// A missing file, a device, a FIFO or "-" passes.
void check_replaceable(const std::string& flag, const std::string& path, Writes writes);

}  // namespace kiln
