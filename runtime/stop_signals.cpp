// Signal handlers that ask the training loop to stop (see stop_signals.h).
#include "runtime/stop_signals.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/file_io.h"

namespace kiln {
namespace {

// Set by the handler on whichever thread took the signal, read by the training loop's.
std::atomic<int> g_requested{0};
const int kStopSignals[] = {SIGINT, SIGTERM};
struct sigaction g_previous[2];
bool g_installed[2];
// The handler's lines (for each phase; for SIGINT, SIGTERM), composed before it can run: it may
// only write(2). g_phase picks the row.
char g_message[StopSignals::kMaxPhases][2][256];
std::atomic<int> g_phase{0};

// Async-signal-safe: a flag and a write(2). The second signal restores the default action
// and raises itself, which ends the process as if no handler were there.
void on_signal(int sig) {
  // (Compare-and-swap: of two signals arriving at once on two threads, one is the first.)
  if (int none = 0; !g_requested.compare_exchange_strong(none, sig)) {
    remove_pending_temporary();  // a checkpoint or --save half written
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  const char* msg = g_message[g_phase.load()][sig == SIGINT ? 0 : 1];
  ssize_t ignored = ::write(2, msg, std::strlen(msg));
  (void)ignored;
}

}  // namespace

StopSignals::StopSignals(int rank, int world, std::initializer_list<const char*> phases) {
  g_requested.store(0);
  g_phase.store(0);
  char who[32] = "";
  if (world > 1) std::snprintf(who, sizeof who, "rank %d: ", rank);
  const char* what = "stopping";
  for (int phase = 0; phase < kMaxPhases; ++phase) {
    if (phase < int(phases.size())) what = phases.begin()[phase];  // (the last one given stays)
    for (int i = 0; i < 2; ++i)
      std::snprintf(g_message[phase][i], sizeof g_message[phase][i], "\nkiln: %s%s: %s (again to stop now)\n", who,
                    i == 0 ? "SIGINT" : "SIGTERM", what);
  }
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // reads, writes and sockets carry on where they were
  // A signal the run was started ignoring (nohup, a script's background job) stays ignored.
  for (int i = 0; i < 2; ++i) {
    sigaction(kStopSignals[i], nullptr, &g_previous[i]);
    g_installed[i] = g_previous[i].sa_handler != SIG_IGN;
    if (g_installed[i]) sigaction(kStopSignals[i], &sa, nullptr);
  }
}

StopSignals::~StopSignals() {
  for (int i = 0; i < 2; ++i)
    if (g_installed[i]) sigaction(kStopSignals[i], &g_previous[i], nullptr);
}

int StopSignals::requested() const { return g_requested.load(); }

void StopSignals::phase(int i) { g_phase.store(i < 0 ? 0 : i < kMaxPhases ? i : kMaxPhases - 1); }

void end_by_signal(int sig) {
  std::fflush(nullptr);
  ::signal(sig, SIG_DFL);
  sigset_t just;
  sigemptyset(&just);
  sigaddset(&just, sig);
  pthread_sigmask(SIG_UNBLOCK, &just, nullptr);
  ::raise(sig);
  std::_Exit(128 + sig);  // not reached
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    default: return "a signal";
  }
}

}  // namespace kiln
