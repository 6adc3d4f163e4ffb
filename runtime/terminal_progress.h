// A progress line for long work, on a terminal only.
#pragma once
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>

namespace kiln {

// Seconds left after `done` of `done + left` steps that took `elapsed` seconds, the first of them
// `first`: from the steps after the first when there are any, since the first also warms up
// (caches, pages, kernels) and would inflate every later estimate.
inline double eta_seconds(double elapsed, double first, int64_t done, int64_t left) {
  if (done <= 0) return 0;
  const double per = done > 1 ? (elapsed - first) / double(done - 1) : elapsed / double(done);
  return per * double(left);
}

// An evaluation's seconds before one has been timed: `batches` forward passes of a micro-step's
// batch, each about a third of a micro-step (the backward pass does twice the forward's matrix
// products), so the first ETAs of a run with evaluations do not leave them out.
inline double evaluation_guess_seconds(double step_seconds, int64_t micro_steps, int64_t batches) {
  return micro_steps > 0 ? step_seconds / double(micro_steps) / 3.0 * double(batches) : 0;
}

// How many of the steps after `done` of `total` are followed by work done every `every` steps and
// after the last (evaluation, samples, checkpoints): the multiples of `every` in (done, total],
// and `total` when it is none of them; `every` <= 0: the last alone.
inline int64_t periodic_left(int64_t done, int64_t total, int64_t every) {
  if (done >= total) return 0;
  if (every <= 0) return 1;
  return total / every - done / every + (total % every != 0 ? 1 : 0);
}

// How far long work is, on a terminal only: "\rWHAT: done/total UNIT, s, about s left", at most
// ten times a second and at the end. end_line() before an error, clear() before the result.
class TerminalProgress {
 public:
  // shown: false for a process that must not print (a rank other than 0).
  TerminalProgress(const char* what, const char* unit, bool shown = true)
      : what_(what), unit_(unit), on_(shown && ::isatty(2) == 1) {}
  bool on() const { return on_; }
  void update(int64_t done, int64_t total) {
    const Clock::time_point now = Clock::now();
    if (done < total && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    shown_ = true;
    const double s = std::chrono::duration<double>(now - start_).count();
    std::fprintf(stderr, "\r%s: %lld/%lld %s, %.0f s, about %.0f s left ", what_, (long long)done, (long long)total,
                 unit_, s, s / double(done) * double(total - done));
    std::fflush(stderr);
  }
  void end_line() const {
    if (shown_) std::fprintf(stderr, "\n");
  }
  void clear() const {
    if (shown_) std::fprintf(stderr, "\r%*s\r", 72, "");
  }

 private:
  using Clock = std::chrono::steady_clock;
  const char* what_;
  const char* unit_;
  bool on_;
  bool shown_ = false;
  Clock::time_point start_ = Clock::now(), last_{};
};

}  // namespace kiln
