// Data parallelism over a Communicator: gradient buckets, and ZeRO-1 sharding of the optimizer.
//
// Gradients are averaged in buckets: consecutive parameters, taken from the last to the first
// (the backward pass finishes the last parameters first), grouped up to --bucket-mb each; a
// parameter larger than that is a bucket of its own. The buckets lie one after another in a flat
// vector, each parameter at a multiple of 64 elements; a rank's executor lays its gradients out
// just so in its arena (data_parallel_state), and its values the same way, so the collectives
// reduce and gather there in place, with no staging copy. For a cuda module those are device
// addresses, and the collectives (NCCL) run on the executor's stream. The 1/world of the
// average is folded into the loss weight (loss / (accum * world)), so the reduction is a sum.
//
// ZeRO-1 (--zero 1): each bucket is cut into world_size contiguous pieces of equal size (+-1) and
// rank r owns piece r of every bucket. Gradients are reduce-scattered (each rank receives the
// sum of its pieces only), the global norm is the square root of the all-reduced sum of the
// owned pieces' squares, AdamW updates only the owned elements (the executor's parameter-slice
// hook), and the parameters are then all-gathered. The result is the same as plain averaging.
// On a GPU the device executor slices its AdamW and norm kernels' ranges, sums the norm over the
// ranks between its two kernels, and rounds the gathered values' bf16 copies with a kernel.
// A rank's arena keeps only its slices of both AdamW moments (data_parallel_state): 2/world of
// the moments instead of all of them. Before a checkpoint the
// ranks gather the whole moments to rank 0, which writes the same file as without ZeRO-1.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/checkpoint.h"
#include "runtime/comm/communicator.h"
#include "runtime/executor.h"

namespace kiln {

struct BucketPlan {
  struct Slot {
    int64_t flat = 0, size = 0;  // where the parameter lies in the flat vector
    size_t bucket = 0;
  };
  struct Bucket {
    int64_t begin = 0, end = 0;    // range of the flat vector
    std::vector<size_t> params;    // in flat order (descending parameter index)
    std::vector<int64_t> pieces;   // ZeRO-1: elements owned by each rank, in rank order
  };
  std::vector<Slot> params;        // by parameter index
  std::vector<Bucket> buckets;     // bucket 0 holds the last parameters
  int64_t total = 0;

  // Rank r's piece of bucket b, as a range of the flat vector.
  int64_t piece_begin(size_t b, int r) const { return buckets[b].begin + piece_offset(buckets[b].pieces, r); }
  int64_t piece_end(size_t b, int r) const { return piece_begin(b, r) + buckets[b].pieces[size_t(r)]; }
  // The elements [begin, end) of parameter p that rank r owns (begin == end when none).
  std::pair<int64_t, int64_t> owned(size_t p, int r) const;
};

// Buckets of at most `bucket_bytes` (fp32) over parameters of the given element counts.
BucketPlan plan_buckets(const std::vector<int64_t>& param_sizes, int64_t bucket_bytes, int world_size,
                        int64_t align = 1);
// Buckets given as groups of parameter indices (the compiler's kiln.reduce_gradients).
// align: each parameter starts at a multiple of `align` elements of the flat vector (64: the
// arena's 256 bytes, so that a rank laid out in bucket order reduces its gradients in place).
BucketPlan plan_buckets(const std::vector<std::vector<size_t>>& groups, const std::vector<int64_t>& param_sizes,
                        int world_size, int64_t align = 1);

// The buckets of a module for `world_size` ranks: the compiler's (its ReduceGradients
// instructions) when it placed them, else buckets of bucket_bytes; *compiled says which.
BucketPlan module_buckets(const Module& m, int world_size, int64_t bucket_bytes, bool* compiled = nullptr);
// How `rank` lays out its state (the trainer builds its executor with it, arena_layout.h): the
// gradients and values in bucket order, as the flat vector of the plan, so that the collectives
// run on them in place; with zero 1 the moments of the elements the rank updates only.
StatePlan data_parallel_state(const Module& m, int world_size, int rank, int zero, int64_t bucket_bytes);
StatePlan data_parallel_state(const BucketPlan& module_plan, int rank, int zero);  // module_buckets' plan

class DataParallel {
 public:
  // zero: 0 (average the gradients) or 1 (ZeRO-1). With zero 1 it installs the executor's
  // parameter slices and norm reducer; kiln::Error when the optimizer program is not the
  // GlobalNorm/ClipCoef/AdamW sequence those hooks know.
  DataParallel(Executor& ex, Communicator& comm, int zero, int64_t bucket_bytes);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Armed for the last micro-step of an optimizer step: the program's ReduceGradients
  // instructions then start their buckets while the backward pass goes on.
  void arm(bool last_micro_step) { armed_ = last_micro_step; }
  // After the last micro-step's backward: starts every bucket not started yet.
  void start_gradient_reduction();
  // Waits for them and leaves the averaged gradients (ZeRO-1: this rank's pieces) in place.
  void finish_gradient_reduction();
  // ZeRO-1: every rank's gradient pieces to every rank (for --dump-grads).
  void gather_gradients();
  // ZeRO-1, after the optimizer program: every rank's updated parameter pieces to every rank.
  void gather_parameters();
  // ZeRO-1, before a checkpoint (every rank calls it, after the optimizer step): every rank's
  // pieces of both AdamW moments, whole, to rank 0, so that the checkpoint holds the whole state
  // (the same file as without ZeRO-1). Both pass through the gradient buffers (the trainer
  // zeroes them before they are used again), which then hold m; v is in the result's own memory,
  // one moment's worth on rank 0 for the time of the save. Empty on the other ranks, and without
  // ZeRO-1 (the executor holds the moments whole).
  WholeMoments gather_optimizer_state();

  const BucketPlan& plan() const { return plan_; }
  int zero() const { return zero_; }
  // "3 gradient bucket(s) placed by the compiler in the backward pass, reduced in place, ZeRO-1 (...)"
  std::string describe() const;
  // Whether the module placed the buckets (kilnc --bucket-mb), not --bucket-mb at run time.
  bool compiled_buckets() const { return compiled_; }

 private:
  enum class Field { Value, Grad, AdamM, AdamV };  // which of a parameter's buffers
  void start_bucket(size_t b);
  void all_gather(float* flat);
  void gather_into(Field f, float* flat);  // ZeRO-1: the owned pieces of a moment, all-gathered
  float* in_place(Field f) const;
  std::string arena_note() const;

  Executor& ex_;
  Communicator& comm_;
  int zero_;
  int64_t bucket_bytes_;
  BucketPlan plan_;
  // The flat vectors of the gradients and values in the executor's arena (world > 1 only; on a
  // GPU device addresses): the collectives run on them in place.
  float* grads_ = nullptr;
  float* values_ = nullptr;
  std::vector<std::pair<size_t, std::unique_ptr<CommRequest>>> pending_;  // (bucket, request)
  std::vector<bool> started_;
  bool compiled_ = false;  // buckets from the module's ReduceGradients instructions
  bool armed_ = false;
};

}  // namespace kiln
