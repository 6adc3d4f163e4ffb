// Top-k (and top-p) sampling from the compiled forward pass (`prefill`, `decode` and `logits` programs):
// continuations of a prompt.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/executor.h"
#include "runtime/rng.h"

namespace kiln {

struct SampleOptions {
  int64_t max_new_tokens = 64;
  int64_t top_k = 50;            // 0 = the whole vocabulary
  double top_p = 1.0;            // in (0, 1]; 1 = no nucleus cut
  int64_t num_samples = 1;
  uint64_t seed = 1337;
  float temperature = 1.0f;      // finite and > 0
  // When set: the logits each token was drawn from, [num_samples, max_new_tokens, vocab] (the
  // first V columns of the row, before the temperature), filled in that order.
  std::vector<float>* logits_out = nullptr;
  // When set: where the time went. A round's first step also feeds its prompt through the model.
  struct Times {
    double first_steps_s = 0, other_steps_s = 0;
    int64_t first_steps = 0;                     // one per round of rows
    int64_t other_steps = 0, other_tokens = 0;  // tokens: one per row of a step
    int64_t decode_steps = 0, logits_steps = 0;  // which program gave each step's logits
    int64_t decode_prompt_positions = 0;  // prompt positions @decode read, one a call (the last, and those no prefill took)
    struct Prefill {  // one per prefill program loaded
      std::string name;
      int64_t per_call = 0, cost = 0;    // its M, and prefill_cost's count
      int64_t calls = 0, positions = 0;  // prompt positions it read
    };
    std::vector<Prefill> prefill;
  }* times = nullptr;
  // Called after each forward pass with the passes done and the passes in all
  // (ceil(num_samples / B) * max_new_tokens): for a progress line.
  std::function<void(int64_t done, int64_t total)> progress;
  // Asked before each forward pass: true ends the sampling there (a Ctrl-C should not wait for
  // the samples to finish). sample() then returns the rows begun so far, each as far as it got,
  // and sets *stopped when given.
  std::function<bool()> stop;
  bool* stopped = nullptr;
};

// Returns one token sequence per sample: the prompt followed by max_new_tokens sampled tokens.
// Up to B samples run together (one per row); each step samples the next token of every row from
// the softmax of its last position's logits (restricted to the k largest, then to the top-p nucleus). The logits come from
// the `decode` program while a row holds at most T tokens (when the executor loaded it: one
// position per call over key/value caches), else from the forward pass over the last T tokens
// (`logits`): the same numbers up to rounding. With `prefill` (and `prefill_short`) loaded too,
// the prompt goes into the caches M positions per call (all but its last token, which @decode
// reads for the logits), by the cheapest mix of calls (plan_prefill).
// Deterministic for a seed. kiln::Error when the prompt is empty or holds an id outside
// [0, vocab), when the temperature is not finite and positive, and when a row of logits holds a
// NaN or +infinity (the weights overflow: any pick from it would be arbitrary).
// kiln::Error `what` + "N samples of P + M tokens are more than the 2^31 tokens the sampler
// keeps" when they are (sample() checks it too; a caller that samples later checks up front).
void check_sample_size(int64_t prompt_tokens, const SampleOptions& options, const std::string& what);

// What one call of a prefill program of M positions costs, in @decode calls, from 2 to max(2, M). A
// @decode call is bound by memory: it reads every weight, the head's included, for B rows. A
// prefill call is bound by arithmetic: 2 FLOPs per weight of the layers (not the head) for each of
// its B x M rows. Their times at the target's balance of FLOPs to bytes (a CPU about 10, 20 in
// bf16; an H100 or H200 about 200) give the count.
int64_t prefill_cost(const Module& module, int64_t M);

// The cheapest calls that read n prompt positions into the caches: program i of `programs`
// ({M, cost}) reads up to M positions a call at `cost` @decode calls, and @decode one position
// for 1 (a tie goes to the prefill call, and between prefill calls to the one of fewer positions). Returns the prefill calls (indexes into `programs`), the
// larger first; the positions they leave go through @decode.
std::vector<size_t> plan_prefill(int64_t n, const std::vector<std::pair<int64_t, int64_t>>& programs);

// A sample as it is printed: `text` of its ids when given (GPT-2's tokenizer; bytes, possibly NUL),
// else the ids separated by spaces.
std::string sample_string(const std::vector<int32_t>& ids,
                          const std::function<std::string(const std::vector<int32_t>&)>& text);

// One draw: the id of a token from the softmax of `row` (V logits, all finite or -infinity, not all
// -infinity) at `temperature`, restricted to the k largest (1 <= k <= V; ties to the lower id),
// then, with top_p < 1, to the nucleus: the fewest of those, most likely first, whose probability
// (among the k) adds up to at least top_p (Hugging Face's top-p, applied after its top-k).
// `order` and `weights` are scratch, kept by the caller so that a draw allocates nothing.
int32_t pick_token(const std::vector<float>& row, int64_t k, float temperature, double top_p, Rng& rng,
                   std::vector<int32_t>& order, std::vector<double>& weights);

std::vector<std::vector<int32_t>> sample(Executor& ex, const std::vector<int32_t>& prompt,
                                         const SampleOptions& options);

}  // namespace kiln
