#include "runtime/token_scan.h"

#include <gtest/gtest.h>

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "runtime/data_loader.h"
#include "test/unit/temp_dir_fixture.h"

namespace {

class TokenScanTest : public kiln::testing::TempDirTest {
 protected:
  kiln::TokenScan::Shard shard(const std::string& name, const std::vector<uint16_t>& tokens) {
    kiln::write_token_shard(path(name), tokens);
    return {path(name), int64_t(tokens.size())};
  }
};

// Waits for the scan to finish (it reads a few MB here).
void finish(const kiln::TokenScan& scan) {
  for (int i = 0; i < 2000 && !scan.done(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(scan.done());
}

TEST_F(TokenScanTest, FindsTheFirstBadTokenPastAPieceBoundary) {
  std::vector<uint16_t> clean(1000, 511);
  // The second shard's bad ids lie in the scan's second 4 MB piece (2^21 tokens a piece).
  std::vector<uint16_t> late((size_t(1) << 21) + 100, 7);
  late[(size_t(1) << 21) + 3] = 512;
  late[(size_t(1) << 21) + 50] = 60000;
  kiln::TokenScan::Shard b = shard("b.bin", late);
  b.reader = [](int64_t position) { return "step " + std::to_string(12 + position / 1000000); };
  kiln::TokenScan scan({shard("a.bin", clean), b, shard("c.bin", {9999})}, 512);
  finish(scan);
  EXPECT_EQ(scan.error(), path("b.bin") + ": token 512 at position 2097155 is not below the model's vocabulary "
                                          "size 512 (data for another tokenizer?); step 14 would read it: stopping now");
}

TEST_F(TokenScanTest, CleanShardsGiveNoError) {
  kiln::TokenScan scan({shard("a.bin", std::vector<uint16_t>(5000, 50256)), shard("b.bin", {0, 1, 2})}, 50257);
  finish(scan);
  EXPECT_EQ(scan.error(), "");
  kiln::TokenScan none({}, 512);
  EXPECT_TRUE(none.done());
  EXPECT_EQ(none.error(), "");
}

TEST_F(TokenScanTest, AShardGoneOrShortIsAnError) {
  kiln::TokenScan gone({{path("missing.bin"), 10}}, 512);
  finish(gone);
  EXPECT_EQ(gone.error(), path("missing.bin") + ": cannot open: No such file or directory");
  kiln::TokenScan::Shard s = shard("short.bin", {1, 2, 3});
  s.tokens = 5;  // the header said more when the run started
  kiln::TokenScan cut({s}, 512);
  finish(cut);
  EXPECT_NE(cut.error().find(path("short.bin") + ": reading tokens: unexpected end of file"), std::string::npos)
      << cut.error();
}

// The scan's thread must never take Ctrl-C or SIGTERM: the process delivers them to a thread that
// has them unblocked, and the trainer's handlers act on the threads they expect. The reader runs on
// the scan's thread, so it sees that thread's mask; the caller's own mask comes back unchanged.
TEST_F(TokenScanTest, ItsThreadBlocksSignalsAndTheCallersMaskStays) {
  // The caller blocks SIGUSR2 alone, to see its mask kept exactly as it was.
  sigset_t usr2, before, after;
  sigemptyset(&usr2);
  sigaddset(&usr2, SIGUSR2);
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, &usr2, &before), 0);
  std::atomic<int> blocked{-1};
  kiln::TokenScan::Shard s = shard("bad.bin", {600});
  s.reader = [&blocked](int64_t) {
    sigset_t mine;
    pthread_sigmask(SIG_BLOCK, nullptr, &mine);
    blocked = sigismember(&mine, SIGINT) + sigismember(&mine, SIGTERM) + sigismember(&mine, SIGHUP) +
              sigismember(&mine, SIGUSR1);
    return std::string("step 1");
  };
  {
    kiln::TokenScan scan({s}, 512);
    ASSERT_EQ(pthread_sigmask(SIG_BLOCK, nullptr, &after), 0);
    finish(scan);
  }
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  EXPECT_EQ(blocked.load(), 4);
  for (int sig : {SIGINT, SIGTERM, SIGUSR1}) EXPECT_EQ(sigismember(&after, sig), 0) << "signal " << sig;
  EXPECT_EQ(sigismember(&after, SIGUSR2), 1);
}

TEST(TokenScan, FirstOutOfVocab) {
  const std::vector<uint16_t> t = {1, 2, 700, 3, 800};
  EXPECT_EQ(kiln::first_out_of_vocab(t.data(), t.size(), 1000), t.size());
  EXPECT_EQ(kiln::first_out_of_vocab(t.data(), t.size(), 700), 2u);
  EXPECT_EQ(kiln::first_out_of_vocab(t.data(), t.size(), 701), 4u);
  EXPECT_EQ(kiln::first_out_of_vocab(t.data(), 0, 1), 0u);
  // An id equal to the vocabulary size is out of it, also when it is the largest one.
  EXPECT_EQ(kiln::first_out_of_vocab(t.data(), t.size(), 800), 4u);
  EXPECT_EQ(kiln::first_out_of_vocab(t.data(), t.size(), 801), t.size());
}

}  // namespace
