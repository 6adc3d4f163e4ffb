// The emulation notices what a GPU leaves undefined (shim.h's counters, which the emulated device
// turns into a failed launch): a full-mask shuffle in a warp some of whose lanes have returned,
// and __syncthreads reached from different lines in one round; a kernel doing neither counts
// nothing. Exit status 0 when each kernel moves exactly its counter.
#include "shim.h"

namespace kdev {

extern "C" __global__ void clean(void* const* b, const long long*) {
  float v = float(threadIdx.x);
  __syncthreads();
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  ((float*)b[0])[threadIdx.x] = v;
}

extern "C" __global__ void shuffle_after_return(void* const* b, const long long*) {
  if (threadIdx.x % 32 == 31) return;  // the last lane of each warp leaves
  ((float*)b[0])[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

extern "C" __global__ void divergent_barrier(void* const* b, const long long*) {
  if (threadIdx.x < 32) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  ((float*)b[0])[threadIdx.x] = 1.0f;
}

}  // namespace kdev

int main() {
  static float out[64];
  void* args[] = {out};
  struct Case {
    const char* name;
    kemu::KernelFn fn;
    long long shuffles, barriers;  // expected increments of kemu_stats[4], [5]
  } cases[] = {{"clean", kdev::clean, 0, 0},
               {"shuffle_after_return", kdev::shuffle_after_return, 1, 0},
               {"divergent_barrier", kdev::divergent_barrier, 0, 1}};
  int failed = 0;
  for (const Case& c : cases) {
    long long before[6], after[6];
    kemu_stats(before);
    kemu_launch(c.fn, c.name, 1, 64, args, nullptr);
    kemu_stats(after);
    const long long shuffles = after[4] - before[4], barriers = after[5] - before[5];
    const bool ok = (shuffles > 0) == (c.shuffles > 0) && (barriers > 0) == (c.barriers > 0);
    printf("%-22s shuffles with returned lanes %lld, divergent barriers %lld: %s\n", c.name, shuffles, barriers,
           ok ? "ok" : "WRONG");
    failed += !ok;
  }
  return failed ? 1 : 0;
}
