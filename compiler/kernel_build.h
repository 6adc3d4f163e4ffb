// Turns generated kernel source into what the runtime loads: a shared library built by the host
// C++ compiler (CPU) or cubins built by NVRTC (CUDA), and writes sources for users to read.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "compiler/kernel_prelude.h"
#include "compiler/ptxas_info.h"

namespace kiln {

// CPU kernel libraries are cached by a hash of the source, the flags and the compiler (its name
// and file contents) under $KILN_KERNEL_CACHE (default ~/.cache/kiln/kernels; "off" disables it).
// The cache's library for this source, when it has one.
std::optional<std::vector<uint8_t>> cachedCpuKernels(const std::string& source);

// Whether there is a kernel cache at all (not with KILN_KERNEL_CACHE=off, or with no HOME).
bool cpuKernelCacheEnabled();

// Compiles CPU kernel source into a shared library (its bytes) and stores it in the cache (for a
// source cachedCpuKernels found none for). On failure, `error` holds the compiler's first diagnostics.
std::optional<std::vector<uint8_t>> compileCpuKernels(const std::string& source, std::string& error);

// One architecture's compiled kernels.
struct CudaImageBuild {
  std::string arch;  // "sm_80", "sm_90"; "compute_90" for PTX
  std::vector<uint8_t> cubin;  // or PTX text
  std::vector<CudaFunctionResources> resources;
};

// Compiles CUDA kernel source with NVRTC for sm_80 and sm_90 (ptxas verbose, for the
// resources), and keeps sm_90's PTX as a third image, "compute_90", for later GPUs. Fails with a message when kilnc was built without NVRTC.
// `lineInfo` (kilnc --cuda-line-info) adds NVRTC's --generate-line-info: compute-sanitizer and
// the profilers then name the source line of a generated kernel; the cubins grow about 3x.
std::optional<std::vector<CudaImageBuild>> compileCudaKernels(const std::string& source, std::string& error,
                                                              bool lineInfo = false);

// Writes `source` as DIR/kernels.cpp (or kernels.cu) and `manifest` as DIR/kernels.tsv.
bool dumpKernelSource(const std::string& dir, Target target, const std::string& source,
                      const std::string& manifest, std::string& error);

}  // namespace kiln
