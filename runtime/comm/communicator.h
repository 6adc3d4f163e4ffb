// Collectives between the ranks of a data-parallel run.
//
// Backends (make_communicator picks one from the environment; see select_comm_backend):
//   SingleProcess  world 1: every collective is a no-op. A lone process needs neither MPI nor NCCL.
//   MPI            launched by mpirun/srun (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK+SLURM_NTASKS
//                  set); host buffers. MPI_Init happens only then. runtime/comm/mpi_communicator.cpp
//   TCP            the environment rendezvous torchrun uses (RANK, WORLD_SIZE, MASTER_ADDR,
//                  MASTER_PORT): rank 0 listens, the others connect; a star through rank 0 over
//                  plain sockets, for launchers without MPI. runtime/comm/tcp_communicator.cpp
//   NCCL           GPU buffers; its unique id travels over the MPI (or TCP) bootstrap, which also
//                  carries the host-side scalars. Only for a GPU target; its collectives run on
//                  a stream of their own, each after the device executor's work queued before it.
//                  runtime/comm/nccl_communicator.cpp
//
// Float buffers live where the target's executor keeps its arena (host memory for the CPU
// executor, device memory for NCCL); doubles and bytes are always host memory.
//
// Every rank must issue the same collectives in the same order. A collective that does not
// complete within the timeout (KILN_COMM_TIMEOUT seconds, default 600) ends the process with a
// message naming the rank and the operation, so that a dead or hung peer never hangs the others
// forever; time the process spends stopped (SIGSTOP, Ctrl-Z; comm/backends.h's
// PauseAwareDeadline) is not counted. Errors are kiln::Error; abort() ends the whole job.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

// A collective started by an i*() call. wait() blocks until it has completed (kiln::Error on
// failure); destroying an unwaited request waits for it.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // The rank's index among the ranks of its machine (chooses the local GPU).
  virtual int local_rank() const = 0;
  // "single process", "MPI", "TCP 127.0.0.1:29500", "NCCL 2.28.9 over MPI" — for the start line.
  virtual std::string describe() const = 0;

  // Whether the float collectives take device memory (NCCL) rather than host memory.
  virtual bool device_memory() const { return false; }
  // Device-memory backends: start each collective after the work queued on this stream (a
  // cudaStream_t) when it is issued, instead of after the legacy default stream's; it then runs
  // on the backend's own stream, beside the work queued later.
  virtual void use_stream(void* stream) { (void)stream; }

  // data[0, n) becomes the sum over ranks, identical on every rank.
  virtual std::unique_ptr<CommRequest> iall_reduce_sum(float* data, int64_t n) = 0;
  void all_reduce_sum(float* data, int64_t n) { iall_reduce_sum(data, n)->wait(); }

  // "v" collectives over data[0, sum(counts)), piece r at displacement counts[0] + ... + counts[r-1]
  // (counts has world_size entries, which may differ).
  // reduce-scatter: every rank holds a full vector; afterwards rank r's own piece holds the sum
  // over ranks of that piece. The other pieces are unspecified afterwards.
  virtual std::unique_ptr<CommRequest> ireduce_scatter_sum(float* data,
                                                           const std::vector<int64_t>& counts) = 0;
  // all-gather: rank r's own piece is its contribution; afterwards every rank holds all pieces.
  virtual std::unique_ptr<CommRequest> iall_gather(float* data,
                                                   const std::vector<int64_t>& counts) = 0;
  void reduce_scatter_sum(float* data, const std::vector<int64_t>& counts) {
    ireduce_scatter_sum(data, counts)->wait();
  }
  void all_gather(float* data, const std::vector<int64_t>& counts) { iall_gather(data, counts)->wait(); }

  // Host values: the loss, pieces of the gradient norm, start-up checks.
  virtual void all_reduce_sum(double* data, int64_t n) = 0;
  double all_reduce_sum(double x) {
    all_reduce_sum(&x, 1);
    return x;
  }
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;

  // Ends every rank of the job after printing `message` (this rank's last words); never returns.
  [[noreturn]] virtual void abort(const std::string& message) = 0;
};

// Which backend to use. Auto: MPI when an MPI launcher started more than one process, else TCP
// when WORLD_SIZE > 1, else a single process; NCCL on top of that bootstrap when the target is a
// GPU. Forcing NCCL for a "cpu" module is an error.
enum class CommBackend { Auto, Single, Mpi, Tcp, Nccl };
CommBackend parse_comm_backend(const std::string& name);  // "auto", "single", "mpi", "tcp", "nccl"
const char* comm_backend_name(CommBackend b);
// The concrete choice for this process's environment and the module's target ("cpu", "cuda").
CommBackend select_comm_backend(CommBackend requested, const std::string& target);

// This process's rank and the job's rank count as its launcher set them (mpirun/srun's variables,
// else RANK and WORLD_SIZE), without connecting to the others: {0, 1} when no launcher started
// more than one process. For commands that one rank does alone (sample).
std::pair<int, int> launcher_rank();
// Whether the launcher started every rank with one command line (Open MPI's one app context, not
// an MPMD `mpirun -n 1 A : -n 1 B`); false when it cannot tell.
bool launcher_same_command();

// Builds the chosen communicator (connecting to the peers). kiln::Error when it cannot.
std::unique_ptr<Communicator> make_communicator(CommBackend requested, const std::string& target);
std::unique_ptr<Communicator> make_single_process_communicator();

// How many of the job's ranks run on this machine (the same host name), by one collective that
// every rank must call.
int ranks_on_this_machine(Communicator& comm);

// Seconds a collective may take before the process gives up: KILN_COMM_TIMEOUT (default 600).
double comm_timeout_seconds();

// The displacement of piece r: counts[0] + ... + counts[r-1].
int64_t piece_offset(const std::vector<int64_t>& counts, int r);

}  // namespace kiln
