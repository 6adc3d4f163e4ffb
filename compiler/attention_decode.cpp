// Decode attention templates (see attention_decode.h).
#include "compiler/attention_decode.h"

#include <cmath>
#include <stdexcept>

#include "compiler/source_template.h"

namespace kiln {
namespace {

std::vector<std::pair<std::string, std::string>> values(const std::string& symbol, const DecodeAttentionShape& s) {
  if (s.B <= 0 || s.C <= 0 || s.H <= 0 || s.S <= 0) throw std::invalid_argument("decode attention: sizes must be positive");
  if (s.C % s.H != 0) throw std::invalid_argument("decode attention: H must divide C");
  const int64_t hs = s.C / s.H;
  return {{"SYM", symbol},
          {"B", num(s.B)},
          {"C", num(s.C)},
          {"H", num(s.H)},
          {"S", num(s.S)},
          {"HS", num(hs)},
          {"SCALE", floatLiteral(1.0f / std::sqrt(float(hs)))},
          {"ELT", s.bf16 ? "bf16" : "float"},
          {"SHAPE", "B=" + num(s.B) + " C=" + num(s.C) + " H=" + num(s.H) + ", head size " + num(hs) + ", " + num(s.S) +
                        " cached positions" + (s.bf16 ? ", bf16 qkv and out" : "")}};
}

}  // namespace

double decodeAttentionFlops(const DecodeAttentionShape& s) { return 4.0 * double(s.B) * double(s.S) * double(s.C); }

std::string cpuDecodeAttention(const std::string& symbol, const DecodeAttentionShape& s) {
  return fillTemplate(R"(// Decode attention (${SHAPE}). Per row bb and head h, at p = position:
//   the token's k and v go into the cache at p; s[t2] = q . k[t2] / sqrt(hs) for t2 <= p;
//   out = sum softmax(s)[t2] v[t2].
extern "C" void ${SYM}(void* const* b, const int64_t* range) {
  const ${ELT}* qkv = (const ${ELT}*)b[0];
  float* cache = (float*)b[1];  // [2, B, H, S, HS]: keys, then values
  const int64_t p = ((const int32_t*)b[2])[0];
  ${ELT}* out = (${ELT}*)b[3];
  if (p < 0 || p >= ${S}) return;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bb = 0; bb < ${B}; ++bb)
    for (int64_t h = 0; h < ${H}; ++h) {
      float* kc = cache + (bb * ${H} + h) * (int64_t)${S} * ${HS};
      float* vc = kc + (int64_t)${B} * ${H} * ${S} * ${HS};
      const int64_t row = bb * 3 * ${C} + h * ${HS};
      float s[${S}], q[${HS}], o[${HS}];
      for (int64_t c = 0; c < ${HS}; ++c) {
        q[c] = ld(qkv, row + c) * ${SCALE};
        kc[p * ${HS} + c] = ld(qkv, row + ${C} + c);
        vc[p * ${HS} + c] = ld(qkv, row + 2 * ${C} + c);
      }
      float m = -INFINITY;
      for (int64_t t2 = 0; t2 <= p; ++t2) {
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t c = 0; c < ${HS}; ++c) dot += q[c] * kc[t2 * ${HS} + c];
        s[t2] = dot;
        m = dot > m ? dot : m;
      }
      float l = 0.0f;
#pragma omp simd reduction(+ : l)
      for (int64_t t2 = 0; t2 <= p; ++t2) {
        s[t2] = exp_f(s[t2] - m);
        l += s[t2];
      }
      for (int64_t c = 0; c < ${HS}; ++c) o[c] = 0.0f;
      for (int64_t t2 = 0; t2 <= p; ++t2) {
        const float w = s[t2];
#pragma omp simd
        for (int64_t c = 0; c < ${HS}; ++c) o[c] += w * vc[t2 * ${HS} + c];
      }
      const float inv = 1.0f / l;
      for (int64_t c = 0; c < ${HS}; ++c) st(out, bb * ${C} + h * ${HS} + c, o[c] * inv);
    }
}
)",
                      values(symbol, s));
}

std::string cudaDecodeAttention(const std::string& symbol, const DecodeAttentionShape& s, CudaKernelLaunch& launch) {
  auto v = values(symbol, s);
  if ((s.S + s.C / s.H + 32) * 4 > 40 * 1024)
    throw std::invalid_argument("decode attention: the scores of " + num(s.S) + " positions do not fit in shared memory");
  if (s.B * s.H > (int64_t(1) << 31)) throw std::invalid_argument("decode attention: shape too large");
  constexpr int kThreads = 128;
  launch = {symbol, unsigned(s.B * s.H), kThreads};
  v.push_back({"THREADS", num(kThreads)});
  return fillTemplate(R"(// Decode attention (${SHAPE}): one block of ${THREADS} threads per (row, head).
// At p = position: the token's k and v go into the cache at p; warps take the cached positions
// t2 <= p in turn for the scores s[t2] = q . k[t2] / sqrt(hs) (lanes split the channels); after the
// block's max and sum, each thread adds up one channel of out = sum softmax(s)[t2] v[t2].
extern "C" __global__ void ${SYM}(void* const* b, const long long* range) {
  constexpr int B = ${B}, C = ${C}, H = ${H}, S = ${S}, HS = ${HS}, WARPS = ${THREADS} / 32;
  const ${ELT}* qkv = (const ${ELT}*)b[0];
  float* cache = (float*)b[1];  // [2, B, H, S, HS]: keys, then values
  const int p = ((const int32_t*)b[2])[0];
  ${ELT}* out = (${ELT}*)b[3];
  if (p < 0 || p >= S) return;
  __shared__ float q[HS], s[S], part[WARPS];
  const int bb = blockIdx.x / H, h = blockIdx.x % H, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* kc = cache + ((long long)bb * H + h) * S * HS;
  float* vc = kc + (long long)B * H * S * HS;
  const long long row = (long long)bb * 3 * C + h * HS;
  for (int c = threadIdx.x; c < HS; c += blockDim.x) {
    q[c] = ld(qkv, row + c) * ${SCALE};
    kc[(long long)p * HS + c] = ld(qkv, row + C + c);
    vc[(long long)p * HS + c] = ld(qkv, row + 2 * C + c);
  }
  __syncthreads();
  float m = -INFINITY;
  for (int t2 = warp; t2 <= p; t2 += WARPS) {
    float dot = 0.0f;
    for (int c = lane; c < HS; c += 32) dot += q[c] * kc[(long long)t2 * HS + c];
    dot = warp_sum(dot);
    if (lane == 0) s[t2] = dot;
    m = fmaxf(m, dot);
  }
  if (lane == 0) part[warp] = m;
  __syncthreads();
  m = part[0];
  for (int w = 1; w < WARPS; ++w) m = fmaxf(m, part[w]);
  __syncthreads();  // every thread has read part[] before it is reused
  float l = 0.0f;
  for (int t2 = threadIdx.x; t2 <= p; t2 += blockDim.x) {
    const float e = expf(s[t2] - m);
    s[t2] = e;
    l += e;
  }
  l = warp_sum(l);
  if (lane == 0) part[warp] = l;
  __syncthreads();
  l = 0.0f;
  for (int w = 0; w < WARPS; ++w) l += part[w];
  const float inv = 1.0f / l;
  for (int c = threadIdx.x; c < HS; c += blockDim.x) {
    float o = 0.0f;
    for (int t2 = 0; t2 <= p; ++t2) o += s[t2] * vc[(long long)t2 * HS + c];
    st(out, (long long)bb * C + h * HS + c, o * inv);
  }
}
)",
                      v);
}

}  // namespace kiln
