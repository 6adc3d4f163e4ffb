// plan_prefill: the calls that read a prompt into the key/value caches, at prefill_cost's prices.
// pick_token: one draw of top-k (and top-p) sampling, whose frequencies must follow the softmax.
// check_sample_size and sample_string: the sampler's bounds and its text of ids.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <limits>

#include "runtime/error.h"
#include "runtime/sampler.h"
#include "test/unit/param_module.h"

namespace {
using Plan = std::vector<size_t>;

// gpt2-mini's prices ({M, cost in @decode calls}: prefill_cost of @prefill and @prefill_short).
const std::vector<std::pair<int64_t, int64_t>> kMini = {{64, 3}, {16, 2}};

TEST(PlanPrefill, ShortPromptsTakeTheShortProgram) {
  EXPECT_EQ(kiln::plan_prefill(0, kMini), Plan{});
  EXPECT_EQ(kiln::plan_prefill(1, kMini), Plan{});      // one @decode call (1) beats any prefill call (2)
  EXPECT_EQ(kiln::plan_prefill(2, kMini), Plan{1});     // a tie goes to the prefill call
  EXPECT_EQ(kiln::plan_prefill(15, kMini), Plan{1});
  EXPECT_EQ(kiln::plan_prefill(16, kMini), Plan{1});
  EXPECT_EQ(kiln::plan_prefill(17, kMini), Plan{1});    // 16 + one @decode call (3) ties with 64: the smaller
  EXPECT_EQ(kiln::plan_prefill(18, kMini), Plan{0});    // 3 < 2 + 2
  EXPECT_EQ(kiln::plan_prefill(65, kMini), Plan{0});    // 64 + one @decode call: 4 < 3 + 2
  EXPECT_EQ(kiln::plan_prefill(66, kMini), (Plan{0, 1})); // 5, a tie with 64 + two @decode calls
  EXPECT_EQ(kiln::plan_prefill(99, kMini), (Plan{0, 0}));
}

TEST(PlanPrefill, MixesCallsByPrice) {
  // Dearer calls (a CPU model whose layers outweigh its head): 26 and 7 @decode calls.
  const std::vector<std::pair<int64_t, int64_t>> p = {{64, 26}, {16, 7}};
  EXPECT_EQ(kiln::plan_prefill(6, p), Plan{});
  EXPECT_EQ(kiln::plan_prefill(7, p), Plan{1});
  EXPECT_EQ(kiln::plan_prefill(40, p), (Plan{1, 1, 1}));  // 21 < 26
  EXPECT_EQ(kiln::plan_prefill(63, p), Plan{0});          // 26 < 28
  EXPECT_EQ(kiln::plan_prefill(70, p), Plan{0});          // 64 + 6 @decode calls: 32 < 33
  EXPECT_EQ(kiln::plan_prefill(71, p), (Plan{0, 1}));     // 33
  EXPECT_EQ(kiln::plan_prefill(140, p), (Plan{0, 0, 1})); // the larger calls first
}

TEST(PlanPrefill, EqualPricesFavourTheSmallerCall) {
  // Both at the floor of 2 (a GPU, or a small model): 16 positions need not pad to 64.
  const std::vector<std::pair<int64_t, int64_t>> p = {{64, 2}, {16, 2}};
  EXPECT_EQ(kiln::plan_prefill(2, p), Plan{1});
  EXPECT_EQ(kiln::plan_prefill(16, p), Plan{1});
  EXPECT_EQ(kiln::plan_prefill(17, p), Plan{0});  // one call of 64 (2) beats 16 + one @decode call (3)
  EXPECT_EQ(kiln::plan_prefill(80, p), (Plan{0, 1}));
}

TEST(PlanPrefill, OneProgramIsUsedOnceItsPriceIsMet) {
  // With @prefill alone, a call serves once as many positions are left as it costs.
  const std::vector<std::pair<int64_t, int64_t>> p = {{64, 26}};
  EXPECT_EQ(kiln::plan_prefill(25, p), Plan{});
  EXPECT_EQ(kiln::plan_prefill(26, p), Plan{0});
  EXPECT_EQ(kiln::plan_prefill(89, p), Plan{0});
  EXPECT_EQ(kiln::plan_prefill(90, p), (Plan{0, 0}));
  EXPECT_EQ(kiln::plan_prefill(1000, {}), Plan{});
}

// Listed smaller first: a tie still goes to the call of fewer positions.
TEST(PlanPrefill, EqualPricesFavourTheSmallerCallInEitherOrder) {
  const std::vector<std::pair<int64_t, int64_t>> p = {{16, 2}, {64, 2}};
  EXPECT_EQ(kiln::plan_prefill(2, p), Plan{0});
  EXPECT_EQ(kiln::plan_prefill(17, p), Plan{1});
}

// A prefill call's price in @decode calls: its FLOPs (2 B M a position's layer weights, the
// embeddings aside) over what a @decode call reads (every weight but wpe's one row: 4 bytes each,
// 2 for a bf16 compute copy) times the device's FLOPs per byte (a CPU: 10, 20 in bf16), rounded
// up and kept in [2, M]. param_module's parameters: wte [16, 4] (64 values), c_attn [4, 12] (48),
// ln_f [4] (4).
TEST(PrefillCost, FlopsOverTheBytesADecodeCallReads) {
  using kiln::testing::ModelSpec;
  auto cost = [](const ModelSpec& spec, int64_t M) {
    return kiln::prefill_cost(kiln::Module::from_bytes(kiln::testing::param_module(spec), "p.kiln"), M);
  };
  ModelSpec fp32;
  EXPECT_EQ(cost(fp32, 1000), 23);  // 2 * 1000 * 52 / (116 * 4 * 10) = 22.4
  EXPECT_EQ(cost(fp32, 10), 2);     // 0.22: at least 2
  ModelSpec bf16;
  bf16.precision = "bf16";
  bf16.compute_copy = true;         // wte's: 2 bytes a value
  EXPECT_EQ(cost(bf16, 1000), 16);  // 104000 / ((64 * 2 + 52 * 4) * 20) = 15.5
  ModelSpec wide;
  wide.batch_size = 1000;
  EXPECT_EQ(cost(wide, 3), 3);      // 67: at most M
}

// The sampler keeps at most 2^31 tokens (the samples' prompts and new tokens), and says how many
// were asked for.
TEST(CheckSampleSize, AtMost2To31Tokens) {
  auto error = [](int64_t prompt, int64_t new_tokens, int64_t samples) {
    kiln::SampleOptions o;
    o.max_new_tokens = new_tokens;
    o.num_samples = samples;
    try {
      kiln::check_sample_size(prompt, o, "sample: ");
    } catch (const kiln::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error(1, (int64_t(1) << 31), 1),
            "sample: 1 sample of 1 + 2147483648 tokens are more than the 2^31 tokens the sampler keeps");
  EXPECT_EQ(error(1, (int64_t(1) << 30), 2),
            "sample: 2 samples of 1 + 1073741824 tokens are more than the 2^31 tokens the sampler keeps");
  // Exactly 2^31 is not refused for its count (8 GiB of ids: a small machine may refuse it for memory).
  EXPECT_EQ(error(1, (int64_t(1) << 30) - 1, 2).find("2^31"), std::string::npos);
  EXPECT_EQ(error(5, 64, 3), "");
}

// Samples that would take more than half the memory the process may use (here ulimit -v 4 GiB,
// set in a child) are refused before sampling starts: 2.2 GiB of ids is.
[[noreturn]] void check_under_4_gib(int64_t new_tokens) {
  const rlimit as{rlim_t(4) << 30, rlim_t(4) << 30};
  if (::setrlimit(RLIMIT_AS, &as) != 0) ::_exit(2);
  kiln::SampleOptions o;
  o.max_new_tokens = new_tokens;
  try {
    kiln::check_sample_size(1, o, "sample: ");
  } catch (const kiln::Error& e) {
    std::fputs(e.what(), stderr);
    ::_exit(1);
  }
  ::_exit(0);
}

TEST(CheckSampleSizeDeathTest, MoreThanHalfTheMemoryIsRefused) {
  EXPECT_EXIT(check_under_4_gib(600000000), ::testing::ExitedWithCode(1),
              "sample: 1 sample of 1 \\+ 600000000 tokens need 2.2 GiB, more than half of the 4.0 GiB this process may use");
  EXPECT_EXIT(check_under_4_gib(400000000), ::testing::ExitedWithCode(0), "");  // 1.5 GiB
}

TEST(SampleString, IdsSeparatedBySpacesUnlessThereIsText) {
  EXPECT_EQ(kiln::sample_string({5, 6, 7}, nullptr), "5 6 7");
  EXPECT_EQ(kiln::sample_string({5}, nullptr), "5");
  EXPECT_EQ(kiln::sample_string({5, 6}, [](const std::vector<int32_t>& ids) { return std::to_string(ids.size()) + " ids"; }),
            "2 ids");
}

// Draws n tokens from `row` and returns how often each id came up.
std::vector<int64_t> draw_counts(const std::vector<float>& row, int64_t k, float temperature, int64_t n, uint64_t seed,
                                 double top_p = 1.0) {
  kiln::Rng rng{seed};
  std::vector<int32_t> order;
  std::vector<double> weights;
  std::vector<int64_t> counts(row.size(), 0);
  for (int64_t i = 0; i < n; ++i) ++counts[size_t(kiln::pick_token(row, k, temperature, top_p, rng, order, weights))];
  return counts;
}

// The top-k softmax at the temperature, as the sampler must draw from it (ids outside the k: 0).
std::vector<double> expected_p(const std::vector<float>& row, const std::vector<int>& top, float temperature) {
  std::vector<double> p(row.size(), 0.0);
  double sum = 0;
  for (int id : top) sum += p[size_t(id)] = std::exp(double(row[size_t(id)]) / temperature);
  for (double& x : p) x /= sum;
  return p;
}

// Each count within 5 standard deviations of n*p (a fixed seed: the test cannot flake; a wrong
// temperature, k or running sum moves some count by far more than that), and the ids outside the
// top k never drawn.
void expect_follows(const std::vector<int64_t>& counts, const std::vector<double>& p, int64_t n) {
  for (size_t id = 0; id < p.size(); ++id) {
    if (p[id] == 0) {
      EXPECT_EQ(counts[id], 0) << "id " << id << " is outside the top k";
      continue;
    }
    const double mean = double(n) * p[id], sd = std::sqrt(double(n) * p[id] * (1 - p[id]));
    EXPECT_NEAR(double(counts[id]), mean, 5 * sd) << "id " << id << " (p = " << p[id] << ")";
  }
}

// Ids 1, 3, 4 and 0 are the top four; 3 and 4 tie; 2 (-infinity) can never come up.
const std::vector<float> kRow = {1.0f, 3.0f, -INFINITY, 2.0f, 2.0f, 0.5f, -1.0f, 0.0f};

TEST(PickToken, FollowsTheTopKSoftmaxAtTheTemperature) {
  const int64_t n = 200000;
  expect_follows(draw_counts(kRow, 4, 0.8f, n, 7), expected_p(kRow, {1, 3, 4, 0}, 0.8f), n);
  expect_follows(draw_counts(kRow, 4, 2.5f, n, 8), expected_p(kRow, {1, 3, 4, 0}, 2.5f), n);
  // k = V: every finite logit can come up (the sampler's top_k = 0).
  expect_follows(draw_counts(kRow, 8, 1.0f, n, 9), expected_p(kRow, {0, 1, 3, 4, 5, 6, 7}, 1.0f), n);
}

TEST(PickToken, TheCutAtKKeepsTheLowerIdOfATie) {
  // k = 2 takes 1 and, of the tied 3 and 4, 3.
  const int64_t n = 100000;
  expect_follows(draw_counts(kRow, 2, 1.0f, n, 10), expected_p(kRow, {1, 3}, 1.0f), n);
  // k = 1 is greedy.
  EXPECT_EQ(draw_counts(kRow, 1, 1.0f, 1000, 11)[1], 1000);
}

TEST(PickToken, AColdTemperatureSplitsOnlyBetweenTies) {
  // At 0.01 the gap of 1 between logits is a factor of e^100: 1 alone comes up; with 1 removed
  // from the top (k = 3 of a row where 3 and 4 lead), the tie splits evenly.
  EXPECT_EQ(draw_counts(kRow, 4, 0.01f, 1000, 12)[1], 1000);
  std::vector<float> row = kRow;
  row[1] = -5.0f;
  const int64_t n = 100000;
  const std::vector<int64_t> counts = draw_counts(row, 3, 0.01f, n, 13);
  EXPECT_EQ(counts[3] + counts[4], n);
  EXPECT_NEAR(double(counts[3]), n / 2.0, 5 * std::sqrt(n / 4.0));
}

TEST(PickToken, ATemperatureBelow1e6IsNotRaisedTo1e6) {
  // Two logits one float step apart (1.2e-7): at 1e-9 the lower has weight e^-119, so every draw is
  // the larger; at 1e-6 (a floor the sampler once applied) the lower came up 47% of the time.
  const std::vector<float> row = {2.0f, std::nextafter(2.0f, 0.0f)};
  EXPECT_EQ(draw_counts(row, 2, 1e-9f, 1000, 14)[0], 1000);
  // The smallest positive float is a temperature too: no NaN, the largest logit alone.
  EXPECT_EQ(draw_counts(row, 2, std::numeric_limits<float>::denorm_min(), 1000, 15)[0], 1000);
}

TEST(PickToken, TopPKeepsTheFewestMostLikelyThatReachP) {
  // At temperature 1 the top four of kRow (1; 3 and 4 tied; 0) have probabilities about 0.49,
  // 0.18, 0.18 and 0.07 among the seven finite logits: p 0.5 keeps 1 and 3 (0.49 falls short;
  // the tie is cut at the lower id), p 0.7 adds 4 (1 and 3 hold 0.68), p 0.45 keeps 1 alone.
  const int64_t n = 100000;
  expect_follows(draw_counts(kRow, 8, 1.0f, n, 16, 0.5), expected_p(kRow, {1, 3}, 1.0f), n);
  expect_follows(draw_counts(kRow, 8, 1.0f, n, 17, 0.7), expected_p(kRow, {1, 3, 4}, 1.0f), n);
  EXPECT_EQ(draw_counts(kRow, 8, 1.0f, 1000, 18, 0.45)[1], 1000);
  // The nucleus is taken among the top k: with k 2 the two hold all the mass, and p 0.8 of it
  // (0.48 / 0.66 = 0.73 is short) keeps both.
  expect_follows(draw_counts(kRow, 2, 1.0f, n, 19, 0.8), expected_p(kRow, {1, 3}, 1.0f), n);
  // At a hot temperature the same p reaches further down.
  expect_follows(draw_counts(kRow, 8, 4.0f, n, 20, 0.5), expected_p(kRow, {1, 3, 4}, 4.0f), n);
  // p 1 is no cut: the same draws as without one, and a p just below 1 keeps every finite logit.
  EXPECT_EQ(draw_counts(kRow, 8, 1.0f, 1000, 21, 1.0), draw_counts(kRow, 8, 1.0f, 1000, 21));
  expect_follows(draw_counts(kRow, 8, 1.0f, n, 22, 0.999999), expected_p(kRow, {0, 1, 3, 4, 5, 6, 7}, 1.0f), n);
  // Candidates whose weight before them reaches p exactly are cut: of four equal logits, p 0.5
  // keeps two.
  const std::vector<int64_t> four = draw_counts({0.0f, 0.0f, 0.0f, 0.0f}, 4, 1.0f, 1000, 24, 0.5);
  EXPECT_EQ(four[0] + four[1], 1000);
  // However small p is, the most likely token stays.
  EXPECT_EQ(draw_counts(kRow, 8, 1.0f, 1000, 23, 1e-300)[1], 1000);
}

TEST(PickToken, DrawsAreTheSameForASeed) {
  const std::vector<int64_t> a = draw_counts(kRow, 4, 1.0f, 1000, 99), b = draw_counts(kRow, 4, 1.0f, 1000, 99);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, draw_counts(kRow, 4, 1.0f, 1000, 100));
}
}  // namespace
