// The generated CUDA kernels of one module (kilnc --dump-kernels DIR: DIR/kernels.cu), compiled
// as host C++ over the emulation shim into a shared library the driver loads.
// Build: c++ -std=c++20 -fPIC -shared -DKILN_KERNELS_CU='"DIR/kernels.cu"' kernels_tu.cpp
#include "shim.h"

namespace kdev {
#include KILN_KERNELS_CU
}  // namespace kdev
