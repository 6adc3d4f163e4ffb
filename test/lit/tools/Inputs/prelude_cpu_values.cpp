// Values of the CPU kernel prelude's helpers (compiler/kernel_prelude.cpp), for
// kernel-prelude-values.test: KILN_PRELUDE names the prelude as kilnc writes it (kernels.cpp cut
// before the first generated kernel). Prints what FileCheck compares.
#include <math.h>
#include <stdio.h>
#include KILN_PRELUDE

static float from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

int main() {
  // f2bf: round to nearest, ties to even; infinities stay infinite, NaNs stay NaN (quiet).
  const uint32_t in[] = {0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f80ffffu, 0x7f7fffffu,
                         0x7f800000u, 0xff800000u, 0x7f800001u, 0xffc00000u, 0x80000000u};
  for (uint32_t u : in) printf("f2bf %08x %04x\n", u, f2bf(from_bits(u)));
  // exp_f: clamped to [-87, 88] (finite, normal), within 3e-7 relative of exp in between.
  printf("exp_f(-1e30) %.6e exp_f(-100) %.6e exp_f(88.5) %.6e\n", exp_f(-1e30f), exp_f(-100.0f), exp_f(88.5f));
  double worst = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.01f) worst = fmax(worst, fabs(exp_f(x) / exp((double)x) - 1));
  printf("exp_f worst relative error below 3e-7: %s\n", worst < 3e-7 ? "yes" : "no");
  printf("tanh_f %.6f %.6f %.6f %.6f\n", tanh_f(0.5f), tanh_f(-2.0f), tanh_f(30.0f), tanh_f(-100.0f));
  printf("gelu_f %.6f %.6f %.6f\n", gelu_f(1.0f), gelu_f(-3.0f), gelu_f(0.25f));
  printf("gelu_grad_f %.6f %.6f %.6f\n", gelu_grad_f(1.0f, 1.0f), gelu_grad_f(2.0f, -1.5f), gelu_grad_f(1.0f, 0.25f));
  // kiln_scratch_bytes: every slot's largest request, in fp32 elements.
  scratch(3, 10), scratch(0, 5), scratch(0, 2), scratch(2, 7);
  printf("scratch bytes %lld\n", kiln_scratch_bytes());
  return 0;
}
