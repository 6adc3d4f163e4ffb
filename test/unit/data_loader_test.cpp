#include "runtime/data_loader.h"

#include <cstdint>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
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

// The exact error a constructor over `pattern` throws ("" when none).
std::string loader_error(const std::string& pattern, int64_t B, int64_t T, int rank = 0, int world_size = 1) {
  try {
    kiln::DataLoader dl(pattern, B, T, rank, world_size);
  } catch (const kiln::Error& e) {
    return e.what();
  }
  return "";
}

// A file of exactly these bytes.
std::string write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// A header-only file that is not a GPT-2 shard: each foreign header says what it is.
TEST_F(DataLoaderTest, ForeignFilesSayWhatTheyAre) {
  const std::string one = write_bytes(path("one.bin"), "\x01");
  EXPECT_EQ(loader_error(one, 1, 1),
            one + ": header: file is 1 byte, shorter than the 1024-byte header (not an llm.c token shard)");
  const std::string text = write_bytes(path("short.txt"), "hello world\n");
  EXPECT_EQ(loader_error(text, 1, 1),
            text + ": is text, not an llm.c token shard (kiln-data prepare tokenizes text files into shards)");
  const std::string long_text = write_bytes(path("long.txt"), std::string(2000, 'a'));
  EXPECT_EQ(loader_error(long_text, 1, 1),
            long_text + ": is text, not an llm.c token shard (kiln-data prepare tokenizes text files into shards)");
  const std::string llama = raw_shard("llama.bin", 20240801, 7, 10, 10);
  EXPECT_EQ(loader_error(llama, 1, 1),
            llama + ": header: magic 20240801 is an llm.c Llama 3 shard's (uint32 token ids); Kiln reads GPT-2 "
                    "shards (magic 20240520, uint16 token ids)");
  const std::string eval = raw_shard("eval.bin", 20240522, 1, 10, 10);
  EXPECT_EQ(loader_error(eval, 1, 1),
            eval + ": header: magic 20240522 is an llm.c evaluation file's (multiple-choice examples such as "
                   "HellaSwag's), not a token shard's");
  // A Kiln checkpoint that a --data glob reached (its kind's words are params.cpp's).
  const std::string ckpt = write_bytes(path("ckpt.bin"), "KILNCKPT" + std::string(2000, '\0'));
  EXPECT_KILN_ERROR(kiln::DataLoader(ckpt, 1, 1), ckpt + ": is a Kiln checkpoint",
                    ", not an llm.c token shard (does a --data or --val-data pattern reach further than the shards?)");
  // Only version 1 is read: an older number is no more known than a newer one.
  const std::string v0 = raw_shard("v0.bin", 20240520, 0, 10, 10);
  EXPECT_EQ(loader_error(v0, 1, 1), v0 + ": header: version 0 is not 1 (unsupported llm.c shard version)");
}

// A file whose size disagrees with its header's count says which way.
TEST_F(DataLoaderTest, SizeMismatchSaysWhichWay) {
  const std::string wide = raw_shard("wide.bin", 20240520, 1, 3, 6);  // 3 tokens of 4 bytes
  EXPECT_EQ(loader_error(wide, 1, 1), wide + ": size: header says 3 tokens, so the file should be 1030 bytes, but it "
                                             "is 1036 bytes (4 bytes a token: int32 or uint32 ids? llm.c's GPT-2 "
                                             "shards hold uint16 ones)");
  const std::string longer = raw_shard("longer.bin", 20240520, 1, 3, 4);
  EXPECT_EQ(loader_error(longer, 1, 1), longer + ": size: header says 3 tokens, so the file should be 1030 bytes, but "
                                                 "it is 1032 bytes (bytes past its tokens: something appended, or two "
                                                 "shards run together?)");
  const std::string shorter = raw_shard("shorter.bin", 20240520, 1, 3, 2);
  EXPECT_EQ(loader_error(shorter, 1, 1), shorter + ": size: header says 3 tokens, so the file should be 1030 bytes, "
                                                   "but it is 1028 bytes (truncated or corrupt)");
}

// An empty shard (a header and no tokens) is a shard: left out as short beside others, and named so
// when alone; one of 1 token says "token".
TEST_F(DataLoaderTest, EmptyAndOneTokenShardsAreShort) {
  const std::string empty = shard("e_0.bin", {});
  EXPECT_EQ(loader_error(empty, 1, 1),
            empty + ": holds 0 tokens, but one batch (B=1 x T=1 x world_size=1, plus 1 target) needs 2");
  const std::string one = shard("o.bin", {7});
  EXPECT_EQ(loader_error(one, 2, 3, 1, 2),
            one + ": holds 1 token, but one batch (B=2 x T=3 x world_size=2, plus 1 target) needs 13");
  // When every shard is short, the first is named.
  EXPECT_EQ(loader_error(path("[eo]*.bin"), 2, 3, 1, 2),
            empty + ": holds 0 tokens, but one batch (B=2 x T=3 x world_size=2, plus 1 target) needs 13");
  shard("e_1.bin", iota(0, 3));
  kiln::DataLoader dl(path("e_*.bin"), 1, 2);
  EXPECT_EQ(dl.files(), std::vector<std::string>{path("e_1.bin")});
  EXPECT_EQ(dl.all_shard_tokens(), (std::vector<int64_t>{0, 3}));
}

// The note on short shards names three and counts the rest; ranks are plural past one.
TEST_F(DataLoaderTest, SkippedNoteNamesThreeAndCountsTheRest) {
  shard("n_0.bin", iota(0, 1));
  shard("n_1.bin", iota(0, 2));
  shard("n_2.bin", iota(0, 3));
  shard("n_3.bin", iota(0, 4));
  shard("n_4.bin", iota(0, 5));
  shard("n_5.bin", iota(0, 9));
  kiln::DataLoader dl(path("n_*.bin"), 2, 2, 0, 2);  // needs 9
  EXPECT_EQ(dl.skipped_note(), "5 shards too short for one batch (B=2 x T=2 x 2 ranks, plus 1 target: 9 tokens) left "
                               "out: " + path("n_0.bin") + " (1 token), " + path("n_1.bin") + " (2 tokens), " +
                               path("n_2.bin") + " (3 tokens) and 2 more");
  // The shard after a file, cyclically, and whether it is that file (a checkpoint's file index).
  using P = std::pair<size_t, bool>;
  EXPECT_EQ(dl.shard_from_file(4), (P{0, false}));
  EXPECT_EQ(dl.shard_from_file(5), (P{0, true}));
  EXPECT_EQ(dl.shard_from_file(6), (P{0, false}));
  shard("n_6.bin", iota(0, 4));
  shard("n_7.bin", iota(0, 9));
  kiln::DataLoader two(path("n_*.bin"), 2, 2, 0, 2);
  EXPECT_EQ(two.shard_from_file(5), (P{0, true}));
  EXPECT_EQ(two.shard_from_file(6), (P{1, false}));
  EXPECT_EQ(two.shard_from_file(7), (P{1, true}));
  EXPECT_NE(two.skipped_note().find(" and 3 more"), std::string::npos) << two.skipped_note();
  kiln::DataLoader four(std::vector<std::string>{path("n_0.bin"), path("n_1.bin"), path("n_2.bin"), path("n_3.bin"),
                                                 path("n_5.bin")}, 2, 2, 0, 2);
  EXPECT_EQ(four.skipped_note().substr(four.skipped_note().rfind(')')), ") and 1 more");
  kiln::DataLoader three(std::vector<std::string>{path("n_3.bin"), path("n_5.bin")}, 2, 2);
  EXPECT_EQ(three.skipped_note(), "1 shard too short for one batch (B=2 x T=2 x 1 rank, plus 1 target: 5 tokens) left "
                                  "out: " + path("n_3.bin") + " (4 tokens)");
}

// Errors name the patterns as given, space-separated; and a step of exactly INT32_MAX tokens is
// still one a shard could hold (its count is an int32), so the shard's own shortness is said.
TEST_F(DataLoaderTest, BoundsOfTheArguments) {
  shard("a.bin", iota(0, 10));
  shard("b.bin", iota(0, 10));
  EXPECT_EQ(loader_error("", 1, 1), "an empty path names no shard file");
  try {
    kiln::DataLoader(std::vector<std::string>{path("a.bin"), path("b.bin")}, 0, 1);
    ADD_FAILURE() << "no error";
  } catch (const kiln::Error& e) {
    EXPECT_EQ(std::string(e.what()), path("a.bin") + " " + path("b.bin") + ": DataLoader: B=0 and T=1 must be positive");
  }
  EXPECT_EQ(loader_error(path("a.bin"), INT32_MAX, 1),
            path("a.bin") + ": holds 10 tokens, but one batch (B=2147483647 x T=1 x world_size=1, plus 1 target) "
                            "needs 2147483648");
  EXPECT_EQ(loader_error(path("a.bin"), int64_t(INT32_MAX) + 1, 1),
            path("a.bin") + ": DataLoader: B*T*world_size is larger than any llm.c shard can hold");
}

// The folder's hint is a glob inside it, with one '/' whether the path ends in one or not.
TEST_F(DataLoaderTest, AFolderIsAnsweredWithAGlobInIt) {
  fs::create_directory(path("d"));
  EXPECT_EQ(loader_error(path("d"), 1, 1),
            path("d") + ": is a folder; give its shard files, or a glob such as '" + path("d") + "/train_*.bin'");
  EXPECT_EQ(loader_error(path("d") + "/", 1, 1),
            path("d") + "/: is a folder; give its shard files, or a glob such as '" + path("d") + "/train_*.bin'");
}

// A staging folder left by a kiln-data prepare killed mid-swap (its old/ holds the shards moved
// aside) makes the shards beside it no data set: refused, by file or glob; without old/ it is no
// such folder. Pid 999999999 runs nowhere: the prepare is dead.
TEST_F(DataLoaderTest, ShardsBesideAnInterruptedPrepareAreRefused) {
  const std::string a = shard("train_0.bin", iota(0, 10));
  const std::string staging = path(".kiln-data-prepare.tmp.999999999");
  fs::create_directory(staging);
  EXPECT_NO_THROW(kiln::DataLoader(a, 1, 1));  // no old/: not mid-swap
  fs::create_directory(staging + "/old");
  const std::string said = staging + " was left by a kiln-data prepare killed while it swapped shards in, so the "
                           "shards beside it are not one data set: run that prepare again with --out " +
                           dir_.string() + " (it first finishes or undoes that swap)";
  EXPECT_EQ(loader_error(a, 1, 1), a + ": " + said);
  EXPECT_EQ(loader_error(path("train_*.bin"), 1, 1), path("train_*.bin") + ": " + said);
  EXPECT_EQ(loader_error(path("val_*.bin"), 1, 1),
            path("val_*.bin") + ": no file matches this path or pattern; but " + staging + " holds the shards of a "
            "kiln-data prepare killed while it swapped them in: run that prepare again with --out " + dir_.string() +
            " (it first finishes or undoes that swap)");
  // A glob in the folder's part names no one folder to look in: not "[g]", even where one is so named.
  fs::create_directories(path("[g]/.kiln-data-prepare.tmp.999999999/old"));
  EXPECT_EQ(loader_error(path("[g]/val_*.bin"), 1, 1), path("[g]/val_*.bin") + ": no file matches this path or pattern");
  // Relative to the working folder, that folder is ".".
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_);
  const std::string here = loader_error("train_0.bin", 1, 1);
  fs::current_path(cwd);
  EXPECT_EQ(here, "train_0.bin: ./.kiln-data-prepare.tmp.999999999 was left by a kiln-data prepare killed while it "
                  "swapped shards in, so the shards beside it are not one data set: run that prepare again with "
                  "--out . (it first finishes or undoes that swap)");
  EXPECT_TRUE(kiln::is_orphaned_prepare_staging(".kiln-data-prepare.999999999"));  // (before "tmp." was named)
  EXPECT_FALSE(kiln::is_orphaned_prepare_staging(".kiln-data-prepare.tmp." + std::to_string(::getpid())));
}

TEST_F(DataLoaderTest, ReadShardTokensAndMagicProbe) {
  const std::string p = shard("r.bin", iota(100, 10));
  std::vector<uint16_t> got(4);
  kiln::read_shard_tokens(p, 3, 4, got.data());
  EXPECT_EQ(got, iota(103, 4));
  EXPECT_TRUE(kiln::starts_like_token_shard(p));
  EXPECT_FALSE(kiln::starts_like_token_shard(raw_shard("llama.bin", 20240801, 7, 1, 1)));
  EXPECT_FALSE(kiln::starts_like_token_shard(write_bytes(path("three.bin"), std::string("\xa8\xd6\x34", 3))));
  EXPECT_FALSE(kiln::starts_like_token_shard(path("missing.bin")));
}

// A shard rewritten in place (same inode, same size, the same second) is noticed by its
// nanoseconds, said once by rank 0 only, and its count follows.
TEST_F(DataLoaderTest, AShardRewrittenInPlaceIsSaidByRankZero) {
  shard("z_0.bin", iota(0, 9));
  const std::string z1 = shard("z_1.bin", iota(100, 9));
  const auto set_mtime = [&](long ns) {
    const timespec t[2] = {{1700000000, ns}, {1700000000, ns}};
    ASSERT_EQ(::utimensat(AT_FDCWD, z1.c_str(), t, 0), 0);
  };
  set_mtime(100);
  kiln::DataLoader r0(path("z_*.bin"), 1, 4, 0, 2), r1(path("z_*.bin"), 1, 4, 1, 2);
  {
    std::fstream f(z1, std::ios::in | std::ios::out | std::ios::binary);  // in place: the inode stays
    f.seekp(1024);
    const uint16_t t = 777;
    f.write(reinterpret_cast<const char*>(&t), 2);
  }
  set_mtime(200);
  step(r0, 4), step(r1, 4);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(step(r0, 4).first, (std::vector<int32_t>{777, 101, 102, 103}));
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "kiln: warning: " + z1 + " was replaced or rewritten while the run read its shards (9 tokens, as before); "
            "it is read as it is now\n");
  ::testing::internal::CaptureStderr();
  step(r1, 4);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  // Replaced by a longer one: the counts follow.
  shard("z_0.bin", iota(0, 17));
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(step(r0, 4).first, iota32(0, 4));
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "kiln: warning: " + path("z_0.bin") + " was replaced or rewritten while the run read its shards (17 "
            "tokens, 9 before); it is read as it is now\n");
  EXPECT_EQ(r0.shard_tokens(), (std::vector<int64_t>{17, 9}));
  EXPECT_EQ(r0.all_shard_tokens(), (std::vector<int64_t>{17, 9}));
}

// One shard wraps onto itself without reading its file again; shards_ahead(0) is none even when
// the next call moves on; a seek may land on the last position a step fits.
TEST_F(DataLoaderTest, EdgesOfWrappingAndSeeking) {
  const std::string p = shard("only.bin", iota(0, 10));
  kiln::DataLoader dl(p, 1, 4);
  step(dl, 4), step(dl, 4);
  fs::remove(p);
  EXPECT_EQ(step(dl, 4).first, iota32(0, 4));
  shard("q_0.bin", iota(0, 9));
  shard("q_1.bin", iota(50, 9));
  kiln::DataLoader q(path("q_*.bin"), 1, 4);
  step(q, 4), step(q, 4);
  EXPECT_EQ(q.shard(), 1u);  // q_0 used up: the next call reads q_1
  EXPECT_EQ(q.shards_ahead(0), (std::vector<std::pair<size_t, int64_t>>{}));
  q.seek(1, 4);  // 4 + 4 + 1 = 9: the last position that fits
  EXPECT_EQ(step(q, 4).first, iota32(54, 4));
  EXPECT_KILN_ERROR(q.seek(1, 5), "position 5 leaves no room for one step of 5 tokens in 9 tokens");
}

}  // namespace
