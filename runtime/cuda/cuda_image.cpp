#include "runtime/cuda/cuda_image.h"

#include "runtime/error.h"

namespace kiln {
int cuda_arch_number(const std::string& a, const std::string& prefix) {
  if (a.size() < prefix.size() + 2 || a.size() > prefix.size() + 3 || a.compare(0, prefix.size(), prefix) != 0 ||
      a.find_first_not_of("0123456789", prefix.size()) != std::string::npos)
    return -1;
  return std::stoi(a.substr(prefix.size()));
}

CudaImageChoice pick_cuda_image(const Module& m, int major, int minor, const std::string& gpu_name) {
  const auto* images = m.fb().cuda_images();
  const int device = major * 10 + minor;
  std::string have;
  const fb::CudaImage *cubin = nullptr, *ptx = nullptr;
  int cubin_v = -1, ptx_v = -1;
  if (images)
    for (const fb::CudaImage* im : *images) {
      const std::string arch = im->arch() ? im->arch()->str() : "";
      have += (have.empty() ? "" : ", ") + (arch.empty() ? std::string("?") : arch);
      if (const int v = cuda_arch_number(arch, "sm_"); v >= 0 && v / 10 == major && v <= device && v > cubin_v)
        cubin = im, cubin_v = v;
      if (const int v = cuda_arch_number(arch, "compute_"); v >= 0 && v <= device && v > ptx_v) ptx = im, ptx_v = v;
    }
  CudaImageChoice c{cubin ? cubin : ptx, !cubin && ptx};
  if (!c.image)
    throw Error(m.source() + ": the module has kernels for " + (have.empty() ? "no GPU" : have) + "; this GPU (" +
                gpu_name + ") is sm_" + std::to_string(device) + "; recompile it with a kilnc that targets it");
  if (!c.image->cubin() || c.image->cubin()->size() == 0)
    throw Error(m.source() + ": the " + c.image->arch()->str() + " kernel image is empty");
  return c;
}

}  // namespace kiln
