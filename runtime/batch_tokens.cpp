// Checks of the tokens a training run reads (see batch_tokens.h).
#include "runtime/batch_tokens.h"

#include <algorithm>
#include <functional>
#include <string>

#include "runtime/data_loader.h"
#include "runtime/error.h"
#include "runtime/executor.h"

namespace kiln {

// The next batch into the executor's inputs; token ids the model has no embedding for are an
// error naming the shard, never an out-of-bounds read.
void next_batch(Executor& ex, DataLoader& data, int64_t n, int32_t vocab) {
  const size_t shard = data.shard();
  const int64_t position = data.position();
  int32_t* idx = ex.input("idx");
  int32_t* targets = ex.input("targets");
  data.next(idx, targets);
  // The batch is tokens [at, at + n] of the shard: inputs idx[i] = at + i, targets[i] = at + i + 1.
  const int64_t at = position + data.rank_offset();
  for (int64_t i = 0; i < n; ++i)
    if (idx[i] >= vocab || targets[i] >= vocab) {
      const bool input = idx[i] >= vocab;
      throw Error(out_of_vocab_message(data.files()[shard], input ? idx[i] : targets[i], at + i + (input ? 0 : 1), vocab));
    }
}

// The loader calls (micro-steps) left to a run; a --steps far past any data saturates.
int64_t micro_steps_left(int64_t steps, int64_t first_step, int64_t accum) {
  int64_t calls = 0;
  return __builtin_mul_overflow(steps - first_step, accum, &calls) ? INT64_MAX : calls;
}

// The token ids of the shard a loader holds now that the run will read (`calls` more calls of
// next()) are below the vocabulary: from its position on, and from its start again when the run
// comes round to it after every other shard. A bad validation shard shows at the start, not at
// the first evaluation, many steps in; tokens no call reads (a shard's tail) do not count.
void check_resident_tokens(const DataLoader& d, int32_t vocab, int64_t calls) {
  const std::vector<uint16_t>& t = d.current_tokens();
  const size_t held = d.resident_shard();
  const int64_t s = d.tokens_per_call(), count = int64_t(t.size());
  std::vector<std::pair<int64_t, int64_t>> ranges;  // [first, last] positions read
  int64_t before_return = 0;  // calls until the run is back at this shard's start
  if (d.shard() == held) {
    before_return = d.calls_from(held, d.position());
    if (const int64_t here = std::min(calls, before_return); here > 0)
      ranges.push_back({d.position(), d.position() + here * s});
  }
  for (size_t i = 0; i < d.files().size(); ++i)
    if (i != held) before_return += d.calls_from(i, 0);
  if (calls > before_return) ranges.push_back({0, std::min(d.calls_from(held, 0), calls - before_return) * s});
  for (const auto& [first, last] : ranges) {
    const size_t n = size_t(std::min(last, count - 1) - first + 1);
    if (const size_t bad = first_out_of_vocab(t.data() + first, n, vocab); bad < n)
      throw Error(out_of_vocab_message(d.files()[held], t[size_t(first) + bad], first + int64_t(bad), vocab));
  }
}

// The shards the run will read that are not checked yet (all but the one each loader holds), in
// the order it reads them: the validation shards an evaluation reaches (the first comes after
// step 1), then the training shards the remaining steps reach. Of each, only the tokens the run
// reads: call k in a shard reads [k s, k s + s] (s tokens a call), and the run may end first.
std::vector<TokenScan::Shard> shards_to_scan(const DataLoader& data, int64_t first_step, int64_t steps,
                                             int64_t accum, const DataLoader* val, int64_t val_steps) {
  std::vector<TokenScan::Shard> shards;
  // Shard i of `d`, first read by call `call` of the `calls` the run makes.
  auto add = [&](const DataLoader& d, size_t i, int64_t call, int64_t calls,
                 std::function<std::string(int64_t)> reader) {
    const int64_t reading = std::min(d.calls_from(i, 0), calls - call);
    shards.push_back({d.files()[i], std::min(d.shard_tokens()[i], reading * d.tokens_per_call() + 1), std::move(reader)});
  };
  if (val)
    for (const auto& [i, call] : val->shards_ahead(val_steps))
      add(*val, i, call, val_steps, [](int64_t) { return std::string("each evaluation (--val-data)"); });
  const int64_t calls = micro_steps_left(steps, first_step, accum), s = data.tokens_per_call();
  for (const auto& [i, call] : data.shards_ahead(calls))
    add(data, i, call, calls, [=](int64_t position) {
      const int64_t k = position <= s ? 0 : (position - 1) / s;  // the first call that reads it
      return "step " + std::to_string(first_step + (call + k) / accum + 1);
    });
  return shards;
}

}  // namespace kiln
