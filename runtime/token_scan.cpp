#include "runtime/token_scan.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>

#include "runtime/data_loader.h"
#include "runtime/error.h"

namespace kiln {

size_t first_out_of_vocab(const uint16_t* tokens, size_t n, int32_t vocab) {
  // The common case (no bad id) is one vectorised max over the piece.
  uint16_t top = 0;
  for (size_t i = 0; i < n; ++i) top = std::max(top, tokens[i]);
  if (int32_t(top) < vocab) return n;
  for (size_t i = 0; i < n; ++i)
    if (int32_t(tokens[i]) >= vocab) return i;
  return n;
}

std::string out_of_vocab_message(const std::string& file, int64_t token, int64_t position, int32_t vocab) {
  return file + ": token " + std::to_string(token) + " at position " + std::to_string(position) +
         " is not below the model's vocabulary size " + std::to_string(vocab) + " (data for another tokenizer?)";
}

TokenScan::TokenScan(std::vector<Shard> shards, int32_t vocab) : shards_(std::move(shards)), vocab_(vocab) {
  if (shards_.empty()) {
    done_ = true;
    return;
  }
  // The thread starts with every signal blocked (it inherits the mask), so Ctrl-C and SIGTERM
  // reach the threads whose handlers act on them, never this one.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  try {
    thread_ = std::thread([this] { run(); });
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    throw;
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

TokenScan::~TokenScan() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

std::string TokenScan::error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

void TokenScan::run() {
  constexpr int64_t kPiece = int64_t(1) << 21;  // tokens per read: 4 MB
  std::vector<uint16_t> piece;
  try {
    for (const Shard& s : shards_) {
      for (int64_t at = 0; at < s.tokens && !stop_; at += kPiece) {
        piece.resize(size_t(std::min(kPiece, s.tokens - at)));
        read_shard_tokens(s.path, at, int64_t(piece.size()), piece.data());
        const size_t bad = first_out_of_vocab(piece.data(), piece.size(), vocab_);
        if (bad < piece.size())
          throw Error(out_of_vocab_message(s.path, piece[bad], at + int64_t(bad), vocab_) +
                      (s.reader ? "; " + s.reader(at + int64_t(bad)) + " would read it: stopping now" : ""));
      }
      if (stop_) break;
    }
  } catch (const Error& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = e.what();
  }
  done_.store(true, std::memory_order_release);
}

}  // namespace kiln
