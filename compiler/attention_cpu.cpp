// CPU attention templates (see attention_cpu.h).
#include "compiler/attention_cpu.h"

#include <cmath>

#include "compiler/source_template.h"

namespace kiln {
namespace {

std::vector<std::pair<std::string, std::string>> values(const std::string& symbol, const AttentionShape& s) {
  const int64_t hs = s.C / s.H;
  return {{"SYM", symbol},
          {"B", std::to_string(s.B)},
          {"T", std::to_string(s.T)},
          {"C", std::to_string(s.C)},
          {"C3", std::to_string(3 * s.C)},
          {"H", std::to_string(s.H)},
          {"HS", std::to_string(hs)},
          {"SCALE", floatLiteral(1.0f / std::sqrt(float(hs)))},  // 1.0f at head size 1
          {"ELT", s.bf16 ? "bf16" : "float"},
          {"SHAPE", "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " C=" + std::to_string(s.C) +
                        " H=" + std::to_string(s.H) + ", head size " + std::to_string(hs) +
                        (s.bf16 ? ", bf16 storage" : "")}};
}

}  // namespace

std::string cpuAttentionForward(const std::string& symbol, const AttentionShape& s) {
  return fillTemplate(R"(// Causal self-attention forward (${SHAPE}). Per query row t of head h:
//   s[t2] = q . k[t2] / sqrt(hs) for t2 <= t,  p = softmax(s),  out = sum p[t2] v[t2],
//   lse = max + log(sum exp(s - max)), kept for the backward.
extern "C" void ${SYM}(void* const* b, const int64_t* range) {
  const ${ELT}* qkv = (const ${ELT}*)b[0];
  ${ELT}* out = (${ELT}*)b[1];
  float* lse = (float*)b[2];
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bb = 0; bb < ${B}; ++bb)
    for (int64_t h = 0; h < ${H}; ++h) {
      float s[${T}], q[${HS}], o[${HS}];  // one row of scores: never the T x T matrix
      for (int64_t t = 0; t < ${T}; ++t) {
        const int64_t qrow = (bb * ${T} + t) * ${C3} + h * ${HS};
        for (int64_t c = 0; c < ${HS}; ++c) q[c] = ld(qkv, qrow + c) * ${SCALE};
        float m = -INFINITY;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const int64_t krow = (bb * ${T} + t2) * ${C3} + ${C} + h * ${HS};
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t c = 0; c < ${HS}; ++c) dot += q[c] * ld(qkv, krow + c);
          s[t2] = dot;
          m = dot > m ? dot : m;
        }
        float l = 0.0f;
#pragma omp simd reduction(+ : l)
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          s[t2] = exp_f(s[t2] - m);
          l += s[t2];
        }
        for (int64_t c = 0; c < ${HS}; ++c) o[c] = 0.0f;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const int64_t vrow = (bb * ${T} + t2) * ${C3} + 2 * ${C} + h * ${HS};
          const float p = s[t2];
#pragma omp simd
          for (int64_t c = 0; c < ${HS}; ++c) o[c] += p * ld(qkv, vrow + c);
        }
        const float inv = 1.0f / l;
        const int64_t orow = (bb * ${T} + t) * ${C} + h * ${HS};
        for (int64_t c = 0; c < ${HS}; ++c) st(out, orow + c, o[c] * inv);
        lse[(bb * ${H} + h) * ${T} + t] = m + logf(l);
      }
    }
}
)",
              values(symbol, s));
}

std::string cpuAttentionBackward(const std::string& symbol, const AttentionShape& s) {
  return fillTemplate(R"(// Causal self-attention backward (${SHAPE}). Per query row t, with p rebuilt from the
// stored log-sum-exp (p[t2] = exp(s[t2] - lse[t])) and D = do . o:
//   dv[t2] += p[t2] do,  ds[t2] = p[t2] (do . v[t2] - D) / sqrt(hs),
//   dq = sum ds[t2] k[t2],  dk[t2] += ds[t2] q.
// dk and dv gather over every query row: fp32 accumulators per (b, h), stored once at the end.
extern "C" void ${SYM}(void* const* b, const int64_t* range) {
  const ${ELT}* dout = (const ${ELT}*)b[0];
  const ${ELT}* qkv = (const ${ELT}*)b[1];
  const ${ELT}* out = (const ${ELT}*)b[2];
  const float* lse = (const float*)b[3];
  ${ELT}* dqkv = (${ELT}*)b[4];
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bb = 0; bb < ${B}; ++bb)
    for (int64_t h = 0; h < ${H}; ++h) {
      float* dk = (float*)calloc(2 * ${T} * ${HS}, sizeof(float));  // dk | dv of this head
      float* dv = dk + ${T} * ${HS};
      float p[${T}], ds[${T}], q[${HS}], dy[${HS}], dq[${HS}];
      for (int64_t t = 0; t < ${T}; ++t) {
        const int64_t qrow = (bb * ${T} + t) * ${C3} + h * ${HS}, orow = (bb * ${T} + t) * ${C} + h * ${HS};
        float D = 0.0f;
        for (int64_t c = 0; c < ${HS}; ++c) {
          q[c] = ld(qkv, qrow + c);
          dy[c] = ld(dout, orow + c);
          D += dy[c] * ld(out, orow + c);
        }
        const float row_lse = lse[(bb * ${H} + h) * ${T} + t];
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const int64_t krow = (bb * ${T} + t2) * ${C3} + ${C} + h * ${HS}, vrow = krow + ${C};
          float qk = 0.0f, dp = 0.0f;
#pragma omp simd reduction(+ : qk, dp)
          for (int64_t c = 0; c < ${HS}; ++c) {
            qk += q[c] * ld(qkv, krow + c);
            dp += dy[c] * ld(qkv, vrow + c);
          }
          p[t2] = qk * ${SCALE} - row_lse;
          ds[t2] = dp;
        }
#pragma omp simd
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          p[t2] = exp_f(p[t2]);
          ds[t2] = p[t2] * (ds[t2] - D) * ${SCALE};
        }
        for (int64_t c = 0; c < ${HS}; ++c) dq[c] = 0.0f;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const int64_t krow = (bb * ${T} + t2) * ${C3} + ${C} + h * ${HS};
          const float d = ds[t2], pp = p[t2];
          float* dkr = dk + t2 * ${HS};
          float* dvr = dv + t2 * ${HS};
#pragma omp simd
          for (int64_t c = 0; c < ${HS}; ++c) {
            dq[c] += d * ld(qkv, krow + c);
            dkr[c] += d * q[c];
            dvr[c] += pp * dy[c];
          }
        }
        for (int64_t c = 0; c < ${HS}; ++c) st(dqkv, qrow + c, dq[c]);
      }
      for (int64_t t2 = 0; t2 < ${T}; ++t2) {
        const int64_t krow = (bb * ${T} + t2) * ${C3} + ${C} + h * ${HS};
        for (int64_t c = 0; c < ${HS}; ++c) {
          st(dqkv, krow + c, dk[t2 * ${HS} + c]);
          st(dqkv, krow + ${C} + c, dv[t2 * ${HS} + c]);
        }
      }
      free(dk);
    }
}
)",
              values(symbol, s));
}

}  // namespace kiln
