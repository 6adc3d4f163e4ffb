#include "runtime/batch_tokens.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/data_loader.h"
#include "runtime/error.h"
#include "runtime/executor.h"
#include "test/unit/module_builder.h"
#include "test/unit/temp_dir_fixture.h"

namespace {

// B = 1, T = 4: a call of next() moves on by s = 4 tokens and reads 5 (inputs and targets), so
// call k in a shard reads positions [4k, 4k + 4].
class BatchTokensTest : public kiln::testing::TempDirTest {
 protected:
  std::string shard(const std::string& name, std::vector<uint16_t> tokens) {
    kiln::write_token_shard(path(name), tokens);
    return path(name);
  }
  // Moves `d` on by `calls` calls of next().
  static void read_calls(kiln::DataLoader& d, int calls) {
    std::vector<int32_t> x(size_t(d.tokens_per_call())), y(x.size());
    for (int k = 0; k < calls; ++k) d.next(x.data(), y.data());
  }
};

// The message check_resident_tokens gives ("" when it finds nothing).
std::string resident_error(const kiln::DataLoader& d, int64_t calls) {
  try {
    kiln::check_resident_tokens(d, 512, calls);
  } catch (const kiln::Error& e) {
    return e.what();
  }
  return "";
}

TEST_F(BatchTokensTest, TheResidentCheckReachesTheLastCallsTarget) {
  // 21 tokens: 5 calls, the last reading [16, 20]; position 20 is only ever a target.
  std::vector<uint16_t> t(21, 5);
  t[20] = 600;
  shard("a.bin", t);
  kiln::DataLoader d(path("a.bin"), 1, 4);
  EXPECT_EQ(resident_error(d, 4), "");  // four calls end at position 16
  EXPECT_NE(resident_error(d, 5).find("a.bin: token 600 at position 20 is not below"), std::string::npos)
      << resident_error(d, 5);
}

TEST_F(BatchTokensTest, TheResidentCheckComesRoundToTheShardsStart) {
  // Two calls in, three are left before the run is back at position 0; the fourth call reads [0, 4].
  std::vector<uint16_t> t(21, 5);
  t[1] = 600;
  shard("a.bin", t);
  kiln::DataLoader d(path("a.bin"), 1, 4);
  read_calls(d, 2);
  ASSERT_EQ(d.position(), 8);
  EXPECT_EQ(resident_error(d, 3), "");
  EXPECT_NE(resident_error(d, 4).find("a.bin: token 600 at position 1 is not below"), std::string::npos)
      << resident_error(d, 4);
}

TEST_F(BatchTokensTest, ShardsAheadAreScannedAsFarAsTheRunReads) {
  shard("d_000.bin", std::vector<uint16_t>(21, 5));  // 5 calls
  shard("d_001.bin", std::vector<uint16_t>(41, 5));  // 10 calls
  kiln::DataLoader d(path("d_*.bin"), 1, 4);
  // Resumed at step 3 of 10: 7 calls, the last 2 in d_001, reading its positions [0, 8].
  std::vector<kiln::TokenScan::Shard> s = kiln::shards_to_scan(d, 3, 10, 1, nullptr, 0);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].path, path("d_001.bin"));
  EXPECT_EQ(s[0].tokens, 9);
  // Call 5 (step 9) reads [0, 4], call 6 (step 10) [4, 8]: a position on a boundary is first read
  // by the call that ends there (as a target).
  EXPECT_EQ(s[0].reader(0), "step 9");
  EXPECT_EQ(s[0].reader(4), "step 9");
  EXPECT_EQ(s[0].reader(5), "step 10");
  EXPECT_EQ(s[0].reader(8), "step 10");
  // With two micro-steps a step: 14 calls, 9 of them in d_001 ([0, 36]); call 5 is in step 6.
  s = kiln::shards_to_scan(d, 3, 10, 2, nullptr, 0);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].tokens, 37);
  EXPECT_EQ(s[0].reader(4), "step 6");
  EXPECT_EQ(s[0].reader(8), "step 7");
  // A run reaching past the shard's end reads all of it but the tail no call reads.
  shard("e_000.bin", std::vector<uint16_t>(21, 5));
  shard("e_001.bin", std::vector<uint16_t>(43, 5));  // 10 calls: positions 41 and 42 are never read
  kiln::DataLoader e(path("e_*.bin"), 1, 4);
  s = kiln::shards_to_scan(e, 0, 100, 1, nullptr, 0);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].tokens, 41);
}

// Of the shard held now, only the positions the remaining calls read: none when no call is left;
// from the position on, and the bad token named at its own position; the shard's start only when
// a call comes back to it; never its tail, which no call reads.
TEST_F(BatchTokensTest, TheResidentCheckReadsOnlyWhatTheCallsRead) {
  std::vector<uint16_t> t(23, 5);  // 5 calls read [0, 20]: positions 21 and 22 are never read
  t[0] = 600;
  t[8] = 601;  // the position the next call starts at
  t[22] = 602;
  shard("a.bin", t);
  kiln::DataLoader d(path("a.bin"), 1, 4);
  read_calls(d, 2);
  ASSERT_EQ(d.position(), 8);
  EXPECT_EQ(resident_error(d, 0), "");
  EXPECT_NE(resident_error(d, 1).find("a.bin: token 601 at position 8 is not below"), std::string::npos)
      << resident_error(d, 1);
  t[8] = 5;
  shard("b.bin", t);
  kiln::DataLoader e(path("b.bin"), 1, 4);
  read_calls(e, 2);
  // Three calls end this pass at position 20; position 0 is read by the fourth.
  EXPECT_EQ(resident_error(e, 3), "");
  EXPECT_NE(resident_error(e, 4).find("b.bin: token 600 at position 0 is not below"), std::string::npos)
      << resident_error(e, 4);
  // Many passes over the shard still never read its tail.
  t[0] = 5;
  shard("c.bin", t);
  kiln::DataLoader f(path("c.bin"), 1, 4);
  EXPECT_EQ(resident_error(f, 1000), "");
}

// A shard the next call leaves (its last call done) is checked only once the run comes back to it.
TEST_F(BatchTokensTest, AShardTheNextCallLeavesIsCheckedFromItsStartOnly) {
  std::vector<uint16_t> t(21, 5);
  t[1] = 600;
  shard("d_000.bin", t);
  shard("d_001.bin", std::vector<uint16_t>(21, 5));
  kiln::DataLoader d(path("d_*.bin"), 1, 4);
  read_calls(d, 5);
  ASSERT_EQ(d.resident_shard(), 0u);
  ASSERT_EQ(d.shard(), 1u);
  EXPECT_EQ(resident_error(d, 5), "");  // d_001's 5 calls
  EXPECT_NE(resident_error(d, 6).find("d_000.bin: token 600 at position 1 is not below"), std::string::npos)
      << resident_error(d, 6);
}

// Validation shards come first, scanned as far as an evaluation's calls read them.
TEST_F(BatchTokensTest, ValidationShardsAreScannedAsFarAsAnEvaluationReads) {
  shard("d_000.bin", std::vector<uint16_t>(21, 5));
  shard("v_000.bin", std::vector<uint16_t>(21, 5));  // 5 calls
  shard("v_001.bin", std::vector<uint16_t>(41, 5));  // first read by call 5
  kiln::DataLoader d(path("d_000.bin"), 1, 4), v(path("v_*.bin"), 1, 4);
  std::vector<kiln::TokenScan::Shard> s = kiln::shards_to_scan(d, 0, 1, 1, &v, 6);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].path, path("v_001.bin"));
  EXPECT_EQ(s[0].tokens, 5);  // one call: [0, 4]
  EXPECT_EQ(s[0].reader(3), "each evaluation (--val-data)");
  EXPECT_TRUE(kiln::shards_to_scan(d, 0, 1, 1, &v, 5).empty());
}

// next_batch: the batch in the executor's idx and targets (the test module's B = 1, T = 8), and an
// id the model has no embedding for (vocabulary 8 here) named with its shard and position: an
// input at its own position, a target at the next one, each rank's from where its batch starts.
TEST_F(BatchTokensTest, NextBatchNamesAnIdOutsideTheVocabulary) {
  using namespace kiln::testing;
  const auto I32 = kiln::fb::DType::I32;
  kiln::Module m = kiln::Module::from_bytes(
      build({{"idx", K::Input, I32, {1, 8}}, {"targets", K::Input, I32, {1, 8}}, {"a", K::Input, kiln::fb::DType::F32, {8}},
             {"out", K::Activation, kiln::fb::DType::F32, {8}}},
            {{"forward", {{O::Add, {2, 2}, {3}, {8}}}, 3}}),  // (a program the executor can load)
      "ids.kiln");
  kiln::Executor ex(m);
  auto error = [&](std::vector<uint16_t> tokens, int rank = 0) {
    tokens.resize(9 + 8 * size_t(rank), 1);
    shard("s.bin", tokens);
    kiln::DataLoader d(path("s.bin"), 1, 8, rank, rank + 1);
    try {
      kiln::next_batch(ex, d, 8, 8);
    } catch (const kiln::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  auto said = [&](int token, int position) {
    return path("s.bin") + ": token " + std::to_string(token) + " at position " + std::to_string(position) +
           " is not below the model's vocabulary size 8 (data for another tokenizer?)";
  };
  EXPECT_EQ(error({1, 2, 3, 4, 5, 6, 7, 0, 7}), "");
  EXPECT_EQ(std::vector<int32_t>(ex.input("idx"), ex.input("idx") + 8), (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 0}));
  EXPECT_EQ(std::vector<int32_t>(ex.input("targets"), ex.input("targets") + 8), (std::vector<int32_t>{2, 3, 4, 5, 6, 7, 0, 7}));
  EXPECT_EQ(error({8}), said(8, 0));                          // the first input; 8 is the first id past
  EXPECT_EQ(error({1, 2, 3, 4, 5, 6, 7, 0, 9}), said(9, 8));  // the last target only
  EXPECT_EQ(error({1, 2, 9}), said(9, 2));                    // an input (and the target before it)
  EXPECT_EQ(error({9, 10}), said(9, 0));                      // input and target both: the input first
  // Rank 1 of 2 reads [8, 16]; its first token's position is 8 + 0.
  EXPECT_EQ(error({0, 0, 0, 0, 0, 0, 0, 0, 12}, 1), said(12, 8));
}

TEST(MicroStepsLeft, CountsFromTheFirstStepAndSaturates) {
  EXPECT_EQ(kiln::micro_steps_left(10, 3, 2), 14);
  EXPECT_EQ(kiln::micro_steps_left(10, 10, 4), 0);
  EXPECT_EQ(kiln::micro_steps_left(INT64_MAX, 0, 2), INT64_MAX);
}

}  // namespace
