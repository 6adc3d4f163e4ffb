// Signal handlers that ask the training loop to stop (see stop_signals.h).
#include "runtime/stop_signals.h"

#include <signal.h>
#include <unistd.h>

#include <cstring>

namespace kiln {
namespace {

volatile sig_atomic_t g_requested = 0;
struct sigaction g_previous_int, g_previous_term;

// Async-signal-safe: a flag and a write(2). The second signal restores the default action
// and raises itself, which ends the process as if no handler were there.
void on_signal(int sig) {
  if (g_requested) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  g_requested = sig;
  const char* msg = sig == SIGINT ? "\nkiln: SIGINT: stopping after this step, with a checkpoint (again to stop now)\n"
                                  : "\nkiln: SIGTERM: stopping after this step, with a checkpoint (again to stop now)\n";
  ssize_t ignored = ::write(2, msg, std::strlen(msg));
  (void)ignored;
}

}  // namespace

StopSignals::StopSignals() {
  g_requested = 0;
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // reads, writes and sockets carry on where they were
  sigaction(SIGINT, &sa, &g_previous_int);
  sigaction(SIGTERM, &sa, &g_previous_term);
}

StopSignals::~StopSignals() {
  sigaction(SIGINT, &g_previous_int, nullptr);
  sigaction(SIGTERM, &g_previous_term, nullptr);
}

int StopSignals::requested() const { return g_requested; }

const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    default: return "a signal";
  }
}

}  // namespace kiln
