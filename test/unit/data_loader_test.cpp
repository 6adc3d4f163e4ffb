#include "runtime/data_loader.h"

#include <cstdint>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "runtime/error.h"
#include "test/unit/temp_dir_fixture.h"

namespace fs = std::filesystem;

namespace {

// Tokens first, first + 1, ..., first + n - 1.
std::vector<uint16_t> iota(uint16_t first, size_t n) {
  std::vector<uint16_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<int32_t> iota32(int32_t first, size_t n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

class DataLoaderTest : public kiln::testing::TempDirTest {
 protected:

  std::string shard(const std::string& name, const std::vector<uint16_t>& tokens) {
    kiln::write_token_shard(path(name), tokens);
    return path(name);
  }

  // A shard with a hand-made header and `n` tokens actually present.
  std::string raw_shard(const std::string& name, int32_t magic, int32_t version, int32_t count,
                        size_t n) {
    std::vector<int32_t> header(256, 0);
    header[0] = magic, header[1] = version, header[2] = count;
    std::vector<uint16_t> tokens = iota(0, n);
    std::ofstream f(path(name), std::ios::binary);
    f.write(reinterpret_cast<const char*>(header.data()), 1024);
    f.write(reinterpret_cast<const char*>(tokens.data()), 2 * n);
    return path(name);
  }
};

// `stmt` must throw kiln::Error: one line containing every given part.
#define EXPECT_KILN_ERROR(stmt, ...)                                                \
  do {                                                                              \
    try {                                                                           \
      stmt;                                                                         \
      ADD_FAILURE() << "no kiln::Error from " #stmt;                                \
    } catch (const kiln::Error& e) {                                                \
      const std::string msg = e.what();                                             \
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;                          \
      for (const std::string& part : std::vector<std::string>{__VA_ARGS__})         \
        EXPECT_NE(msg.find(part), std::string::npos) << part << " not in: " << msg; \
    }                                                                               \
  } while (0)

// One next() call, returned as (x, y).
std::pair<std::vector<int32_t>, std::vector<int32_t>> step(kiln::DataLoader& dl, size_t n) {
  std::vector<int32_t> x(n), y(n);
  dl.next(x.data(), y.data());
  return {x, y};
}

TEST_F(DataLoaderTest, SequenceOverTwoShardsWrapsAround) {
  shard("train_001.bin", iota(200, 8));   // one step of B*T + 1 = 7 fits
  shard("train_000.bin", iota(100, 13));  // two steps fit
  shard("val_000.bin", iota(900, 50));    // not matched
  kiln::DataLoader dl(path("train_*.bin"), /*B=*/2, /*T=*/3);
  ASSERT_EQ(dl.files(), (std::vector<std::string>{path("train_000.bin"), path("train_001.bin")}));
  EXPECT_EQ(dl.tokens_in_current_shard(), 13);

  auto [x1, y1] = step(dl, 6);
  EXPECT_EQ(x1, iota32(100, 6));
  EXPECT_EQ(y1, iota32(101, 6));
  EXPECT_EQ(dl.shard(), 0u);
  EXPECT_EQ(dl.position(), 6);

  auto [x2, y2] = step(dl, 6);  // uses the shard's last token as the final target
  EXPECT_EQ(x2, iota32(106, 6));
  EXPECT_EQ(y2, iota32(107, 6));
  EXPECT_EQ(dl.shard(), 1u);  // 12 + 7 > 13: next shard
  EXPECT_EQ(dl.position(), 0);
  EXPECT_EQ(dl.resident_shard(), 0u);  // read by the next call
  EXPECT_EQ(dl.tokens_in_current_shard(), 13);

  auto [x3, y3] = step(dl, 6);
  EXPECT_EQ(dl.resident_shard(), 1u);
  EXPECT_EQ(dl.tokens_in_current_shard(), 8);
  EXPECT_EQ(x3, iota32(200, 6));
  EXPECT_EQ(y3, iota32(201, 6));
  EXPECT_EQ(dl.shard(), 0u);  // wrapped around
  EXPECT_EQ(dl.position(), 0);

  auto [x4, y4] = step(dl, 6);
  EXPECT_EQ(x4, x1);
  EXPECT_EQ(y4, y1);

  dl.reset();
  EXPECT_EQ(step(dl, 6).first, x1);
}

// One pass over the shards (an evaluation) reads each once: the pass's last batch does not read
// shard 0 again for a batch nobody asks for. The shard after is read when a batch needs it.
TEST_F(DataLoaderTest, APassReadsNoShardItDoesNotUse) {
  shard("v_0.bin", iota(0, 13));    // two batches of 6 (+1)
  shard("v_1.bin", iota(100, 8));   // one batch
  kiln::DataLoader dl(path("v_*.bin"), 2, 3);
  step(dl, 6);
  step(dl, 6);
  fs::remove(path("v_0.bin"));      // read already; the pass must not need it again
  EXPECT_EQ(step(dl, 6).first, iota32(100, 6));
  EXPECT_EQ(dl.shard(), 0u);        // where a checkpoint resumes
  EXPECT_EQ(dl.position(), 0);
  EXPECT_KILN_ERROR(step(dl, 6), path("v_0.bin"), "open");  // a batch past the pass reads it
  EXPECT_EQ(dl.shard(), 0u);        // a failed read leaves the loader as it was
  EXPECT_EQ(dl.resident_shard(), 1u);
  shard("v_0.bin", iota(0, 13));
  EXPECT_EQ(step(dl, 6).first, iota32(0, 6));

  // A seek or a reset in between lands where it says, whatever the next call would have read.
  step(dl, 6);  // shard 0's last batch: shard 1 is next
  dl.seek(0, 6);
  EXPECT_EQ(step(dl, 6).first, iota32(6, 6));
  dl.reset();
  EXPECT_EQ(step(dl, 6).first, iota32(0, 6));
}

// The shards the next calls read besides the resident one, with the call that first reads each.
TEST_F(DataLoaderTest, ShardsAheadInTheOrderTheyAreRead) {
  shard("w_0.bin", iota(0, 13));  // 2 batches of 6 (+1)
  shard("w_1.bin", iota(0, 8));   // 1
  shard("w_2.bin", iota(0, 20));  // 3
  using Ahead = std::vector<std::pair<size_t, int64_t>>;
  kiln::DataLoader dl(path("w_*.bin"), 2, 3);
  EXPECT_EQ(dl.shards_ahead(0), Ahead{});
  EXPECT_EQ(dl.shards_ahead(2), Ahead{});
  EXPECT_EQ(dl.shards_ahead(3), (Ahead{{1, 2}}));
  EXPECT_EQ(dl.shards_ahead(4), (Ahead{{1, 2}, {2, 3}}));
  EXPECT_EQ(dl.shards_ahead(1000), (Ahead{{1, 2}, {2, 3}}));  // shard 0 is resident: checked
  step(dl, 6);
  step(dl, 6);  // shard 1 is next, shard 0 still resident
  EXPECT_EQ(dl.shards_ahead(1), (Ahead{{1, 0}}));
  EXPECT_EQ(dl.shards_ahead(1000), (Ahead{{1, 0}, {2, 1}}));
  dl.seek(2, 6);  // a resume: 2 batches left in shard 2
  EXPECT_EQ(dl.shards_ahead(2), Ahead{});
  EXPECT_EQ(dl.shards_ahead(1000), (Ahead{{0, 2}, {1, 4}}));
  kiln::DataLoader one(path("w_2.bin"), 2, 3);
  EXPECT_EQ(one.shards_ahead(1000), Ahead{});
}

TEST_F(DataLoaderTest, SingleShardWrapsOntoItself) {
  shard("only.bin", iota(0, 10));
  kiln::DataLoader dl(path("only.bin"), 1, 4);  // step 4, needs 5
  EXPECT_EQ(step(dl, 4).first, iota32(0, 4));
  EXPECT_EQ(step(dl, 4).first, iota32(4, 4));  // 8 + 5 > 10: wraps
  EXPECT_EQ(dl.position(), 0);
  EXPECT_EQ(step(dl, 4).first, iota32(0, 4));
}

// Two ranks of B=1, T=4 over the shards named by `pattern`: each step's first tokens for rank 0
// and rank 1 are `starts`, and the ranks stay at one place.
void expect_two_ranks(const std::string& pattern, const std::vector<std::array<int32_t, 2>>& starts) {
  kiln::DataLoader r0(pattern, /*B=*/1, /*T=*/4, /*rank=*/0, /*world_size=*/2);
  kiln::DataLoader r1(pattern, 1, 4, 1, 2);
  for (const auto& s : starts) {
    SCOPED_TRACE(s[0]);
    auto [x0, y0] = step(r0, 4);
    auto [x1, y1] = step(r1, 4);
    EXPECT_EQ(x0, iota32(s[0], 4));
    EXPECT_EQ(y0, iota32(s[0] + 1, 4));
    EXPECT_EQ(x1, iota32(s[1], 4));
    EXPECT_EQ(y1, iota32(s[1] + 1, 4));
    EXPECT_EQ(r0.shard(), r1.shard());
    EXPECT_EQ(r0.position(), r1.position());
  }
}

TEST_F(DataLoaderTest, RanksSplitEachStep) {
  shard("s_0.bin", iota(0, 20));   // B*T*world_size + 1 = 9: two steps fit
  shard("s_1.bin", iota(50, 10));  // one step fits
  expect_two_ranks(path("s_*.bin"), {{0, 4}, {8, 12}, {50, 54}, {0, 4}});
}

// A step of all ranks' tokens must fit whole: at position 16 of a 21-token shard the ranks need
// 16 + 2 * 4 + 1 = 25 tokens, so both go on to the next shard (one rank's 16 + 4 + 1 = 21 would
// fit, and rank 1 would read past the end).
TEST_F(DataLoaderTest, RanksAdvanceWhenTheWholeStepDoesNotFit) {
  shard("w_0.bin", iota(0, 21));
  shard("w_1.bin", iota(50, 10));
  expect_two_ranks(path("w_*.bin"), {{0, 4}, {8, 12}, {50, 54}, {0, 4}});
}

TEST_F(DataLoaderTest, SeekResumesExactly) {
  shard("d_0.bin", iota(0, 30));
  shard("d_1.bin", iota(100, 30));
  kiln::DataLoader a(path("d_*.bin"), 2, 2);
  for (int i = 0; i < 8; ++i) step(a, 4);
  kiln::DataLoader b(path("d_*.bin"), 2, 2);
  b.seek(a.shard(), a.position());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(step(a, 4), step(b, 4)) << i;

  // A bad seek names the problem and leaves the loader where it was.
  const size_t s = b.shard();
  const int64_t p = b.position();
  EXPECT_KILN_ERROR(b.seek(2, 0), path("d_*.bin"), "shard 2", "2 shards");
  EXPECT_KILN_ERROR(b.seek(1 - s, 26), path(s ? "d_0.bin" : "d_1.bin"), "position 26");
  EXPECT_KILN_ERROR(b.seek(s, -1), "position -1");
  // A position near the largest int64 (a damaged checkpoint) must not overflow past the check.
  EXPECT_KILN_ERROR(b.seek(s, INT64_MAX), "position 9223372036854775807");
  EXPECT_KILN_ERROR(b.seek(s, INT64_MAX - 3), "position 9223372036854775804");
  EXPECT_EQ(b.shard(), s);
  EXPECT_EQ(b.position(), p);
  EXPECT_EQ(step(a, 4), step(b, 4));
}

TEST_F(DataLoaderTest, ExpandPatternSortsAndSkipsDirectories) {
  for (const char* n : {"t_010.bin", "t_002.bin", "t_000.bin", "t_001.bin"}) shard(n, iota(0, 2));
  fs::create_directory(path("t_dir.bin"));
  EXPECT_EQ(kiln::expand_data_pattern(path("t_*.bin")),
            (std::vector<std::string>{path("t_000.bin"), path("t_001.bin"), path("t_002.bin"),
                                      path("t_010.bin")}));
  EXPECT_EQ(kiln::expand_data_pattern(path("t_002.bin")),
            std::vector<std::string>{path("t_002.bin")});
  EXPECT_KILN_ERROR(kiln::expand_data_pattern(path("nope_*.bin")), path("nope_*.bin"),
                    "no file matches");
  EXPECT_KILN_ERROR(kiln::expand_data_pattern(path("t_dir.bin")), "t_dir.bin: is a folder");
  EXPECT_KILN_ERROR(kiln::expand_data_pattern(""), "an empty path names no shard file");
  EXPECT_KILN_ERROR(kiln::DataLoader(path("missing.bin"), 1, 1), path("missing.bin"));
  // A file's own name is that file, glob characters in it or not: "t_[1].bin" is not "t_1.bin".
  shard("t_[1].bin", iota(0, 2));
  shard("t_1.bin", iota(0, 2));
  EXPECT_EQ(kiln::expand_data_pattern(path("t_[1].bin")), std::vector<std::string>{path("t_[1].bin")});
}

// A file named twice (another spelling, a link) is read once, under its first name in path order.
TEST_F(DataLoaderTest, ExpandPatternsReadsAFileOnceWhateverItsNames) {
  shard("v_0.bin", iota(0, 9));
  fs::create_symlink(path("v_0.bin"), path("v_link.bin"));
  const std::string dotted = (dir_ / "." / "v_0.bin").string();  // sorts first: '.' < 'v'
  EXPECT_EQ(kiln::expand_data_patterns({path("v_0.bin"), path("v_link.bin"), dotted}), std::vector<std::string>{dotted});
}

// A shard too short for one step holds no batch: left out and said, unless every one is short.
TEST_F(DataLoaderTest, ShardsTooShortForAStepAreLeftOut) {
  shard("w_0.bin", iota(0, 9));   // B*T = 4: batches at 0 and 4
  shard("w_1.bin", iota(0, 4));   // needs 5
  shard("w_2.bin", iota(100, 5));
  kiln::DataLoader d(path("w_*.bin"), 2, 2);
  EXPECT_EQ(d.files(), (std::vector<std::string>{path("w_0.bin"), path("w_2.bin")}));
  ASSERT_EQ(d.skipped().size(), 1u);
  EXPECT_EQ(d.skipped()[0], (std::pair<std::string, int64_t>{path("w_1.bin"), 4}));
  EXPECT_NE(d.skipped_note().find("1 shard too short for one batch (B=2 x T=2 x 1 rank, plus 1 target: 5 tokens) left out: " +
                                  path("w_1.bin") + " (4 tokens)"),
            std::string::npos)
      << d.skipped_note();
  EXPECT_EQ(d.batches_per_pass(), 3);
  EXPECT_EQ(step(d, 4).first, iota32(0, 4));
  EXPECT_EQ(step(d, 4).first, iota32(4, 4));
  EXPECT_EQ(step(d, 4).first, iota32(100, 4));  // w_1.bin left out
  EXPECT_KILN_ERROR(kiln::DataLoader(path("w_1.bin"), 2, 2), "w_1.bin: holds 4 tokens, but one batch");
}

// A shard of exactly k batches' tokens holds k - 1: the last batch's targets would need one token
// more (what caps --val-steps and eval's whole pass; an over-count reads past the shard's end).
TEST_F(DataLoaderTest, AShardOfExactlyKBatchesHoldsKMinusOne) {
  shard("x_0.bin", iota(0, 8));  // B*T = 4: a batch at 0 (targets 1..4); at 4 the targets need token 8
  shard("x_1.bin", iota(0, 9));  // batches at 0 and 4
  EXPECT_EQ(kiln::DataLoader(path("x_0.bin"), 2, 2).batches_per_pass(), 1);
  EXPECT_EQ(kiln::DataLoader(path("x_*.bin"), 2, 2).batches_per_pass(), 3);
}

// Several patterns (a shell's expansion of an unquoted glob): their union, by path, each file once.
TEST_F(DataLoaderTest, ExpandPatternsTakesTheUnionInPathOrder) {
  for (const char* n : {"u_2.bin", "u_0.bin", "u_1.bin"}) shard(n, iota(0, 9));
  const std::vector<std::string> all{path("u_0.bin"), path("u_1.bin"), path("u_2.bin")};
  EXPECT_EQ(kiln::expand_data_patterns({path("u_2.bin"), path("u_0.bin"), path("u_1.bin")}), all);
  EXPECT_EQ(kiln::expand_data_patterns({path("u_1.bin"), path("u_*.bin")}), all);
  EXPECT_KILN_ERROR(kiln::expand_data_patterns({path("u_0.bin"), path("none.bin")}), path("none.bin"),
                    "no file matches");
  EXPECT_KILN_ERROR(kiln::expand_data_patterns({}), "no data");
  kiln::DataLoader loader(std::vector<std::string>{path("u_2.bin"), path("u_0.bin")}, 1, 4);
  EXPECT_EQ(loader.files(), (std::vector<std::string>{path("u_0.bin"), path("u_2.bin")}));
  EXPECT_KILN_ERROR(kiln::DataLoader(std::vector<std::string>{path("u_0.bin"), path("gone.bin")}, 1, 4),
                    path("gone.bin"), "no file matches");
}

TEST_F(DataLoaderTest, WriteTokenShardIsAtomicAndLaidOut) {
  const std::string p = shard("w.bin", {1, 2, 65535});
  shard("w.bin", {7, 8, 9, 10});  // overwrite
  EXPECT_EQ(listing(), std::vector<std::string>{"w.bin"});
  EXPECT_EQ(fs::file_size(p), 1024u + 8u);
  std::ifstream f(p, std::ios::binary);
  int32_t header[256];
  uint16_t tokens[4];
  f.read(reinterpret_cast<char*>(header), sizeof(header));
  f.read(reinterpret_cast<char*>(tokens), sizeof(tokens));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 4);
  EXPECT_EQ(std::vector<uint16_t>(tokens, tokens + 4), (std::vector<uint16_t>{7, 8, 9, 10}));
  EXPECT_TRUE(std::all_of(header + 3, header + 256, [](int32_t v) { return v == 0; }));

  const std::string nodir = path("no/dir/x.bin");
  EXPECT_KILN_ERROR(kiln::write_token_shard(nodir, {1}), nodir);
  EXPECT_EQ(listing(), std::vector<std::string>{"w.bin"});
}

TEST_F(DataLoaderTest, HighTokenIdsSurviveAsInt32) {
  shard("hi.bin", {50256, 65535, 0, 1});
  kiln::DataLoader dl(path("hi.bin"), 1, 2);
  auto [x, y] = step(dl, 2);
  EXPECT_EQ(x, (std::vector<int32_t>{50256, 65535}));
  EXPECT_EQ(y, (std::vector<int32_t>{65535, 0}));
}

TEST_F(DataLoaderTest, BadShardsNameFileAndProblem) {
  const std::string magic = raw_shard("magic.bin", 1234, 1, 10, 10);
  EXPECT_KILN_ERROR(kiln::DataLoader(magic, 1, 4), magic, "magic 1234", "20240520");

  const std::string version = raw_shard("version.bin", 20240520, 7, 10, 10);
  EXPECT_KILN_ERROR(kiln::DataLoader(version, 1, 4), version, "version 7");

  const std::string truncated = raw_shard("truncated.bin", 20240520, 1, 10, 6);
  EXPECT_KILN_ERROR(kiln::DataLoader(truncated, 1, 4), truncated, "10 tokens", "1044 bytes",
                    "1036 bytes");

  const std::string negative = raw_shard("negative.bin", 20240520, 1, -3, 0);
  EXPECT_KILN_ERROR(kiln::DataLoader(negative, 1, 4), negative, "-3");

  const std::string tiny = path("tiny.bin");
  std::ofstream(tiny, std::ios::binary) << std::string("\x01\x02\x03\x04\x05", 5);  // (text is said to be text)
  EXPECT_KILN_ERROR(kiln::DataLoader(tiny, 1, 4), tiny, "5 bytes", "1024-byte header");

  // B*T*world_size + 1 = 2*4*2 + 1 = 17 tokens needed.
  const std::string few = shard("few.bin", iota(0, 16));
  EXPECT_KILN_ERROR(kiln::DataLoader(few, 2, 4, 0, 2), few, "16 tokens", "needs 17");
  EXPECT_NO_THROW(kiln::DataLoader(few, 3, 5));  // 16 = 15 + 1 is enough
}

TEST_F(DataLoaderTest, LaterBadShardFailsAtConstruction) {
  shard("c_0.bin", iota(0, 100));
  shard("c_1.bin", iota(0, 100));
  const std::string bad = raw_shard("c_2.bin", 20240520, 1, 100, 99);
  EXPECT_KILN_ERROR(kiln::DataLoader(path("c_*.bin"), 2, 8), bad, "should be 1224 bytes");
}

TEST_F(DataLoaderTest, BadArguments) {
  shard("a.bin", iota(0, 100));
  EXPECT_KILN_ERROR(kiln::DataLoader(path("a.bin"), 0, 4), path("a.bin"), "B=0");
  EXPECT_KILN_ERROR(kiln::DataLoader(path("a.bin"), 4, -1), "T=-1");
  EXPECT_KILN_ERROR(kiln::DataLoader(path("a.bin"), 1, 1, 2, 2), "rank 2", "world_size=2");
  EXPECT_KILN_ERROR(kiln::DataLoader(path("a.bin"), 1, 1, 0, 0), "world_size=0");
  EXPECT_KILN_ERROR(kiln::DataLoader(path("a.bin"), int64_t(1) << 40, int64_t(1) << 40), "B*T");
}

}  // namespace
