// Which of a module's compiled kernel images a GPU runs. Plain C++ (no CUDA), so that the rule
// is tested on machines without a GPU.
#pragma once
#include <string>

#include "runtime/module.h"

namespace kiln {

// The number of an image's architecture: "sm_90" is 90 for prefix "sm_", "compute_90" for
// "compute_"; -1 for any other name (an "sm_90a" image runs only on its exact GPU).
int cuda_arch_number(const std::string& arch, const std::string& prefix);

struct CudaImageChoice {
  const fb::CudaImage* image = nullptr;
  bool jit = false;  // PTX: the driver compiles it for this GPU when it is loaded
};

// A cubin ("sm_XY") runs on its own architecture and on later minor versions of the same major
// one (sm_80 on sm_86), never across majors: the exact image, else the closest older minor.
// Else PTX ("compute_XY", for any GPU of compute capability X.Y or later): the newest such.
// Throws naming what the module holds when nothing fits.
CudaImageChoice pick_cuda_image(const Module& m, int major, int minor, const std::string& gpu_name);

}  // namespace kiln
