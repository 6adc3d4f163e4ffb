// Where each buffer lies in the arena a process allocates. The module plans one layout for
// every process: the state region (parameters, gradients, AdamW moments, inputs, hyperparameters)
// and then the activations. A data-parallel rank lays its state region out anew (StatePlan): the
// gradients in the order of the buckets it reduces, one after another, so that the collectives
// work on the arena itself, and the values likewise; under ZeRO-1 a rank updates only its slice
// [begin, end) of each parameter, so it keeps only that slice of both AdamW moments. The
// activations follow the state region, as the module planned them.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/module.h"

namespace kiln {

struct ArenaLayout {
  // By buffer: the byte position of its element 0. For a sliced moment, element `begin` is the
  // first one stored, so element 0's position lies before its storage (on the parameter's value
  // and gradient, which precede it: never before the arena). Kernels index from element 0 and
  // touch only [begin, end). Positions keep the module's 256-byte alignment of element 0.
  std::vector<uint64_t> at;
  // By buffer: the elements [begin, end) it stores (all of them, but for a sliced moment).
  std::vector<std::pair<int64_t, int64_t>> held;
  std::vector<int64_t> numel;  // by buffer: its elements
  uint64_t state_bytes = 0;  // the packed state region; the activations start here
  bool sliced = false;       // some moment holds less than its whole

  bool whole(uint32_t buffer) const { return held[buffer].first == 0 && held[buffer].second == numel[buffer]; }
  // The bytes [begin, end) a buffer's stored elements take (for a sliced moment, after at[]).
  std::pair<uint64_t, uint64_t> storage(const Module& m, uint32_t buffer) const;
  // The state region and the largest of these programs' activations.
  uint64_t arena_bytes(const Module& m, const std::vector<std::string>& programs) const;
};

// How a data-parallel rank lays out its state instead of as the module does (data_parallel.h).
struct StatePlan {
  // Parameters (their indices) in the order of the gradient buckets: their gradients first in
  // the state region, one after another in this order (each 256-byte aligned), then their values
  // the same way. Empty: the module's order.
  std::vector<size_t> bucket_order;
  // ZeRO-1: the elements [begin, end) of each parameter (module order) this rank updates; the
  // arena keeps only those of its AdamW moments (begin == end: none). Empty: all.
  std::vector<std::pair<int64_t, int64_t>> moment_slices;
};

// The layout of the module's arena under `plan`. kiln::Error naming the module for a bucket
// order that is not a permutation of its parameters or a slice outside its parameter.
ArenaLayout layout_arena(const Module& m, const StatePlan& plan = {});

}  // namespace kiln
