// plan_prefill: the calls that read a prompt into the key/value caches.
#include <gtest/gtest.h>

#include "runtime/sampler.h"

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
}  // namespace
