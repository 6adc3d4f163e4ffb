// CUDA source for causal flash-style attention (see attention_cuda.h).
//
// The three kernels share one layout. A block has 256 threads: 8 warps of 32 lanes. Each warp
// owns a few consecutive rows of the block's tile (query rows in the forward and dq kernels, key
// rows in the dk/dv kernel); the tile it walks over (keys, or queries) sits in shared memory.
//   - Products against the walked tile, s[i][j] = row_i . tile_row_j: lane l computes the columns
//     j = l, l + 32, ...; the warp's own rows live in registers spread over the lanes (channel c in
//     lane c % 32, slot c / 32) and __shfl_sync broadcasts channel c to every lane.
//   - Accumulations over the walked tile, acc[i][c] += sum_j x[i][j] tile_row_j[c]: lane l owns the
//     channels c = l, l + 32, ...; x[i][j] is broadcast from lane j % 32 with __shfl_sync.
// Shared tiles are fp32 [row][channel] with a row stride of hs + 1, so lanes reading one channel
// of different rows hit different banks. hs and the tile sizes are constants and every loop that
// indexes a per-lane array is unrolled, so those arrays stay in registers; the loops over the 32
// source lanes of a broadcast are unrolled by 8 only (full unrolling makes ptxas 5x slower and
// the kernels use more registers).
#include "compiler/attention_cuda.h"
#include "compiler/source_template.h"

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace kiln {
namespace {

constexpr int kThreads = 256;  // threads per block: 8 warps

// Products of a warp's rows (in registers, spread over the lanes) with the rows of the tile in
// shared memory: ${OUT}[i][j] = ${IN}[row i] . tile[k0 + j*32 + lane] (the forward's and dq's
// scores q k, dq's dp = dout v).
const char* kRowProducts = R"(    // ${OUT}[i][j] = ${IN}[row i] . tile[k0 + j*32 + lane]
    float ${OUT}[ROWS][KPL] = {};
#pragma unroll
    for (int cj = 0; cj < CPL; cj++) {
#pragma unroll 8
      for (int src = 0; src < 32; src++) {
        const int c = cj * 32 + src;
        if (c >= HS) break;
        float tc[KPL];
#pragma unroll
        for (int j = 0; j < KPL; j++) tc[j] = kv_tile[(j * 32 + lane) * LD + c];
#pragma unroll
        for (int i = 0; i < ROWS; i++) {
          const float xc = __shfl_sync(0xffffffffu, ${IN}[i][cj], src);  // ${IN}[row i][c]
#pragma unroll
          for (int j = 0; j < KPL; j++) ${OUT}[i][j] += xc * tc[j];
        }
      }
    }
)";

// The key/value tile of the forward and dq kernels, and its loader.
const char* kKvTile = R"(  __shared__ float kv_tile[KTILE * LD];  // this step's keys or values: [key][channel]
  auto load_tile = [&](int part, int k0) {  // rows past the sequence read as 0
    for (int e = threadIdx.x; e < KTILE * HS; e += THREADS) {
      const int r = e / HS, c = e % HS;
      kv_tile[r * LD + c] = k0 + r < T ? ld(qkv, qkv_at(k0 + r, part, c)) : 0.0f;
    }
  };
)";

// acc[i][c] += sum_key x[i][key] tile[key][c] over the key tile in shared memory (the forward's
// o += p v, dq's dq += ds k): x[i][key] is broadcast from lane key % 32.
const char* kTileAccumulate = R"(#pragma unroll
    for (int kj = 0; kj < KPL; kj++) {
#pragma unroll 8
      for (int src = 0; src < 32; src++) {
        const int r = kj * 32 + src;  // key k0 + r, whose x lane src holds
        float tc[CPL];
#pragma unroll
        for (int j = 0; j < CPL; j++) tc[j] = j * 32 + lane < HS ? kv_tile[r * LD + j * 32 + lane] : 0.0f;
#pragma unroll
        for (int i = 0; i < ROWS; i++) {
          const float x = __shfl_sync(0xffffffffu, ${X}[i][kj], src);
#pragma unroll
          for (int j = 0; j < CPL; j++) ${ACC}[i][j] += x * tc[j];
        }
      }
    }
)";

int64_t headSize(const AttentionShape& s) {
  if (s.B <= 0 || s.T <= 0 || s.C <= 0 || s.H <= 0) throw std::invalid_argument("sizes must be positive");
  if (s.C % s.H != 0) throw std::invalid_argument("the heads must divide n_embd");
  const int64_t hs = s.C / s.H;
  if (hs > 128)
    throw std::invalid_argument("head size " + std::to_string(hs) + " (n_embd " + std::to_string(s.C) + " / " +
                                std::to_string(s.H) + " heads) is above 128, the most the CUDA attention kernels take");
  if (s.B * s.H * s.T > (int64_t(1) << 31))
    throw std::invalid_argument("B x H x T = " + std::to_string(s.B * s.H * s.T) + " rows is above 2^31, the most the "
                                "kernels index");
  if (s.B * s.T * 3 * s.C > (int64_t(1) << 40))
    throw std::invalid_argument("B x T x 3C = " + std::to_string(s.B * s.T * 3 * s.C) + " elements of q, k and v is "
                                "above 2^40, the most the kernels index");
  return hs;
}

// Constants and helpers every kernel body starts with (after batch and h are known).
const char* kCommon = R"(  // Batch, sequence length, channels, heads, head size; the score scale 1 / sqrt(HS).
  constexpr int B = ${B}, T = ${T}, C = ${C}, H = ${H}, HS = ${HS};
  constexpr float scale = ${SCALE};
  constexpr int THREADS = ${THREADS};
  constexpr int CPL = (HS + 31) / 32;  // channels per lane: lane l holds channels l, l + 32, ...
  constexpr int LD = HS + 1;           // row stride of the shared tiles (padded against bank conflicts)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
)";

const char* kIndexing = R"(
  // Element offsets of token t, channel c of head h: in qkv [B, T, 3C] (part 0 q, 1 k, 2 v) and in
  // out, dout [B, T, C]; and of token t in lse [B, H, T].
  auto qkv_at = [&](int t, int part, int c) { return ((long long)batch * T + t) * (3 * C) + part * C + h * HS + c; };
  auto act_at = [&](int t, int c) { return ((long long)batch * T + t) * C + h * HS + c; };
  auto lse_at = [&](int t) { return ((long long)batch * H + h) * T + t; };
)";

// ------------------------------------------------------------------------------------------------
// Forward

const char* kForward = R"(// Causal self-attention forward, flash style (B=${B} T=${T} C=${C} H=${H}, head size ${HS}, ${DTYPE}).
// For each (b, h) and query row t, with scale = 1 / sqrt(${HS}):
//   s[t2] = scale * q[t] . k[t2] for t2 <= t,   out[t] = sum_t2 softmax(s)[t2] v[t2],
//   lse[t] = log sum_t2 exp(s[t2]).
// One block per (query tile of QTILE rows, b, h) walks the key tiles up to the diagonal with the
// online softmax: per row a running max m, a running sum l = sum exp(s - m), and the output
// accumulator o = sum exp(s - m) v; both l and o are rescaled by exp(m_old - m_new) when m grows.
// Warp w owns query rows q0 + w*ROWS .. q0 + w*ROWS + ROWS-1; lane l scores them against the keys
// k0 + l, k0 + l + 32, ... and accumulates the output channels l, l + 32, ...
extern "C" __global__ void __launch_bounds__(${THREADS}) ${SYMBOL}(void* const* b, const long long* range) {
${COMMON}  constexpr int ROWS = ${ROWS}, QTILE = 8 * ROWS;  // query rows per warp, per block
  constexpr int KTILE = ${KTILE}, KPL = KTILE / 32;  // keys per step, per lane
  const ${ELEM}* qkv = (const ${ELEM}*)b[0];
  ${ELEM}* out = (${ELEM}*)b[1];
  float* lse = (float*)b[2];
  (void)range;

  // Blocks in order of decreasing work: the last query tiles (most keys) first.
  constexpr int q_tiles = (T + QTILE - 1) / QTILE;
  const int q0 = (q_tiles - 1 - (int)blockIdx.x / (B * H)) * QTILE;
  const int batch = (blockIdx.x % (B * H)) / H, h = blockIdx.x % H;
${INDEXING}
  auto warp_max = [](float v) {
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;  // every lane holds the warp's max
  };
${KV_TILE}
  // This warp's query rows, spread over the lanes: q[i][j] = q[q0 + warp*ROWS + i][j*32 + lane].
  float q[ROWS][CPL], o[ROWS][CPL], m[ROWS], l[ROWS];
#pragma unroll
  for (int i = 0; i < ROWS; i++) {
    const int t = q0 + warp * ROWS + i;
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < CPL; j++) {
      const int c = j * 32 + lane;
      q[i][j] = t < T && c < HS ? ld(qkv, qkv_at(t, 0, c)) : 0.0f;
      o[i][j] = 0.0f;
    }
  }

  // Every key a row of this tile can see: keys 0 .. min(q0 + QTILE, T) - 1.
  const int key_end = min(q0 + QTILE, T);
  for (int k0 = 0; k0 < key_end; k0 += KTILE) {
    __syncthreads();  // the previous step is done reading its values
    load_tile(1, k0);
    __syncthreads();

${QK_SCORES}
    // Online softmax: scale and mask the scores (a key past the row, or past the sequence, is
    // -inf), then move each row's max, rescale its sum and output, and turn s into
    // p = exp(s - m_new). Key 0 is in every row's first step, so m is finite from then on
    // (rows past the sequence included: they are computed, never stored).
#pragma unroll
    for (int i = 0; i < ROWS; i++) {
      const int t = q0 + warp * ROWS + i;
      float step_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < KPL; j++) {
        const int key = k0 + j * 32 + lane;
        s[i][j] = key <= t && key < T ? s[i][j] * scale : -INFINITY;
        step_max = fmaxf(step_max, s[i][j]);
      }
      const float m_new = fmaxf(m[i], warp_max(step_max));
      const float rescale = expf(m[i] - m_new);  // 0 on the first step (m = -inf)
      float p_sum = 0.0f;
#pragma unroll
      for (int j = 0; j < KPL; j++) {
        s[i][j] = expf(s[i][j] - m_new);  // masked keys: exp(-inf) = 0
        p_sum += s[i][j];
      }
      l[i] = l[i] * rescale + warp_sum(p_sum);
      m[i] = m_new;
#pragma unroll
      for (int j = 0; j < CPL; j++) o[i][j] *= rescale;
    }

    __syncthreads();  // everyone is done reading the keys
    load_tile(2, k0);
    __syncthreads();

    // o[i][c] += sum_key p[i][key] v[key][c]
${ACC_O}  }

  // out = o / l; lse = m + log l.
#pragma unroll
  for (int i = 0; i < ROWS; i++) {
    const int t = q0 + warp * ROWS + i;
    if (t >= T) continue;
    const float inv = 1.0f / l[i];
#pragma unroll
    for (int j = 0; j < CPL; j++) {
      const int c = j * 32 + lane;
      if (c < HS) st(out, act_at(t, c), o[i][j] * inv);
    }
    if (lane == 0) lse[lse_at(t)] = m[i] + logf(l[i]);
  }
}
)";

// ------------------------------------------------------------------------------------------------
// Backward

const char* kBackwardHeader = R"(// Causal self-attention backward, flash style (B=${B} T=${T} C=${C} H=${H}, head size ${HS}, ${DTYPE}).
// With p[t][t2] = exp(scale * q[t] . k[t2] - lse[t]) for t2 <= t (the forward's softmax, rebuilt
// from its log-sum-exp), dout = dL/dout and D[t] = dout[t] . out[t] (= sum_t2 p[t][t2] dp[t][t2]):
//   dp[t][t2] = dout[t] . v[t2],        ds[t][t2] = p[t][t2] (dp[t][t2] - D[t]),
//   dv[t2] = sum_t p[t][t2] dout[t],    dk[t2] = scale * sum_t ds[t][t2] q[t],
//   dq[t]  = scale * sum_t2 ds[t][t2] k[t2].
// Two kernels, each rebuilding p and ds on the fly: ${SYMBOL}_dkv (one block per key tile, sums
// over the queries that see it) and ${SYMBOL}_dq (one block per query tile, sums over its keys).
// They write disjoint parts of dqkv and together all of it.
)";

const char* kBackwardDkv = R"(
// dk and dv of one key tile (KTILE keys) of one (b, h). Warp w owns keys k0 + w*ROWS .. + ROWS-1,
// with their k, v rows and dk, dv accumulators in registers; the block walks the query tiles
// (QTILE queries) from the diagonal to the end, lane l handling queries q0 + l, q0 + l + 32, ...
extern "C" __global__ void __launch_bounds__(${THREADS}) ${SYMBOL}_dkv(void* const* b, const long long* range) {
${COMMON}  constexpr int ROWS = ${ROWS}, KTILE = 8 * ROWS;  // keys per warp, per block
  constexpr int QTILE = ${QTILE}, QPL = QTILE / 32;  // queries per step, per lane
  const ${ELEM}* dout = (const ${ELEM}*)b[0];
  const ${ELEM}* qkv = (const ${ELEM}*)b[1];
  const ${ELEM}* out = (const ${ELEM}*)b[2];
  const float* lse = (const float*)b[3];
  ${ELEM}* dqkv = (${ELEM}*)b[4];
  (void)range;

  // Blocks in order of decreasing work: the first key tiles (seen by the most queries) first.
  const int k0 = (int)blockIdx.x / (B * H) * KTILE;
  const int batch = (blockIdx.x % (B * H)) / H, h = blockIdx.x % H;
${INDEXING}
  __shared__ float q_tile[QTILE * LD];     // this step's queries: [query][channel]
  __shared__ float dout_tile[QTILE * LD];  // and their output gradients
  __shared__ float d_tile[QTILE];          // and their D = dout . out

  // This warp's key rows, spread over the lanes: k[i][j] = k[k0 + warp*ROWS + i][j*32 + lane].
  float k[ROWS][CPL], v[ROWS][CPL], dk[ROWS][CPL], dv[ROWS][CPL];
#pragma unroll
  for (int i = 0; i < ROWS; i++) {
    const int key = k0 + warp * ROWS + i;
#pragma unroll
    for (int j = 0; j < CPL; j++) {
      const int c = j * 32 + lane;
      k[i][j] = key < T && c < HS ? ld(qkv, qkv_at(key, 1, c)) : 0.0f;
      v[i][j] = key < T && c < HS ? ld(qkv, qkv_at(key, 2, c)) : 0.0f;
      dk[i][j] = 0.0f;
      dv[i][j] = 0.0f;
    }
  }

  // The queries that see a key of this tile: t >= k0, from the query tile holding k0 on.
  for (int q0 = k0 / QTILE * QTILE; q0 < T; q0 += QTILE) {
    __syncthreads();  // the previous step is done with the tiles
    for (int e = threadIdx.x; e < QTILE * HS; e += THREADS) {  // rows past the sequence read as 0
      const int r = e / HS, c = e % HS, t = q0 + r;
      q_tile[r * LD + c] = t < T ? ld(qkv, qkv_at(t, 0, c)) : 0.0f;
      dout_tile[r * LD + c] = t < T ? ld(dout, act_at(t, c)) : 0.0f;
    }
    __syncthreads();
    // D[t] = dout[t] . out[t], one warp per query.
    for (int r = warp; r < QTILE; r += THREADS / 32) {
      float part = 0.0f;
      if (q0 + r < T)
        for (int c = lane; c < HS; c += 32) part += dout_tile[r * LD + c] * ld(out, act_at(q0 + r, c));
      part = warp_sum(part);
      if (lane == 0) d_tile[r] = part;
    }
    __syncthreads();

    // s[i][j] = k[key i] . q[q0 + j*32 + lane],  dp[i][j] = v[key i] . dout[q0 + j*32 + lane]
    float s[ROWS][QPL] = {}, dp[ROWS][QPL] = {};
#pragma unroll
    for (int cj = 0; cj < CPL; cj++) {
#pragma unroll 8
      for (int src = 0; src < 32; src++) {
        const int c = cj * 32 + src;
        if (c >= HS) break;
        float qc[QPL], gc[QPL];
#pragma unroll
        for (int j = 0; j < QPL; j++) {
          qc[j] = q_tile[(j * 32 + lane) * LD + c];
          gc[j] = dout_tile[(j * 32 + lane) * LD + c];
        }
#pragma unroll
        for (int i = 0; i < ROWS; i++) {
          const float kc = __shfl_sync(0xffffffffu, k[i][cj], src);  // k[key i][c]
          const float vc = __shfl_sync(0xffffffffu, v[i][cj], src);  // v[key i][c]
#pragma unroll
          for (int j = 0; j < QPL; j++) {
            s[i][j] += kc * qc[j];
            dp[i][j] += vc * gc[j];
          }
        }
      }
    }

    // s becomes p = exp(scale * s - lse[t]) (0 unless key <= t < T), dp becomes ds = p (dp - D[t]).
#pragma unroll
    for (int j = 0; j < QPL; j++) {
      const int t = q0 + j * 32 + lane;
      const float row_lse = t < T ? lse[lse_at(t)] : 0.0f, row_d = d_tile[j * 32 + lane];
#pragma unroll
      for (int i = 0; i < ROWS; i++) {
        const int key = k0 + warp * ROWS + i;
        const float p = key <= t && t < T ? expf(s[i][j] * scale - row_lse) : 0.0f;
        s[i][j] = p;
        dp[i][j] = p * (dp[i][j] - row_d);
      }
    }

    // dv[key i][c] += sum_t p[i][t] dout[t][c],  dk[key i][c] += sum_t ds[i][t] q[t][c]
#pragma unroll
    for (int qj = 0; qj < QPL; qj++) {
#pragma unroll 8
      for (int src = 0; src < 32; src++) {
        const int r = qj * 32 + src;  // query q0 + r, whose p and ds lane src holds
        float qc[CPL], gc[CPL];
#pragma unroll
        for (int j = 0; j < CPL; j++) {
          const bool in = j * 32 + lane < HS;
          qc[j] = in ? q_tile[r * LD + j * 32 + lane] : 0.0f;
          gc[j] = in ? dout_tile[r * LD + j * 32 + lane] : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < ROWS; i++) {
          const float p = __shfl_sync(0xffffffffu, s[i][qj], src);
          const float ds = __shfl_sync(0xffffffffu, dp[i][qj], src);
#pragma unroll
          for (int j = 0; j < CPL; j++) {
            dv[i][j] += p * gc[j];
            dk[i][j] += ds * qc[j];
          }
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < ROWS; i++) {
    const int key = k0 + warp * ROWS + i;
    if (key >= T) continue;
#pragma unroll
    for (int j = 0; j < CPL; j++) {
      const int c = j * 32 + lane;
      if (c >= HS) continue;
      st(dqkv, qkv_at(key, 1, c), dk[i][j] * scale);
      st(dqkv, qkv_at(key, 2, c), dv[i][j]);
    }
  }
}
)";

const char* kBackwardDq = R"(
// dq of one query tile (QTILE rows) of one (b, h). Warp w owns rows q0 + w*ROWS .. + ROWS-1, with
// their q and dout rows and dq accumulators in registers; the block walks the key tiles (KTILE
// keys) up to the diagonal, lane l handling keys k0 + l, k0 + l + 32, ... One shared tile holds
// the step's values (for dp), then its keys (for s and dq).
extern "C" __global__ void __launch_bounds__(${THREADS}) ${SYMBOL}_dq(void* const* b, const long long* range) {
${COMMON}  constexpr int ROWS = ${ROWS}, QTILE = 8 * ROWS;  // query rows per warp, per block
  constexpr int KTILE = ${KTILE}, KPL = KTILE / 32;  // keys per step, per lane
  const ${ELEM}* dout = (const ${ELEM}*)b[0];
  const ${ELEM}* qkv = (const ${ELEM}*)b[1];
  const ${ELEM}* out = (const ${ELEM}*)b[2];
  const float* lse = (const float*)b[3];
  ${ELEM}* dqkv = (${ELEM}*)b[4];
  (void)range;

  // Blocks in order of decreasing work: the last query tiles (most keys) first.
  constexpr int q_tiles = (T + QTILE - 1) / QTILE;
  const int q0 = (q_tiles - 1 - (int)blockIdx.x / (B * H)) * QTILE;
  const int batch = (blockIdx.x % (B * H)) / H, h = blockIdx.x % H;
${INDEXING}
${KV_TILE}
  // This warp's rows, spread over the lanes: q[i][j] = q[q0 + warp*ROWS + i][j*32 + lane], g = dout likewise.
  // Rows past the sequence are 0 and masked out.
  float q[ROWS][CPL], g[ROWS][CPL], dq[ROWS][CPL], row_lse[ROWS], row_d[ROWS];
#pragma unroll
  for (int i = 0; i < ROWS; i++) {
    const int t = q0 + warp * ROWS + i;
    float d = 0.0f;  // D[t] = dout[t] . out[t]
#pragma unroll
    for (int j = 0; j < CPL; j++) {
      const int c = j * 32 + lane;
      const bool in = t < T && c < HS;
      q[i][j] = in ? ld(qkv, qkv_at(t, 0, c)) : 0.0f;
      g[i][j] = in ? ld(dout, act_at(t, c)) : 0.0f;
      d += in ? g[i][j] * ld(out, act_at(t, c)) : 0.0f;
      dq[i][j] = 0.0f;
    }
    row_d[i] = warp_sum(d);
    row_lse[i] = t < T ? lse[lse_at(t)] : 0.0f;
  }

  const int key_end = min(q0 + QTILE, T);
  for (int k0 = 0; k0 < key_end; k0 += KTILE) {
    __syncthreads();  // the previous step is done reading its keys
    load_tile(2, k0);
    __syncthreads();

    // dout . v (g holds dout)
${DP_SCORES}
    __syncthreads();  // everyone is done reading the values
    load_tile(1, k0);
    __syncthreads();

${QK_SCORES}
    // ds = p (dp - D) with p = exp(scale * s - lse) (0 unless key <= t < T), kept in dp.
#pragma unroll
    for (int i = 0; i < ROWS; i++) {
      const int t = q0 + warp * ROWS + i;
#pragma unroll
      for (int j = 0; j < KPL; j++) {
        const int key = k0 + j * 32 + lane;
        const float p = key <= t && t < T ? expf(s[i][j] * scale - row_lse[i]) : 0.0f;
        dp[i][j] = p * (dp[i][j] - row_d[i]);
      }
    }

    // dq[i][c] += sum_key ds[i][key] k[key][c]
${ACC_DQ}  }

#pragma unroll
  for (int i = 0; i < ROWS; i++) {
    const int t = q0 + warp * ROWS + i;
    if (t >= T) continue;
#pragma unroll
    for (int j = 0; j < CPL; j++) {
      const int c = j * 32 + lane;
      if (c < HS) st(dqkv, qkv_at(t, 0, c), dq[i][j] * scale);
    }
  }
}
)";

std::vector<std::pair<std::string, std::string>> shapeVars(const std::string& symbol, const AttentionShape& s) {
  const int64_t hs = headSize(s);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));  // as the CPU kernels compute it
  std::vector<std::pair<std::string, std::string>> common = {
      {"B", num(s.B)}, {"T", num(s.T)}, {"C", num(s.C)},     {"H", num(s.H)},
      {"HS", num(hs)}, {"SCALE", floatLiteral(scale)}, {"THREADS", num(kThreads)}};
  std::vector<std::pair<std::string, std::string>> vars = {
      {"SYMBOL", symbol},
      {"ELEM", s.bf16 ? "bf16" : "float"},
      {"DTYPE", s.bf16 ? "bf16 storage" : "fp32"},
      {"COMMON", fillTemplate(kCommon, common)},
      {"INDEXING", kIndexing},
      {"QK_SCORES", fillTemplate(kRowProducts, {{"OUT", "s"}, {"IN", "q"}})},
      {"DP_SCORES", fillTemplate(kRowProducts, {{"OUT", "dp"}, {"IN", "g"}})},
      {"KV_TILE", kKvTile},
      {"ACC_O", fillTemplate(kTileAccumulate, {{"X", "s"}, {"ACC", "o"}})},
      {"ACC_DQ", fillTemplate(kTileAccumulate, {{"X", "dp"}, {"ACC", "dq"}})}};
  vars.insert(vars.end(), common.begin(), common.end());
  return vars;
}

unsigned gridOf(const AttentionShape& s, int64_t tile) { return unsigned(s.B * s.H * ((s.T + tile - 1) / tile)); }

}  // namespace

// Tiles (shared memory is the walked tile, fp32 with rows of hs + 1: 64 rows * 129 * 4 B = 33 KB
// at most): the forward takes 64 queries (8 per warp) against 64 keys per step.
AttentionSource cudaAttentionForward(const std::string& symbol, const AttentionShape& s) {
  auto vars = shapeVars(symbol, s);
  if (cudaAttentionUsesTensorCores(s)) return cudaAttentionForwardMma(symbol, s);
  const int rows = 8, ktile = 64;
  vars.push_back({"ROWS", num(rows)});
  vars.push_back({"KTILE", num(ktile)});
  AttentionSource a;
  a.source = fillTemplate(kForward, vars);
  a.launches.push_back({symbol, gridOf(s, 8 * rows), unsigned(kThreads)});
  return a;
}

// The dk/dv kernel holds two query tiles (q and dout) in shared memory: 64 queries per step up to
// hs = 64 (33 KB), 32 above (33 KB at hs = 128); its register rows (k, v, dk, dv) are 8 keys per
// warp up to hs = 64 and 4 above. The dq kernel takes 64 (hs <= 64) or 32 query rows per block
// against 64 keys per step.
AttentionSource cudaAttentionBackward(const std::string& symbol, const AttentionShape& s) {
  auto vars = shapeVars(symbol, s);
  if (cudaAttentionUsesTensorCores(s)) return cudaAttentionBackwardMma(symbol, s);
  const bool small = headSize(s) <= 64;
  const int dkvRows = small ? 8 : 4, dkvQtile = small ? 64 : 32;
  const int dqRows = small ? 8 : 4, dqKtile = 64;

  auto dkv = vars, dq = vars;
  dkv.push_back({"ROWS", num(dkvRows)});
  dkv.push_back({"QTILE", num(dkvQtile)});
  dq.push_back({"ROWS", num(dqRows)});
  dq.push_back({"KTILE", num(dqKtile)});

  AttentionSource a;
  a.source = fillTemplate(kBackwardHeader, vars) + fillTemplate(kBackwardDkv, dkv) + fillTemplate(kBackwardDq, dq);
  a.launches.push_back({symbol + "_dkv", gridOf(s, 8 * dkvRows), unsigned(kThreads)});
  a.launches.push_back({symbol + "_dq", gridOf(s, 8 * dqRows), unsigned(kThreads)});
  return a;
}

}  // namespace kiln
