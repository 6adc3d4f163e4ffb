// CUDA C++ source for causal self-attention, forward and backward, flash style: the T x T score
// matrix is never stored; each block walks tiles of queries against tiles of keys in shared memory.
// Plain C++ (no MLIR): the result is text for NVRTC, to be appended after
// kernelPrelude(Target::Cuda) (bf16, ld/st, warp_sum, INFINITY).
//
// Semantics are those of runtime/cpu/kernels.cpp attention_fwd / attention_bwd: head size
// hs = C / H, scale 1 / sqrt(hs), causal (key t2 <= query t), fp32 arithmetic; bf16 is storage
// only (read with ld, written with st: rounded to nearest even).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

struct AttentionShape {
  int64_t B, T, C, H;  // batch, sequence length, channels, heads (hs = C / H <= 128)
  bool bf16;           // qkv, out, dout, dqkv stored as bf16 (else fp32); lse is always fp32
  bool simt = false;   // never the tensor-core kernels (kilnc --cuda-simt-attention)
  int forwardRows = 0;  // query rows per warp of the tensor-core forward: 16 or 32; 0: its choice
};

// One kernel launch: `symbol` with a 1-D grid of `grid` blocks of `block` threads. All shared
// memory is static (at most 48 KB per block): the dynamic shared size is 0.
struct CudaKernelLaunch {
  std::string symbol;
  unsigned grid, block;
};

// `source` defines the kernels of `launches`, each
//   extern "C" __global__ void SYMBOL(void* const* b, const long long* range)
// (range is ignored). Launch them in the order given, all with the same b[].
struct AttentionSource {
  std::string source;
  std::vector<CudaKernelLaunch> launches;
  uint64_t scratch_bytes = 0;  // device workspace the kernels use, at b[operands] (module.fbs)
  double tensor_flops = 0;     // the tile products the tensor cores execute (module.fbs)
};

// Forward: one kernel named `symbol`.
//   b[0] = qkv [B, T, 3C] (q | k | v; head h owns channels h*hs .. h*hs+hs-1 of each)
//   b[1] = out [B, T, C]
//   b[2] = lse [B, H, T] fp32: log-sum-exp of the scaled scores of row t over keys t2 <= t
AttentionSource cudaAttentionForward(const std::string& symbol, const AttentionShape& s);

// Backward: two kernels, `symbol`_dkv then `symbol`_dq (independent: they write disjoint parts
// of dqkv). Every element of dqkv is written (no accumulation into it). The tensor-core kernels
// run `symbol`_delta first, which writes D = dout . out and lse log2(e) per row into the
// workspace b[5] (2 B H T floats) that the others read; for head sizes up to 112 their _dkv also
// adds dq into an fp32 [B, T, C] accumulator after those in the workspace (cleared by _delta),
// and `symbol`_dq_store rounds it into dqkv instead of _dq.
//   b[0] = dout [B, T, C], b[1] = qkv, b[2] = out, b[3] = lse, b[4] = dqkv [B, T, 3C]
AttentionSource cudaAttentionBackward(const std::string& symbol, const AttentionShape& s);

// bf16 with a head size that is a multiple of 16 (GPT-2: 64) takes the tensor-core kernels of
// attention_cuda_mma.cpp (mma.sync, bf16 products with fp32 accumulation; the probabilities and
// their gradients are rounded to bf16 as product inputs), unless shape.simt; everything else the
// SIMT kernels (fp32 FMAs). Same operands, launches in the same order.
bool cudaAttentionUsesTensorCores(const AttentionShape& s);
AttentionSource cudaAttentionForwardMma(const std::string& symbol, const AttentionShape& s);
AttentionSource cudaAttentionBackwardMma(const std::string& symbol, const AttentionShape& s);

// Both throw std::invalid_argument for a shape they do not handle (H not dividing C, hs > 128,
// a non-positive size).

}  // namespace kiln
