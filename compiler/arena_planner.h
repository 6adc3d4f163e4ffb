// Offsets for buffers with known live intervals, packed into one arena. Plain C++ (no MLIR), so
// the planning pass and the randomized tests share it.
#pragma once
#include <cstdint>
#include <vector>

namespace kiln {

struct LiveBuffer {
  uint64_t size = 0;      // bytes
  int64_t first = 0;      // index of the kernel that writes it first
  int64_t last = 0;       // index of the last kernel that uses it (inclusive)
};

constexpr uint64_t kArenaAlignment = 256;  // cuBLASLt workspace/operands and 16-byte vectors

struct ArenaPlan {
  std::vector<uint64_t> offsets;  // one per buffer, multiples of kArenaAlignment
  uint64_t size = 0;              // bytes of the arena
};

// Greedy by size, best fit (TFLite's arena planner, XLA's heap simulator in spirit): buffers are
// placed largest first, each in the smallest gap left by the already placed buffers whose live
// intervals intersect its own, or above them all. Deterministic: ties keep the input order.
ArenaPlan plan_arena(const std::vector<LiveBuffer>& buffers);

}  // namespace kiln
