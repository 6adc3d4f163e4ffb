// What ptxas says about the functions it compiles (NVRTC --ptxas-options=-v): plain C++, so
// that the unit tests can check the parser without MLIR.
#pragma once

#include <string>
#include <vector>

namespace kiln {

// One entry function of one image: registers per thread, static shared memory, and the local
// memory it needed (stack frame, register spills), in bytes.
struct CudaFunctionResources {
  std::string symbol;
  unsigned registers = 0, sharedBytes = 0, stackBytes = 0, spillStoreBytes = 0, spillLoadBytes = 0;
};

// The entry functions' resources from a ptxas -v log ("Compiling entry function 'f' for
// 'sm_90'", "... bytes stack frame, ... bytes spill stores, ... bytes spill loads", "Used N
// registers, ..., S bytes smem"); the properties of non-entry functions are skipped.
std::vector<CudaFunctionResources> parsePtxasInfo(const std::string& log);

// Why a block of `blockThreads` threads of this function cannot launch on sm_80 or sm_90 ("" when
// it can): more than 1024 threads, more registers than one block may hold (64K; a warp's are
// allocated 256 at a time), or more than 48 KB of static shared memory. The launch would fail at
// run time with "too many resources requested"; kilnc says so instead.
std::string launchResourceProblem(const CudaFunctionResources& r, unsigned blockThreads);

}  // namespace kiln
