// Which compiled kernel image a GPU of each compute capability runs (runtime/cuda/cuda_image.h):
// cubins within their major version, PTX for later GPUs, a clear error otherwise.
#include <gtest/gtest.h>

#include "runtime/cuda/cuda_image.h"
#include "runtime/error.h"

namespace kiln {
namespace {

// A module with no programs whose cuda_images are `archs`, each image holding a few bytes.
Module module_with_images(const std::vector<std::string>& archs) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<int64_t> one = {1};
  std::vector<flatbuffers::Offset<fb::Buffer>> bufs = {
      fb::CreateBufferDirect(fbb, "lr", fb::BufferKind::Hyper, fb::DType::F32, &one, 0, 4)};
  std::vector<flatbuffers::Offset<fb::CudaImage>> images;
  std::vector<uint8_t> bytes = {1, 2, 3, 4};
  for (const std::string& a : archs) images.push_back(fb::CreateCudaImageDirect(fbb, a.c_str(), &bytes));
  std::vector<flatbuffers::Offset<fb::Program>> progs;
  std::vector<flatbuffers::Offset<fb::Parameter>> params;
  auto model = fb::CreateModelDirect(fbb, 1, 1, 4, 16, 8, 1, 8, "bf16", "cuda", "random");
  fb::FinishModuleBuffer(fbb, fb::CreateModuleDirect(fbb, kModuleFormatVersion, "test", model, 256, &bufs, &params,
                                                      &progs, 256, 0, 0, "none", nullptr, nullptr, nullptr, &images,
                                                      true, /*crc32=*/1));
  std::vector<uint8_t> out(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
  seal_module(out);
  return Module::from_bytes(std::move(out), "m.kiln");
}

std::string picked(const Module& m, int major, int minor) {
  CudaImageChoice c = pick_cuda_image(m, major, minor, "GPU");
  return c.image->arch()->str() + (c.jit ? " jit" : "");
}

TEST(CudaImage, CubinsWithinTheirMajorVersionThenPtx) {
  Module m = module_with_images({"sm_80", "sm_90", "compute_90"});
  EXPECT_EQ(picked(m, 8, 0), "sm_80");
  EXPECT_EQ(picked(m, 8, 6), "sm_80");  // later minor, same major
  EXPECT_EQ(picked(m, 8, 9), "sm_80");
  EXPECT_EQ(picked(m, 9, 0), "sm_90");
  EXPECT_EQ(picked(m, 10, 0), "compute_90 jit");  // no cubin runs across majors
  EXPECT_EQ(picked(m, 12, 0), "compute_90 jit");
  try {
    picked(m, 7, 5);  // older than every image
    FAIL() << "sm_75 ran an image";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "m.kiln: the module has kernels for sm_80, sm_90, compute_90; this GPU (GPU) is sm_75; recompile it "
                 "with a kilnc that targets it");
  }
}

TEST(CudaImage, ClosestOlderMinorAndNewestFittingPtx) {
  Module m = module_with_images({"compute_80", "sm_86", "sm_80", "compute_90", "sm_90a"});
  EXPECT_EQ(picked(m, 8, 9), "sm_86");
  EXPECT_EQ(picked(m, 8, 0), "sm_80");
  EXPECT_EQ(picked(m, 9, 0), "compute_90 jit");  // sm_90a runs only on its exact GPU: not chosen
  EXPECT_EQ(picked(m, 10, 3), "compute_90 jit");
  // Modules of earlier kilnc versions hold cubins alone: a later GPU is refused, as before.
  Module old = module_with_images({"sm_80", "sm_90"});
  EXPECT_THROW(picked(old, 10, 0), Error);
}

}  // namespace
}  // namespace kiln
