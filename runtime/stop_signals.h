// Ctrl-C (SIGINT), SIGTERM (a scheduler's preemption, `kill`) and SIGHUP (the terminal closed)
// during training: the run finishes the step it is in (or the micro-step, leaving a step cut
// short undone), writes a checkpoint and --save, and exits 128 + the signal, so that --resume
// goes on from there. A second signal ends the process at once (one within 0.3 s of the first counts as the first:
// `timeout` sends its signal twice). The process then ends by that signal (as a shell expects of a
// Ctrl-C'd command), after the communicator is shut.
#pragma once
#include <initializer_list>
#include <string>
#include <vector>

namespace kiln {

// Installs the handlers for its lifetime and restores the previous ones after. The handler's line
// says what happens now: phases[0] at first, phases[i] once phase(i) is called (a run's start, its
// first step, the steps after); with several ranks (world > 1) it names the rank that got the signal.
// With keep_on_broken_pipe, SIGPIPE is ignored meanwhile: a write to a closed pipe fails with
// EPIPE instead of ending the process (the trainer then stops as if signalled, see request()).
class StopSignals {
 public:
  static constexpr int kMaxPhases = 4;
  StopSignals(int rank, int world, std::initializer_list<const char*> phases, bool keep_on_broken_pipe = false);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The first signal that arrived (SIGINT, SIGTERM or SIGHUP), or 0.
  int requested() const;
  // Asks to stop as `sig` would, without its line; false if a signal came first.
  bool request(int sig);
  // From now on a signal's line says phases[i]; returns the phase before.
  int phase(int i);
  // Folders the run made for its outputs (outermost first), still empty before its first step:
  // the first signal removes those still empty (rmdir), innermost first. Under mpirun a rank's
  // failure reaches the others as SIGTERM and then SIGKILL, which no destructor outlives.
  void remove_on_signal(const std::vector<std::string>& folders);
  // Stops that (before the first write into them, at the first step's end): true if a signal
  // removed them, and the run, which goes on to the end of that step (ranks), must make them again.
  bool keep_folders();
};

// "SIGINT", "SIGTERM", "SIGHUP", "SIGPIPE".
const char* signal_name(int sig);

// Thrown by train() after an interrupted run has saved what it has: not an error; the CLI shuts
// the communicator and raises the signal with its default action (end_by_signal).
struct Interrupted {
  int signal;
};

// Restores the default action of `sig` and raises it: the process ends as if no handler had
// been there (a shell sees a command ended by SIGINT, and stops its script).
[[noreturn]] void end_by_signal(int sig);

}  // namespace kiln
