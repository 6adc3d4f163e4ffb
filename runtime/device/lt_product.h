// A row-major product (MatmulSpec) as column-major cuBLASLt is asked for it: which matrix is
// cuBLASLt's A and B, their transposes, and every layout's rows, columns and leading dimension.
// runtime/cuda/cuda_device.cpp builds its descriptors from this alone, and the CUDA emulation
// (test/e2e/cuda_emulation) computes the product from it as cuBLASLt defines the column-major
// call, so the end-to-end tests check the translation, not only the executor. No CUDA header.
#pragma once
#include <cstdint>

#include "runtime/device/device.h"

namespace kiln {

// One matrix of a cuBLASLt call: column-major `rows` x `cols` (as stored, before the transpose
// the call applies), element (i, j) at ptr[i + j * ld].
struct LtMatrix {
  DevicePtr ptr = 0;
  fb::DType type = fb::DType::F32;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  bool transposed = false;  // CUBLAS_OP_T for A and B; never for C and D
};

// D = epilogue(op(a) op(b) + beta C), column-major, op(a) d.rows x K and op(b) K x d.cols. The
// bias (CUBLASLT_EPILOGUE_*BIAS) runs along D's rows: bias[i] is added to row i of every column.
// The GELU auxiliary matrix is laid out like D with leading dimension aux_ld.
struct LtProduct {
  LtMatrix a, b;
  LtMatrix d;  // also C's layout (C when beta != 0, else D's address, not read)
  DevicePtr c = 0;
  int64_t aux_ld = 0;
};

LtProduct lt_product(const MatmulSpec& s);

}  // namespace kiln
