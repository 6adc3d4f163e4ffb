// Decode attention templates (see attention_decode.h).
#include "compiler/attention_decode.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "compiler/source_template.h"

namespace kiln {
namespace {

std::vector<std::pair<std::string, std::string>> values(const std::string& symbol, const DecodeAttentionShape& s) {
  if (s.B <= 0 || s.C <= 0 || s.H <= 0 || s.S <= 0 || s.M <= 0) throw std::invalid_argument("decode attention: sizes must be positive");
  if (s.C % s.H != 0) throw std::invalid_argument("decode attention: H must divide C");
  if (s.M > s.S) throw std::invalid_argument("decode attention: more new positions than the cache holds");
  const int64_t hs = s.C / s.H;
  return {{"SYM", symbol},
          {"B", num(s.B)},
          {"C", num(s.C)},
          {"H", num(s.H)},
          {"S", num(s.S)},
          {"M", num(s.M)},
          {"HS", num(hs)},
          {"SCALE", floatLiteral(1.0f / std::sqrt(float(hs)))},
          {"ELT", s.bf16 ? "bf16" : "float"},
          {"SHAPE", "B=" + num(s.B) + " C=" + num(s.C) + " H=" + num(s.H) + ", head size " + num(hs) + ", " + num(s.S) +
                        " cached positions, " + num(s.M) + (s.M == 1 ? " new position" : " new positions") +
                        " per row" + (s.bf16 ? ", bf16 qkv and out" : "")}};
}

// Cached positions whose scores one pass holds (on the CPU stack, in CUDA shared memory).
constexpr int64_t kChunk = 2048;

}  // namespace

double decodeAttentionFlops(const DecodeAttentionShape& s) {
  const double m = double(s.M), attended = m * double(s.S) - m * (m - 1) / 2;  // S + (S-1) + ... + (S-M+1)
  return 4.0 * double(s.B) * attended * double(s.C);
}

std::string cpuDecodeAttention(const std::string& symbol, const DecodeAttentionShape& s) {
  auto v = values(symbol, s);
  v.push_back({"CHUNK", num(std::min<int64_t>(s.S, kChunk))});
  return fillTemplate(R"(// Decode attention (${SHAPE}). Per row bb and head h, and new token m at
//   t = position + m: the tokens' k and v go into the cache at t (all of them first); then for
//   each token s[t2] = q . k[t2] / sqrt(hs) for t2 <= t, out = sum softmax(s)[t2] v[t2], the
//   softmax taken online over chunks of ${CHUNK} positions (a running max m, sum l and output o,
//   rescaled by exp(m_old - m_new) when m grows).
extern "C" void ${SYM}(void* const* b, const int64_t* range) {
  const ${ELT}* qkv = (const ${ELT}*)b[0];
  float* cache = (float*)b[1];  // [2, B, H, S, HS]: keys, then values
  const int64_t p = ((const int32_t*)b[2])[0];
  ${ELT}* out = (${ELT}*)b[3];
  if (p < 0 || p >= ${S}) return;
  const int64_t news = ${M} < ${S} - p ? ${M} : ${S} - p;  // new tokens that fit the cache
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bb = 0; bb < ${B}; ++bb)
    for (int64_t h = 0; h < ${H}; ++h) {
      float* kc = cache + (bb * ${H} + h) * (int64_t)${S} * ${HS};
      float* vc = kc + (int64_t)${B} * ${H} * ${S} * ${HS};
      for (int64_t tok = 0; tok < news; ++tok) {
        const int64_t row = (bb * ${M} + tok) * 3 * ${C} + h * ${HS};
        for (int64_t c = 0; c < ${HS}; ++c) {
          kc[(p + tok) * ${HS} + c] = ld(qkv, row + ${C} + c);
          vc[(p + tok) * ${HS} + c] = ld(qkv, row + 2 * ${C} + c);
        }
      }
      for (int64_t tok = 0; tok < news; ++tok) {
        const int64_t row = (bb * ${M} + tok) * 3 * ${C} + h * ${HS}, t = p + tok;
        float s[${CHUNK}], q[${HS}], o[${HS}];
        for (int64_t c = 0; c < ${HS}; ++c) {
          q[c] = ld(qkv, row + c) * ${SCALE};
          o[c] = 0.0f;
        }
        float m = -INFINITY, l = 0.0f;
        for (int64_t c0 = 0; c0 <= t; c0 += ${CHUNK}) {
          const int64_t n = t + 1 - c0 < ${CHUNK} ? t + 1 - c0 : ${CHUNK};
          float cm = m;
          for (int64_t j = 0; j < n; ++j) {
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t c = 0; c < ${HS}; ++c) dot += q[c] * kc[(c0 + j) * ${HS} + c];
            s[j] = dot;
            cm = dot > cm ? dot : cm;
          }
          const float r = exp_f(m - cm);  // 0 on the first chunk (m = -inf)
          l *= r;
          for (int64_t c = 0; c < ${HS}; ++c) o[c] *= r;
          m = cm;
#pragma omp simd reduction(+ : l)
          for (int64_t j = 0; j < n; ++j) {
            s[j] = exp_f(s[j] - m);
            l += s[j];
          }
          for (int64_t j = 0; j < n; ++j) {
            const float w = s[j];
#pragma omp simd
            for (int64_t c = 0; c < ${HS}; ++c) o[c] += w * vc[(c0 + j) * ${HS} + c];
          }
        }
        const float inv = 1.0f / l;
        for (int64_t c = 0; c < ${HS}; ++c) st(out, (bb * ${M} + tok) * ${C} + h * ${HS} + c, o[c] * inv);
      }
    }
}
)",
                      v);
}

std::string cudaDecodeAttention(const std::string& symbol, const DecodeAttentionShape& s, CudaKernelLaunch& launch) {
  auto v = values(symbol, s);
  if (s.B * s.H * s.M >= (int64_t(1) << 31)) throw std::invalid_argument("decode attention: shape too large");
  constexpr int kThreads = 128;
  const int64_t hs = s.C / s.H;
  if (hs > 1024) throw std::invalid_argument("decode attention: head size above 1024");
  launch = {symbol, unsigned(s.B * s.H * s.M), kThreads};
  v.push_back({"THREADS", num(kThreads)});
  v.push_back({"CHUNK", num(std::min<int64_t>(s.S, kChunk))});
  v.push_back({"CPT", num((hs + kThreads - 1) / kThreads)});
  return fillTemplate(R"(// Decode attention (${SHAPE}): one block of ${THREADS} threads per (row, head, new token).
// The token at t = position + m puts its k and v into the cache at t. Then over chunks of ${CHUNK}
// positions t2 <= t: warps take the positions in turn for the scores s[t2] = q . k[t2] / sqrt(hs)
// (lanes split the channels); the chunk's max rescales the running sum l and the output o (each
// thread holds channels threadIdx.x + ${THREADS} i), which then add the chunk's exp(s - max) and
// its share of sum exp(s - max) v[t2]. Keys and values of this call's tokens (t2 >= position) are
// read from qkv, since other blocks are storing them; earlier ones from the cache.
extern "C" __global__ void ${SYM}(void* const* b, const long long* range) {
  constexpr int B = ${B}, C = ${C}, H = ${H}, S = ${S}, M = ${M}, HS = ${HS}, WARPS = ${THREADS} / 32, CHUNK = ${CHUNK},
                CPT = ${CPT};
  const ${ELT}* qkv = (const ${ELT}*)b[0];
  float* cache = (float*)b[1];  // [2, B, H, S, HS]: keys, then values
  const int p = ((const int32_t*)b[2])[0];
  ${ELT}* out = (${ELT}*)b[3];
  const int tok = blockIdx.x % M, bb = blockIdx.x / M / H, h = blockIdx.x / M % H, t = p + tok;
  if (p < 0 || p >= S || t >= S) return;  // the whole block
  __shared__ float q[HS], s[CHUNK], part[WARPS];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* kc = cache + ((long long)bb * H + h) * S * HS;
  float* vc = kc + (long long)B * H * S * HS;
  const long long first = (long long)bb * M * 3 * C + h * HS;  // this row's token 0, head h
  const long long row = first + (long long)tok * 3 * C;
  for (int c = threadIdx.x; c < HS; c += blockDim.x) {
    q[c] = ld(qkv, row + c) * ${SCALE};
    kc[(long long)t * HS + c] = ld(qkv, row + C + c);
    vc[(long long)t * HS + c] = ld(qkv, row + 2 * C + c);
  }
  __syncthreads();
  float m = -INFINITY, l = 0.0f, o[CPT];
  for (int i = 0; i < CPT; ++i) o[i] = 0.0f;
  for (int c0 = 0; c0 <= t; c0 += CHUNK) {
    const int n = t + 1 - c0 < CHUNK ? t + 1 - c0 : CHUNK;
    float cm = -INFINITY;
    for (int j = warp; j < n; j += WARPS) {
      const int t2 = c0 + j;
      float dot = 0.0f;
      if (t2 < p)
        for (int c = lane; c < HS; c += 32) dot += q[c] * kc[(long long)t2 * HS + c];
      else
        for (int c = lane; c < HS; c += 32) dot += q[c] * ld(qkv, first + (long long)(t2 - p) * 3 * C + C + c);
      dot = warp_sum(dot);
      if (lane == 0) s[j] = dot;
      cm = fmaxf(cm, dot);
    }
    if (lane == 0) part[warp] = cm;
    __syncthreads();
    cm = m;
    for (int w = 0; w < WARPS; ++w) cm = fmaxf(cm, part[w]);
    __syncthreads();  // every thread has read part[] before it is reused
    const float r = expf(m - cm);  // 0 on the first chunk (m = -inf)
    m = cm;
    float cl = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      const float e = expf(s[j] - m);
      s[j] = e;
      cl += e;
    }
    cl = warp_sum(cl);
    if (lane == 0) part[warp] = cl;
    __syncthreads();
    cl = 0.0f;
    for (int w = 0; w < WARPS; ++w) cl += part[w];
    l = l * r + cl;
    for (int i = 0; i < CPT; ++i) {
      const int c = threadIdx.x + i * ${THREADS};
      if (c >= HS) break;
      float acc = o[i] * r;
      for (int j = 0; j < n; ++j) {
        const int t2 = c0 + j;
        acc += s[j] * (t2 < p ? vc[(long long)t2 * HS + c] : ld(qkv, first + (long long)(t2 - p) * 3 * C + 2 * C + c));
      }
      o[i] = acc;
    }
    __syncthreads();  // s[] and part[] are free for the next chunk
  }
  const float inv = 1.0f / l;
  for (int i = 0; i < CPT; ++i) {
    const int c = threadIdx.x + i * ${THREADS};
    if (c < HS) st(out, ((long long)bb * M + tok) * C + h * HS + c, o[i] * inv);
  }
}
)",
                      v);
}

}  // namespace kiln
