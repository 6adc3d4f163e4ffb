// Which Device a cuda module runs on.
#include "runtime/device/device.h"

#include "runtime/error.h"
#ifdef KILN_HAVE_CUDA
#include "runtime/cuda/cuda_device.h"
#endif

namespace kiln {
namespace {
std::function<std::unique_ptr<Device>()>& factory() {
  static std::function<std::unique_ptr<Device>()> f;
  return f;
}
}  // namespace

void set_device_factory(std::function<std::unique_ptr<Device>()> f) { factory() = std::move(f); }

std::unique_ptr<Device> make_device() {
  if (factory()) return factory()();
#ifdef KILN_HAVE_CUDA
  return make_cuda_device();
#else
  throw Error("this runtime was built without CUDA (no CUDA toolkit at build time), so it cannot run a cuda "
              "module; rebuild it where /usr/local/cuda exists");
#endif
}

}  // namespace kiln
