// Which Device a cuda module runs on.
#include "runtime/device/device.h"

#include <chrono>

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
bool& host_addressable_flag() {
  static bool host_addressable = false;
  return host_addressable;
}
}  // namespace

EpilogueFlags epilogue_flags(const std::string& e, const std::string& where) {
  EpilogueFlags f;
  if (e == "DEFAULT") return f;
  if (e == "BIAS") f.bias = true;
  else if (e == "GELU") f.gelu = true;
  else if (e == "GELU_AUX") f.gelu = f.aux_out = true;
  else if (e == "GELU_BIAS") f.gelu = f.bias = true;
  else if (e == "GELU_AUX_BIAS") f.gelu = f.aux_out = f.bias = true;
  else if (e == "DGELU") f.dgelu = true;
  else
    throw Error(where + ": unknown cuBLASLt epilogue '" + e +
                "' (DEFAULT, BIAS, GELU, GELU_AUX, GELU_BIAS, GELU_AUX_BIAS, DGELU)");
  return f;
}

void Device::mark(size_t i) {
  synchronize();
  host_marks_.at(i) = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void set_device_factory(std::function<std::unique_ptr<Device>()> f, bool host_addressable) {
  factory() = std::move(f);
  host_addressable_flag() = host_addressable;
}

bool devices_host_addressable() { return factory() && host_addressable_flag(); }

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
