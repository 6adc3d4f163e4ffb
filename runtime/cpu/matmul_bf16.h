// bf16 matrix products on the CPU by oneDNN's matmul primitive, which runs them on AMX or
// AVX-512 BF16 tiles where the CPU has them (several times the fp32 BLAS's rate).
#pragma once

#include <cstdint>

namespace kiln::cpu {

// out[M, N] = op(a) op(b) for row-major bf16 a (stored [K, M] when trans_a) and b (stored [N, K]
// when trans_b): bf16 products summed in fp32, written as fp32, or rounded once to the nearest
// even bf16 when out_bf16 (what widening both operands for the BLAS and narrowing its result
// gives, up to the order of the sums, which oneDNN splits among its threads: another thread
// count rounds otherwise). Returns false when this build has no oneDNN or oneDNN has no bf16
// matmul for this CPU (or failed): the caller then computes all of out with the BLAS.
// Each shape's primitive is made at its first call and kept.
bool matmul_bf16(void* out, bool out_bf16, const uint16_t* a, const uint16_t* b, int64_t M, int64_t N,
                 int64_t K, bool trans_a, bool trans_b);

// The bf16 FLOPs per cycle and core that matmul_bf16's units can do on this CPU, for an MFU
// estimate: 1024 on AMX tiles, 128 on AVX-512 BF16 (two 16-pair dot products a cycle), 0 when
// this build has no oneDNN or oneDNN may use neither (the CPU's features, ONEDNN_MAX_CPU_ISA).
int bf16_flops_per_cycle();

}  // namespace kiln::cpu
