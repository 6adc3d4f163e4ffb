// The real GPU behind runtime/device/device.h: the first NVIDIA GPU, driven through the CUDA
// runtime, the driver's module API (reached through the runtime) and cuBLASLt. Only
// runtime/cuda/cuda_device.cpp includes CUDA headers; callers see the Device interface.
#pragma once
#include <memory>

#include "runtime/device/device.h"

namespace kiln {

// Opens GPU 0 with one compute stream, a cuBLASLt handle and its workspace. Throws kiln::Error
// with one clear line when no CUDA GPU is usable (no driver, no device, a busy device).
std::unique_ptr<Device> make_cuda_device();
// Opens cuBLASLt and looks up every function the device uses (done by make_cuda_device; for
// tests); throws kiln::Error naming what is missing.
void open_cublaslt();

}  // namespace kiln
