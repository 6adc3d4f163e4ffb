// Top-k sampling from the compiled forward pass (`logits` program): continuations of a prompt.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/executor.h"

namespace kiln {

struct SampleOptions {
  int64_t max_new_tokens = 64;
  int64_t top_k = 50;            // 0 = the whole vocabulary
  int64_t num_samples = 1;
  uint64_t seed = 1337;
  float temperature = 1.0f;      // finite and > 0
  // Called after each forward pass with the passes done and the passes in all
  // (ceil(num_samples / B) * max_new_tokens): for a progress line.
  std::function<void(int64_t done, int64_t total)> progress;
};

// Returns one token sequence per sample: the prompt followed by max_new_tokens sampled tokens.
// Up to B samples run together (one per row); each step runs the forward pass over the last T
// tokens of every row and samples the next token from the softmax of the last position's
// logits (restricted to the k largest). Deterministic for a seed. kiln::Error when the prompt is
// empty or holds an id outside [0, vocab), or the temperature is not finite and positive.
std::vector<std::vector<int32_t>> sample(Executor& ex, const std::vector<int32_t>& prompt,
                                         const SampleOptions& options);

}  // namespace kiln
