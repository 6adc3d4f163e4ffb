// CPU reference kernels (see kernels.h for the contract of each one).
//
// Plain fp32 loops in the style of llm.c. Reductions that decide accuracy (layer norm statistics,
// the cross-entropy mean, sum of squares) accumulate in double. Reductions across rows that run in
// parallel use a fixed number of chunks, so results do not depend on the OpenMP thread count.
#include "runtime/cpu/kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace kiln::cpu {

namespace {

// Below this many elements an elementwise loop is not worth a parallel region.
constexpr int64_t kParallelMin = 1 << 14;

// Row reductions (layernorm_bwd's dw/db, sum_squares) split their rows into at most this many
// contiguous chunks, reduce each chunk in parallel, then add the chunk partials in order.
constexpr int64_t kReduceChunks = 32;

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

}  // namespace

// ------------------------------------------------------------------------------------------------
// Embedding

void embedding_fwd(float* out, const int32_t* idx, const float* table, int64_t n, int64_t C) {
#pragma omp parallel for if (n * C >= kParallelMin)
  for (int64_t i = 0; i < n; i++) {
    std::memcpy(out + i * C, table + static_cast<int64_t>(idx[i]) * C, C * sizeof(float));
  }
}

void embedding_bwd(float* dtable, const int32_t* idx, const float* dout, int64_t n, int64_t V,
                   int64_t C) {
  std::fill(dtable, dtable + V * C, 0.0f);
  // Serial scatter-add: repeated indices make a parallel loop over i racy, and the op is cheap.
  for (int64_t i = 0; i < n; i++) {
    float* row = dtable + static_cast<int64_t>(idx[i]) * C;
    const float* d = dout + i * C;
    for (int64_t c = 0; c < C; c++) row[c] += d[c];
  }
}

// ------------------------------------------------------------------------------------------------
// Matmul

void matmul(float* out, const float* a, const float* b, int64_t M, int64_t N, int64_t K,
            bool transA, bool transB) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // empty sum; BLAS is not asked to handle the degenerate leading dimensions
    std::fill(out, out + M * N, 0.0f);
    return;
  }
  // Row-major leading dimensions of the arrays as stored.
  const int64_t lda = transA ? M : K;
  const int64_t ldb = transB ? K : N;
  cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans,
              transB ? CblasTrans : CblasNoTrans, static_cast<int>(M), static_cast<int>(N),
              static_cast<int>(K), 1.0f, a, static_cast<int>(lda), b, static_cast<int>(ldb), 0.0f,
              out, static_cast<int>(N));
}

// ------------------------------------------------------------------------------------------------
// Elementwise

void add(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void mul(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) out[i] = a[i] * b[i];
}

void scale(float* out, const float* a, float s, int64_t n) {
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) out[i] = a[i] * s;
}

void fill(float* out, float value, int64_t n) {
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) out[i] = value;
}

void copy(float* out, const float* a, int64_t n) {
  if (n > 0 && out != a) std::memmove(out, a, n * sizeof(float));
}

void accumulate(float* dst, const float* src, int64_t n) {
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

// ------------------------------------------------------------------------------------------------
// GELU (tanh approximation)

void gelu_fwd(float* out, const float* inp, int64_t n) {
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) {
    float u = inp[i];
    float cube = kGeluCubic * u * u * u;
    out[i] = 0.5f * u * (1.0f + tanhf(kGeluScale * (u + cube)));
  }
}

void gelu_bwd(float* dinp, const float* inp, const float* dout, int64_t n) {
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) {
    // With a = s (u + 0.044715 u^3):  gelu(u) = 0.5 u (1 + tanh a), so
    // gelu'(u) = 0.5 (1 + tanh a) + 0.5 u (1 - tanh^2 a) s (1 + 3 * 0.044715 u^2).
    float u = inp[i];
    float cube = kGeluCubic * u * u * u;
    float th = tanhf(kGeluScale * (u + cube));
    float sech2 = 1.0f - th * th;
    float grad = 0.5f * (1.0f + th) +
                 0.5f * u * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * u * u);
    dinp[i] = grad * dout[i];
  }
}

// ------------------------------------------------------------------------------------------------
// Broadcast / reduce / reshape helpers

void broadcast_rows(float* out, const float* inp, int64_t R, int64_t K) {
#pragma omp parallel for if (R * K >= kParallelMin)
  for (int64_t r = 0; r < R; r++) std::memcpy(out + r * K, inp, K * sizeof(float));
}

void sum_rows(float* out, const float* inp, int64_t R, int64_t K) {
  // Each column is summed (in double) by one thread; a static schedule gives every thread a
  // contiguous band of columns, so each row is read in contiguous pieces.
#pragma omp parallel for if (R * K >= kParallelMin)
  for (int64_t k = 0; k < K; k++) {
    double acc = 0.0;
    for (int64_t r = 0; r < R; r++) acc += inp[r * K + k];
    out[k] = static_cast<float>(acc);
  }
}

void transpose(float* out, const float* inp, int64_t M, int64_t K) {
#pragma omp parallel for if (M * K >= kParallelMin)
  for (int64_t k = 0; k < K; k++) {
    for (int64_t m = 0; m < M; m++) out[k * M + m] = inp[m * K + k];
  }
}

void slice_cols(float* out, const float* inp, int64_t R, int64_t K, int64_t offset,
                int64_t width) {
#pragma omp parallel for if (R * width >= kParallelMin)
  for (int64_t r = 0; r < R; r++) {
    std::memcpy(out + r * width, inp + r * K + offset, width * sizeof(float));
  }
}

void insert_cols(float* out, const float* inp, int64_t R, int64_t K, int64_t offset,
                 int64_t width) {
#pragma omp parallel for if (R * width >= kParallelMin)
  for (int64_t r = 0; r < R; r++) {
    std::memcpy(out + r * K + offset, inp + r * width, width * sizeof(float));
  }
}

// ------------------------------------------------------------------------------------------------
// Layer norm

void layernorm_fwd(float* out, float* mean, float* rstd, const float* inp, const float* w,
                   const float* b, int64_t N, int64_t C, float eps) {
#pragma omp parallel for
  for (int64_t i = 0; i < N; i++) {
    const float* x = inp + i * C;
    // Two passes, accumulated in double: the mean first, then the biased variance around it.
    double sum = 0.0;
    for (int64_t c = 0; c < C; c++) sum += x[c];
    double m = sum / static_cast<double>(C);
    double ssq = 0.0;
    for (int64_t c = 0; c < C; c++) {
      double d = x[c] - m;
      ssq += d * d;
    }
    double var = ssq / static_cast<double>(C);
    float mf = static_cast<float>(m);
    float s = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
    float* o = out + i * C;
    for (int64_t c = 0; c < C; c++) o[c] = (x[c] - mf) * s * w[c] + b[c];
    mean[i] = mf;
    rstd[i] = s;
  }
}

void layernorm_bwd(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                   const float* w, const float* mean, const float* rstd, int64_t N, int64_t C) {
  // Per-chunk partial sums of dw and db: partial[chunk] = [dw(C) | db(C)].
  const int64_t chunks = std::max<int64_t>(1, std::min(N, kReduceChunks));
  std::vector<float> partial(static_cast<size_t>(chunks * 2 * C), 0.0f);

#pragma omp parallel for
  for (int64_t ch = 0; ch < chunks; ch++) {
    float* pdw = partial.data() + ch * 2 * C;
    float* pdb = pdw + C;
    const int64_t begin = N * ch / chunks;
    const int64_t end = N * (ch + 1) / chunks;
    for (int64_t i = begin; i < end; i++) {
      const float* x = inp + i * C;
      const float* dy = dout + i * C;
      float* dx = dinp + i * C;
      const float m = mean[i];
      const float s = rstd[i];
      // With xhat = (x - mean) * rstd and g = dout * w (the gradient wrt xhat):
      //   dx = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat))
      // The two means are the projections that mean and rstd contribute through every x[c].
      double sum_g = 0.0, sum_gx = 0.0;
      for (int64_t c = 0; c < C; c++) {
        float xhat = (x[c] - m) * s;
        float g = dy[c] * w[c];
        sum_g += g;
        sum_gx += static_cast<double>(g) * xhat;
      }
      const float mean_g = static_cast<float>(sum_g / static_cast<double>(C));
      const float mean_gx = static_cast<float>(sum_gx / static_cast<double>(C));
      for (int64_t c = 0; c < C; c++) {
        float xhat = (x[c] - m) * s;
        float g = dy[c] * w[c];
        dx[c] = s * (g - mean_g - xhat * mean_gx);
        pdw[c] += dy[c] * xhat;
        pdb[c] += dy[c];
      }
    }
  }

  // Reduce the chunk partials in a fixed order (deterministic whatever the thread count).
  for (int64_t c = 0; c < C; c++) {
    float sw = 0.0f, sb = 0.0f;
    for (int64_t ch = 0; ch < chunks; ch++) {
      sw += partial[ch * 2 * C + c];
      sb += partial[ch * 2 * C + C + c];
    }
    dw[c] = sw;
    db[c] = sb;
  }
}

// ------------------------------------------------------------------------------------------------
// Causal self-attention

namespace {

// One query row: o[hs] = sum_t softmax(q . k[t] * sc) v[t] over the n keys k[t] = k + t * stride
// (values likewise), by the online softmax: o accumulates sum_t exp(s[t] - m) v[t] and l the
// matching normaliser, both rescaled by exp(m_old - m_new) whenever the running max m grows.
// Returns the log-sum-exp of the scaled scores.
float attend(float* o, const float* q, const float* k, const float* v, int64_t n, int64_t stride, int64_t hs,
             float sc) {
  for (int64_t c = 0; c < hs; c++) o[c] = 0.0f;
  float m = -INFINITY;
  float l = 0.0f;
  for (int64_t t = 0; t < n; t++, k += stride, v += stride) {
    float s = 0.0f;
    for (int64_t c = 0; c < hs; c++) s += q[c] * k[c];
    s *= sc;
    if (s > m) {
      float r = expf(m - s);  // 0 on the first key (m = -inf)
      l *= r;
      for (int64_t c = 0; c < hs; c++) o[c] *= r;
      m = s;
    }
    float e = expf(s - m);
    l += e;
    for (int64_t c = 0; c < hs; c++) o[c] += e * v[c];
  }
  const float inv = 1.0f / l;
  for (int64_t c = 0; c < hs; c++) o[c] *= inv;
  return m + logf(l);
}

}  // namespace

void decode_attention(float* out, float* cache, const float* qkv, int64_t p, int64_t B, int64_t C, int64_t H,
                      int64_t S, int64_t M) {
  const int64_t hs = C / H;
  const int64_t n = std::min(M, S - p);  // new positions that fit the cache
  const float sc = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel for collapse(2)
  for (int64_t b = 0; b < B; b++) {
    for (int64_t h = 0; h < H; h++) {
      float* keys = cache + (b * H + h) * S * hs;
      float* values = keys + B * H * S * hs;
      // All the new keys and values first: token m attends to the tokens before it.
      for (int64_t m = 0; m < n; m++) {
        const float* q = qkv + (b * M + m) * 3 * C + h * hs;
        for (int64_t c = 0; c < hs; c++) {
          keys[(p + m) * hs + c] = q[C + c];
          values[(p + m) * hs + c] = q[2 * C + c];
        }
      }
      for (int64_t m = 0; m < n; m++)
        attend(out + (b * M + m) * C + h * hs, qkv + (b * M + m) * 3 * C + h * hs, keys, values, p + m + 1, hs, hs, sc);
    }
  }
}

void attention_fwd(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C,
                   int64_t H) {
  const int64_t hs = C / H;
  const int64_t C3 = 3 * C;
  const float sc = 1.0f / std::sqrt(static_cast<float>(hs));

  // Every (b, h) pair reads and writes its own channels only, so the pairs run in parallel.
#pragma omp parallel for collapse(2)
  for (int64_t b = 0; b < B; b++) {
    for (int64_t h = 0; h < H; h++) {
      for (int64_t t = 0; t < T; t++) {
        const float* row = qkv + b * T * C3 + h * hs;  // token 0 of this row and head
        lse[(b * H + h) * T + t] =
            attend(out + (b * T + t) * C + h * hs, row + t * C3, row + C, row + 2 * C, t + 1, C3, hs, sc);
      }
    }
  }
}

void attention_bwd(float* dqkv, const float* dout, const float* qkv, const float* out,
                   const float* lse, int64_t B, int64_t T, int64_t C, int64_t H) {
  const int64_t hs = C / H;
  const int64_t C3 = 3 * C;
  const float sc = 1.0f / std::sqrt(static_cast<float>(hs));

  // Head h owns channels h*hs.. of q, k and v, so the (b, h) pairs write disjoint parts of dqkv.
#pragma omp parallel for collapse(2)
  for (int64_t b = 0; b < B; b++) {
    for (int64_t h = 0; h < H; h++) {
      for (int64_t t = 0; t < T; t++) {
        float* d = dqkv + (b * T + t) * C3 + h * hs;
        for (int64_t c = 0; c < hs; c++) {
          d[c] = 0.0f;
          d[C + c] = 0.0f;
          d[2 * C + c] = 0.0f;
        }
      }

      // For one query row t, with p = softmax(s) and o = sum_t2 p[t2] v[t2]:
      //   dv[t2] += p[t2] do,   dp[t2] = do . v[t2],
      //   ds[t2] = p[t2] (dp[t2] - D) with D = sum_t2 p[t2] dp[t2] = do . o,
      //   dq += sc * sum_t2 ds[t2] k[t2],   dk[t2] += sc * ds[t2] q.
      // p is rebuilt from the stored log-sum-exp: p[t2] = exp(s[t2] - lse[t]).
      for (int64_t t = 0; t < T; t++) {
        const float* q = qkv + (b * T + t) * C3 + h * hs;
        const float* o = out + (b * T + t) * C + h * hs;
        const float* dy = dout + (b * T + t) * C + h * hs;
        float* dq = dqkv + (b * T + t) * C3 + h * hs;
        const float row_lse = lse[(b * H + h) * T + t];

        float D = 0.0f;
        for (int64_t c = 0; c < hs; c++) D += dy[c] * o[c];

        for (int64_t t2 = 0; t2 <= t; t2++) {
          const float* k = qkv + (b * T + t2) * C3 + C + h * hs;
          const float* v = qkv + (b * T + t2) * C3 + 2 * C + h * hs;
          float* dk = dqkv + (b * T + t2) * C3 + C + h * hs;
          float* dv = dqkv + (b * T + t2) * C3 + 2 * C + h * hs;

          float s = 0.0f;
          for (int64_t c = 0; c < hs; c++) s += q[c] * k[c];
          const float p = expf(s * sc - row_lse);

          float dp = 0.0f;
          for (int64_t c = 0; c < hs; c++) dp += dy[c] * v[c];
          const float ds = p * (dp - D) * sc;

          for (int64_t c = 0; c < hs; c++) {
            dq[c] += ds * k[c];
            dk[c] += ds * q[c];
            dv[c] += p * dy[c];
          }
        }
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Cross-entropy

void cross_entropy_fwd(float* loss, float* lse, const float* logits, const int32_t* targets,
                       int64_t N, int64_t V, int64_t valid) {
  std::vector<double> row_loss(static_cast<size_t>(N));
#pragma omp parallel for
  for (int64_t i = 0; i < N; i++) {
    const float* x = logits + i * V;  // row stride V; classes are the first `valid` columns
    // log sum exp with the max subtracted so no exp overflows.
    float mx = -INFINITY;
    for (int64_t j = 0; j < valid; j++) mx = std::max(mx, x[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < valid; j++) sum += expf(x[j] - mx);
    const double l = static_cast<double>(mx) + std::log(sum);
    lse[i] = static_cast<float>(l);
    row_loss[i] = l - static_cast<double>(x[targets[i]]);
  }
  // Serial sum in row order: deterministic.
  double total = 0.0;
  for (int64_t i = 0; i < N; i++) total += row_loss[i];
  loss[0] = N > 0 ? static_cast<float>(total / static_cast<double>(N)) : 0.0f;
}

void cross_entropy_bwd(float* dlogits, const float* dloss, const float* logits,
                       const float* lse, const int32_t* targets, int64_t N, int64_t V,
                       int64_t valid) {
  const float g = N > 0 ? dloss[0] / static_cast<float>(N) : 0.0f;
#pragma omp parallel for
  for (int64_t i = 0; i < N; i++) {
    const float* x = logits + i * V;
    float* dx = dlogits + i * V;
    const float l = lse[i];
    for (int64_t j = 0; j < valid; j++) dx[j] = g * expf(x[j] - l);
    for (int64_t j = valid; j < V; j++) dx[j] = 0.0f;  // padded columns take no gradient
    dx[targets[i]] -= g;
  }
}

// ------------------------------------------------------------------------------------------------
// Optimiser support

double sum_squares(const float* x, int64_t n) {
  if (n <= 0) return 0.0;
  const int64_t chunks = n >= kParallelMin ? kReduceChunks : 1;
  double partial[kReduceChunks] = {};
#pragma omp parallel for if (chunks > 1)
  for (int64_t ch = 0; ch < chunks; ch++) {
    double acc = 0.0;
    // Vector lanes of partial sums (one dependent add per element was the loop's whole cost),
    // combined in the same order every run.
#pragma omp simd reduction(+ : acc)
    for (int64_t i = n * ch / chunks; i < n * (ch + 1) / chunks; i++) {
      acc += static_cast<double>(x[i]) * x[i];
    }
    partial[ch] = acc;
  }
  double total = 0.0;
  for (int64_t ch = 0; ch < chunks; ch++) total += partial[ch];
  return total;
}

void adamw(float* p, const float* g, float* m, float* v, int64_t n, float grad_scale, float lr,
           float beta1, float beta2, float eps, float weight_decay, int64_t t) {
  // Bias corrections 1 - beta^t, computed in double (beta^t underflows gracefully, no drift).
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), t));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), t));
  const float decay = 1.0f - lr * weight_decay;
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) {
    const float gi = g[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / bc1;
    const float vhat = vi / bc2;
    p[i] = p[i] * decay - lr * mhat / (std::sqrt(vhat) + eps);
  }
}

}  // namespace kiln::cpu
