// Ranks of one data-parallel job must run the same module on the same data from the same
// weights with the same options, or they drift apart (or deadlock on different collectives).
// What they compare at start, and how they all stop alike when one differs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/trainer.h"

namespace kiln {

class DataLoader;
class Executor;

// What ranks compare to find out that they were given different things: a 64-bit FNV-1a of
// bytes (not a cryptographic hash); of every parameter's value; of the data's shard sizes in
// order and the tokens of the shard being read (paths may differ from machine to machine).
uint64_t fingerprint(const void* data, size_t n, uint64_t h = 1469598103934665603ull);
uint64_t weights_fingerprint(const Module& module, Executor& ex);
uint64_t data_fingerprint(const DataLoader& data);
// Stops every rank alike when some rank differs from rank 0 (this_one[i]: this rank does about
// what[i]): all learn how many do, and each throws "<who>: N rank(s) disagree with rank 0 about ...".
void require_ranks_agree(Communicator& comm, const std::vector<bool>& this_one, const std::vector<std::string>& what,
                         const std::string& who);

// Training: the module, options, weights, data and outputs of every rank against rank 0's.
void check_ranks_agree(Communicator& comm, const Module& module, const TrainOptions& o, int64_t total,
                       int64_t first_step, Executor& ex, const DataLoader& data, const DataLoader* val,
                       int64_t val_steps, bool compiled_buckets);

}  // namespace kiln
