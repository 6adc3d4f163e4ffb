// Source for kiln.decode_attention (M new positions per row against a key/value cache: M = 1 for
// @decode, more for @prefill), for the CPU and for CUDA: text appended after
// kernelPrelude(target) (bf16, ld/st, exp_f or expf, warp_sum). Plain C++ (no MLIR).
//
// Per row b, head h and new token m, at position t = position[0] + m, with scale = 1 / sqrt(hs):
//   cache[0, b, h, t] = k,  cache[1, b, h, t] = v      (the token's key and value, as fp32)
//   s[t2] = scale q . cache[0, b, h, t2] for t2 <= t,  out = sum_t2 softmax(s)[t2] cache[1, b, h, t2]
// which is row t of kiln.attention over the positions the cache holds. fp32 arithmetic; the
// kernels do nothing for a position outside [0, S) (the runtime never passes one), and skip the
// tokens whose position is S or beyond.
#pragma once

#include <cstdint>
#include <string>

#include "compiler/attention_cuda.h"  // CudaKernelLaunch

namespace kiln {

struct DecodeAttentionShape {
  int64_t B, C, H, S;  // rows, channels, heads, cached positions
  bool bf16;           // qkv and out stored as bf16 (the cache is fp32)
  int64_t M = 1;       // new positions per row in one call
};

// Operands of both: b[0] = qkv [B*M, 3C], b[1] = cache [2, B, H, S, hs] (fp32, read and written),
// b[2] = position [1] (int32), b[3] = out [B*M, C].
//   CPU: extern "C" void SYMBOL(void* const* b, const int64_t* range)
std::string cpuDecodeAttention(const std::string& symbol, const DecodeAttentionShape& s);
//   CUDA: extern "C" __global__ void SYMBOL(void* const* b, const long long* range), one block
//   per (b, h, m); `launch` gets its grid and block.
std::string cudaDecodeAttention(const std::string& symbol, const DecodeAttentionShape& s, CudaKernelLaunch& launch);

// The arithmetic of one call with its last token at the last position (the most work):
// 4 B C (S + (S - 1) + ... + (S - M + 1)).
double decodeAttentionFlops(const DecodeAttentionShape& s);

// Both take the softmax online over chunks of up to 2048 cached positions, so S has no limit.
// They throw std::invalid_argument for a shape they do not handle (H not dividing C, a
// non-positive size, M above S; CUDA: a head size above 1024, 2^31 or more (row, head, token)
// triples).

}  // namespace kiln
