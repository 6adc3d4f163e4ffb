// A kiln::Device that runs a cuda module's generated kernels on the CPU (shim.h), so the runtime's
// device executor (runtime/device) is tested end to end on machines without a GPU.
#pragma once
#include <memory>

#include "runtime/device/device.h"

namespace kiln {
// Memory is host memory (fresh allocations are filled with NaN bytes; KILN_CUDA_POISON=1 has the
// executor refill the activations before every run); kernels are the module's kernel_source compiled over shim.h by the
// host compiler ($CXX, default c++) into $KILN_EMU_CACHE (default $TMPDIR/kiln-emu-cache);
// cuBLASLt calls are computed by a loop in double; graphs record the work and replay it.
std::unique_ptr<Device> make_emulated_device();
}  // namespace kiln
