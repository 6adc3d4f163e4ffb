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

  // The placed buffers, kept sorted by [start, end) in the arena, so that one pass over them
  // (skipping those not alive with the new buffer) visits the busy ranges in address order: no
  // per-buffer list to build and sort (a 1024-layer model places tens of thousands).
  struct Placed {
    uint64_t start, end;
    int64_t first, last;
  };
  std::vector<Placed> placed;
  placed.reserve(buffers.size());
  for (size_t i : order) {
    const LiveBuffer& b = buffers[i];
    const uint64_t need = align_up(std::max<uint64_t>(b.size, 1));
    // Best fit: the smallest gap between busy ranges that holds `need` (the lowest of equals),
    // else the top of them.
    uint64_t best = UINT64_MAX, best_gap = UINT64_MAX, cursor = 0;
    for (const Placed& p : placed) {
      if (p.first > b.last || b.first > p.last) continue;  // not alive at the same time
      if (p.start > cursor && p.start - cursor >= need && p.start - cursor < best_gap) {
        best = cursor, best_gap = p.start - cursor;
        if (best_gap == need) break;  // no later gap can fit more tightly
      }
      cursor = std::max(cursor, p.end);
    }
    plan.offsets[i] = best != UINT64_MAX ? best : cursor;
    plan.size = std::max(plan.size, plan.offsets[i] + need);
    Placed p{plan.offsets[i], plan.offsets[i] + need, b.first, b.last};
    auto at = std::upper_bound(placed.begin(), placed.end(), p, [](const Placed& x, const Placed& y) {
      return x.start != y.start ? x.start < y.start : x.end < y.end;
    });
    placed.insert(at, p);
  }
  return plan;
}

}  // namespace kiln
