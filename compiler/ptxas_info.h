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

}  // namespace kiln
