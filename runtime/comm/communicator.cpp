// Backend selection, the single-process communicator and the watchdog.
#include "runtime/comm/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/comm/backends.h"
#include "runtime/error.h"

namespace kiln {
namespace {

// A non-negative integer from the environment, or -1 when unset; kiln::Error when malformed.
int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end || x < 0 || x > 1 << 20)
    throw Error(std::string("environment: ") + name + "='" + one_line(v) + "' is not a rank count or index");
  return int(x);
}

// WORLD_SIZE and RANK as a launcher sets them (torchrun-style): WORLD_SIZE at least 1 and RANK
// below it. A process with a stray RANK but no world must not train alone as if it were rank 0.
int env_world(bool under_mpi) {
  const int world = env_int("WORLD_SIZE"), rank = env_int("RANK");
  if (world == 0) throw Error("environment: WORLD_SIZE=0: a world has at least one rank");
  // Under an MPI launcher MPI numbers the ranks (wrappers often export RANK from it alone).
  if (under_mpi) return std::max(world, 0);
  if (rank > 0 && rank >= std::max(world, 1))
    throw Error("environment: RANK=" + std::to_string(rank) + " is not in [0, WORLD_SIZE=" +
                std::to_string(std::max(world, 1)) + ")" + (world < 0 ? " (WORLD_SIZE is not set)" : ""));
  return std::max(world, 0);
}

// The number of processes an MPI launcher started, or 0 when not started by one: mpirun
// (Open MPI sets OMPI_COMM_WORLD_SIZE), MPICH-style PMI (PMI_SIZE), srun --mpi=pmix (PMIX_RANK,
// with the task count in SLURM_NTASKS).
int mpi_launcher_world() {
  if (int n = env_int("OMPI_COMM_WORLD_SIZE"); n > 0) return n;
  if (int n = env_int("PMI_SIZE"); n > 0) return n;
  if (std::getenv("PMIX_RANK"))
    if (int n = env_int("SLURM_NTASKS"); n > 0) return n;
  return 0;
}

bool is_gpu_target(const std::string& target) { return target.rfind("cuda", 0) == 0 || target == "gpu"; }

constexpr bool kHaveMpi =
#ifdef KILN_HAVE_MPI
    true;
#else
    false;
#endif
constexpr bool kHaveNccl =
#ifdef KILN_HAVE_NCCL
    true;
#else
    false;
#endif

class SingleProcess final : public Communicator {
  struct Done final : CommRequest {
    void wait() override {}
  };

 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  int local_rank() const override { return 0; }
  std::string describe() const override { return "single process"; }
  std::unique_ptr<CommRequest> iall_reduce_sum(float*, int64_t) override { return std::make_unique<Done>(); }
  std::unique_ptr<CommRequest> ireduce_scatter_sum(float*, const std::vector<int64_t>& counts) override {
    check(counts);
    return std::make_unique<Done>();
  }
  std::unique_ptr<CommRequest> iall_gather(float*, const std::vector<int64_t>& counts) override {
    check(counts);
    return std::make_unique<Done>();
  }
  void all_reduce_sum(double*, int64_t) override {}
  void broadcast(void*, size_t, int root) override {
    if (root != 0) throw Error("broadcast: root " + std::to_string(root) + " is not a rank of 1");
  }
  void barrier() override {}
  [[noreturn]] void abort(const std::string& message) override {
    std::fprintf(stderr, "error: %s\n", message.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }

 private:
  static void check(const std::vector<int64_t>& counts) {
    if (counts.size() != 1)
      throw Error("collective: " + std::to_string(counts.size()) + " pieces for 1 rank");
  }
};

}  // namespace

int64_t piece_offset(const std::vector<int64_t>& counts, int r) {
  int64_t off = 0;
  for (int i = 0; i < r; ++i) off += counts[size_t(i)];
  return off;
}

double comm_timeout_seconds() {
  const char* v = std::getenv("KILN_COMM_TIMEOUT");
  if (!v || !*v) return 600;
  char* end = nullptr;
  double s = std::strtod(v, &end);
  if (*end || !(s > 0))
    throw Error(std::string("environment: KILN_COMM_TIMEOUT='") + one_line(v) + "' is not a positive number of seconds");
  // A deadline is a steady_clock time point in nanoseconds: past about 292 years it would wrap.
  // A billion seconds (31 years) is as good as no limit.
  return std::min(s, 1e9);
}

CommBackend parse_comm_backend(const std::string& name) {
  if (name == "auto") return CommBackend::Auto;
  if (name == "single") return CommBackend::Single;
  if (name == "mpi") return CommBackend::Mpi;
  if (name == "tcp") return CommBackend::Tcp;
  if (name == "nccl") return CommBackend::Nccl;
  throw Error("--comm: '" + name + "' is not one of auto, single, mpi, tcp, nccl");
}

const char* comm_backend_name(CommBackend b) {
  switch (b) {
    case CommBackend::Auto: return "auto";
    case CommBackend::Single: return "single";
    case CommBackend::Mpi: return "mpi";
    case CommBackend::Tcp: return "tcp";
    case CommBackend::Nccl: return "nccl";
  }
  return "?";
}

CommBackend select_comm_backend(CommBackend requested, const std::string& target) {
  const int mpi_world = mpi_launcher_world(), env_world = kiln::env_world(mpi_world > 0);
  const bool gpu = is_gpu_target(target);
  switch (requested) {
    case CommBackend::Single:
      if (mpi_world > 1 || env_world > 1)
        throw Error("--comm single: this process is one of " + std::to_string(std::max(mpi_world, env_world)) +
                    " started by a launcher; every one would run alone (and write the same files)");
      return CommBackend::Single;
    case CommBackend::Mpi:
      if (!kHaveMpi) throw Error("--comm mpi: this runtime was built without MPI (no MPI found by CMake)");
      // Outside an MPI launcher MPI starts a world of one: with WORLD_SIZE > 1 every process
      // would run alone (and write the same files).
      if (mpi_world <= 1 && env_world > 1)
        throw Error("--comm mpi: WORLD_SIZE=" + std::to_string(env_world) + " but no MPI launcher started this "
                    "process (run it under mpirun, or use --comm tcp)");
      if (mpi_world <= 0)  // (mpirun -np 1 is a launcher)
        std::fprintf(stderr, "note: --comm mpi: no MPI launcher started this process: it runs alone, an MPI world of "
                     "one rank (mpirun -np N starts N)\n");
      return CommBackend::Mpi;
    case CommBackend::Tcp: return CommBackend::Tcp;
    case CommBackend::Nccl:
      if (!gpu)
        throw Error("--comm nccl: NCCL reduces GPU buffers, but the module targets '" + target +
                    "' (its buffers are in host memory); use --comm mpi or tcp");
      if (!kHaveNccl) throw Error("--comm nccl: this runtime was built without NCCL (CUDA or nccl.h not found by CMake)");
      return CommBackend::Nccl;
    case CommBackend::Auto:
      if (mpi_world <= 1 && env_world <= 1) return CommBackend::Single;
      if (gpu) {
        if (!kHaveNccl)
          throw Error("data parallel: the module targets '" + target + "' but this runtime was built without NCCL");
        return CommBackend::Nccl;
      }
      if (mpi_world > 1) {
        if (!kHaveMpi)
          throw Error("data parallel: started by an MPI launcher with " + std::to_string(mpi_world) +
                      " processes, but this runtime was built without MPI");
        return CommBackend::Mpi;
      }
      return CommBackend::Tcp;
  }
  return CommBackend::Single;
}

std::pair<int, int> launcher_rank() {
  if (const int mpi_world = mpi_launcher_world(); mpi_world > 1) {
    for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
      if (const int r = env_int(name); r >= 0) return {r, mpi_world};
    return {0, mpi_world};
  }
  if (env_int("WORLD_SIZE") <= 1) return {0, 1};
  const int world = env_world(false);  // (a RANK outside the world is an error)
  if (env_int("RANK") < 0)  // (not rank 0 by default: every such process would be)
    throw Error("environment: WORLD_SIZE=" + std::to_string(world) + " but RANK is not set (a launcher sets both, "
                "as torchrun does)");
  return {env_int("RANK"), world};
}

bool launcher_same_command() { return mpi_launcher_world() > 1 && env_int("OMPI_NUM_APP_CTX") == 1; }

std::unique_ptr<Communicator> make_single_process_communicator() { return std::make_unique<SingleProcess>(); }

int ranks_on_this_machine(Communicator& comm) {
  if (comm.world_size() == 1) return 1;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  // FNV-1a of the host name, cut to 52 bits so that a double holds it exactly through the sum.
  uint64_t h = 14695981039346656037ull;
  for (const char* c = host; *c; ++c) h = (h ^ uint8_t(*c)) * 1099511628211ull;
  const double id = double(h & ((uint64_t(1) << 52) - 1));
  std::vector<double> ids(size_t(comm.world_size()), 0.0);
  ids[size_t(comm.rank())] = id;
  comm.all_reduce_sum(ids.data(), int64_t(ids.size()));
  return int(std::count(ids.begin(), ids.end(), id));
}

std::unique_ptr<Communicator> make_communicator(CommBackend requested, const std::string& target) {
  switch (select_comm_backend(requested, target)) {
    case CommBackend::Single: return make_single_process_communicator();
    case CommBackend::Mpi:
#ifdef KILN_HAVE_MPI
      return comm::make_mpi_communicator();
#else
      break;
#endif
    case CommBackend::Tcp: return comm::make_tcp_communicator_from_env();
    case CommBackend::Nccl: {
#ifdef KILN_HAVE_NCCL
      // The bootstrap carries NCCL's unique id: MPI when an MPI launcher started us, else TCP.
      std::unique_ptr<Communicator> bootstrap;
#ifdef KILN_HAVE_MPI
      if (mpi_launcher_world() > 0) bootstrap = comm::make_mpi_communicator();
#endif
      if (!bootstrap) bootstrap = comm::make_tcp_communicator_from_env();
      return comm::make_nccl_communicator(std::move(bootstrap));
#else
      break;
#endif
    }
    case CommBackend::Auto: break;
  }
  throw Error("data parallel: no communicator backend available");
}

namespace comm {

Watchdog::Watchdog() : thread_([this] { loop(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Watchdog::set_name(std::string name) {
  std::lock_guard<std::mutex> lock(mu_);
  name_ = std::move(name);
}

void Watchdog::arm(std::string what, double seconds) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = true;
    what_ = std::move(what);
    seconds_ = seconds;
    deadline_.reset(seconds);
  }
  cv_.notify_all();
}

void Watchdog::disarm() {
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = false;
}

void Watchdog::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (!armed_) {
      cv_.wait(lock);
      continue;
    }
    if (!deadline_.passed()) {
      cv_.wait_until(lock, deadline_.next_check());
      continue;
    }
    std::fprintf(stderr,
                 "error: %s: %s did not complete within %.0f s; another rank has probably died, hung or "
                 "cannot be reached (KILN_COMM_TIMEOUT sets the limit)\n",
                 name_.c_str(), what_.c_str(), seconds_);
    std::fflush(stderr);
    ::_exit(1);  // MPI and NCCL calls cannot be interrupted; the launcher ends the other ranks
  }
}

}  // namespace comm
}  // namespace kiln
