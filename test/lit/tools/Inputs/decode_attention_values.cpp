// The decode attention kernels as kilnc writes them (decode-attention-values.test: the prelude and
// the kernels of a model of B = 3 rows, C = 16, H = 2 heads, S = 2100 cached positions, cut from
// kernels.cpp or kernels.cu and renamed decode1 (M = 1) and prefill (M = PREFILL_M)), on inputs
// made here, against a float64 softmax over the cache. With KILN_CUDA the CUDA kernels, on the
// emulation (test/e2e/cuda_emulation/shim.h): one block of 128 threads per (row, head, token).
// Prints what FileCheck compares.
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include <vector>
#ifdef KILN_CUDA
#include "shim.h"
namespace kdev {
#include KILN_KERNELS
}
static void run(kemu::KernelFn kernel, unsigned blocks, void** b) { kemu_launch(kernel, "decode", blocks, 128, b, nullptr); }
using kdev::decode1, kdev::prefill;
#else
#include KILN_KERNELS
static void run(void (*kernel)(void* const*, const int64_t*), unsigned, void** b) { kernel(b, nullptr); }
#endif

constexpr int64_t B = 3, C = 16, H = 2, S = 2100, HS = C / H;

static uint32_t seed = 1;
static float rnd() {  // uniform in [-1, 1)
  seed = seed * 1664525u + 1013904223u;
  return float(seed >> 8) / 8388608.0f - 1.0f;
}

static float* key(std::vector<float>& cache, int64_t bb, int64_t h, int64_t t) { return &cache[((bb * H + h) * S + t) * HS]; }
static float* value(std::vector<float>& cache, int64_t bb, int64_t h, int64_t t) { return key(cache, bb, h, t) + B * H * S * HS; }

// Attention of query q (one head) over cache positions 0..t, in float64.
static void reference(std::vector<float>& cache, int64_t bb, int64_t h, int64_t t, const float* q, double* out) {
  std::vector<double> s(size_t(t + 1));
  double m = -INFINITY, l = 0;
  for (int64_t t2 = 0; t2 <= t; ++t2) {
    double d = 0;
    for (int64_t c = 0; c < HS; ++c) d += double(q[c]) * key(cache, bb, h, t2)[c];
    s[size_t(t2)] = d / sqrt(double(HS));
    m = fmax(m, s[size_t(t2)]);
  }
  for (int64_t c = 0; c < HS; ++c) out[c] = 0;
  for (int64_t t2 = 0; t2 <= t; ++t2) {
    const double p = exp(s[size_t(t2)] - m);
    l += p;
    for (int64_t c = 0; c < HS; ++c) out[c] += p * value(cache, bb, h, t2)[c];
  }
  for (int64_t c = 0; c < HS; ++c) out[c] /= l;
}

// One call of `kernel` (M new tokens per row at `position`) on a random cache; checks the cache
// after it (the tokens' k and v at their positions below S, every other element as it was) and
// out (each token below S against the reference; the rows of the others left as they were).
template <class Kernel>
static void call(const char* what, Kernel kernel, int64_t M, int32_t position, float key_growth) {
  std::vector<float> qkv(size_t(B * M * 3 * C)), cache(size_t(2 * B * H * S * HS)), out(size_t(B * M * C), 12345.0f);
  for (float& x : qkv) x = rnd();
  // Keys grow along u (the queries' direction, every channel +-1) with the position: with
  // key_growth > 0 the largest scores are the last positions, past the first 2048-position chunk.
  float u[HS];
  for (float& x : u) x = rnd() < 0 ? -1.0f : 1.0f;
  for (int64_t bb = 0; bb < B; ++bb)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < S; ++t)
        for (int64_t c = 0; c < HS; ++c) {
          key(cache, bb, h, t)[c] = 0.5f * rnd() + key_growth * u[c] * float(t) / S;
          value(cache, bb, h, t)[c] = rnd();
        }
  // q near u; the new tokens' keys as the cache's at their positions.
  for (int64_t r = 0; r < B * M; ++r)
    for (int64_t c = 0; c < C; ++c) {
      qkv[size_t(r * 3 * C + c)] = u[c % HS] + 0.25f * rnd();
      qkv[size_t(r * 3 * C + C + c)] = 0.5f * rnd() + key_growth * u[c % HS] * float(position + r % M) / S;
    }
  std::vector<float> before = cache;
  int32_t pos = position;
  void* b[4] = {qkv.data(), cache.data(), &pos, out.data()};
  run(kernel, unsigned(B * H * M), b);
  const int64_t fit = position < 0 || position >= S ? 0 : (M < S - position ? M : S - position);
  for (int64_t bb = 0; bb < B; ++bb)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t tok = 0; tok < fit; ++tok)
        for (int64_t c = 0; c < HS; ++c) {
          const float* row = &qkv[size_t((bb * M + tok) * 3 * C + h * HS)];
          key(before, bb, h, position + tok)[c] = row[C + c];
          value(before, bb, h, position + tok)[c] = row[2 * C + c];
        }
  size_t cache_changed = 0;
  for (size_t i = 0; i < cache.size(); ++i) cache_changed += cache[i] != before[i];
  double worst = 0;
  size_t untouched = 0;
  for (int64_t bb = 0; bb < B; ++bb)
    for (int64_t tok = 0; tok < M; ++tok)
      for (int64_t h = 0; h < H; ++h) {
        const float* o = &out[size_t((bb * M + tok) * C + h * HS)];
        if (tok >= fit) {
          for (int64_t c = 0; c < HS; ++c) untouched += o[c] == 12345.0f;
          continue;
        }
        double ref[HS];
        reference(cache, bb, h, position + tok, &qkv[size_t((bb * M + tok) * 3 * C + h * HS)], ref);
        for (int64_t c = 0; c < HS; ++c) {
          const double d = fabs(o[c] - ref[c]);
          if (!(d <= worst)) worst = d == d ? d : INFINITY;  // NaN: the worst
        }
      }
  printf("%s: cache elements not as expected %zu, out rows past the cache untouched %zu of %lld, worst error "
         "below 1e-5: %s\n",
         what, cache_changed, untouched, (long long)((M - fit) * B * C), worst < 1e-5 ? "yes" : "no");
}

int main() {
  // The last position: 2100 cached positions in two chunks, the largest scores in the second.
  call("decode at 2099", decode1, 1, 2099, 4.0f);
  call("decode at 2099, flat keys", decode1, 1, 2099, 0.0f);
  // Scores falling by about 100 from the first chunk to the second: the running max stays the
  // first chunk's (rescaling by exp(m - max) with the second chunk's max, e^100, would overflow).
  call("decode at 2099, falling keys", decode1, 1, 2099, -36.0f);
  call("decode at 0", decode1, 1, 0, 4.0f);
  // A prompt read in: at 2040 across the chunks' border; at 2090 only 10 of its tokens fit.
  call("prefill at 2040", prefill, PREFILL_M, 2040, 4.0f);
  call("prefill at 2090", prefill, PREFILL_M, 2090, 4.0f);
  // Outside the cache: nothing stored or computed.
  call("decode at 2100", decode1, 1, 2100, 4.0f);
  call("prefill at -1", prefill, PREFILL_M, -1, 4.0f);
  return 0;
}
