// CUDA source for causal flash attention on tensor cores (see attention_cuda.h): bf16 modules
// whose head size is a multiple of 16. Same semantics, operands and launch order as the SIMT
// kernels of attention_cuda.cpp; the products run as warp-wide mma.sync.m16n8k16 (bf16 inputs,
// fp32 accumulation) through mma_bf16_16816 (kernelPrelude).
//
// Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16"), for lane = 4 g + t (g = lane / 4,
// t = lane % 4), two bf16 per 32-bit register, the lower index in the low half:
//   A 16x16 (row-major): a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..], a[2] = A[g][2t+8..], a[3] = A[g+8][2t+8..]
//   B 16x8:              b[0] = B[2t..2t+1][g],  b[1] = B[2t+8..2t+9][g]
//   C 16x8 (fp32):       c[0..1] = C[g][2t..2t+1], c[2..3] = C[g+8][2t..2t+1]
// So a warp's 16 x 64 score tile is 8 C tiles; two neighbouring C tiles, rounded to bf16, are
// one A fragment over 16 keys (the P or dS operand of the next product), and a row's values sit
// in the 4 lanes of its g: row reductions are two __shfl_xor_sync (1, 2).
// A block is 4 warps of 16 rows (64 queries, or 64 keys for dk/dv; the forward's warps take 32
// rows, two m-tiles, where head size and sequence allow: forwardMTiles) and walks 64-row tiles
// of the other side in shared memory (bf16, rows padded by 8 elements so that the 8 row
// addresses of an ldmatrix fall in different banks). The walk is pipelined: while a tile is
// used, the next one is copied in by cp.async into the other of two buffers (head sizes up to
// 80; larger heads have one buffer, as two would pass the 48 KB of static shared memory). B
// fragments come from ldmatrix, four 8x8 matrices (two B fragments) per instruction: plain for
// B = X^T of a row-major tile X (the scores: keys or queries as the tile's rows), transposed for
// B = X (the value-side products); each feeds the products of all the warp's m-tiles.
// Softmax exponentials are exp2 of scores pre-multiplied by log2(e); tiles wholly inside the
// causal triangle and the sequence skip the mask.
#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "compiler/attention_cuda.h"
#include "compiler/source_template.h"

namespace kiln {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps, kTile = 16 * kWarps;

// Constants, this block's (b, h), the indexing of qkv / out / lse, and the fragment loaders.
const char* kCommon = R"(  // Batch, sequence length, channels, heads, head size; the score scale 1 / sqrt(HS), and it
  // times log2(e): exp(scale x - y) = exp2(scale_log2 x - log2e y).
  constexpr int B = ${B}, T = ${T}, C = ${C}, H = ${H}, HS = ${HS};
  constexpr float scale = ${SCALE}, scale_log2 = ${SCALE_LOG2}, log2e = 1.44269504f;
  constexpr int TILE = ${TILE};        // rows of a walked tile; a block owns MT x TILE rows
  constexpr int STAGES = ${STAGES};    // tile buffers: 2 (the next tile is copied during this one) when they fit
  constexpr int KC = HS / 16, NC = HS / 8;  // 16-channel chunks (products over channels), 8-channel C tiles
  constexpr int MT = ${MT};            // 16-row m-tiles per warp: each B fragment read serves MT products
  constexpr int LD = HS + 8;           // row stride of the shared tiles, in bf16 elements
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int batch = (blockIdx.x % (B * H)) / H, h = blockIdx.x % H;
  // Element offsets of token r, channel c of head h: in qkv [B, T, 3C] (part 0 q, 1 k, 2 v), in
  // out / dout [B, T, C]; and of token r in lse [B, H, T].
  auto qkv_at = [&](int r, int part, int c) { return ((long long)batch * T + r) * (3 * C) + part * C + h * HS + c; };
  auto act_at = [&](int r, int c) { return ((long long)batch * T + r) * C + h * HS + c; };
  auto lse_at = [&](int r) { return ((long long)batch * H + h) * T + r; };
  // A fragments of rows r0 and r0 + 8 of a [T, *] operand at `at` (rows past the sequence are 0).
  auto load_a = [&](uint32_t (*f)[4], const bf16* base, auto at, int r0) {
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
      const int c = 16 * kc + 2 * t;
      f[kc][0] = r0 < T ? ld_pair(base + at(r0, c)) : 0u;
      f[kc][1] = r0 + 8 < T ? ld_pair(base + at(r0 + 8, c)) : 0u;
      f[kc][2] = r0 < T ? ld_pair(base + at(r0, c + 8)) : 0u;
      f[kc][3] = r0 + 8 < T ? ld_pair(base + at(r0 + 8, c + 8)) : 0u;
    }
  };
  // The row address this lane gives ldmatrix: row lane % 8 of matrix lane / 8.
  const int lm = lane / 8, lr = lane % 8;
  // The products below take the warp's MT m-tiles at once (acc[mt], a[mt]; with MT = 1, &x of
  // a single tile's x): each ldmatrix's B fragments feed 2 MT mma.
  // acc[mt][j] (8 C tiles: 16 rows x 64 tile rows) += a[mt] . tile^T over the channels: B =
  // tile^T; one ldmatrix gives the B fragments of tile rows 8j .. 8j + 15 for 16 channels.
  auto rows_product = [&](float (*acc)[8][4], const uint32_t (*a)[KC][4], const bf16* tile) {
#pragma unroll
    for (int j = 0; j < 8; j += 2)
#pragma unroll
      for (int kc = 0; kc < KC; kc++) {
        uint32_t bf[4];
        ldmatrix_x4(bf, tile + (8 * (j + lm / 2) + lr) * LD + 16 * kc + 8 * (lm % 2));
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          mma_bf16_16816(acc[mt][j], a[mt][kc], bf);
          mma_bf16_16816(acc[mt][j + 1], a[mt][kc], bf + 2);
        }
      }
  };
  // acc[mt][n] (NC C tiles: 16 rows x HS channels) += a[mt] . tile rows 16 kc .. 16 kc + 15, a
  // one A fragment over those rows: B = the tile read column-wise, one transposed ldmatrix per
  // 16 channels.
  auto cols_chunk = [&](float (*acc)[NC][4], const uint32_t (*a)[4], const bf16* tile, int kc) {
#pragma unroll
    for (int n = 0; n < NC; n += 2) {
      uint32_t bf[4];
      ldmatrix_x4_trans(bf, tile + (16 * kc + 8 * (lm % 2) + lr) * LD + 8 * (n + lm / 2));
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        mma_bf16_16816(acc[mt][n], a[mt], bf);
        mma_bf16_16816(acc[mt][n + 1], a[mt], bf + 2);
      }
    }
  };
  // acc[mt] += x[mt] . tile, x[mt] 16 x 64 values in 8 C tiles (rounded to bf16 as A fragments).
  auto cols_product = [&](float (*acc)[NC][4], const float (*x)[8][4], const bf16* tile) {
#pragma unroll
    for (int kc = 0; kc < 4; kc++) {
      uint32_t af[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        const float (*y)[4] = x[mt];
        af[mt][0] = pack_bf16(y[2 * kc][0], y[2 * kc][1]);
        af[mt][1] = pack_bf16(y[2 * kc][2], y[2 * kc][3]);
        af[mt][2] = pack_bf16(y[2 * kc + 1][0], y[2 * kc + 1][1]);
        af[mt][3] = pack_bf16(y[2 * kc + 1][2], y[2 * kc + 1][3]);
      }
      cols_chunk(acc, af, tile, kc);
    }
  };
  // Starts copying rows r0 .. r0 + TILE - 1 of part `part` of qkv (of dout: part -1) into a shared
  // tile, 16 bytes per cp.async; rows past the sequence become zeros.
  auto load_tile = [&](bf16* tile, const bf16* base, int part, int r0) {
    for (int e = threadIdx.x; e < TILE * HS / 8; e += ${THREADS}) {
      const int r = e / (HS / 8), c = 8 * (e % (HS / 8)), row = min(r0 + r, T - 1);  // a valid address
      cp_async16(tile + r * LD + c, base + (part < 0 ? act_at(row, c) : qkv_at(row, part, c)), r0 + r < T);
    }
  };
  // The walk over n tiles of the other side: issue(i, buf) starts the copies of tile i into
  // buffer buf, body(i, buf) uses it. With two stages tile i + 1 is in flight while tile i is
  // used; with one (large heads: two do not fit in 48 KB) it is copied after.
  auto walk = [&](int n, auto&& issue, auto&& body) {
    issue(0, 0);
    cp_async_commit();
    for (int i = 0; i < n; i++) {
      if (STAGES == 2 && i + 1 < n) {
        issue(i + 1, (i + 1) % STAGES);
        cp_async_commit();
        cp_async_wait<1>();  // this thread's copies of tile i have landed
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();  // ... and every other thread's
      body(i, i % STAGES);
      __syncthreads();  // every warp is done with this buffer before another tile is copied into it
      if (STAGES == 1 && i + 1 < n) {
        issue(i + 1, 0);
        cp_async_commit();
      }
    }
  };
  // f(j, e, col, i) for every element of a warp's 8 C tiles: s[j][e] is at column col = 8j + 2t
  // + (e & 1) of the walked tile and row r0 + 8i of the warp's own (i = e >> 1).
  auto each = [&](auto&& f) {
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) f(j, e, 8 * j + 2 * t + (e & 1), e >> 1);
  };
)";

const char* kForward = R"(// Causal self-attention forward on tensor cores (B=${B} T=${T} C=${C} H=${H}, head size ${HS}, bf16).
// For each (b, h) and query row r, with scale = 1 / sqrt(${HS}):
//   s[r2] = scale * q[r] . k[r2] for r2 <= r,   out[r] = sum_r2 softmax(s)[r2] v[r2],
//   lse[r] = log sum_r2 exp(s[r2]).
// One block per (query tile of ${QTILE}, b, h); warp w owns the ${MT} x 16 queries from
// q0 + 16 MT w (q in registers as A fragments) and walks the key tiles up to the block's last
// query: S = q k^T (keys row-wise), the online softmax on the C fragments (running max m and sum
// l per row; o and l rescaled when m grows), then o += P v (values column-wise).
extern "C" __global__ void __launch_bounds__(${THREADS}) ${SYMBOL}(void* const* b, const long long* range) {
${COMMON}  const bf16* qkv = (const bf16*)b[0];
  bf16* out = (bf16*)b[1];
  float* lse = (float*)b[2];
  (void)range;
  __shared__ __align__(16) bf16 k_tile[STAGES][TILE * LD], v_tile[STAGES][TILE * LD];

  // Blocks in order of decreasing work: the last query tiles (most keys) first.
  constexpr int QTILE = MT * TILE, q_tiles = (T + QTILE - 1) / QTILE;
  const int q0 = (q_tiles - 1 - (int)blockIdx.x / (B * H)) * QTILE, r0 = q0 + 16 * MT * warp + g;
  uint32_t qf[MT][KC][4];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) load_a(qf[mt], qkv, [&](int r, int c) { return qkv_at(r, 0, c); }, r0 + 16 * mt);
  // Per row (m-tile mt; r0 + 16 mt: i = 0, + 8: i = 1): o the unnormalised output, m the running
  // max of the scores in log2 units (scale_log2 q . k), l the sum of exp2(score - m).
  float o[MT][NC][4] = {}, m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;

  walk((min(q0 + QTILE, T) + TILE - 1) / TILE, [&](int tile, int buf) {  // the key tiles to the last query
    load_tile(k_tile[buf], qkv, 1, tile * TILE);
    load_tile(v_tile[buf], qkv, 2, tile * TILE);
  }, [&](int tile, int buf) {
    const int k0 = tile * TILE;
    float s[MT][8][4] = {};
    rows_product(s, qf, k_tile[buf]);
    // A tile with a key past the block's first query, or past the sequence, tests the mask (such
    // a key is -inf). Key 0 is in every row's first tile, so m is finite from then on, also in
    // tiles wholly masked for a warp's rows (and for rows past the sequence: computed, never
    // stored).
    const bool masked = k0 + TILE - 1 > q0 || k0 + TILE > T;
    float mx[MT][2], rescale[MT][2], sum[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
      mx[mt][0] = mx[mt][1] = -INFINITY, sum[mt][0] = sum[mt][1] = 0.0f;
      each([&](int j, int e, int col, int i) {
        const int key = k0 + col, row = r0 + 16 * mt + 8 * i;
        s[mt][j][e] = masked && (key > row || key >= T) ? -INFINITY : s[mt][j][e] * scale_log2;
        mx[mt][i] = fmaxf(mx[mt][i], s[mt][j][e]);
      });
#pragma unroll
      for (int i = 0; i < 2; i++) {
        mx[mt][i] = fmaxf(mx[mt][i], __shfl_xor_sync(0xffffffffu, mx[mt][i], 1));
        mx[mt][i] = fmaxf(mx[mt][i], __shfl_xor_sync(0xffffffffu, mx[mt][i], 2));
        const float m_new = fmaxf(m[mt][i], mx[mt][i]);
        rescale[mt][i] = exp2f(m[mt][i] - m_new);  // 0 on the first tile (m = -inf)
        m[mt][i] = m_new;
      }
      each([&](int j, int e, int, int i) {
        s[mt][j][e] = exp2f(s[mt][j][e] - m[mt][i]);  // masked keys: exp2(-inf) = 0
        sum[mt][i] += s[mt][j][e];
      });
#pragma unroll
      for (int i = 0; i < 2; i++) {
        sum[mt][i] += __shfl_xor_sync(0xffffffffu, sum[mt][i], 1);
        sum[mt][i] += __shfl_xor_sync(0xffffffffu, sum[mt][i], 2);
        l[mt][i] = l[mt][i] * rescale[mt][i] + sum[mt][i];
      }
#pragma unroll
      for (int n = 0; n < NC; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[mt][n][e] *= rescale[mt][e >> 1];
    }
    cols_product(o, s, v_tile[buf]);
  });

  // out = o / l; lse = (m + log2 l) / log2(e), the natural log-sum-exp of the scaled scores.
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int i = 0; i < 2; i++) {
      const int row = r0 + 16 * mt + 8 * i;
      if (row >= T) continue;
      const float inv = 1.0f / l[mt][i];
#pragma unroll
      for (int n = 0; n < NC; n++)
        st_pair(out + act_at(row, 8 * n + 2 * t), pack_bf16(o[mt][n][2 * i] * inv, o[mt][n][2 * i + 1] * inv));
      if (t == 0) lse[lse_at(row)] = (m[mt][i] + log2f(l[mt][i])) / log2e;
    }
}
)";

const char* kBackwardHeader = R"(// Causal self-attention backward on tensor cores (B=${B} T=${T} C=${C} H=${H}, head size ${HS}, bf16).
// With p[r][r2] = exp(scale * q[r] . k[r2] - lse[r]) for r2 <= r (the forward's softmax, rebuilt
// from its log-sum-exp), dout = dL/dout and D[r] = dout[r] . out[r]:
//   dp[r][r2] = dout[r] . v[r2],        ds[r][r2] = p[r][r2] (dp[r][r2] - D[r]),
//   dv[r2] = sum_r p[r][r2] dout[r],    dk[r2] = scale * sum_r ds[r][r2] q[r],
//   dq[r]  = scale * sum_r2 ds[r][r2] k[r2].
// Three kernels: ${SYMBOL}_delta writes D and lse log2(e) per row into the workspace; then
// ${SYMBOL}_dkv (one block per key tile, walking the queries that see it) writes dk and dv and,
// when its tiles fit in shared memory (DQ_IN_DKV), adds dq into an fp32 accumulator that
// ${SYMBOL}_dq_store rounds into dqkv; otherwise ${SYMBOL}_dq (one block per query tile, walking
// its keys) rebuilds p and ds and writes dq. Together they write all of dqkv.
)";

// The backward kernels' operands (attention_cuda.h), and the workspace: D = dout . out of row
// r at delta[lse_at(r)], lse[r] log2(e) at lse2[lse_at(r)].
const char* kBackwardOperands = R"(  const bf16* dout = (const bf16*)b[0];
  const bf16* qkv = (const bf16*)b[1];
  const bf16* out = (const bf16*)b[2];
  const float* lse = (const float*)b[3];
  bf16* dqkv = (bf16*)b[4];
  float* delta = (float*)b[5];
  float* lse2 = delta + B * H * T;
  float* dq_acc = lse2 + B * H * T;  // [B, T, C] fp32, when dq is accumulated by _dkv (DQ_IN_DKV)
  (void)range, (void)lse, (void)out, (void)dq_acc;
)";

const char* kBackwardDelta = R"(
// D[r] = dout[r] . out[r] and lse[r] log2(e) of every row of every (b, h), once, for the two
// kernels after this one (each of them reads them for many tiles), and the row's dq accumulator
// cleared when _dkv accumulates dq: a warp per row, a lane per pair of channels.
extern "C" __global__ void ${SYMBOL}_delta(void* const* b, const long long* range) {
  constexpr int B = ${B}, T = ${T}, C = ${C}, H = ${H}, HS = ${HS};
  constexpr float log2e = 1.44269504f;
${OPERANDS}  const long long row = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;  // (batch, h, r)
  const int lane = threadIdx.x % 32;
  if (row >= (long long)B * H * T) return;
  const int r = (int)(row % T), h = (int)(row / T % H), batch = (int)(row / T / H);
  const long long at = ((long long)batch * T + r) * C + h * HS;
  float d = 0.0f;
  for (int c = 2 * lane; c < HS; c += 64) {
    const uint32_t g2 = ld_pair(dout + at + c), o2 = ld_pair(out + at + c);
    d += bf2f((bf16)(g2 & 0xffffu)) * bf2f((bf16)(o2 & 0xffffu)) + bf2f((bf16)(g2 >> 16)) * bf2f((bf16)(o2 >> 16));
    if (${DQ_IN_DKV}) dq_acc[at + c] = dq_acc[at + c + 1] = 0.0f;  // _dkv adds into it
  }
  d = warp_sum(d);
  if (lane == 0) {
    delta[row] = d;
    lse2[row] = lse[row] * log2e;
  }
}
)";

const char* kBackwardDkv = R"(
// dk and dv of one key tile of one (b, h). Warp w owns keys k0 + 16w .. + 15 (k and v in registers
// as A fragments); per query tile: S^T = k q^T and dP^T = v dout^T (queries row-wise), then
// dv += P^T dout and dk += dS^T q (queries column-wise). With DQ_IN_DKV (FlashAttention-2's
// order: 5 tile products per pair of tiles instead of 7 with the separate dq kernel), also this
// key tile's share of dq: dS goes to shared memory (into the dout tile, used by then, when a row
// of it holds 64 queries), warp w takes queries q0 + 16w .. + 15 and adds dS^T k (k from a tile
// of this block's keys) into the fp32 accumulator with atomics; _dq_store rounds it.
extern "C" __global__ void __launch_bounds__(${THREADS}) ${SYMBOL}_dkv(void* const* b, const long long* range) {
${COMMON}${OPERANDS}  constexpr bool DQ_IN_DKV = ${DQ_IN_DKV};
  constexpr int LDS = HS >= TILE ? LD : TILE + 8;  // row stride of the dS tile [key][query]
  __shared__ __align__(16) bf16 q_tile[STAGES][TILE * LD], g_tile[STAGES][TILE * LD];  // queries, their dout
  __shared__ float lse_tile[STAGES][TILE], d_tile[STAGES][TILE];  // their lse log2(e) and D
  __shared__ __align__(16) bf16 kk_tile[DQ_IN_DKV ? TILE * LD : 8];  // this block's keys (DQ_IN_DKV)
  __shared__ __align__(16) bf16 ds_own[DQ_IN_DKV && HS < TILE ? TILE * LDS : 8];  // dS when a dout row is too short

  // Blocks in order of decreasing work: the first key tiles (seen by the most queries) first.
  constexpr int q_tiles = (T + TILE - 1) / TILE;
  const int k0 = (int)blockIdx.x / (B * H) * TILE, r0 = k0 + 16 * warp + g;
  uint32_t kf[KC][4], vf[KC][4];
  load_a(kf, qkv, [&](int r, int c) { return qkv_at(r, 1, c); }, r0);
  load_a(vf, qkv, [&](int r, int c) { return qkv_at(r, 2, c); }, r0);
  float dk[NC][4] = {}, dv[NC][4] = {};
  if constexpr (DQ_IN_DKV) {
    load_tile(kk_tile, qkv, 1, k0);
    cp_async_commit();
    cp_async_wait<0>();  // (read after the walk's first barrier)
  }

  walk(q_tiles - k0 / TILE, [&](int tile, int buf) {  // the query tiles from the diagonal on
    const int q0 = k0 + tile * TILE;
    load_tile(q_tile[buf], qkv, 0, q0);
    load_tile(g_tile[buf], dout, -1, q0);
    for (int r = threadIdx.x; r < TILE; r += ${THREADS}) {  // the queries' D and lse log2(e), from _delta
      d_tile[buf][r] = q0 + r < T ? delta[lse_at(q0 + r)] : 0.0f;
      lse_tile[buf][r] = q0 + r < T ? lse2[lse_at(q0 + r)] : 0.0f;
    }
  }, [&](int tile, int buf) {
    const int q0 = k0 + tile * TILE;
    float s[8][4] = {}, dp[8][4] = {};
    rows_product(&s, &kf, q_tile[buf]);
    rows_product(&dp, &vf, g_tile[buf]);
    // s becomes p = exp(scale * s - lse[query]) (0 unless key <= query < T: only the diagonal
    // tile and the sequence's last need the test), dp becomes ds.
    const bool masked = q0 == k0 || q0 + TILE > T;
    each([&](int j, int e, int col, int i) {
      const int query = q0 + col, key = r0 + 8 * i;
      const float p = masked && (key > query || query >= T) ? 0.0f : exp2f(s[j][e] * scale_log2 - lse_tile[buf][col]);
      s[j][e] = p;
      dp[j][e] = p * (dp[j][e] - d_tile[buf][col]);
    });
    cols_product(&dv, &s, g_tile[buf]);
    cols_product(&dk, &dp, q_tile[buf]);
    if constexpr (DQ_IN_DKV) {
      bf16* ds = HS >= TILE ? g_tile[buf] : ds_own;
      __syncthreads();  // every warp is done with the dout tile
      each([&](int j, int e, int col, int i) {  // dS [key][query], bf16 as the dq product's input
        if ((e & 1) == 0) st_pair(ds + (16 * warp + g + 8 * i) * LDS + col, pack_bf16(dp[j][e], dp[j][e + 1]));
      });
      __syncthreads();
      // dq (queries q0 + 16 warp .. + 15) += dS^T kk over this block's 64 keys: A = dS^T by
      // transposed ldmatrix of the [key][query] tile, B = kk read column-wise.
      float dqp[NC][4] = {};
#pragma unroll
      for (int kc = 0; kc < 4; kc++) {
        uint32_t af[1][4];
        ldmatrix_x4_trans(af[0], ds + (16 * kc + 8 * (lm / 2) + lr) * LDS + 16 * warp + 8 * (lm % 2));
        cols_chunk(&dqp, af, kk_tile, kc);
      }
#pragma unroll
      for (int n = 0; n < NC; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int query = q0 + 16 * warp + g + 8 * (e >> 1);
          if (query < T) atomicAdd(&dq_acc[act_at(query, 8 * n + 2 * t + (e & 1))], dqp[n][e]);
        }
    }
  });

#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int key = r0 + 8 * i;
    if (key >= T) continue;
#pragma unroll
    for (int n = 0; n < NC; n++) {
      st_pair(dqkv + qkv_at(key, 1, 8 * n + 2 * t), pack_bf16(dk[n][2 * i] * scale, dk[n][2 * i + 1] * scale));
      st_pair(dqkv + qkv_at(key, 2, 8 * n + 2 * t), pack_bf16(dv[n][2 * i], dv[n][2 * i + 1]));
    }
  }
}
)";

const char* kBackwardDq = R"(
// dq of one query tile of one (b, h). Warp w owns queries q0 + 16w .. + 15 (q and dout in
// registers as A fragments); per key tile up to the diagonal: S = q k^T and dP = dout v^T (keys
// row-wise), then dq += dS k (keys column-wise).
extern "C" __global__ void __launch_bounds__(${THREADS}) ${SYMBOL}_dq(void* const* b, const long long* range) {
${COMMON}${OPERANDS}  __shared__ __align__(16) bf16 k_tile[STAGES][TILE * LD], v_tile[STAGES][TILE * LD];

  // Blocks in order of decreasing work: the last query tiles (most keys) first.
  constexpr int q_tiles = (T + TILE - 1) / TILE;
  const int q0 = (q_tiles - 1 - (int)blockIdx.x / (B * H)) * TILE, r0 = q0 + 16 * warp + g;
  uint32_t qf[KC][4], gf[KC][4];
  load_a(qf, qkv, [&](int r, int c) { return qkv_at(r, 0, c); }, r0);
  load_a(gf, dout, act_at, r0);
  // D and lse log2(e) of rows r0 and r0 + 8, from _delta.
  float row_d[2], row_lse[2];
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int row = r0 + 8 * i;
    row_d[i] = row < T ? delta[lse_at(row)] : 0.0f;
    row_lse[i] = row < T ? lse2[lse_at(row)] : 0.0f;
  }
  float dq[NC][4] = {};

  walk(q0 / TILE + 1, [&](int tile, int buf) {  // the key tiles up to the diagonal
    load_tile(k_tile[buf], qkv, 1, tile * TILE);
    load_tile(v_tile[buf], qkv, 2, tile * TILE);
  }, [&](int tile, int buf) {
    const int k0 = tile * TILE;
    float s[8][4] = {}, dp[8][4] = {};
    rows_product(&s, &qf, k_tile[buf]);
    rows_product(&dp, &gf, v_tile[buf]);
    // ds = p (dp - D) with p = exp(scale * s - lse) (0 unless key <= row < T: only the diagonal
    // tile and the sequence's last need the test), kept in dp.
    const bool masked = k0 == q0 || k0 + TILE > T;
    each([&](int j, int e, int col, int i) {
      const int key = k0 + col, row = r0 + 8 * i;
      const float p = masked && (key > row || row >= T) ? 0.0f : exp2f(s[j][e] * scale_log2 - row_lse[i]);
      dp[j][e] = p * (dp[j][e] - row_d[i]);
    });
    cols_product(&dq, &dp, k_tile[buf]);
  });

#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int row = r0 + 8 * i;
    if (row >= T) continue;
#pragma unroll
    for (int n = 0; n < NC; n++)
      st_pair(dqkv + qkv_at(row, 0, 8 * n + 2 * t), pack_bf16(dq[n][2 * i] * scale, dq[n][2 * i + 1] * scale));
  }
}
)";

// Tile buffers per walked tile: two when the kernels' static shared memory (each stage: two
// [TILE][HS + 8] bf16 tiles, and dk/dv's two fp32 rows of TILE) stays within 48 KB.
int stagesOf(int64_t hs) {
  const int64_t stage = 2 * kTile * (hs + 8) * 2 + 2 * kTile * 4;
  return 2 * stage <= 48 * 1024 ? 2 : 1;
}

const char* kBackwardDqStore = R"(
// dq = scale * the fp32 sums _dkv accumulated, rounded to bf16 into dqkv's q part.
extern "C" __global__ void ${SYMBOL}_dq_store(void* const* b, const long long* range) {
  constexpr int B = ${B}, T = ${T}, C = ${C}, H = ${H};
  constexpr float scale = ${SCALE};
${OPERANDS}  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (long long)B * T * C / 2;
       i += (long long)gridDim.x * blockDim.x) {
    const long long row = 2 * i / C, c = 2 * i % C;
    st_pair(dqkv + row * 3 * C + c, pack_bf16(dq_acc[2 * i] * scale, dq_acc[2 * i + 1] * scale));
  }
}
)";

// Shared memory of the dk/dv kernel when it also accumulates dq: the buffers per stage (query
// and dout tiles, their lse and D), the block's key tile, and a dS tile of its own when a dout
// row cannot hold 64 queries. Two stages when that fits in 48 KB, else one; 0: it does not fit
// (large heads), and the separate dq kernel runs instead.
int dkvStagesWithDq(int64_t hs) {
  const int64_t stage = 2 * kTile * (hs + 8) * 2 + 2 * kTile * 4, keys = kTile * (hs + 8) * 2;
  const int64_t ds = hs < kTile ? kTile * (kTile + 8) * 2 : 0, limit = 48 * 1024;
  return 2 * stage + keys + ds <= limit ? 2 : stage + keys + ds <= limit ? 1 : 0;
}

// 16-row m-tiles per warp in the forward: two for head sizes up to 64 and sequences of more than
// one tile (each B fragment read from shared memory then feeds two products, and half as many
// blocks copy the key tiles; two tiles' o, S and q fit in the registers), else one.
// AttentionShape::forwardRows chooses otherwise (kilnc --cuda-attention-rows).
int forwardMTiles(const AttentionShape& s) {
  if (s.forwardRows) return s.forwardRows / 16;
  return s.C / s.H <= 64 && s.T > kTile ? 2 : 1;
}

std::vector<std::pair<std::string, std::string>> vars(const std::string& symbol, const AttentionShape& s,
                                                      int mTiles = 1) {
  const int64_t hs = s.C / s.H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));  // as the CPU kernels compute it
  std::vector<std::pair<std::string, std::string>> common = {
      {"B", num(s.B)},   {"T", num(s.T)},         {"C", num(s.C)},           {"H", num(s.H)},
      {"HS", num(hs)},   {"SCALE", floatLiteral(scale)}, {"SCALE_LOG2", floatLiteral(static_cast<float>(scale * 1.4426950408889634))},   {"TILE", num(kTile)},      {"THREADS", num(kThreads)},
      {"WARPS", num(kWarps)}, {"STAGES", num(stagesOf(hs))}, {"MT", num(mTiles)}, {"QTILE", num(kTile * mTiles)}};
  std::vector<std::pair<std::string, std::string>> v = {
      {"SYMBOL", symbol}, {"COMMON", fillTemplate(kCommon, common)}, {"OPERANDS", kBackwardOperands}};
  v.insert(v.end(), common.begin(), common.end());
  return v;
}

unsigned gridOf(const AttentionShape& s, int rows = kTile) { return unsigned(s.B * s.H * ((s.T + rows - 1) / rows)); }

// Arithmetic of `products` products (each 2 HS per (row, key) pair) for every pair the causal
// walk visits: blocks of `rows` rows against whole key tiles up to the block's last row.
double tileProductFlops(const AttentionShape& s, int products, int rows = kTile) {
  double pairs = 0;
  for (int64_t r0 = 0; r0 < s.T; r0 += rows)
    pairs += double(rows) * kTile * double((std::min<int64_t>(r0 + rows, s.T) + kTile - 1) / kTile);
  return double(products) * 2.0 * double(s.C / s.H) * pairs * double(s.B * s.H);
}

}  // namespace

bool cudaAttentionUsesTensorCores(const AttentionShape& s) {
  return s.bf16 && !s.simt && s.H > 0 && s.C % s.H == 0 && (s.C / s.H) % 16 == 0 && s.C / s.H <= 128;
}

AttentionSource cudaAttentionForwardMma(const std::string& symbol, const AttentionShape& s) {
  AttentionSource a;
  const int mTiles = forwardMTiles(s);
  a.source = fillTemplate(kForward, vars(symbol, s, mTiles));
  a.launches.push_back({symbol, gridOf(s, kTile * mTiles), unsigned(kThreads)});
  a.tensor_flops = tileProductFlops(s, 2, kTile * mTiles);  // S = q k^T, out += P v
  return a;
}

AttentionSource cudaAttentionBackwardMma(const std::string& symbol, const AttentionShape& s) {
  const int64_t hs = s.C / s.H, rows = s.B * s.H * s.T;
  const int dkvStages = dkvStagesWithDq(hs);
  const bool dqInDkv = dkvStages > 0;
  auto v = vars(symbol, s);
  v.push_back({"DQ_IN_DKV", dqInDkv ? "true" : "false"});
  // The dk/dv kernel's own stage count (its extra tiles), in its copy of the common part.
  auto dkv = v;
  for (auto& [name, value] : dkv) {
    if (name == "STAGES" && dqInDkv) value = num(dkvStages);
  }
  for (auto& [name, value] : dkv)
    if (name == "COMMON") {
      std::vector<std::pair<std::string, std::string>> common;
      for (const auto& kv : dkv)
        if (kv.first != "SYMBOL" && kv.first != "COMMON" && kv.first != "OPERANDS") common.push_back(kv);
      value = fillTemplate(kCommon, common);
    }
  AttentionSource a;
  a.source = fillTemplate(kBackwardHeader, v) + fillTemplate(kBackwardDelta, v) + fillTemplate(kBackwardDkv, dkv) +
             fillTemplate(dqInDkv ? kBackwardDqStore : kBackwardDq, v);
  a.launches.push_back({symbol + "_delta", unsigned((rows + 7) / 8), 256u});
  a.scratch_bytes = uint64_t(2 * rows + (dqInDkv ? s.B * s.T * s.C : 0)) * sizeof(float);
  a.launches.push_back({symbol + "_dkv", gridOf(s), unsigned(kThreads)});
  // _dkv: S and dP again, dv += P^T dout, dk += dS^T q; dq += dS k in _dkv or in _dq, which
  // rebuilds S and dP itself.
  a.tensor_flops = tileProductFlops(s, dqInDkv ? 5 : 7);
  if (dqInDkv)
    a.launches.push_back({symbol + "_dq_store", unsigned(std::min<int64_t>((s.B * s.T * s.C / 2 + 255) / 256, 4096)), 256u});
  else
    a.launches.push_back({symbol + "_dq", gridOf(s), unsigned(kThreads)});
  return a;
}

}  // namespace kiln
