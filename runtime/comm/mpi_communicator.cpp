// The MPI backend (Open MPI from Debian's libopenmpi-dev; any MPI-3 library works): host buffers,
// MPI_COMM_WORLD. MPI_Init runs only when this backend is chosen, i.e. when an MPI launcher
// started the process; a lone process never initialises MPI.
//
// Errors: MPI_ERRORS_RETURN turns failed calls into kiln::Error (the caller then aborts the job).
// A peer that dies makes mpirun end the job within about a second; a peer that hangs is caught
// by the watchdog (KILN_COMM_TIMEOUT), which ends this process so that mpirun ends the rest.
//
// Non-blocking collectives progress inside MPI calls (Open MPI runs no progress thread by
// default), so they overlap with computation only as far as the library progresses them.
// The C API only: Open MPI's mpi.h would otherwise pull in its deprecated C++ bindings.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/comm/backends.h"
#include "runtime/error.h"

namespace kiln::comm {
namespace {

class MpiCommunicator;

// Element counts per MPI call: MPI counts are int.
constexpr int64_t kMaxCount = int64_t(1) << 30;

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator();
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  int local_rank() const override { return local_rank_; }
  std::string describe() const override {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, size_t(len));
    v = v.substr(0, v.find_first_of(",\n"));
    return "MPI (" + v + ")";
  }

  std::unique_ptr<CommRequest> iall_reduce_sum(float* data, int64_t n) override;
  std::unique_ptr<CommRequest> ireduce_scatter_sum(float* data, const std::vector<int64_t>& counts) override;
  std::unique_ptr<CommRequest> iall_gather(float* data, const std::vector<int64_t>& counts) override;
  void all_reduce_sum(double* data, int64_t n) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void barrier() override;
  [[noreturn]] void abort(const std::string& message) override {
    std::fprintf(stderr, "error: %s\n", message.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }

  // "rank 1 of 4 (MPI)"
  std::string who() const { return "rank " + std::to_string(rank_) + " of " + std::to_string(world_) + " (MPI)"; }
  void check(int rc, const char* call) const {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw Error(who() + ": " + call + ": " + std::string(msg, size_t(len)));
  }
  std::vector<int> int_counts(const std::vector<int64_t>& counts, const char* what) const {
    if (counts.size() != size_t(world_))
      throw Error(who() + ": " + what + ": " + std::to_string(counts.size()) + " pieces for " +
                  std::to_string(world_) + " ranks");
    // MPI counts are ints: each piece, and (as displacements) their sum. The sum of at most 65536
    // pieces of at most INT_MAX each cannot overflow an int64_t.
    std::vector<int> c;
    int64_t total = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      const int64_t x = counts[i];
      if (x < 0) throw Error(who() + ": " + what + ": piece " + std::to_string(i) + " has " + std::to_string(x) + " elements");
      if (x > INT_MAX)
        throw Error(who() + ": " + what + ": piece " + std::to_string(i) + "'s " + std::to_string(x) +
                    " elements exceed MPI's int counts; use smaller gradient buckets");
      total += x;
      c.push_back(int(x));
    }
    if (total > INT_MAX)
      throw Error(who() + ": " + what + ": the pieces' " + std::to_string(total) +
                  " elements in all exceed MPI's int counts; use smaller gradient buckets");
    return c;
  }

  Watchdog watchdog;
  double timeout = 600;

 private:
  int rank_ = 0, world_ = 1, local_rank_ = 0;
};

// One started collective: its MPI requests and what to do once they complete.
class MpiRequest final : public CommRequest {
 public:
  MpiRequest(MpiCommunicator& c, std::string what) : c_(c), what_(std::move(what)) {}
  ~MpiRequest() override {
    try {
      wait();
    } catch (...) {
    }
  }
  void wait() override {
    if (done_) return;
    done_ = true;
    {
      Watchdog::Scope guard(c_.watchdog, what_, c_.timeout);
      c_.check(MPI_Waitall(int(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    }
    if (copy_to_) std::memcpy(copy_to_, scratch_.data(), scratch_.size() * sizeof(float));
  }

  std::vector<MPI_Request> reqs_;
  std::vector<int> counts_, displs_;  // alive until completion, as MPI requires
  std::vector<float> scratch_;
  float* copy_to_ = nullptr;

 private:
  MpiCommunicator& c_;
  std::string what_;
  bool done_ = false;
};

int g_mpi_users = 0;  // communicators alive; MPI_Finalize when the last one goes

MpiCommunicator::MpiCommunicator() {
  timeout = comm_timeout_seconds();
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    Watchdog::Scope guard(watchdog, "MPI_Init (connecting to the other ranks)", timeout);
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      throw Error("MPI_Init_thread: failed (is this process started by mpirun or srun?)");
  }
  ++g_mpi_users;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_);
  watchdog.set_name(who());
  // The rank among the processes of this machine: from the launcher, else from MPI itself.
  if (const char* l = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) {
    local_rank_ = std::atoi(l);
  } else {
    MPI_Comm node;
    check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
          "MPI_Comm_split_type");
    MPI_Comm_rank(node, &local_rank_);
    MPI_Comm_free(&node);
  }
}

MpiCommunicator::~MpiCommunicator() {
  if (--g_mpi_users > 0) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    Watchdog::Scope guard(watchdog, "MPI_Finalize", timeout);
    MPI_Finalize();
  }
}

std::unique_ptr<CommRequest> MpiCommunicator::iall_reduce_sum(float* data, int64_t n) {
  auto r = std::make_unique<MpiRequest>(*this, "all_reduce of " + std::to_string(n) + " floats");
  for (int64_t at = 0; at < n; at += kMaxCount) {
    MPI_Request req;
    check(MPI_Iallreduce(MPI_IN_PLACE, data + at, int(std::min(kMaxCount, n - at)), MPI_FLOAT, MPI_SUM,
                         MPI_COMM_WORLD, &req),
          "MPI_Iallreduce");
    r->reqs_.push_back(req);
  }
  return r;
}

std::unique_ptr<CommRequest> MpiCommunicator::ireduce_scatter_sum(float* data, const std::vector<int64_t>& counts) {
  auto r = std::make_unique<MpiRequest>(*this, "reduce_scatter of " + std::to_string(piece_offset(counts, world_)) + " floats");
  r->counts_ = int_counts(counts, "reduce_scatter");
  // MPI_IN_PLACE would leave the result at the start of the buffer, not at this rank's piece:
  // receive into scratch and copy it into place on completion.
  r->scratch_.resize(size_t(counts[size_t(rank_)]));
  r->copy_to_ = data + piece_offset(counts, rank_);
  MPI_Request req;
  check(MPI_Ireduce_scatter(data, r->scratch_.data(), r->counts_.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req),
        "MPI_Ireduce_scatter");
  r->reqs_.push_back(req);
  return r;
}

std::unique_ptr<CommRequest> MpiCommunicator::iall_gather(float* data, const std::vector<int64_t>& counts) {
  auto r = std::make_unique<MpiRequest>(*this, "all_gather of " + std::to_string(piece_offset(counts, world_)) + " floats");
  r->counts_ = int_counts(counts, "all_gather");
  for (int i = 0; i < world_; ++i) r->displs_.push_back(int(piece_offset(counts, i)));
  MPI_Request req;
  check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, r->counts_.data(), r->displs_.data(), MPI_FLOAT,
                        MPI_COMM_WORLD, &req),
        "MPI_Iallgatherv");
  r->reqs_.push_back(req);
  return r;
}

void MpiCommunicator::all_reduce_sum(double* data, int64_t n) {
  MpiRequest r(*this, "all_reduce of " + std::to_string(n) + (n == 1 ? " double" : " doubles"));
  MPI_Request req;
  check(MPI_Iallreduce(MPI_IN_PLACE, data, int(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &req), "MPI_Iallreduce");
  r.reqs_.push_back(req);
  r.wait();
}

void MpiCommunicator::broadcast(void* data, size_t bytes, int root) {
  MpiRequest r(*this, "broadcast of " + std::to_string(bytes) + " bytes from rank " + std::to_string(root));
  auto* p = static_cast<char*>(data);
  for (size_t at = 0; at < bytes; at += size_t(kMaxCount)) {
    MPI_Request req;
    check(MPI_Ibcast(p + at, int(std::min(size_t(kMaxCount), bytes - at)), MPI_BYTE, root, MPI_COMM_WORLD, &req),
          "MPI_Ibcast");
    r.reqs_.push_back(req);
  }
  r.wait();
}

void MpiCommunicator::barrier() {
  MpiRequest r(*this, "barrier");
  MPI_Request req;
  check(MPI_Ibarrier(MPI_COMM_WORLD, &req), "MPI_Ibarrier");
  r.reqs_.push_back(req);
  r.wait();
}

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() { return std::make_unique<MpiCommunicator>(); }

}  // namespace kiln::comm
