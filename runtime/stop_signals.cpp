// Signal handlers that ask the training loop to stop (see stop_signals.h).
#include "runtime/stop_signals.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iterator>

#include "runtime/file_io.h"

namespace kiln {
namespace {

// Set by the handler on whichever thread took the signal, read by the training loop's.
std::atomic<int> g_requested{0};
// When the first one came (CLOCK_MONOTONIC, ns; 0 before its handler has read the clock).
std::atomic<int64_t> g_first_ns{0};
// `timeout` sends its signal to the command and then to its process group, so the command may
// get it twice within microseconds; a person pressing Ctrl-C again takes longer than this.
constexpr int64_t kSameSignalNs = 300'000'000;
static_assert(std::atomic<int64_t>::is_always_lock_free, "the signal handler reads it");
// SIGHUP: the terminal (or ssh session) the run was started from is gone; a run that was not
// started under nohup keeps its work as for the others.
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};
constexpr int kNumStop = int(std::size(kStopSignals));
struct sigaction g_previous[kNumStop];
bool g_installed[kNumStop];
// The handler's lines (for each phase; for each of kStopSignals), composed before it can run: it
// may only write(2). g_phase picks the row.
char g_message[StopSignals::kMaxPhases][kNumStop][256];
char g_again[kNumStop][128];  // the second signal's line
std::atomic<int> g_phase{0};
bool g_pipe_ignored = false;
// remove_on_signal's folders: kFoldersArmed until the first signal (kFoldersRemoving while its
// handler removes them, then kFoldersRemoved) or keep_folders() (kFoldersNone).
enum { kFoldersNone, kFoldersArmed, kFoldersRemoving, kFoldersRemoved };
std::atomic<int> g_folders_state{kFoldersNone};
constexpr int kMaxFolders = 16;
char g_folders[kMaxFolders][4096];
int g_num_folders = 0;
struct sigaction g_previous_pipe;

// The armed folders removed, innermost first (rmdir: async-signal-safe, and only an empty one
// goes), by whichever comes first: the first signal's handler, or remove_on_signal after a
// signal that came while they were made. (Compare-and-swap: keep_folders() on the training
// loop's thread may be disarming them now.)
void remove_folders() {
  int armed = kFoldersArmed;
  if (!g_folders_state.compare_exchange_strong(armed, kFoldersRemoving)) return;
  for (int i = g_num_folders - 1; i >= 0; --i) ::rmdir(g_folders[i]);
  g_folders_state.store(kFoldersRemoved);
}

int64_t monotonic_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);  // async-signal-safe
  return int64_t(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

// Its place in kStopSignals (the handler is installed for those alone).
int index_of(int sig) {
  int i = 0;
  while (i + 1 < kNumStop && kStopSignals[i] != sig) ++i;
  return i;
}

void say(const char* msg) {
  ssize_t ignored = ::write(2, msg, std::strlen(msg));
  (void)ignored;
}

// Async-signal-safe: a flag, the clock and a write(2). The second signal restores the default
// action and raises itself, which ends the process as if no handler were there; the same signal
// again within kSameSignalNs is the first one sent twice, and is ignored.
void on_signal(int sig) {
  const int saved_errno = errno;  // (the interrupted code may be about to read it)
  const int64_t now = monotonic_ns();
  // (Compare-and-swap: of two signals arriving at once on two threads, one is the first.)
  int first = 0;
  bool is_first = g_requested.compare_exchange_strong(first, sig);
  // A stop the run asked for itself (request(): its stdout closed) is no signal: the first real
  // one is still the first.
  if (!is_first && first == SIGPIPE) is_first = g_requested.compare_exchange_strong(first, sig);
  if (!is_first) {
    // A signal within kSameSignalNs of the first is the same request sent twice (timeout's two
    // copies, or a launcher's SIGTERM beside the terminal's SIGINT).
    const int64_t then = g_first_ns.load();
    if (then == 0 || now - then < kSameSignalNs) {
      errno = saved_errno;
      return;
    }
    say(g_again[index_of(sig)]);
    remove_pending_temporary();  // a checkpoint or --save half written
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  g_first_ns.store(now);
  say(g_message[g_phase.load()][index_of(sig)]);
  remove_folders();
  errno = saved_errno;
}

}  // namespace

StopSignals::StopSignals(int rank, int world, std::initializer_list<const char*> phases, bool keep_on_broken_pipe) {
  g_requested.store(0);
  g_first_ns.store(0);
  g_phase.store(0);
  char who[32] = "";
  if (world > 1) std::snprintf(who, sizeof who, "rank %d: ", rank);
  // A new line first on a terminal, where the echoed ^C ends the line; none in a file (a
  // scheduler's log), where it would be a blank line.
  const char* nl = ::isatty(2) ? "\n" : "";
  const char* what = "stopping";
  for (int phase = 0; phase < kMaxPhases; ++phase) {
    if (phase < int(phases.size())) what = phases.begin()[phase];  // (the last one given stays)
    for (int i = 0; i < kNumStop; ++i)
      std::snprintf(g_message[phase][i], sizeof g_message[phase][i], "%skiln: %s%s: %s (again to stop now)\n", nl,
                    who, signal_name(kStopSignals[i]), what);
  }
  for (int i = 0; i < kNumStop; ++i)
    std::snprintf(g_again[i], sizeof g_again[i], "%skiln: %s%s, a second signal: stopping now, without a checkpoint or --save\n",
                  nl, who, signal_name(kStopSignals[i]));
  // A closed stdout (`train ... | head`) then fails a write with EPIPE, which the caller sees,
  // instead of ending the process with SIGPIPE in the middle of a step.
  g_pipe_ignored = keep_on_broken_pipe;
  if (keep_on_broken_pipe) {
    struct sigaction ignore{};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, &g_previous_pipe);
  }
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // reads, writes and sockets carry on where they were
  // A signal the run was started ignoring (nohup, a script's background job) stays ignored.
  for (int i = 0; i < kNumStop; ++i) {
    sigaction(kStopSignals[i], nullptr, &g_previous[i]);
    g_installed[i] = g_previous[i].sa_handler != SIG_IGN;
    if (g_installed[i]) sigaction(kStopSignals[i], &sa, nullptr);
  }
}

StopSignals::~StopSignals() {
  g_folders_state.store(kFoldersNone);
  for (int i = 0; i < kNumStop; ++i)
    if (g_installed[i]) sigaction(kStopSignals[i], &g_previous[i], nullptr);
  if (g_pipe_ignored) sigaction(SIGPIPE, &g_previous_pipe, nullptr);
  g_pipe_ignored = false;
}

int StopSignals::requested() const { return g_requested.load(); }

bool StopSignals::request(int sig) {
  int none = 0;
  if (!g_requested.compare_exchange_strong(none, sig)) return false;
  g_first_ns.store(monotonic_ns());
  return true;
}

void StopSignals::remove_on_signal(const std::vector<std::string>& folders) {
  g_folders_state.store(kFoldersNone);
  g_num_folders = 0;
  if (folders.empty() || folders.size() > size_t(kMaxFolders)) return;  // (then the run's destructor alone removes them)
  for (const std::string& f : folders)
    if (f.size() >= sizeof g_folders[0]) return;
  for (const std::string& f : folders) std::memcpy(g_folders[g_num_folders++], f.c_str(), f.size() + 1);
  g_folders_state.store(kFoldersArmed);
  // A signal that came while they were made (its handler found none armed) removes them now.
  if (const int came = g_requested.load(); came != 0 && came != SIGPIPE) remove_folders();
}

bool StopSignals::keep_folders() {
  int state = kFoldersArmed;
  if (g_folders_state.compare_exchange_strong(state, kFoldersNone)) return false;
  // A handler on another thread may be removing them still.
  while ((state = g_folders_state.load()) == kFoldersRemoving) sched_yield();
  g_folders_state.store(kFoldersNone);
  return state == kFoldersRemoved;
}

int StopSignals::phase(int i) { return g_phase.exchange(i < 0 ? 0 : i < kMaxPhases ? i : kMaxPhases - 1); }

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
    case SIGHUP: return "SIGHUP";
    case SIGPIPE: return "SIGPIPE";
    default: return "a signal";
  }
}

}  // namespace kiln
