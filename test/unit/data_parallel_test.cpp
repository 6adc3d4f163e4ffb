// The gradient bucket plan (plan_buckets, BucketPlan::owned) at its edges, and the buckets the
// compiler placed in micro_step as module_buckets reads them, damaged modules included.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "runtime/data_parallel.h"
#include "runtime/error.h"
#include "test/unit/error_of.h"
#include "test/unit/module_builder.h"

namespace kiln {
namespace {

using namespace kiln::testing;

TEST(BucketPlan, AParameterEndingAtAPieceBoundaryIsNoneOfTheNextRanks) {
  // One bucket [p1 p0] of 8 elements, pieces 4 and 4: p1 is rank 0's whole piece, p0 rank 1's.
  BucketPlan plan = plan_buckets({4, 4}, 1 << 20, 2, 1);
  EXPECT_EQ(plan.owned(1, 0), std::make_pair(int64_t(0), int64_t(4)));
  EXPECT_EQ(plan.owned(1, 1), std::make_pair(int64_t(0), int64_t(0)));
  EXPECT_EQ(plan.owned(0, 0), std::make_pair(int64_t(0), int64_t(0)));
  EXPECT_EQ(plan.owned(0, 1), std::make_pair(int64_t(0), int64_t(4)));
}

TEST(BucketPlan, AnEmptyParameterOpensNoBucketOfItsOwn) {
  // From the last: p1 (no elements) starts a bucket, and p0, larger than a bucket, joins it
  // rather than leaving it empty of elements.
  BucketPlan plan = plan_buckets({50, 0}, 100, 1);
  ASSERT_EQ(plan.buckets.size(), 1u);
  EXPECT_EQ(plan.buckets[0].params, std::vector<size_t>({1, 0}));
}

TEST(BucketPlan, RefusesWhatNoCallerShouldPass) {
  using Groups = std::vector<std::vector<size_t>>;
  const std::vector<int64_t> sizes = {4};
  EXPECT_EQ(error_of([&] { plan_buckets(Groups{{0}}, sizes, 0, 64); }), "plan_buckets: world size 0");
  EXPECT_EQ(error_of([&] { plan_buckets(Groups{{0}}, sizes, 2, 0); }), "plan_buckets: alignment 0");
  EXPECT_EQ(error_of([&] { plan_buckets(Groups{{0, 1}}, sizes, 2, 64); }), "plan_buckets: parameter 1 out of range");
  EXPECT_EQ(error_of([&] { plan_buckets(Groups{{0}}, sizes, 1, 1); }), "(no error)");
}

// A module of three parameters whose micro_step holds the given ReduceGradients (their inputs,
// their bucket numbers), as kilnc places them in the backward pass.
Module bucket_module(const std::vector<std::pair<std::vector<uint32_t>, int64_t>>& reduces) {
  const auto F = fb::DType::F32, I = fb::DType::I32;
  std::vector<Buf> bufs;
  for (const char* p : {"a", "b", "c"})
    for (K k : {K::Parameter, K::Gradient, K::AdamM, K::AdamV}) bufs.push_back({p, k, F, {64}});
  bufs.push_back({"idx", K::Input, I, {1, 8}});      // 12
  bufs.push_back({"targets", K::Input, I, {1, 8}});  // 13
  bufs.push_back({"loss", K::Activation, F, {1}});   // 14
  std::vector<Ins> step;
  for (const auto& [grads, number] : reduces) step.push_back({O::ReduceGradients, grads, {}, {number, 256}});
  step.push_back({O::GlobalNorm, {1}, {14}, {64}});
  return Module::from_bytes(build(bufs, {{"micro_step", step, 14}}, {{"a", 0, 1, 2, 3}, {"b", 4, 5, 6, 7}, {"c", 8, 9, 10, 11}}),
                            "buckets.kiln");
}

TEST(BucketPlan, TheCompilersBucketsAndALastOneForParametersWithoutGradient) {
  bool compiled = false;
  // c's gradient, then b's; a is in no bucket (the loss does not reach it): it joins a last one.
  BucketPlan plan = module_buckets(bucket_module({{{9}, 0}, {{5}, 1}}), 2, 1 << 20, &compiled);
  EXPECT_TRUE(compiled);
  ASSERT_EQ(plan.buckets.size(), 3u);
  EXPECT_EQ(plan.buckets[0].params, std::vector<size_t>({2}));
  EXPECT_EQ(plan.buckets[1].params, std::vector<size_t>({1}));
  EXPECT_EQ(plan.buckets[2].params, std::vector<size_t>({0}));
  // Without ReduceGradients: buckets of --bucket-mb, from the last parameter.
  plan = module_buckets(bucket_module({}), 2, 1 << 20, &compiled);
  EXPECT_FALSE(compiled);
  ASSERT_EQ(plan.buckets.size(), 1u);
  EXPECT_EQ(plan.buckets[0].params, std::vector<size_t>({2, 1, 0}));
}

TEST(BucketPlan, ADamagedModulesBucketsAreNamed) {
  EXPECT_EQ(error_of([] { module_buckets(bucket_module({{{9}, 1}, {{5}, 0}}), 2, 1 << 20); }),
            "buckets.kiln: ReduceGradients buckets are not numbered in program order");
  EXPECT_EQ(error_of([] { module_buckets(bucket_module({{{9}, 0}, {{4}, 1}}), 2, 1 << 20); }),
            "buckets.kiln: a ReduceGradients instruction reads a buffer that is no gradient");
  EXPECT_EQ(error_of([] { module_buckets(bucket_module({{{9, 1}, 0}, {{1}, 1}}), 2, 1 << 20); }),
            "buckets.kiln: parameter 0 is in two gradient buckets");
}

}  // namespace
}  // namespace kiln
