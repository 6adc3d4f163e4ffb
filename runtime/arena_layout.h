// Where each buffer lies in the arena a process allocates. The module plans one layout for
// every process: the state region (parameters, gradients, AdamW moments, inputs, hyperparameters)
// and then the activations. Under ZeRO-1 a rank updates only its slice [begin, end) of each
// parameter, so it keeps only that slice of both AdamW moments: the layout packs the state
// region without the rest, and the activations follow it.
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
  // The state region and the largest of these programs' activations.
  uint64_t arena_bytes(const Module& m, const std::vector<std::string>& programs) const;
};

// The module's layout, with each parameter's moments cut to slices[p] when slices is not empty
// (one [begin, end) per parameter, in the module's parameter order; begin == end: none kept).
// kiln::Error naming the module for a slice outside its parameter.
ArenaLayout layout_arena(const Module& m, const std::vector<std::pair<int64_t, int64_t>>& slices = {});

}  // namespace kiln
