// Internal to runtime/comm: the backends' factories and the timeout watchdog they share.
#pragma once
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "runtime/comm/communicator.h"

namespace kiln::comm {

// A deadline that leaves out the time this process spent stopped (Ctrl-Z of a whole job, or
// SIGSTOP then SIGCONT): the ranks of a job paused together would otherwise each find their
// deadline passed on waking, and end a job that nothing is wrong with. Whoever checks it does
// so at least every kTick; a gap of more than kStopped between two checks is taken for a stop,
// and moves the deadline on by that gap. (A system suspend stops steady_clock itself.)
class PauseAwareDeadline {
 public:
  using clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kTick{250}, kStopped{2000};

  explicit PauseAwareDeadline(double seconds = 0) { reset(seconds); }
  void reset(double seconds) {
    last_ = clock::now();
    deadline_ = last_ + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(seconds));
  }
  bool passed() {
    const clock::time_point now = clock::now();
    if (now - last_ > kStopped) deadline_ += now - last_;
    last_ = now;
    return now >= deadline_;
  }
  // When to check next: the deadline, or a tick from the last check if that comes first.
  clock::time_point next_check() const { return std::min(deadline_, last_ + kTick); }

 private:
  clock::time_point last_, deadline_;
};

// Ends the process when a blocking wait outlives its deadline: MPI and NCCL calls cannot be
// interrupted, so a thread watches them. It prints one line and calls _exit(1); the launcher
// (mpirun, srun, torchrun) then sees a failed rank and ends the job.
class Watchdog {
 public:
  Watchdog();
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Who this process is, for the message ("rank 1 of 2 (MPI)").
  void set_name(std::string name);
  // Arms the deadline for `what`; disarm() (or the next arm) cancels it.
  void arm(std::string what, double seconds);
  void disarm();

  // Arms for the lifetime of a scope.
  struct Scope {
    Watchdog& w;
    Scope(Watchdog& w, std::string what, double seconds) : w(w) { w.arm(std::move(what), seconds); }
    ~Scope() { w.disarm(); }
  };

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false, stop_ = false;
  PauseAwareDeadline deadline_;
  double seconds_ = 0;
  std::string what_, name_ = "this rank";
  std::thread thread_;
};

#ifdef KILN_HAVE_MPI
// MPI_Init (once per process) and MPI_COMM_WORLD. Built only with MPI.
std::unique_ptr<Communicator> make_mpi_communicator();
#endif
// From RANK, WORLD_SIZE, MASTER_ADDR (default 127.0.0.1), MASTER_PORT (default 29500), LOCAL_RANK.
std::unique_ptr<Communicator> make_tcp_communicator_from_env();
#ifdef KILN_HAVE_NCCL
// An NCCL communicator over `bootstrap`, which carries its unique id and the host values.
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> bootstrap);
// Opens NCCL and looks up every function the communicator uses (for tests); kiln::Error if not.
void open_nccl();
#endif

}  // namespace kiln::comm
