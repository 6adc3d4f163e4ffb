// The CUDA kernel prelude's helpers and support kernels (compiler/kernel_prelude.cpp) on the CUDA
// emulation (test/e2e/cuda_emulation/shim.h), for kernel-prelude-values.test: KILN_PRELUDE names
// the prelude as kilnc writes it (kernels.cu cut before the first generated kernel). Prints what
// FileCheck compares; "misaligned" as the argument makes a bf16 pair load from an odd address.
#include "shim.h"

namespace kdev {
#include KILN_PRELUDE

// warp_sum of lane + 100 warp; combine_max_sum of (lane / 2 or -inf, 1 or 0) pairs.
extern "C" __global__ void reductions(void* const* b, const long long*) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  ((float*)b[0])[threadIdx.x] = warp_sum(float(lane + 100 * warp));
  // Warp 0: every lane finite; warp 1: lanes 0..15 -inf (sum 0), 16..31 finite; warp 2: all -inf.
  const bool empty = warp == 2 || (warp == 1 && lane < 16);
  float mx = empty ? -INFINITY : 0.5f * lane, sum = empty ? 0.0f : 1.0f;
  combine_max_sum(mx, sum);
  ((float*)b[1])[2 * threadIdx.x] = mx;
  ((float*)b[1])[2 * threadIdx.x + 1] = sum;
}
extern "C" __global__ void pair_load(void* const* b, const long long*) {
  ((uint32_t*)b[1])[0] = ld_pair((const bf16*)b[0] + 1);
}
}  // namespace kdev

using kdev::bf16, kdev::bf2f, kdev::f2bf, kdev::uint32_t;
static float from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

int main(int argc, char** argv) {
  if (argc > 1 && !strcmp(argv[1], "misaligned")) {
    static uint32_t words[4], out[1];
    void* args[] = {words, out};
    kemu_launch(kdev::pair_load, "pair_load", 1, 32, args, nullptr);
    return 0;
  }
  static float sums[96], pairs[192];
  void* red[] = {sums, pairs};
  kemu_launch(kdev::reductions, "reductions", 1, 96, red, nullptr);
  printf("warp_sum %g %g %g %g %g\n", sums[0], sums[31], sums[32], sums[63], sums[95]);
  for (int w = 0; w < 3; w++) printf("combine_max_sum warp %d lanes 0, 31: %g %.6f, %g %.6f\n", w, pairs[64 * w],
                                     pairs[64 * w + 1], pairs[64 * w + 62], pairs[64 * w + 63]);

  // kiln_sum_squares over slices of two tensors (2 blocks of 64), then kiln_norm_finish, twice.
  static float g0[300], g1[50], norm[1];
  static double acc[1];
  for (int i = 0; i < 300; i++) g0[i] = float(i % 7) - 3.0f;
  for (int i = 0; i < 50; i++) g1[i] = 0.5f * float(i);
  void* sq[] = {g0, g1, acc, norm};
  const long long range[] = {2, 5, 290, 10, 20};
  for (int run = 0; run < 2; run++) {
    kemu_launch(kdev::kiln_sum_squares, "kiln_sum_squares", 2, 64, sq, range);
    const double sum = acc[0];
    kemu_launch(kdev::kiln_norm_finish, "kiln_norm_finish", 1, 32, sq, range);
    printf("sum_squares %.2f norm %.6f acc after %g\n", sum, norm[0], acc[0]);
  }

  // kiln_matmul_epilogue, 4 rows of 3 columns on 2 blocks of 4 threads (a grid stride of 8).
  static float prod[12], bias[3], aux[12], dst[12], dy[12];
  static bf16 dst16[12], aux16[12];
  for (int i = 0; i < 12; i++) prod[i] = 0.25f * float(i) - 1.0f, dy[i] = 1.0f + 0.125f * float(i);
  for (int j = 0; j < 3; j++) bias[j] = 0.5f * float(j + 1);
  const auto epilogue = [&](int flags, int dt, int at, void* d, void* a) {
    void* args[] = {prod, bias, a, d};
    const long long r[] = {12, 3, flags, dt, 0, at};
    kemu_launch(kdev::kiln_matmul_epilogue, "kiln_matmul_epilogue", 2, 4, args, r);
  };
  epilogue(1, 0, 0, dst, aux);
  printf("bias:");
  for (int i = 0; i < 12; i++) printf(" %g", dst[i]);
  printf("\n");
  for (int i = 0; i < 12; i++) aux[i] = prod[i];  // the product in aux: bias, aux written, GELU
  epilogue(1 | 2 | 4, 0, 0, dst, aux);
  printf("bias gelu aux: %g %g %g, d: %.6f %.6f %.6f\n", aux[0], aux[5], aux[11], dst[0], dst[5], dst[11]);
  for (int i = 0; i < 12; i++) aux16[i] = f2bf(prod[i]);
  epilogue(1 | 4, 2, 2, dst16, aux16);  // bf16 aux and D
  printf("bf16 bias aux: %g %g, d: %g %g\n", bf2f(aux16[1]), bf2f(aux16[10]), bf2f(dst16[1]), bf2f(dst16[10]));
  for (int i = 0; i < 12; i++) aux[i] = prod[i];  // GELU backward: d = dy gelu'(aux)
  {
    void* args[] = {dy, bias, aux, dst};
    const long long r[] = {12, 3, 8, 0, 0, 0};
    kemu_launch(kdev::kiln_matmul_epilogue, "kiln_matmul_epilogue", 2, 4, args, r);
  }
  printf("gelu backward: %.6f %.6f %.6f\n", dst[0], dst[4], dst[11]);

  // kiln_round_copies of two slices; outside them the copies keep their 0xdddd.
  static float v0[6], v1[4];
  static bf16 c0[6], c1[4];
  const uint32_t bits[] = {0x3f80c000u, 0x3f808000u, 0x3f818000u, 0xbf80c001u, 0x40490fdbu, 0x7f800000u};
  for (int i = 0; i < 6; i++) v0[i] = from_bits(bits[i]), c0[i] = 0xdddd;
  for (int i = 0; i < 4; i++) v1[i] = 1.0f / 3.0f + float(i), c1[i] = 0xdddd;
  void* rc[] = {v0, c0, v1, c1};
  const long long rr[] = {2, 0, 6, 1, 3};
  kemu_launch(kdev::kiln_round_copies, "kiln_round_copies", 2, 2, rc, rr);
  printf("round_copies");
  for (int i = 0; i < 6; i++) printf(" %04x", c0[i]);
  printf(" |");
  for (int i = 0; i < 4; i++) printf(" %04x", c1[i]);
  printf("\npack_bf16 %08x\n", kdev::pack_bf16(1.0f, -2.0f));
  return 0;
}
