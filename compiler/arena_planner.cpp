#include "compiler/arena_planner.h"

#include <algorithm>
#include <numeric>

namespace kiln {

static uint64_t align_up(uint64_t n) { return (n + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment; }

ArenaPlan plan_arena(const std::vector<LiveBuffer>& buffers) {
  ArenaPlan plan;
  plan.offsets.assign(buffers.size(), 0);
  std::vector<size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return buffers[a].size > buffers[b].size; });

  std::vector<size_t> placed;
  for (size_t i : order) {
    const LiveBuffer& b = buffers[i];
    const uint64_t need = align_up(std::max<uint64_t>(b.size, 1));
    // Intervals [offset, end) of placed buffers alive at the same time, by offset.
    std::vector<std::pair<uint64_t, uint64_t>> busy;
    for (size_t j : placed) {
      const LiveBuffer& o = buffers[j];
      if (o.first <= b.last && b.first <= o.last)
        busy.push_back({plan.offsets[j], plan.offsets[j] + align_up(std::max<uint64_t>(o.size, 1))});
    }
    std::sort(busy.begin(), busy.end());
    uint64_t best = UINT64_MAX, best_gap = UINT64_MAX, cursor = 0;
    for (const auto& [start, end] : busy) {
      if (start > cursor && start - cursor >= need && start - cursor < best_gap)
        best = cursor, best_gap = start - cursor;
      cursor = std::max(cursor, end);
    }
    plan.offsets[i] = best != UINT64_MAX ? best : cursor;
    plan.size = std::max(plan.size, plan.offsets[i] + need);
    placed.push_back(i);
  }
  return plan;
}

}  // namespace kiln
