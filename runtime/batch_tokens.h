// The tokens a training run reads: each batch, and ahead of it the shards the run will reach,
// are checked against the vocabulary, so a bad token id is an error naming the shard and the
// place in it, never an out-of-bounds read of the embedding table.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/token_scan.h"

namespace kiln {

class DataLoader;
class Executor;

// The next batch into the executor's inputs; token ids the model has no embedding for are an
// error naming the shard, never an out-of-bounds read.
void next_batch(Executor& ex, DataLoader& data, int64_t n, int32_t vocab);

// The loader calls (micro-steps) left to a run; a --steps far past any data saturates.
int64_t micro_steps_left(int64_t steps, int64_t first_step, int64_t accum);

// The token ids of the shard a loader holds now that the run will read (`calls` more calls of
// next()) are below the vocabulary: from its position on, and from its start again when the run
// comes round to it after every other shard. A bad validation shard shows at the start, not at
// the first evaluation, many steps in; tokens no call reads (a shard's tail) do not count.
void check_resident_tokens(const DataLoader& d, int32_t vocab, int64_t calls);

// The shards the run will read that are not checked yet (all but the one each loader holds), in
// the order it reads them: the validation shards an evaluation reaches (the first comes after
// step 1), then the training shards the remaining steps reach. Of each, only the tokens the run
// reads: call k in a shard reads [k s, k s + s] (s tokens a call), and the run may end first.
std::vector<TokenScan::Shard> shards_to_scan(const DataLoader& data, int64_t first_step, int64_t steps,
                                             int64_t accum, const DataLoader* val, int64_t val_steps);

}  // namespace kiln
