// Unit tests for the CPU reference kernels (runtime/cpu/kernels.h).
//
// Every kernel is compared against a naive double-precision reference written here, on small,
// deliberately awkward sizes (nothing a power of two, heads of 4 channels, odd vector lengths).
// Backward kernels are additionally checked against central finite differences of a
// double-precision forward reference.
//
// Tolerances: the kernels run in fp32, so against a double reference we allow a few hundred fp32
// ulps relative (rtol ~1e-5..1e-4) plus a small absolute floor for values that cancel towards 0.
// Finite differences are taken in double with step h = 1e-6, so their own error
// (~h^2 f''' + 1e-16 / h ~ 1e-10) is far below the fp32 error of the kernel being checked; the
// finite-difference tolerances are therefore the same fp32-driven ones.
#include "runtime/cpu/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace kiln::cpu {
namespace {

using VecF = std::vector<float>;
using VecD = std::vector<double>;

// Small awkward sizes shared by the tests.
constexpr int64_t kB = 3, kT = 7, kC = 12, kH = 3, kV = 37;
constexpr int64_t kN = kB * kT;  // 21 rows

VecF Random(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  VecF v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<int32_t> RandomIndices(int64_t n, int32_t hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, hi - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

VecD ToDouble(const VecF& v) { return VecD(v.begin(), v.end()); }

// Expects |got - want| <= atol + rtol |want| elementwise; reports the worst element.
void ExpectClose(const VecF& got, const VecD& want, double atol, double rtol,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t worst = 0;
  double worst_excess = -1.0;
  int bad = 0;
  for (size_t i = 0; i < got.size(); i++) {
    double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    double excess = err - (atol + rtol * std::fabs(want[i]));
    if (!(excess <= 0.0)) bad++;  // also catches NaN
    if (!(excess <= worst_excess)) {
      worst_excess = excess;
      worst = i;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size()
                    << " elements out of tolerance; worst at " << worst << ": got " << got[worst]
                    << ", want " << want[worst] << " (atol " << atol << ", rtol " << rtol << ")";
}

void ExpectClose(const VecF& got, const VecF& want, double atol, double rtol,
                 const std::string& what) {
  ExpectClose(got, ToDouble(want), atol, rtol, what);
}

// Central finite differences of a scalar function f at x (in double).
VecD FiniteDiff(const std::function<double(const VecD&)>& f, VecD x, double h = 1e-6) {
  VecD grad(x.size());
  for (size_t i = 0; i < x.size(); i++) {
    const double xi = x[i];
    x[i] = xi + h;
    const double fp = f(x);
    x[i] = xi - h;
    const double fm = f(x);
    x[i] = xi;
    grad[i] = (fp - fm) / (2.0 * h);
  }
  return grad;
}

double Dot(const VecD& a, const VecF& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
  return s;
}

// ------------------------------------------------------------------------------------------------
// Double-precision references

double GeluRef(double u) {
  const double s = std::sqrt(2.0 / M_PI);
  return 0.5 * u * (1.0 + std::tanh(s * (u + 0.044715 * u * u * u)));
}

double GeluGradRef(double u) {
  const double s = std::sqrt(2.0 / M_PI);
  const double th = std::tanh(s * (u + 0.044715 * u * u * u));
  return 0.5 * (1.0 + th) + 0.5 * u * (1.0 - th * th) * s * (1.0 + 3.0 * 0.044715 * u * u);
}

struct LayerNormRef {
  VecD out, mean, rstd;
};

LayerNormRef LayerNormFwdRef(const VecD& x, const VecD& w, const VecD& b, int64_t N, int64_t C,
                             double eps) {
  LayerNormRef r{VecD(N * C), VecD(N), VecD(N)};
  for (int64_t i = 0; i < N; i++) {
    double m = 0.0;
    for (int64_t c = 0; c < C; c++) m += x[i * C + c];
    m /= C;
    double var = 0.0;
    for (int64_t c = 0; c < C; c++) var += (x[i * C + c] - m) * (x[i * C + c] - m);
    var /= C;
    const double s = 1.0 / std::sqrt(var + eps);
    for (int64_t c = 0; c < C; c++) r.out[i * C + c] = (x[i * C + c] - m) * s * w[c] + b[c];
    r.mean[i] = m;
    r.rstd[i] = s;
  }
  return r;
}

// Analytic layer-norm backward in double, written independently of the kernel: the explicit
// Jacobian d xhat[c] / d x[k] = rstd (delta_ck - 1/C - xhat[c] xhat[k] / C).
void LayerNormBwdRef(VecD& dx, VecD& dw, VecD& db, const VecD& dy, const VecD& x, const VecD& w,
                     int64_t N, int64_t C, double eps) {
  const VecD zeros(C, 0.0);
  LayerNormRef f = LayerNormFwdRef(x, w, zeros, N, C, eps);
  dx.assign(N * C, 0.0);
  dw.assign(C, 0.0);
  db.assign(C, 0.0);
  for (int64_t i = 0; i < N; i++) {
    VecD xhat(C);
    for (int64_t c = 0; c < C; c++) xhat[c] = (x[i * C + c] - f.mean[i]) * f.rstd[i];
    for (int64_t c = 0; c < C; c++) {
      dw[c] += dy[i * C + c] * xhat[c];
      db[c] += dy[i * C + c];
    }
    for (int64_t k = 0; k < C; k++) {
      double acc = 0.0;
      for (int64_t c = 0; c < C; c++) {
        const double jac = f.rstd[i] * ((c == k ? 1.0 : 0.0) - 1.0 / C - xhat[c] * xhat[k] / C);
        acc += dy[i * C + c] * w[c] * jac;
      }
      dx[i * C + k] = acc;
    }
  }
}

// Naive attention: materialises the full masked T x T score matrix per (b, h).
void AttentionFwdRef(VecD& out, VecD& lse, const VecD& qkv, int64_t B, int64_t T, int64_t C,
                     int64_t H) {
  const int64_t hs = C / H;
  const double sc = 1.0 / std::sqrt(static_cast<double>(hs));
  const double neg_inf = -std::numeric_limits<double>::infinity();
  out.assign(B * T * C, 0.0);
  lse.assign(B * H * T, 0.0);
  auto Q = [&](int64_t b, int64_t t, int64_t h, int64_t c) {
    return qkv[(b * T + t) * 3 * C + h * hs + c];
  };
  auto K = [&](int64_t b, int64_t t, int64_t h, int64_t c) {
    return qkv[(b * T + t) * 3 * C + C + h * hs + c];
  };
  auto Vv = [&](int64_t b, int64_t t, int64_t h, int64_t c) {
    return qkv[(b * T + t) * 3 * C + 2 * C + h * hs + c];
  };
  for (int64_t b = 0; b < B; b++) {
    for (int64_t h = 0; h < H; h++) {
      VecD S(T * T, neg_inf);
      for (int64_t t = 0; t < T; t++) {
        for (int64_t t2 = 0; t2 < T; t2++) {
          if (t2 > t) continue;  // causal mask
          double s = 0.0;
          for (int64_t c = 0; c < hs; c++) s += Q(b, t, h, c) * K(b, t2, h, c);
          S[t * T + t2] = s * sc;
        }
      }
      for (int64_t t = 0; t < T; t++) {
        double mx = neg_inf;
        for (int64_t t2 = 0; t2 < T; t2++) mx = std::max(mx, S[t * T + t2]);
        double sum = 0.0;
        for (int64_t t2 = 0; t2 < T; t2++) sum += std::exp(S[t * T + t2] - mx);
        lse[(b * H + h) * T + t] = mx + std::log(sum);
        for (int64_t t2 = 0; t2 < T; t2++) {
          const double p = std::exp(S[t * T + t2] - mx) / sum;
          for (int64_t c = 0; c < hs; c++) out[(b * T + t) * C + h * hs + c] += p * Vv(b, t2, h, c);
        }
      }
    }
  }
}

// Naive attention backward with materialised P, dP and dS matrices.
VecD AttentionBwdRef(const VecD& dout, const VecD& qkv, int64_t B, int64_t T, int64_t C,
                     int64_t H) {
  const int64_t hs = C / H;
  const int64_t C3 = 3 * C;
  const double sc = 1.0 / std::sqrt(static_cast<double>(hs));
  VecD dqkv(B * T * C3, 0.0);
  for (int64_t b = 0; b < B; b++) {
    for (int64_t h = 0; h < H; h++) {
      auto at = [&](int64_t t, int64_t part, int64_t c) {
        return (b * T + t) * C3 + part * C + h * hs + c;
      };
      VecD P(T * T, 0.0), dP(T * T, 0.0);
      for (int64_t t = 0; t < T; t++) {
        VecD s(t + 1);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t t2 = 0; t2 <= t; t2++) {
          double d = 0.0;
          for (int64_t c = 0; c < hs; c++) d += qkv[at(t, 0, c)] * qkv[at(t2, 1, c)];
          s[t2] = d * sc;
          mx = std::max(mx, s[t2]);
        }
        double sum = 0.0;
        for (int64_t t2 = 0; t2 <= t; t2++) sum += std::exp(s[t2] - mx);
        for (int64_t t2 = 0; t2 <= t; t2++) P[t * T + t2] = std::exp(s[t2] - mx) / sum;
        for (int64_t t2 = 0; t2 <= t; t2++) {
          double d = 0.0;
          for (int64_t c = 0; c < hs; c++) {
            d += dout[(b * T + t) * C + h * hs + c] * qkv[at(t2, 2, c)];
          }
          dP[t * T + t2] = d;
        }
      }
      for (int64_t t = 0; t < T; t++) {
        // Softmax Jacobian: dS = P * (dP - rowsum(P * dP)).
        double rowdot = 0.0;
        for (int64_t t2 = 0; t2 < T; t2++) rowdot += P[t * T + t2] * dP[t * T + t2];
        for (int64_t t2 = 0; t2 <= t; t2++) {
          const double p = P[t * T + t2];
          const double ds = p * (dP[t * T + t2] - rowdot);
          for (int64_t c = 0; c < hs; c++) {
            dqkv[at(t, 0, c)] += ds * sc * qkv[at(t2, 1, c)];
            dqkv[at(t2, 1, c)] += ds * sc * qkv[at(t, 0, c)];
            dqkv[at(t2, 2, c)] += p * dout[(b * T + t) * C + h * hs + c];
          }
        }
      }
    }
  }
  return dqkv;
}

double CrossEntropyRef(const VecD& logits, const std::vector<int32_t>& targets, int64_t N,
                       int64_t V, VecD* lse_out = nullptr) {
  double total = 0.0;
  if (lse_out) lse_out->assign(N, 0.0);
  for (int64_t i = 0; i < N; i++) {
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < V; j++) mx = std::max(mx, logits[i * V + j]);
    double sum = 0.0;
    for (int64_t j = 0; j < V; j++) sum += std::exp(logits[i * V + j] - mx);
    const double lse = mx + std::log(sum);
    if (lse_out) (*lse_out)[i] = lse;
    total += lse - logits[i * V + targets[i]];
  }
  return total / N;
}

// ------------------------------------------------------------------------------------------------
// Embedding

TEST(CpuKernels, EmbeddingFwd) {
  const int64_t n = kN;
  const VecF table = Random(kV * kC, 1);
  const auto idx = RandomIndices(n, kV, 2);
  VecF out(n * kC, 123.0f);
  embedding_fwd(out.data(), idx.data(), table.data(), n, kC);
  VecD want(n * kC);
  for (int64_t i = 0; i < n; i++) {
    for (int64_t c = 0; c < kC; c++) want[i * kC + c] = table[idx[i] * kC + c];
  }
  ExpectClose(out, want, 0.0, 0.0, "embedding_fwd");
}

TEST(CpuKernels, EmbeddingBwdRepeatedIndices) {
  const int64_t n = 11;
  // Index 5 appears four times, 0 twice, V - 1 once; the rest of the table is never touched.
  const std::vector<int32_t> idx = {5, 0, 5, 36, 5, 2, 0, 5, 9, 30, 2};
  const VecF dout = Random(n * kC, 3);
  VecF dtable(kV * kC, 7.0f);  // garbage: the kernel must overwrite all of it
  embedding_bwd(dtable.data(), idx.data(), dout.data(), n, kV, kC);

  VecD want(kV * kC, 0.0);
  for (int64_t i = 0; i < n; i++) {
    for (int64_t c = 0; c < kC; c++) want[idx[i] * kC + c] += dout[i * kC + c];
  }
  ExpectClose(dtable, want, 1e-6, 1e-6, "embedding_bwd vs reference");

  // Finite differences of L(table) = sum(embedding(table) * dout). L is linear, so the
  // differences are exact up to double rounding.
  const VecF table = Random(kV * kC, 4);
  auto loss = [&](const VecD& tab) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) {
      for (int64_t c = 0; c < kC; c++) s += tab[idx[i] * kC + c] * dout[i * kC + c];
    }
    return s;
  };
  ExpectClose(dtable, FiniteDiff(loss, ToDouble(table)), 1e-6, 1e-6, "embedding_bwd vs FD");
}

// ------------------------------------------------------------------------------------------------
// Matmul

void CheckMatmul(int64_t M, int64_t N, int64_t K, bool transA, bool transB) {
  const VecF a = Random(M * K, 10 + transA);
  const VecF b = Random(K * N, 20 + transB);
  VecF out(M * N, 99.0f);
  matmul(out.data(), a.data(), b.data(), M, N, K, transA, transB);
  VecD want(M * N, 0.0);
  for (int64_t m = 0; m < M; m++) {
    for (int64_t n = 0; n < N; n++) {
      double s = 0.0;
      for (int64_t k = 0; k < K; k++) {
        const double av = transA ? a[k * M + m] : a[m * K + k];
        const double bv = transB ? b[n * K + k] : b[k * N + n];
        s += av * bv;
      }
      want[m * N + n] = s;
    }
  }
  ExpectClose(out, want, 1e-5, 1e-5,
              "matmul M=" + std::to_string(M) + " N=" + std::to_string(N) +
                  " K=" + std::to_string(K) + " transA=" + std::to_string(transA) +
                  " transB=" + std::to_string(transB));
}

TEST(CpuKernels, MatmulAllTransposeCombinations) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      CheckMatmul(5, 7, 9, ta, tb);
      CheckMatmul(kN, kV, kC, ta, tb);
      CheckMatmul(1, 3, 1, ta, tb);
    }
  }
}

TEST(CpuKernels, MatmulEmptyInnerDimensionGivesZeros) {
  VecF out(6, 5.0f);
  matmul(out.data(), nullptr, nullptr, 2, 3, 0, false, false);
  ExpectClose(out, VecD(6, 0.0), 0.0, 0.0, "matmul K=0");
}

// ------------------------------------------------------------------------------------------------
// Elementwise

TEST(CpuKernels, Elementwise) {
  // One small odd size and one large enough to take the parallel path. Each result is one fp32
  // rounding of the exact value: within 2^-23 relative.
  for (int64_t n : {int64_t{13}, int64_t{100003}}) {
    const VecF a = Random(n, 30), b = Random(n, 31);
    VecF out(n);
    VecD want(n);
    const std::string sz = " n=" + std::to_string(n);

    add(out.data(), a.data(), b.data(), n);
    for (int64_t i = 0; i < n; i++) want[i] = static_cast<double>(a[i]) + b[i];
    ExpectClose(out, want, 0.0, 1.2e-7, "add" + sz);

    mul(out.data(), a.data(), b.data(), n);
    for (int64_t i = 0; i < n; i++) want[i] = static_cast<double>(a[i]) * b[i];
    ExpectClose(out, want, 0.0, 1.2e-7, "mul" + sz);

    scale(out.data(), a.data(), -2.5f, n);
    for (int64_t i = 0; i < n; i++) want[i] = -2.5 * a[i];
    ExpectClose(out, want, 0.0, 1.2e-7, "scale" + sz);

    fill(out.data(), 0.75f, n);
    ExpectClose(out, VecD(n, 0.75), 0.0, 0.0, "fill" + sz);

    copy(out.data(), a.data(), n);
    ExpectClose(out, a, 0.0, 0.0, "copy" + sz);

    VecF dst = b;
    accumulate(dst.data(), a.data(), n);
    for (int64_t i = 0; i < n; i++) want[i] = static_cast<double>(b[i]) + a[i];
    ExpectClose(dst, want, 0.0, 1.2e-7, "accumulate" + sz);
  }
}

// ------------------------------------------------------------------------------------------------
// GELU

TEST(CpuKernels, GeluFwd) {
  const int64_t n = 101;
  VecF x = Random(n, 40, -6.0f, 6.0f);
  x[0] = 0.0f;
  x[1] = -20.0f;  // tanh saturates: gelu -> 0
  x[2] = 20.0f;   // gelu -> u
  VecF out(n);
  gelu_fwd(out.data(), x.data(), n);
  VecD want(n);
  for (int64_t i = 0; i < n; i++) want[i] = GeluRef(x[i]);
  ExpectClose(out, want, 1e-6, 1e-5, "gelu_fwd");
}

TEST(CpuKernels, GeluFwdTightWhereWellConditioned) {
  // For u >= -1 (no cancellation in 1 + tanh) fp32 gelu is good to a few ulps, tight enough to
  // pin sqrt(2 / pi) to its ~6th digit (GeluFwd's 1e-5 relative would not).
  const int64_t n = 1001;
  VecF x(n);
  for (int64_t i = 0; i < n; i++) x[i] = -1.0f + 4.0f * static_cast<float>(i) / (n - 1);
  VecF out(n);
  gelu_fwd(out.data(), x.data(), n);
  VecD want(n);
  for (int64_t i = 0; i < n; i++) want[i] = GeluRef(x[i]);
  // Measured within 2e-7 relative; a 6-digit sqrt(2 / pi) (0.79788) is ~1.3e-6 off.
  ExpectClose(out, want, 1e-8, 5e-7, "gelu_fwd on [-1, 3]");
}

TEST(CpuKernels, GeluBwd) {
  const int64_t n = 101;
  VecF x = Random(n, 41, -6.0f, 6.0f);
  x[0] = 0.0f;
  x[1] = -20.0f;
  x[2] = 20.0f;
  const VecF dout = Random(n, 42);
  VecF dinp(n);
  gelu_bwd(dinp.data(), x.data(), dout.data(), n);

  VecD want(n);
  for (int64_t i = 0; i < n; i++) want[i] = dout[i] * GeluGradRef(x[i]);
  ExpectClose(dinp, want, 1e-6, 1e-5, "gelu_bwd vs reference");

  // L(x) = sum gelu(x) * dout.
  auto loss = [&](const VecD& u) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += GeluRef(u[i]) * dout[i];
    return s;
  };
  ExpectClose(dinp, FiniteDiff(loss, ToDouble(x)), 1e-6, 1e-5, "gelu_bwd vs FD");
}

// ------------------------------------------------------------------------------------------------
// Broadcast / reduce / reshape

TEST(CpuKernels, BroadcastAndSumRows) {
  const int64_t R = 9, K = 13;
  const VecF v = Random(K, 50);
  VecF out(R * K);
  broadcast_rows(out.data(), v.data(), R, K);
  VecD want(R * K);
  for (int64_t r = 0; r < R; r++) {
    for (int64_t k = 0; k < K; k++) want[r * K + k] = v[k];
  }
  ExpectClose(out, want, 0.0, 0.0, "broadcast_rows");

  const VecF m = Random(R * K, 51);
  VecF sums(K, 3.0f);
  sum_rows(sums.data(), m.data(), R, K);
  VecD want_sums(K, 0.0);
  for (int64_t r = 0; r < R; r++) {
    for (int64_t k = 0; k < K; k++) want_sums[k] += m[r * K + k];
  }
  ExpectClose(sums, want_sums, 1e-6, 1e-6, "sum_rows");

  // Large enough to take the parallel path.
  const int64_t R2 = 1001, K2 = 37;
  const VecF m2 = Random(R2 * K2, 52);
  VecF sums2(K2);
  sum_rows(sums2.data(), m2.data(), R2, K2);
  VecD want2(K2, 0.0);
  for (int64_t r = 0; r < R2; r++) {
    for (int64_t k = 0; k < K2; k++) want2[k] += m2[r * K2 + k];
  }
  ExpectClose(sums2, want2, 1e-5, 1e-6, "sum_rows large");
}

TEST(CpuKernels, Transpose) {
  for (auto [M, K] : {std::pair<int64_t, int64_t>{5, 7}, {1, 9}, {130, 257}}) {
    const VecF a = Random(M * K, 60);
    VecF t(M * K), back(M * K);
    transpose(t.data(), a.data(), M, K);
    VecD want(M * K);
    for (int64_t m = 0; m < M; m++) {
      for (int64_t k = 0; k < K; k++) want[k * M + m] = a[m * K + k];
    }
    ExpectClose(t, want, 0.0, 0.0, "transpose");
    transpose(back.data(), t.data(), K, M);
    ExpectClose(back, a, 0.0, 0.0, "transpose twice");
  }
}

TEST(CpuKernels, SliceInsertColsRoundTrip) {
  const int64_t R = kN, K = 3 * kC;
  const VecF a = Random(R * K, 70);
  // Split [R, 3C] into three [R, C] column blocks (as the qkv split does) and put them back.
  VecF rebuilt(R * K, -1.0f);
  for (int64_t part = 0; part < 3; part++) {
    VecF piece(R * kC);
    slice_cols(piece.data(), a.data(), R, K, part * kC, kC);
    VecD want(R * kC);
    for (int64_t r = 0; r < R; r++) {
      for (int64_t c = 0; c < kC; c++) want[r * kC + c] = a[r * K + part * kC + c];
    }
    ExpectClose(piece, want, 0.0, 0.0, "slice_cols part " + std::to_string(part));
    insert_cols(rebuilt.data(), piece.data(), R, K, part * kC, kC);
  }
  ExpectClose(rebuilt, a, 0.0, 0.0, "slice/insert round trip");

  // insert_cols leaves the other columns untouched.
  VecF out(R * K, 4.0f);
  const VecF piece = Random(R * 5, 71);
  insert_cols(out.data(), piece.data(), R, K, 7, 5);
  VecD want(R * K, 4.0);
  for (int64_t r = 0; r < R; r++) {
    for (int64_t c = 0; c < 5; c++) want[r * K + 7 + c] = piece[r * 5 + c];
  }
  ExpectClose(out, want, 0.0, 0.0, "insert_cols other columns untouched");
}

// ------------------------------------------------------------------------------------------------
// Layer norm

TEST(CpuKernels, LayerNormFwd) {
  const float eps = 1e-5f;
  // A large common offset makes a one-pass E[x^2] - E[x]^2 variance lose most of its digits.
  const VecF x = Random(kN * kC, 80, 99.0f, 101.0f);
  const VecF w = Random(kC, 81), b = Random(kC, 82);
  VecF out(kN * kC), mean(kN), rstd(kN);
  layernorm_fwd(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), kN, kC, eps);
  LayerNormRef r = LayerNormFwdRef(ToDouble(x), ToDouble(w), ToDouble(b), kN, kC, eps);
  // (x - mean) loses ~log2(100) bits in fp32 before normalisation, hence the looser tolerance.
  ExpectClose(out, r.out, 1e-4, 1e-4, "layernorm_fwd out");
  ExpectClose(mean, r.mean, 0.0, 1e-6, "layernorm_fwd mean");
  ExpectClose(rstd, r.rstd, 0.0, 1e-4, "layernorm_fwd rstd");
}

TEST(CpuKernels, LayerNormFwdWideRowsLargeOffsetAccumulateInDouble) {
  // GPT-2 width (C = 768) around a common offset of 1000: summed in fp32, the row sum (~7.7e5,
  // ulp 0.06) and the squared deviations put the mean and rstd ~3e-7 relative off (measured),
  // beyond the one fp32 rounding of a double-accumulated mean and rstd checked here.
  const int64_t N = 16, C = 768;
  const float eps = 1e-5f;
  VecF x = Random(N * C, 83, -1.0f, 1.0f);
  for (auto& v : x) v += 1000.0f;
  const VecF w = Random(C, 84), b = Random(C, 85);
  VecF out(N * C), mean(N), rstd(N);
  layernorm_fwd(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, eps);
  LayerNormRef r = LayerNormFwdRef(ToDouble(x), ToDouble(w), ToDouble(b), N, C, eps);
  ExpectClose(mean, r.mean, 0.0, 6e-8, "layernorm_fwd mean, one fp32 rounding");   // 2^-24
  ExpectClose(rstd, r.rstd, 0.0, 1.2e-7, "layernorm_fwd rstd, one fp32 rounding");  // 2^-23
  // out uses the fp32 mean (off by <= 3e-5 at 1000) times rstd ~1.7: within 1e-4.
  ExpectClose(out, r.out, 1e-4, 1e-5, "layernorm_fwd out (C=768, offset 1000)");
}

TEST(CpuKernels, LayerNormFwdVarianceAroundTheExactMean) {
  // Around 1e6 fp32 values are 0.0625 apart: the row {1e6, 1e6, 1e6 + 1/16, 1e6 + 1/16} has
  // mean 1e6 + 1/32, halfway between two floats (the stored mean rounds to 1e6). The variance
  // must be taken around the exact (double) mean, 1/32^2, not around the rounded one (1/16^2 / 2,
  // twice as large).
  const VecF x = {1e6f, 1e6f, 1e6f + 0.0625f, 1e6f + 0.0625f};
  const VecF w(4, 1.0f), b(4, 0.0f);
  VecF out(4), mean(1), rstd(1);
  layernorm_fwd(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), 1, 4, 1e-5f);
  const double want = 1.0 / std::sqrt(1.0 / 1024.0 + static_cast<double>(1e-5f));
  EXPECT_NEAR(rstd[0], want, 1.2e-7 * want);
}

TEST(CpuKernels, LayerNormBwd) {
  const float eps = 1e-5f;
  const VecF x = Random(kN * kC, 90, -2.0f, 3.0f);
  const VecF w = Random(kC, 91), b = Random(kC, 92);
  const VecF dout = Random(kN * kC, 93);
  VecF out(kN * kC), mean(kN), rstd(kN);
  layernorm_fwd(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), kN, kC, eps);
  VecF dx(kN * kC, 5.0f), dw(kC, 5.0f), db(kC, 5.0f);  // garbage: must be overwritten
  layernorm_bwd(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                rstd.data(), kN, kC);

  VecD rdx, rdw, rdb;
  LayerNormBwdRef(rdx, rdw, rdb, ToDouble(dout), ToDouble(x), ToDouble(w), kN, kC, eps);
  ExpectClose(dx, rdx, 1e-5, 1e-4, "layernorm_bwd dinp vs reference");
  ExpectClose(dw, rdw, 1e-5, 1e-5, "layernorm_bwd dw vs reference");
  ExpectClose(db, rdb, 1e-5, 1e-5, "layernorm_bwd db vs reference");

  // Finite differences of L = sum(layernorm(x, w, b) * dout) wrt each input in turn.
  const VecD xd = ToDouble(x), wd = ToDouble(w), bd = ToDouble(b);
  auto L = [&](const VecD& xx, const VecD& ww, const VecD& bb) {
    return Dot(LayerNormFwdRef(xx, ww, bb, kN, kC, eps).out, dout);
  };
  ExpectClose(dx, FiniteDiff([&](const VecD& v) { return L(v, wd, bd); }, xd), 1e-5, 1e-4,
              "layernorm_bwd dinp vs FD");
  ExpectClose(dw, FiniteDiff([&](const VecD& v) { return L(xd, v, bd); }, wd), 1e-5, 1e-5,
              "layernorm_bwd dw vs FD");
  ExpectClose(db, FiniteDiff([&](const VecD& v) { return L(xd, wd, v); }, bd), 1e-5, 1e-5,
              "layernorm_bwd db vs FD");
}

// layernorm_bwd's dx, dw and db, from the mean and rstd of layernorm_fwd on the same rows.
struct LayerNormGrads {
  VecF dx, dw, db;
};
LayerNormGrads LayerNormFwdThenBwd(const VecF& x, const VecF& w, const VecF& b, const VecF& dy, int64_t N,
                                   int64_t C, float eps) {
  VecF out(N * C), mean(N), rstd(N);
  layernorm_fwd(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, eps);
  LayerNormGrads g{VecF(N * C), VecF(C), VecF(C)};
  layernorm_bwd(g.dx.data(), g.dw.data(), g.db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  return g;
}

TEST(CpuKernels, LayerNormBwdCommonGradientOffsetCancels) {
  // dout = 1 + noise of 1e-3 with w = 1 at C = 768: dx = rstd (g - mean(g) - ...) cancels the
  // common 1 exactly, leaving ~1e-3. mean(g) summed in double is one fp32 rounding (6e-8) off
  // (dx measured within 1.3e-7); summed in fp32 (partial sums up to 768, ulp 6e-5) it is ~1e-6
  // off, over three times the 3e-7 allowed.
  const int64_t N = 4, C = 768;
  const float eps = 1e-5f;
  const VecF x = Random(N * C, 98), b(C, 0.0f), w(C, 1.0f);
  VecF dy = Random(N * C, 99, -1e-3f, 1e-3f);
  for (auto& v : dy) v += 1.0f;
  const LayerNormGrads g = LayerNormFwdThenBwd(x, w, b, dy, N, C, eps);
  VecD rdx, rdw, rdb;
  LayerNormBwdRef(rdx, rdw, rdb, ToDouble(dy), ToDouble(x), ToDouble(w), N, C, eps);
  ExpectClose(g.dx, rdx, 3e-7, 1e-4, "layernorm_bwd dinp, common dout offset (C=768)");
}

TEST(CpuKernels, LayerNormBwdManyRowsUsesAllChunks) {
  // More rows than the kernel's reduction chunks, so dw/db partial sums are really combined.
  const int64_t N = 203, C = 7;
  const float eps = 1e-5f;
  const VecF x = Random(N * C, 94), w = Random(C, 95), b = Random(C, 96), dy = Random(N * C, 97);
  const LayerNormGrads g = LayerNormFwdThenBwd(x, w, b, dy, N, C, eps);
  VecD rdx, rdw, rdb;
  LayerNormBwdRef(rdx, rdw, rdb, ToDouble(dy), ToDouble(x), ToDouble(w), N, C, eps);
  ExpectClose(g.dx, rdx, 1e-5, 1e-4, "layernorm_bwd dinp (N=203)");
  ExpectClose(g.dw, rdw, 1e-4, 1e-5, "layernorm_bwd dw (N=203)");
  ExpectClose(g.db, rdb, 1e-4, 1e-5, "layernorm_bwd db (N=203)");
}

// ------------------------------------------------------------------------------------------------
// Attention

struct AttnShape {
  int64_t B, T, C, H;
};

const AttnShape kAttnShapes[] = {{kB, kT, kC, kH}, {2, 5, 6, 1}, {1, 1, 8, 2}, {2, 9, 10, 5}};

std::string Name(const AttnShape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " C=" + std::to_string(s.C) +
         " H=" + std::to_string(s.H);
}

TEST(CpuKernels, AttentionFwdVsMaterialisedSoftmax) {
  for (const AttnShape& s : kAttnShapes) {
    const VecF qkv = Random(s.B * s.T * 3 * s.C, 100, -1.5f, 1.5f);
    VecF out(s.B * s.T * s.C, 9.0f), lse(s.B * s.H * s.T, 9.0f);
    attention_fwd(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.H);
    VecD rout, rlse;
    AttentionFwdRef(rout, rlse, ToDouble(qkv), s.B, s.T, s.C, s.H);
    ExpectClose(out, rout, 1e-6, 1e-5, "attention_fwd out " + Name(s));
    ExpectClose(lse, rlse, 1e-6, 1e-5, "attention_fwd lse " + Name(s));
  }
}

// The sampler's path: a prompt read into the cache a chunk of M positions per call (the last
// chunk running past S, whose tokens are skipped), then one position per call; every row of out
// is that position's row of attention over the whole sequence.
TEST(CpuKernels, DecodeAttentionOfChunksAndSinglePositionsVsAttention) {
  for (const AttnShape& s : kAttnShapes) {
    const VecF qkv = Random(s.B * s.T * 3 * s.C, 102, -1.5f, 1.5f);
    VecD rout, rlse;
    AttentionFwdRef(rout, rlse, ToDouble(qkv), s.B, s.T, s.C, s.H);
    const int64_t M = std::max<int64_t>(1, (s.T + 1) / 2), hs = s.C / s.H;
    for (int64_t prompt : {int64_t(1), M, s.T - 1, s.T}) {
      if (prompt < 1) continue;
      VecF cache(2 * s.B * s.T * s.C, 7.0f), out(s.B * s.T * s.C, 9.0f);
      VecF chunk(s.B * M * 3 * s.C), chunk_out(s.B * M * s.C, 9.0f);
      for (int64_t p = 0; p < prompt; p += M) {
        // Rows b * M + m: position p + m of row b, zeros past the sequence.
        std::fill(chunk.begin(), chunk.end(), 0.0f);
        for (int64_t b = 0; b < s.B; ++b)
          for (int64_t m = 0; m < M && p + m < s.T; ++m)
            std::copy_n(qkv.begin() + (b * s.T + p + m) * 3 * s.C, 3 * s.C, chunk.begin() + (b * M + m) * 3 * s.C);
        decode_attention(chunk_out.data(), cache.data(), chunk.data(), p, s.B, s.C, s.H, s.T, M);
        for (int64_t b = 0; b < s.B; ++b)
          for (int64_t m = 0; m < M && p + m < std::min(prompt, s.T); ++m)
            std::copy_n(chunk_out.begin() + (b * M + m) * s.C, s.C, out.begin() + (b * s.T + p + m) * s.C);
      }
      VecF one(s.B * 3 * s.C), one_out(s.B * s.C);
      for (int64_t p = prompt; p < s.T; ++p) {
        for (int64_t b = 0; b < s.B; ++b) std::copy_n(qkv.begin() + (b * s.T + p) * 3 * s.C, 3 * s.C, one.begin() + b * 3 * s.C);
        decode_attention(one_out.data(), cache.data(), one.data(), p, s.B, s.C, s.H, s.T);
        for (int64_t b = 0; b < s.B; ++b) std::copy_n(one_out.begin() + b * s.C, s.C, out.begin() + (b * s.T + p) * s.C);
      }
      ExpectClose(out, rout, 1e-6, 1e-5, "decode_attention M=" + std::to_string(M) + ", prompt " + std::to_string(prompt) + " " + Name(s));
      // The cache holds every position's key and value, rows then heads.
      for (int64_t b = 0; b < s.B; ++b)
        for (int64_t h = 0; h < s.H; ++h)
          for (int64_t t = 0; t < s.T; ++t)
            for (int64_t c = 0; c < hs; ++c) {
              const float* row = qkv.data() + (b * s.T + t) * 3 * s.C + h * hs + c;
              const int64_t at = ((b * s.H + h) * s.T + t) * hs + c;
              ASSERT_EQ(cache[size_t(at)], row[s.C]) << Name(s);
              ASSERT_EQ(cache[size_t(s.B * s.T * s.C + at)], row[2 * s.C]) << Name(s);
            }
    }
  }
}

TEST(CpuKernels, AttentionFwdLargeScoresStayFinite) {
  // Scores of order +-1e3: exp overflows without max subtraction.
  const AttnShape s{kB, kT, kC, kH};
  VecF qkv = Random(s.B * s.T * 3 * s.C, 101, -1.0f, 1.0f);
  for (auto& x : qkv) x *= 30.0f;
  VecF out(s.B * s.T * s.C), lse(s.B * s.H * s.T);
  attention_fwd(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.H);
  VecD rout, rlse;
  AttentionFwdRef(rout, rlse, ToDouble(qkv), s.B, s.T, s.C, s.H);
  // Scores of ~1e3 carry an fp32 rounding error of ~1e-4 into the exponent, hence the looser lse.
  ExpectClose(out, rout, 1e-5, 1e-4, "attention_fwd large scores out");
  ExpectClose(lse, rlse, 1e-3, 1e-5, "attention_fwd large scores lse");
}

TEST(CpuKernels, AttentionOutputsOverwriteNaNGarbage) {
  // Outputs may live in reused memory holding anything, NaN included: every element must be
  // written, not scaled (NaN * 0 is NaN). Checks attention_fwd and decode_attention (one
  // position per call) on a NaN-filled out, against the materialised reference.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const AttnShape& s : kAttnShapes) {
    const VecF qkv = Random(s.B * s.T * 3 * s.C, 103, -1.5f, 1.5f);
    VecD rout, rlse;
    AttentionFwdRef(rout, rlse, ToDouble(qkv), s.B, s.T, s.C, s.H);
    VecF out(s.B * s.T * s.C, nan), lse(s.B * s.H * s.T, nan);
    attention_fwd(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.H);
    ExpectClose(out, rout, 1e-6, 1e-5, "attention_fwd over NaN out " + Name(s));
    ExpectClose(lse, rlse, 1e-6, 1e-5, "attention_fwd over NaN lse " + Name(s));

    VecF cache(2 * s.B * s.T * s.C, nan), dec(s.B * s.T * s.C, nan);
    VecF one(s.B * 3 * s.C), one_out(s.B * s.C);
    for (int64_t p = 0; p < s.T; ++p) {
      for (int64_t b = 0; b < s.B; ++b) std::copy_n(qkv.begin() + (b * s.T + p) * 3 * s.C, 3 * s.C, one.begin() + b * 3 * s.C);
      std::fill(one_out.begin(), one_out.end(), nan);
      decode_attention(one_out.data(), cache.data(), one.data(), p, s.B, s.C, s.H, s.T);
      for (int64_t b = 0; b < s.B; ++b) std::copy_n(one_out.begin() + b * s.C, s.C, dec.begin() + (b * s.T + p) * s.C);
    }
    ExpectClose(dec, rout, 1e-6, 1e-5, "decode_attention over NaN out " + Name(s));
  }
}

TEST(CpuKernels, AttentionBwd) {
  for (const AttnShape& s : kAttnShapes) {
    const VecF qkv = Random(s.B * s.T * 3 * s.C, 110, -1.5f, 1.5f);
    const VecF dout = Random(s.B * s.T * s.C, 111);
    VecF out(s.B * s.T * s.C), lse(s.B * s.H * s.T);
    attention_fwd(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.H);
    VecF dqkv(s.B * s.T * 3 * s.C, 8.0f);  // garbage: must be overwritten everywhere
    attention_bwd(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.C,
                  s.H);

    ExpectClose(dqkv, AttentionBwdRef(ToDouble(dout), ToDouble(qkv), s.B, s.T, s.C, s.H), 1e-5,
                1e-4, "attention_bwd vs reference " + Name(s));

    // L(qkv) = sum(attention(qkv) * dout).
    auto loss = [&](const VecD& v) {
      VecD o, l;
      AttentionFwdRef(o, l, v, s.B, s.T, s.C, s.H);
      return Dot(o, dout);
    };
    ExpectClose(dqkv, FiniteDiff(loss, ToDouble(qkv)), 1e-5, 1e-4,
                "attention_bwd vs FD " + Name(s));
  }
}

// ------------------------------------------------------------------------------------------------
// Cross-entropy

TEST(CpuKernels, AttentionBwdLargeScoresStayFinite) {
  // Scores of order 1e3 (as in AttentionFwdLargeScoresStayFinite): p must be rebuilt as
  // exp(s - lse), never exp(s) / exp(lse), which is inf / inf.
  const AttnShape s{kB, kT, kC, kH};
  VecF qkv = Random(s.B * s.T * 3 * s.C, 112, -1.0f, 1.0f);
  for (auto& x : qkv) x *= 30.0f;
  const VecF dout = Random(s.B * s.T * s.C, 113);
  VecF out(s.B * s.T * s.C), lse(s.B * s.H * s.T);
  attention_fwd(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.H);
  VecF dqkv(s.B * s.T * 3 * s.C, 8.0f);
  attention_bwd(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.C, s.H);
  // Scores of ~1e3 carry ~1e-4 of fp32 rounding into the exponent, so p and the gradients built
  // from it are good to ~1e-4 relative; elements that cancel towards 0 measured up to 5e-5 off.
  ExpectClose(dqkv, AttentionBwdRef(ToDouble(dout), ToDouble(qkv), s.B, s.T, s.C, s.H), 2e-4, 1e-4,
              "attention_bwd large scores");
}

TEST(CpuKernels, CrossEntropyFwd) {
  const VecF logits = Random(kN * kV, 120, -4.0f, 4.0f);
  const auto targets = RandomIndices(kN, kV, 121);
  float loss = 0.0f;
  VecF lse(kN);
  cross_entropy_fwd(&loss, lse.data(), logits.data(), targets.data(), kN, kV, kV);
  VecD rlse;
  const double want = CrossEntropyRef(ToDouble(logits), targets, kN, kV, &rlse);
  EXPECT_NEAR(loss, want, 1e-5 * std::fabs(want));
  ExpectClose(lse, rlse, 1e-6, 1e-6, "cross_entropy_fwd lse");
}

TEST(CpuKernels, CrossEntropyFwdLargeLogitsStable) {
  // Softmax is shift invariant: adding 1000 to every logit (exp(1000) overflows) must not change
  // the loss, and lse moves by exactly the shift.
  VecF logits = Random(kN * kV, 122, -4.0f, 4.0f);
  const auto targets = RandomIndices(kN, kV, 123);
  const double want = CrossEntropyRef(ToDouble(logits), targets, kN, kV);
  for (auto& x : logits) x += 1000.0f;
  float loss = 0.0f;
  VecF lse(kN);
  cross_entropy_fwd(&loss, lse.data(), logits.data(), targets.data(), kN, kV, kV);
  ASSERT_TRUE(std::isfinite(loss));
  // The shifted fp32 logits are only accurate to ~6e-5 (ulp at 1000), which bounds the error.
  EXPECT_NEAR(loss, want, 2e-4);
  VecD rlse;
  CrossEntropyRef(ToDouble(logits), targets, kN, kV, &rlse);
  ExpectClose(lse, rlse, 0.0, 1e-6, "cross_entropy_fwd shifted lse");
}

TEST(CpuKernels, CrossEntropyBwdVsReference) {
  const VecF logits = Random(kN * kV, 124, -4.0f, 4.0f);
  const auto targets = RandomIndices(kN, kV, 125);
  float loss = 0.0f;
  VecF lse(kN);
  cross_entropy_fwd(&loss, lse.data(), logits.data(), targets.data(), kN, kV, kV);
  const float dloss = 1.7f;
  VecF dlogits(kN * kV, 6.0f);
  cross_entropy_bwd(dlogits.data(), &dloss, logits.data(), lse.data(), targets.data(), kN, kV, kV);

  VecD rlse;
  CrossEntropyRef(ToDouble(logits), targets, kN, kV, &rlse);
  VecD want(kN * kV);
  for (int64_t i = 0; i < kN; i++) {
    for (int64_t j = 0; j < kV; j++) {
      const double p = std::exp(logits[i * kV + j] - rlse[i]);
      want[i * kV + j] = dloss / kN * (p - (j == targets[i] ? 1.0 : 0.0));
    }
  }
  ExpectClose(dlogits, want, 1e-7, 1e-5, "cross_entropy_bwd vs reference");
}

TEST(CpuKernels, CrossEntropyEndToEndVsFiniteDifferences) {
  const VecF logits = Random(kN * kV, 126, -4.0f, 4.0f);
  const auto targets = RandomIndices(kN, kV, 127);
  float loss = 0.0f;
  VecF lse(kN);
  cross_entropy_fwd(&loss, lse.data(), logits.data(), targets.data(), kN, kV, kV);
  const float dloss = 0.6f;
  VecF dlogits(kN * kV);
  cross_entropy_bwd(dlogits.data(), &dloss, logits.data(), lse.data(), targets.data(), kN, kV, kV);

  const double want_loss = CrossEntropyRef(ToDouble(logits), targets, kN, kV);
  EXPECT_NEAR(loss, want_loss, 1e-5 * std::fabs(want_loss));
  // d(dloss * loss) / dlogits.
  auto f = [&](const VecD& l) { return dloss * CrossEntropyRef(l, targets, kN, kV); };
  ExpectClose(dlogits, FiniteDiff(f, ToDouble(logits)), 1e-7, 1e-4, "cross_entropy vs FD");
}

TEST(CpuKernels, CrossEntropyPaddedColumnsMatchUnpadded) {
  // The same logits stored in rows of kVp > kV columns (the vocabulary padded as the GPT-2 model
  // pads it), with large garbage in the padded columns: the loss and lse must be those of the
  // unpadded [kN, kV] logits, the gradient must equal the unpadded one on the first kV columns
  // and be exactly 0 on the padded ones.
  constexpr int64_t kVp = 64;
  const VecF logits = Random(kN * kV, 128, -4.0f, 4.0f);
  const auto targets = RandomIndices(kN, kV, 129);
  const VecF garbage = Random(kN * kVp, 130, 50.0f, 100.0f);  // would dominate any softmax
  VecF padded(garbage);
  for (int64_t i = 0; i < kN; i++)
    std::copy_n(logits.begin() + i * kV, kV, padded.begin() + i * kVp);

  float loss = 0.0f, loss_p = 0.0f;
  VecF lse(kN), lse_p(kN, 5.0f);
  cross_entropy_fwd(&loss, lse.data(), logits.data(), targets.data(), kN, kV, kV);
  cross_entropy_fwd(&loss_p, lse_p.data(), padded.data(), targets.data(), kN, kVp, kV);
  EXPECT_EQ(loss_p, loss);
  ExpectClose(lse_p, lse, 0.0, 0.0, "padded cross_entropy_fwd lse");

  const float dloss = 0.9f;
  VecF dlogits(kN * kV), dlogits_p(kN * kVp, 9.0f);  // garbage: the kernel writes all of it
  cross_entropy_bwd(dlogits.data(), &dloss, logits.data(), lse.data(), targets.data(), kN, kV, kV);
  cross_entropy_bwd(dlogits_p.data(), &dloss, padded.data(), lse_p.data(), targets.data(), kN, kVp,
                    kV);
  VecF real(kN * kV), pad;
  for (int64_t i = 0; i < kN; i++) {
    std::copy_n(dlogits_p.begin() + i * kVp, kV, real.begin() + i * kV);
    pad.insert(pad.end(), dlogits_p.begin() + i * kVp + kV, dlogits_p.begin() + (i + 1) * kVp);
  }
  ExpectClose(real, dlogits, 0.0, 0.0, "padded cross_entropy_bwd, real columns");
  ASSERT_EQ(pad.size(), size_t(kN * (kVp - kV)));
  EXPECT_TRUE(std::all_of(pad.begin(), pad.end(), [](float x) { return x == 0.0f && !std::signbit(x); }))
      << "the padded columns' gradient must be exactly +0";
}

TEST(CpuKernels, CrossEntropyDominantFirstOrLastClassStable) {
  // One logit 200 above the rest (exp(200) overflows fp32) in the first or the last class
  // column, in rows padded to V > valid with garbage: the max subtracted before exp must range
  // over every class column, including both ends, or that row's lse becomes inf.
  constexpr int64_t kRows = 4, kValid = kV, kVp = kV + 3;
  const VecF base = Random(kRows * kValid, 131, -4.0f, 4.0f);
  const std::vector<int32_t> targets = {0, int32_t(kValid - 1), 5, 3};
  const int64_t hot[kRows] = {0, kValid - 1, 0, kValid - 1};  // column given +200 in each row
  VecF logits(base), padded = Random(kRows * kVp, 132, 50.0f, 100.0f);
  for (int64_t i = 0; i < kRows; i++) {
    logits[i * kValid + hot[i]] += 200.0f;
    std::copy_n(logits.begin() + i * kValid, kValid, padded.begin() + i * kVp);
  }
  VecD rlse;
  const double want = CrossEntropyRef(ToDouble(logits), targets, kRows, kValid, &rlse);
  const float dloss = 1.3f;
  VecD want_d(kRows * kVp, 0.0);  // padded layout; padded columns stay 0
  for (int64_t i = 0; i < kRows; i++) {
    for (int64_t j = 0; j < kValid; j++) {
      const double p = std::exp(logits[i * kValid + j] - rlse[i]);
      want_d[i * kVp + j] = dloss / kRows * (p - (j == targets[i] ? 1.0 : 0.0));
    }
  }
  float loss = 0.0f;
  VecF lse(kRows), dlogits(kRows * kVp, 4.0f);
  cross_entropy_fwd(&loss, lse.data(), padded.data(), targets.data(), kRows, kVp, kValid);
  // Rows 2 and 3 lose ~200 (their target is not the hot class), rows 0 and 1 ~0: the loss is
  // ~100, lse ~204, both within a few fp32 ulps.
  EXPECT_NEAR(loss, want, 1e-5 * std::fabs(want));
  ExpectClose(lse, rlse, 0.0, 1e-6, "cross_entropy_fwd dominant end class lse");
  cross_entropy_bwd(dlogits.data(), &dloss, padded.data(), lse.data(), targets.data(), kRows, kVp,
                    kValid);
  ExpectClose(dlogits, want_d, 1e-6, 1e-4, "cross_entropy_bwd dominant end class");
}

TEST(CpuKernels, CrossEntropyFwdGpt2VocabularyAccumulatesInDouble) {
  // GPT-2's 50257 classes: summed in fp32, sum exp (~4e4, ulp ~4e-3) drifts by ~1e-5 relative,
  // ~1e-5 in lse (~11); accumulated in double, lse is one fp32 rounding of the exact value.
  constexpr int64_t kRows = 4, kVocab = 50257;
  const VecF logits = Random(kRows * kVocab, 133, -4.0f, 4.0f);
  const auto targets = RandomIndices(kRows, kVocab, 134);
  float loss = 0.0f;
  VecF lse(kRows);
  cross_entropy_fwd(&loss, lse.data(), logits.data(), targets.data(), kRows, kVocab, kVocab);
  VecD rlse;
  const double want = CrossEntropyRef(ToDouble(logits), targets, kRows, kVocab, &rlse);
  ExpectClose(lse, rlse, 0.0, 1.2e-7, "cross_entropy_fwd lse (V=50257)");  // 2^-23
  EXPECT_NEAR(loss, want, 2.4e-7 * std::fabs(want));
}

TEST(CpuKernels, CrossEntropyNoRows) {
  // N = 0 (an empty batch): the kernel defines the mean over no rows as 0, not 0/0 = NaN, and
  // the backward writes nothing.
  float loss = 7.0f, dlogits = 7.0f;
  const float dloss = 1.0f;
  cross_entropy_fwd(&loss, nullptr, nullptr, nullptr, 0, kV, kV);
  EXPECT_EQ(loss, 0.0f);
  cross_entropy_bwd(&dlogits, &dloss, nullptr, nullptr, nullptr, 0, kV, kV);
  EXPECT_EQ(dlogits, 7.0f);
}

// ------------------------------------------------------------------------------------------------
// Optimiser support

TEST(CpuKernels, SumSquares) {
  EXPECT_EQ(sum_squares(nullptr, 0), 0.0);
  const VecF small = {3.0f, -4.0f, 0.5f};
  EXPECT_DOUBLE_EQ(sum_squares(small.data(), 3), 25.25);
  for (int64_t n : {int64_t{17}, int64_t{100001}}) {
    const VecF x = Random(n, 130, -3.0f, 3.0f);
    double want = 0.0;
    for (float v : x) want += static_cast<double>(v) * v;
    // Accumulated in double: agrees with the serial double sum to double rounding.
    EXPECT_NEAR(sum_squares(x.data(), n), want, 1e-12 * want) << "n=" << n;
  }
}

TEST(CpuKernels, AdamWHandComputedStep) {
  // One parameter, step t = 1 from zero moments:
  //   g = 0.5 * grad_scale 2 = 1;  p = 1 * (1 - 0.1 * 0.1) = 0.99
  //   m = 0.1 * 1 = 0.1;  v = 0.001 * 1 = 0.001;  mhat = 0.1 / 0.1 = 1;  vhat = 0.001 / 0.001 = 1
  //   p = 0.99 - 0.1 * 1 / (1 + 1e-8) = 0.89 (to 1e-9)
  float p = 1.0f, g = 0.5f, m = 0.0f, v = 0.0f;
  adamw(&p, &g, &m, &v, 1, 2.0f, 0.1f, 0.9f, 0.999f, 1e-8f, 0.1f, 1);
  EXPECT_NEAR(m, 0.1f, 1e-7f);
  // 0.999f is 0.99900001..., so 1 - beta2 is 0.000999987 in fp32: v carries that 1.3e-5 relative.
  EXPECT_NEAR(v, 0.001f, 2e-8f);
  EXPECT_NEAR(p, 0.89f, 1e-6f);

  // Second step, t = 2, g = -0.25 (scaled -0.5), no weight decay:
  //   m = 0.9 * 0.1 + 0.1 * -0.5 = 0.04;  v = 0.999 * 0.001 + 0.001 * 0.25 = 0.001249
  //   mhat = 0.04 / (1 - 0.81) = 0.210526...;  vhat = 0.001249 / (1 - 0.998001) = 0.624812...
  //   p = 0.89 - 0.1 * 0.210526 / (0.790451 + 1e-8) = 0.863366...
  g = -0.25f;
  adamw(&p, &g, &m, &v, 1, 2.0f, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, 2);
  EXPECT_NEAR(m, 0.04f, 1e-7f);
  EXPECT_NEAR(v, 0.001249f, 3e-8f);
  const double mhat = 0.04 / 0.19, vhat = 0.001249 / 0.001999;
  EXPECT_NEAR(p, 0.89 - 0.1 * mhat / (std::sqrt(vhat) + 1e-8), 2e-6);
}

TEST(CpuKernels, AdamWBiasCorrectionEarlyStepsInDouble) {
  // beta2 = 0.999 at steps 2..10: 1 - beta2^t is ~1e-3..1e-2, so an fp32 beta2^t (one ulp,
  // 6e-8) would put ~1e-5 relative error into vhat and the update. With p = 0, no decay and
  // lr = 1 the new p is minus the update itself, which the kernel gets to a few fp32 ulps.
  const int64_t n = 257;
  const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, gs = 1.0f, lr = 1.0f;
  const VecF g = Random(n, 144), m0 = Random(n, 145, -0.1f, 0.1f), v0 = Random(n, 146, 0.0f, 0.01f);
  for (int64_t t : {int64_t{2}, int64_t{3}, int64_t{10}}) {
    VecF p(n, 0.0f), m(m0), v(v0);
    VecD want(n);
    for (int64_t i = 0; i < n; i++) {
      const double gi = g[i];
      const double mi = b1 * static_cast<double>(m0[i]) + (1.0 - b1) * gi;
      const double vi = b2 * static_cast<double>(v0[i]) + (1.0 - b2) * gi * gi;
      const double mhat = mi / (1.0 - std::pow(static_cast<double>(b1), t));
      const double vhat = vi / (1.0 - std::pow(static_cast<double>(b2), t));
      want[i] = -lr * mhat / (std::sqrt(vhat) + eps);
    }
    adamw(p.data(), g.data(), m.data(), v.data(), n, gs, lr, b1, b2, eps, 0.0f, t);
    ExpectClose(p, want, 1e-9, 2e-6, "adamw update at t=" + std::to_string(t));
  }
}

TEST(CpuKernels, AdamWZeroGradientOnlyDecays) {
  // A parameter whose gradient has been exactly 0 since step 1 (the embedding row of a token
  // not yet seen) keeps m = v = 0; the update mhat / (sqrt(vhat) + eps) is 0 / eps = 0, so p
  // only decays, p (1 - lr wd), and stays finite (without eps it would be 0 / 0).
  const float lr = 1e-3f, wd = 0.1f;
  VecF p = {0.5f, -2.0f, 3.0f}, g(3, 0.0f), m(3, 0.0f), v(3, 0.0f);
  VecD want(p.begin(), p.end());
  for (int64_t t = 1; t <= 3; t++) {
    adamw(p.data(), g.data(), m.data(), v.data(), 3, 1.0f, lr, 0.9f, 0.999f, 1e-8f, wd, t);
    for (double& w : want) w *= 1.0f - lr * wd;  // the kernel's fp32 decay factor
  }
  ExpectClose(p, want, 0.0, 1e-6, "adamw zero gradient");
  ExpectClose(m, VecD(3, 0.0), 0.0, 0.0, "adamw zero gradient m");
  ExpectClose(v, VecD(3, 0.0), 0.0, 0.0, "adamw zero gradient v");
}

TEST(CpuKernels, AdamWVsReference) {
  const int64_t n = 1003;
  const float lr = 3e-4f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.8f;
  const int64_t t = 7;
  VecF p = Random(n, 140), g = Random(n, 141), m = Random(n, 142, -0.1f, 0.1f),
       v = Random(n, 143, 0.0f, 0.01f);
  VecD wp(n), wm(n), wv(n);
  for (int64_t i = 0; i < n; i++) {
    const double gi = static_cast<double>(g[i]) * gs;
    wm[i] = b1 * static_cast<double>(m[i]) + (1.0 - b1) * gi;
    wv[i] = b2 * static_cast<double>(v[i]) + (1.0 - b2) * gi * gi;
    const double mhat = wm[i] / (1.0 - std::pow(static_cast<double>(b1), t));
    const double vhat = wv[i] / (1.0 - std::pow(static_cast<double>(b2), t));
    wp[i] = p[i] * (1.0 - static_cast<double>(lr) * wd) - lr * mhat / (std::sqrt(vhat) + eps);
  }
  adamw(p.data(), g.data(), m.data(), v.data(), n, gs, lr, b1, b2, eps, wd, t);
  ExpectClose(m, wm, 1e-8, 1e-6, "adamw m");
  ExpectClose(v, wv, 1e-10, 1e-6, "adamw v");
  // The update is ~lr = 3e-4 in size, so 1e-7 absolute is fp32 rounding of p itself.
  ExpectClose(p, wp, 1e-7, 1e-6, "adamw p");
}

}  // namespace
}  // namespace kiln::cpu
