// CPU reference kernels: one function per graph op (the un-fused path).
//
// Every tensor is a contiguous, row-major array. Unless a comment says "accumulates", a kernel
// overwrites its whole output. Floating point is fp32; loops parallelise with OpenMP where it pays.
#pragma once
#include <cstdint>

namespace kiln::cpu {

// out[n, C] = table[idx[n], :]
void embedding_fwd(float* out, const int32_t* idx, const float* table, int64_t n, int64_t C);
// dtable[V, C] = 0; then dtable[idx[i], :] += dout[i, :] for every i (scatter-add).
void embedding_bwd(float* dtable, const int32_t* idx, const float* dout, int64_t n, int64_t V,
                   int64_t C);

// out[M, N] = op(a) @ op(b) with op(a) [M, K], op(b) [K, N]. transA means a is stored [K, M];
// transB means b is stored [N, K]. BLAS (cblas_sgemm) does the work.
void matmul(float* out, const float* a, const float* b, int64_t M, int64_t N, int64_t K,
            bool transA, bool transB);

// Elementwise over n values.
void add(float* out, const float* a, const float* b, int64_t n);
void mul(float* out, const float* a, const float* b, int64_t n);
void scale(float* out, const float* a, float s, int64_t n);
void fill(float* out, float value, int64_t n);
void copy(float* out, const float* a, int64_t n);
// dst += src (accumulates).
void accumulate(float* dst, const float* src, int64_t n);

// GELU, tanh form: 0.5 u (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3))).
void gelu_fwd(float* out, const float* inp, int64_t n);
// dinp = dout * gelu'(inp).
void gelu_bwd(float* dinp, const float* inp, const float* dout, int64_t n);

// out[R, K] = inp[K] repeated over R rows.
void broadcast_rows(float* out, const float* inp, int64_t R, int64_t K);
// out[K] = sum over r of inp[r, K].
void sum_rows(float* out, const float* inp, int64_t R, int64_t K);

// out[K, M] = transpose(inp[M, K]).
void transpose(float* out, const float* inp, int64_t M, int64_t K);
// out[R, width] = inp[R, offset : offset + width] where inp is [R, K].
void slice_cols(float* out, const float* inp, int64_t R, int64_t K, int64_t offset,
                int64_t width);
// out[R, offset : offset + width] = inp[R, width] where out is [R, K]; other columns untouched.
void insert_cols(float* out, const float* inp, int64_t R, int64_t K, int64_t offset,
                 int64_t width);

// Layer norm over the last axis, biased variance:
// mean[i], rstd[i] = 1 / sqrt(var[i] + eps), out = (x - mean) * rstd * w + b.
void layernorm_fwd(float* out, float* mean, float* rstd, const float* inp, const float* w,
                   const float* b, int64_t N, int64_t C, float eps);
// Writes dinp[N, C], dw[C], db[C] (no accumulation).
void layernorm_bwd(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                   const float* w, const float* mean, const float* rstd, int64_t N, int64_t C);

// Causal self-attention. qkv is [B, T, 3C] holding q | k | v, each [B, T, C] split into H heads
// of hs = C / H channels (head h owns channels h*hs .. h*hs+hs-1). For every b, h, t:
//   s[t2] = q[t] . k[t2] / sqrt(hs) for t2 <= t; p = softmax(s); out[b, t, h*hs:...] = sum p v.
// lse[B, H, T] holds the log-sum-exp of the scaled scores (what the backward needs to rebuild p).
void attention_fwd(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C,
                   int64_t H);
// dqkv[B, T, 3C] from dout[B, T, C]; rebuilds p from qkv and lse. Writes all of dqkv.
void attention_bwd(float* dqkv, const float* dout, const float* qkv, const float* out,
                   const float* lse, int64_t B, int64_t T, int64_t C, int64_t H);

// Attention of M new tokens per row against a key/value cache: qkv [B*M, 3C] (row b*M + m: the
// token at position p + m of row b), cache [2, B, H, S, hs] (keys, then values). Stores the
// tokens' k and v at p + m, then out[b*M + m, h*hs:...] = sum_{t2 <= p+m} softmax(q . k[t2] /
// sqrt(hs)) v[t2]: row p + m of attention_fwd over the positions the cache holds. Requires
// 0 <= p < S; tokens at positions S and beyond are skipped (their out rows untouched).
void decode_attention(float* out, float* cache, const float* qkv, int64_t p, int64_t B, int64_t C, int64_t H,
                      int64_t S, int64_t M = 1);

// Mean softmax cross-entropy over N rows of logits [N, V] against targets [N], where only the
// first `valid` <= V columns are classes (the rest pad the row to V; GPT-2: 50257 of 50304).
// loss[0] = mean_i (lse[i] - logits[i, targets[i]]), lse[i] = log sum_{j < valid} exp(logits[i, j]).
// Padded columns are never read into the result; targets must be < valid.
void cross_entropy_fwd(float* loss, float* lse, const float* logits, const int32_t* targets,
                       int64_t N, int64_t V, int64_t valid);
// dlogits[i, j] = dloss[0] / N * (softmax(logits[i, :valid])[j] - (j == targets[i])) for
// j < valid, and exactly 0 for the padded columns valid <= j < V. Writes all of dlogits.
void cross_entropy_bwd(float* dlogits, const float* dloss, const float* logits,
                       const float* lse, const int32_t* targets, int64_t N, int64_t V,
                       int64_t valid);

// Sum of squares of n values, accumulated in double.
double sum_squares(const float* x, int64_t n);

// One AdamW update (PyTorch semantics) of n parameters, with the gradient first multiplied by
// grad_scale (the clipping coefficient). t is the 1-based step. weight_decay = 0 for the no-decay
// group.
//   p = p * (1 - lr * wd); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2
//   p = p - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
void adamw(float* p, const float* g, float* m, float* v, int64_t n, float grad_scale, float lr,
           float beta1, float beta2, float eps, float weight_decay, int64_t t);

}  // namespace kiln::cpu
