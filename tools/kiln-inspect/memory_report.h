// kiln-inspect's memory and compute accounting: arena, peak, FLOPs, and the timeline picture.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/module.h"

namespace kiln {

// Where an activation buffer of a program is live: from the instr that first uses it to the last
// (the program's result: to the instr count, as it is read after the call).
struct Span {
  uint32_t buffer;
  int64_t first, last;
  const fb::Instr* producer;  // the first instr that uses it
};
std::vector<Span> spans_of(const Module& m, const fb::Program& p);

// Adds arena_bytes, naive_bytes, state/param/grad/optimizer bytes, the peak with its largest
// buffers, the accounting, FLOPs per phase against the 6ND-plus-attention rule, and recompute.
void add_memory_report(const Module& m, nlohmann::ordered_json& j);

// What each of `ranks` data-parallel ranks allocates for training (`train`'s programs): its arena
// as the runtime lays it out (runtime/arena_layout.h: gradients in bucket order; with zero 1 only
// its slices of the AdamW moments), against one process's. bucket_mb: train's --bucket-mb, for a
// module without compiled buckets.
nlohmann::ordered_json data_parallel_report(const Module& m, int ranks, int zero, double bucket_mb);

// A program's buffers as boxes: time (kernel index) across, arena offset down. `program` names
// it (kiln-inspect --program); empty: the program of the most activations.
std::string memory_timeline_svg(const Module& m, const std::string& program = "");

}  // namespace kiln
