// Ctrl-C (SIGINT) and SIGTERM (a scheduler's preemption, `kill`) during training: the run
// finishes the step it is in, writes a checkpoint and --save, and exits 128 + the signal, so
// that --resume goes on from there. A second signal ends the process at once.
#pragma once

namespace kiln {

// Installs the handlers for its lifetime and restores the previous ones after.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The first signal that arrived (SIGINT or SIGTERM), or 0.
  int requested() const;
};

// "SIGINT", "SIGTERM".
const char* signal_name(int sig);

// Thrown by train() after an interrupted run has saved what it has: not an error, the CLI
// exits 128 + signal.
struct Interrupted {
  int signal;
};

}  // namespace kiln
