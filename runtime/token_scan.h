// The token ids of the shards a run has not read yet, checked while it trains: a shard holding an
// id the model has no embedding for (data tokenized for another vocabulary) ends the run within a
// step or two of its start, not when the loader reaches that shard hours in.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kiln {

// The index of the first of tokens[0, n) that is not below `vocab`, or n when none is.
size_t first_out_of_vocab(const uint16_t* tokens, size_t n, int32_t vocab);

// "FILE: token T at position P is not below the model's vocabulary size V (data for another
// tokenizer?)": the one wording for a bad token, wherever it is found.
std::string out_of_vocab_message(const std::string& file, int64_t token, int64_t position, int32_t vocab);

class TokenScan {
 public:
  struct Shard {
    std::string path;
    // The shard's first `tokens` tokens are checked: those the run reads (the header's count
    // when it reads the whole shard; DataLoader checked the header and the file's size).
    int64_t tokens;
    // What reads the token at a position, for the message: "step 157", "each evaluation
    // (--val-data)"; none when empty.
    std::function<std::string(int64_t position)> reader;
  };
  // Starts a thread that reads each shard's tokens in order, in pieces of a few MB, and stops at
  // the first bad one ("...(data for another tokenizer?); step 157 would read it: stopping now")
  // or a read error, worded as the loader words it.
  TokenScan(std::vector<Shard> shards, int32_t vocab);
  ~TokenScan();  // stops the thread (within one piece) and joins it
  TokenScan(const TokenScan&) = delete;
  TokenScan& operator=(const TokenScan&) = delete;

  // The first problem found so far, as a one-line message; empty while none is.
  std::string error() const;
  // Whether every shard has been read (or a problem found).
  bool done() const { return done_.load(std::memory_order_acquire); }

 private:
  void run();

  std::vector<Shard> shards_;
  int32_t vocab_;
  std::atomic<bool> stop_{false}, done_{false};
  mutable std::mutex mutex_;
  std::string error_;
  std::thread thread_;
};

}  // namespace kiln
