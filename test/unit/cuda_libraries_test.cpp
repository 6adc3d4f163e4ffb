// The CUDA libraries the runtime opens at run time (runtime/cuda/shared_library.h): every
// function the GPU path uses is found in the installed cuBLASLt and NCCL (no GPU needed), and a
// missing library is an error that names it.
#include <gtest/gtest.h>

#include <string>

#include "runtime/cuda/shared_library.h"
#include "runtime/error.h"
#ifdef KILN_HAVE_CUDA
#include "runtime/cuda/cuda_device.h"
#endif
#ifdef KILN_HAVE_NCCL
#include "runtime/comm/backends.h"
#endif

TEST(CudaLibraries, CublasLtHasEveryFunction) {
#ifdef KILN_HAVE_CUDA
  EXPECT_NO_THROW(kiln::open_cublaslt());
#else
  GTEST_SKIP() << "runtime built without CUDA";
#endif
}

TEST(CudaLibraries, NcclHasEveryFunction) {
#ifdef KILN_HAVE_NCCL
  EXPECT_NO_THROW(kiln::comm::open_nccl());
#else
  GTEST_SKIP() << "runtime built without NCCL";
#endif
}

TEST(CudaLibraries, MissingLibraryIsNamed) {
  try {
    kiln::open_library({"/nonexistent/libkiln-none.so.1", "libkiln-none.so"}, "the test library");
    FAIL() << "opened a library that does not exist";
  } catch (const kiln::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cannot load the test library (tried /nonexistent/libkiln-none.so.1, libkiln-none.so)"),
              std::string::npos)
        << m;
  }
}

TEST(CudaLibraries, MissingSymbolIsNamed) {
  void* libc = kiln::open_library({"libc.so.6"}, "libc");
  try {
    kiln::library_symbol(libc, "kiln_no_such_function", "libc");
    FAIL() << "found a symbol that does not exist";
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("libc has no kiln_no_such_function"), std::string::npos) << e.what();
  }
}
