// The learning rate of step s (0-based), as ../shared/docs/training-semantics.md defines it.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

namespace kiln {

struct LrSchedule {
  std::string kind = "cosine";  // "cosine" | "constant"
  double lr = 6e-4;             // maximum
  double min_lr_ratio = 0.1;    // min_lr = lr * min_lr_ratio
  int64_t warmup_steps = 0;     // W
  int64_t total_steps = 1;      // S
};

// Linear warm-up over W steps, then cosine decay from lr to min_lr at step S (or a constant lr).
inline double learning_rate(const LrSchedule& s, int64_t step) {
  if (step < s.warmup_steps) return s.lr * double(step + 1) / double(s.warmup_steps);
  if (s.kind == "constant") return s.lr;
  const double min_lr = s.lr * s.min_lr_ratio;
  if (step > s.total_steps) return min_lr;
  const double r = s.total_steps > s.warmup_steps
                       ? double(step - s.warmup_steps) / double(s.total_steps - s.warmup_steps)
                       : 0.0;
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * r)) * (s.lr - min_lr);
}

}  // namespace kiln
