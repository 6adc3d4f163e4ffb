// The NCCL backend: float collectives on GPU buffers, for a CUDA target's executor. Built when
// CMake finds the CUDA toolkit and NCCL (KILN_HAVE_NCCL); chosen for a cuda module run by a
// launcher (select_comm_backend). Not yet run on GPUs: the build machines have none.
//
// Set-up: the bootstrap communicator (MPI under mpirun/srun, else the TCP rendezvous) gives the
// rank and world; this process takes GPU local_rank % device count (OMPI_COMM_WORLD_LOCAL_RANK
// or LOCAL_RANK), rank 0 creates NCCL's unique id and the bootstrap broadcasts it, then
// ncclCommInitRank. Host values (the loss, norm pieces, start-up checks) and barriers go over
// the bootstrap.
//
// Ordering: collectives run on the communicator's own stream, each after an event recorded on
// the device executor's compute stream (handed over by use_stream; else the legacy default
// stream) when it is issued. A bucket's all-reduce therefore follows the kernels that computed its
// gradients and runs while the backward kernels queued after it compute the next buckets' (the
// compiler placed each bucket after the last write of its gradients). The optimizer follows it
// because the executor queues the optimizer only once wait() has seen every collective done.
//
// Failure: wait() polls the stream and ncclCommGetAsyncError; an error, or no completion within
// KILN_COMM_TIMEOUT, aborts the NCCL communicator and raises a kiln::Error.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "runtime/comm/backends.h"
#include "runtime/cuda/shared_library.h"
#include "runtime/error.h"

namespace kiln::comm {
namespace {

// NCCL, opened at run time (runtime/cuda/shared_library.h): the library found at build time,
// then the loader's search.
#define KILN_NCCL_FUNCTIONS(F)                                                                        \
  F(ncclAllGather) F(ncclAllReduce) F(ncclBroadcast) F(ncclCommAbort) F(ncclCommDestroy)              \
  F(ncclCommGetAsyncError) F(ncclCommInitRank) F(ncclGetErrorString) F(ncclGetLastError)              \
  F(ncclGetUniqueId) F(ncclGetVersion) F(ncclGroupEnd) F(ncclGroupStart) F(ncclReduce) F(ncclReduceScatter)
struct NcclApi {
  KILN_NCCL_FUNCTIONS(KILN_API_MEMBER)
};
const NcclApi& nccl_api() {
  static const NcclApi loaded = [] {
    NcclApi api;
    const std::string what = "NCCL";
    void* library = open_library({KILN_NCCL_LIBRARY, "libnccl.so.2", "libnccl.so"}, what);
    KILN_NCCL_FUNCTIONS(KILN_API_LOAD)
    return api;
  }();
  return loaded;
}

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(std::unique_ptr<Communicator> bootstrap);
  ~NcclCommunicator() override;

  int rank() const override { return boot_->rank(); }
  int world_size() const override { return boot_->world_size(); }
  int local_rank() const override { return boot_->local_rank(); }
  std::string describe() const override {
    int v = 0;
    nccl_api().ncclGetVersion(&v);
    return "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100) +
           " on GPU " + std::to_string(device_) + ", over " + boot_->describe();
  }

  std::unique_ptr<CommRequest> iall_reduce_sum(float* data, int64_t n) override {
    begin();
    nccl(nccl_api().ncclAllReduce(data, data, size_t(n), ncclFloat, ncclSum, comm_, stream_), "ncclAllReduce");
    return finish("all_reduce of " + std::to_string(n) + " floats");
  }
  std::unique_ptr<CommRequest> ireduce_scatter_sum(float* data, const std::vector<int64_t>& counts) override {
    check_counts(counts, "reduce_scatter");
    begin();
    if (equal(counts)) {  // in place: this rank's piece is recvbuff
      const size_t c = size_t(counts[0]);
      nccl(nccl_api().ncclReduceScatter(data, data + size_t(rank()) * c, c, ncclFloat, ncclSum, comm_, stream_),
           "ncclReduceScatter");
    } else {  // unequal pieces: one reduce to each piece's owner
      nccl(nccl_api().ncclGroupStart(), "ncclGroupStart");
      for (int r = 0; r < world_size(); ++r) {
        float* p = data + piece_offset(counts, r);
        nccl(nccl_api().ncclReduce(p, p, size_t(counts[size_t(r)]), ncclFloat, ncclSum, r, comm_, stream_), "ncclReduce");
      }
      nccl(nccl_api().ncclGroupEnd(), "ncclGroupEnd");
    }
    return finish("reduce_scatter of " + std::to_string(piece_offset(counts, world_size())) + " floats");
  }
  std::unique_ptr<CommRequest> iall_gather(float* data, const std::vector<int64_t>& counts) override {
    check_counts(counts, "all_gather");
    begin();
    if (equal(counts)) {
      const size_t c = size_t(counts[0]);
      nccl(nccl_api().ncclAllGather(data + size_t(rank()) * c, data, c, ncclFloat, comm_, stream_), "ncclAllGather");
    } else {  // unequal pieces: each owner broadcasts its piece
      nccl(nccl_api().ncclGroupStart(), "ncclGroupStart");
      for (int r = 0; r < world_size(); ++r) {
        float* p = data + piece_offset(counts, r);
        nccl(nccl_api().ncclBroadcast(p, p, size_t(counts[size_t(r)]), ncclFloat, r, comm_, stream_), "ncclBroadcast");
      }
      nccl(nccl_api().ncclGroupEnd(), "ncclGroupEnd");
    }
    return finish("all_gather of " + std::to_string(piece_offset(counts, world_size())) + " floats");
  }
  bool device_memory() const override { return true; }
  void use_stream(void* stream) override { external_ = static_cast<cudaStream_t>(stream); }
  void all_reduce_sum(double* data, int64_t n) override { boot_->all_reduce_sum(data, n); }
  void broadcast(void* data, size_t bytes, int root) override { boot_->broadcast(data, bytes, root); }
  void barrier() override { boot_->barrier(); }
  [[noreturn]] void abort(const std::string& message) override {
    if (comm_) nccl_api().ncclCommAbort(comm_);
    comm_ = nullptr;
    boot_->abort(message);
    std::_Exit(1);  // not reached
  }

 private:
  class Request final : public CommRequest {
   public:
    Request(NcclCommunicator& c, cudaEvent_t ev, std::string what) : c_(c), ev_(ev), what_(std::move(what)) {}
    ~Request() override {
      try {
        wait();
      } catch (...) {
      }
    }
    void wait() override {
      if (!ev_) return;
      cudaEvent_t ev = ev_;
      ev_ = nullptr;
      c_.wait_event(ev, what_);
    }

   private:
    NcclCommunicator& c_;
    cudaEvent_t ev_;
    std::string what_;
  };

  std::string who() const {
    return "rank " + std::to_string(rank()) + " of " + std::to_string(world_size()) + " (NCCL)";
  }
  void nccl(ncclResult_t rc, const char* call) {
    if (rc == ncclSuccess || rc == ncclInProgress) return;
    const char* last = comm_ ? nccl_api().ncclGetLastError(comm_) : nullptr;
    throw Error(who() + ": " + call + ": " + nccl_api().ncclGetErrorString(rc) + (last && *last ? std::string(" (") + last + ")" : ""));
  }
  void cuda(cudaError_t rc, const char* call) const {
    if (rc != cudaSuccess) throw Error(who() + ": " + call + ": " + cudaGetErrorString(rc));
  }
  void check_counts(const std::vector<int64_t>& counts, const char* what) const {
    if (counts.size() != size_t(world_size()))
      throw Error(who() + ": " + what + ": " + std::to_string(counts.size()) + " pieces for " +
                  std::to_string(world_size()) + " ranks");
  }
  static bool equal(const std::vector<int64_t>& counts) {
    for (int64_t c : counts)
      if (c != counts[0]) return false;
    return true;
  }
  // Our stream waits for the work queued so far on the executor's stream (use_stream), else on
  // the legacy default stream (null), and no longer: later kernels there overlap the collective.
  void begin() {
    cuda(cudaEventRecord(ready_, external_), "cudaEventRecord");
    cuda(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
  }
  std::unique_ptr<CommRequest> finish(std::string what) {
    cudaEvent_t ev = nullptr;
    cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    cuda(cudaEventRecord(ev, stream_), "cudaEventRecord");
    return std::make_unique<Request>(*this, ev, std::move(what));
  }
  void wait_event(cudaEvent_t ev, const std::string& what) {
    PauseAwareDeadline deadline(timeout_);
    for (int spins = 0;; ++spins) {
      cudaError_t q = cudaEventQuery(ev);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) {
        cudaEventDestroy(ev);
        cuda(q, what.c_str());
      }
      ncclResult_t async = ncclSuccess;
      nccl_api().ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        cudaEventDestroy(ev);
        nccl_api().ncclCommAbort(comm_);
        comm_ = nullptr;
        throw Error(who() + ": " + what + ": " + nccl_api().ncclGetErrorString(async) + " (a peer rank failed or left)");
      }
      if (deadline.passed()) {
        cudaEventDestroy(ev);
        nccl_api().ncclCommAbort(comm_);
        comm_ = nullptr;
        throw Error(who() + ": " + what + ": did not complete within " + std::to_string(int(timeout_)) +
                    " s; another rank has probably died or hung (KILN_COMM_TIMEOUT sets the limit)");
      }
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    cudaEventDestroy(ev);
  }

  std::unique_ptr<Communicator> boot_;
  Watchdog watchdog_;
  double timeout_ = 600;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;    // the collectives'
  cudaStream_t external_ = nullptr;  // the device executor's compute stream (use_stream), which they follow
  cudaEvent_t ready_ = nullptr;
};

NcclCommunicator::NcclCommunicator(std::unique_ptr<Communicator> bootstrap) : boot_(std::move(bootstrap)) {
  timeout_ = comm_timeout_seconds();
  watchdog_.set_name(who());
  int devices = 0;
  cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  if (devices <= 0) throw Error(who() + ": no CUDA device on this machine");
  device_ = local_rank() % devices;
  cuda(cudaSetDevice(device_), "cudaSetDevice");
  ncclUniqueId id{};
  if (rank() == 0) nccl(nccl_api().ncclGetUniqueId(&id), "ncclGetUniqueId");
  boot_->broadcast(&id, sizeof id, 0);
  {
    Watchdog::Scope guard(watchdog_, "ncclCommInitRank (connecting to the other ranks)", timeout_);
    nccl(nccl_api().ncclCommInitRank(&comm_, world_size(), id, rank()), "ncclCommInitRank");
  }
  cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
}

NcclCommunicator::~NcclCommunicator() {
  if (ready_) cudaEventDestroy(ready_);
  if (stream_) cudaStreamDestroy(stream_);
  if (comm_) nccl_api().ncclCommDestroy(comm_);
}

}  // namespace

void open_nccl() { (void)nccl_api(); }

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> bootstrap) {
  return std::make_unique<NcclCommunicator>(std::move(bootstrap));
}

}  // namespace kiln::comm
