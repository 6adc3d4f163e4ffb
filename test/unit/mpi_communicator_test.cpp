// The MPI communicator (runtime/comm/mpi_communicator.cpp) on the ranks of one mpirun:
// test/lit/tools/comm-mpi.test runs `mpirun -np 3 kiln-unit-tests --gtest_filter='CommMpi.*'`
// (and the CommMpiStall cases, one collective left unanswered). Run alone, without an MPI
// launcher, or from a runtime built without MPI, every test here is skipped.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/error.h"
#include "test/unit/error_of.h"
#include "test/unit/tcp_ranks.h"

namespace kiln {
namespace {

using testing::error_of;
using testing::ScopedEnv;

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : -1;
}

// The process's one MPI communicator, kept until exit: MPI_Init runs once a process, and the
// MPI_Finalize that comes when the last communicator goes ends MPI for good. nullptr when no
// MPI launcher started several ranks, or the runtime has no MPI.
Communicator* mpi_world() {
  static std::unique_ptr<Communicator> comm = []() -> std::unique_ptr<Communicator> {
    if (env_int("OMPI_COMM_WORLD_SIZE") < 2) return nullptr;
    try {
      return make_communicator(CommBackend::Mpi, "cpu");
    } catch (const Error& e) {
      if (std::string(e.what()).find("built without MPI") != std::string::npos) return nullptr;
      throw;
    }
  }();
  return comm.get();
}

#define MPI_WORLD_OR_SKIP(comm)                                                          \
  Communicator* comm = mpi_world();                                                      \
  if (!comm) GTEST_SKIP() << "not one of several ranks under mpirun (or no MPI in the runtime)"

// "rank 1 of 3 (MPI)", as the communicator names itself in its errors.
std::string who(const Communicator& c) {
  return "rank " + std::to_string(c.rank()) + " of " + std::to_string(c.world_size()) + " (MPI)";
}

// Rank, world and local rank are mpirun's; describe() is the library's name and version alone
// ("MPI (Open MPI v4.1.6)", not the rest of its version string).
TEST(CommMpi, RanksAreTheLaunchersAndDescribeIsOneShortLine) {
  MPI_WORLD_OR_SKIP(comm);
  EXPECT_EQ(comm->rank(), env_int("OMPI_COMM_WORLD_RANK"));
  EXPECT_EQ(comm->world_size(), env_int("OMPI_COMM_WORLD_SIZE"));
  EXPECT_EQ(comm->local_rank(), env_int("OMPI_COMM_WORLD_LOCAL_RANK"));
  EXPECT_TRUE(std::regex_match(comm->describe(), std::regex(R"(MPI \([A-Za-z][^,\n]*[0-9]\))"))) << comm->describe();
}

// A second communicator while the first lives: it takes the local rank from
// OMPI_COMM_WORLD_LOCAL_RANK, else from MPI's shared-memory split (every rank here is on one
// machine: the local rank is the rank). Destroying it leaves MPI to the first (no MPI_Finalize).
TEST(CommMpi, ASecondCommunicatorFindsItsLocalRankAndLeavesMpiUp) {
  MPI_WORLD_OR_SKIP(comm);
  {
    ScopedEnv local("OMPI_COMM_WORLD_LOCAL_RANK", "7");
    auto second = make_communicator(CommBackend::Mpi, "cpu");
    EXPECT_EQ(second->local_rank(), 7);
    EXPECT_EQ(second->rank(), comm->rank());
  }
  {
    ScopedEnv local("OMPI_COMM_WORLD_LOCAL_RANK", nullptr);
    auto second = make_communicator(CommBackend::Mpi, "cpu");
    EXPECT_EQ(second->local_rank(), comm->rank());
    EXPECT_EQ(second->all_reduce_sum(1.0), comm->world_size());
  }
  EXPECT_EQ(comm->all_reduce_sum(2.0), 2.0 * comm->world_size());
}

TEST(CommMpi, AllReduceSumsFloatsAndDoubles) {
  MPI_WORLD_OR_SKIP(comm);
  const int r = comm->rank(), n = comm->world_size();
  std::vector<float> f(6);
  for (size_t i = 0; i < f.size(); ++i) f[i] = float(10 * r + int(i)) + 0.5f;
  comm->iall_reduce_sum(f.data(), 5)->wait();  // the 6th stays this rank's own
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(f[i], float(10 * n * (n - 1) / 2 + n * int(i)) + 0.5f * n) << i;
  EXPECT_EQ(f[5], float(10 * r + 5) + 0.5f);
  std::vector<double> d = {double(r), 1.0, -0.25 * r};
  comm->all_reduce_sum(d.data(), 3);
  EXPECT_EQ(d, (std::vector<double>{n * (n - 1) / 2.0, double(n), -0.125 * n * (n - 1)}));
  EXPECT_EQ(comm->all_reduce_sum(double(r + 1)), n * (n + 1) / 2.0);
}

// Pieces of other sizes (one empty): each rank's own piece becomes the sum over ranks, in place
// at its displacement; nothing past the pieces is written.
std::vector<int64_t> uneven_counts(int n) {
  std::vector<int64_t> counts;
  for (int i = 0; i < n; ++i) counts.push_back(i == 1 ? 0 : 2 + 2 * i);  // {2, 0, 6, ...}
  return counts;
}

TEST(CommMpi, ReduceScatterSumsEachRanksOwnPiece) {
  MPI_WORLD_OR_SKIP(comm);
  const int r = comm->rank(), n = comm->world_size();
  const auto counts = uneven_counts(n);
  const int64_t total = piece_offset(counts, n);
  std::vector<float> data(size_t(total) + 1, -1.0f);
  for (int64_t i = 0; i < total; ++i) data[size_t(i)] = float(100 * r + i);
  comm->ireduce_scatter_sum(data.data(), counts)->wait();
  const int64_t at = piece_offset(counts, r);
  for (int64_t i = at; i < at + counts[size_t(r)]; ++i)
    EXPECT_EQ(data[size_t(i)], float(100 * n * (n - 1) / 2 + n * i)) << "element " << i;
  EXPECT_EQ(data[size_t(total)], -1.0f) << "written past the pieces";
}

TEST(CommMpi, AllGatherGivesEveryRankEveryPiece) {
  MPI_WORLD_OR_SKIP(comm);
  const int r = comm->rank(), n = comm->world_size();
  const auto counts = uneven_counts(n);
  const int64_t total = piece_offset(counts, n);
  std::vector<float> data(size_t(total) + 1, -1.0f);
  for (int64_t i = piece_offset(counts, r); i < piece_offset(counts, r + 1); ++i) data[size_t(i)] = float(1000 * r + i);
  comm->iall_gather(data.data(), counts)->wait();
  for (int p = 0; p < n; ++p)
    for (int64_t i = piece_offset(counts, p); i < piece_offset(counts, p + 1); ++i)
      EXPECT_EQ(data[size_t(i)], float(1000 * p + i)) << "piece " << p << ", element " << i;
  EXPECT_EQ(data[size_t(total)], -1.0f) << "written past the pieces";
}

// From the last rank (not rank 0), then from rank 0: every rank ends with the root's bytes, all
// of them, and nothing past them.
TEST(CommMpi, BroadcastCopiesTheRootsBytes) {
  MPI_WORLD_OR_SKIP(comm);
  const int r = comm->rank(), n = comm->world_size();
  auto byte = [](int rank, int i) { return char('a' + (7 * rank + i) % 26); };
  for (int root : {n - 1, 0}) {
    char buf[40];
    for (int i = 0; i < 40; ++i) buf[i] = byte(r, i);
    comm->broadcast(buf, 37, root);
    for (int i = 0; i < 40; ++i) EXPECT_EQ(buf[i], byte(i < 37 ? root : r, i)) << "root " << root << ", byte " << i;
  }
}

// A barrier returns on no rank before the last rank reaches it (that one comes 300 ms late).
TEST(CommMpi, BarrierWaitsForTheLastRank) {
  MPI_WORLD_OR_SKIP(comm);
  const auto start = std::chrono::steady_clock::now();
  if (comm->rank() == comm->world_size() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  comm->barrier();
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(250));
}

// Wrong pieces are refused before anything is sent, naming the rank, the collective and the
// numbers; MPI's own refusals name the call and MPI's reason. The world is still in step after.
TEST(CommMpi, RefusalsNameTheRankTheCallAndTheNumbers) {
  MPI_WORLD_OR_SKIP(comm);
  const int r = comm->rank(), n = comm->world_size();
  const std::string me = who(*comm);
  std::vector<float> data(64);
  std::vector<int64_t> short_counts(size_t(n - 1), 1);
  EXPECT_EQ(error_of([&] { comm->ireduce_scatter_sum(data.data(), short_counts); }),
            me + ": reduce_scatter: " + std::to_string(n - 1) + " pieces for " + std::to_string(n) + " ranks");
  std::vector<int64_t> long_counts(size_t(n + 1), 1);
  EXPECT_EQ(error_of([&] { comm->iall_gather(data.data(), long_counts); }),
            me + ": all_gather: " + std::to_string(n + 1) + " pieces for " + std::to_string(n) + " ranks");
  std::vector<int64_t> negative(size_t(n), 1);
  negative[size_t(n - 1)] = -1;
  EXPECT_EQ(error_of([&] { comm->ireduce_scatter_sum(data.data(), negative); }),
            me + ": reduce_scatter: piece " + std::to_string(n - 1) + " has -1 elements");
  // A piece past INT_MAX; then pieces that fit one by one but not together (this rank's own
  // piece small, so that nothing large is allocated if the check were missing).
  std::vector<int64_t> huge(size_t(n), 1);
  huge[size_t((r + 1) % n)] = int64_t(INT_MAX) + 1;
  EXPECT_EQ(error_of([&] { comm->iall_gather(data.data(), huge); }),
            me + ": all_gather: piece " + std::to_string((r + 1) % n) +
                "'s 2147483648 elements exceed MPI's int counts; use smaller gradient buckets");
  // A piece of INT_MAX fits an int: only the total past it is refused, and named.
  std::vector<int64_t> int_max(size_t(n), 1);
  int_max[0] = INT_MAX;
  EXPECT_EQ(error_of([&] { comm->iall_gather(data.data(), int_max); }),
            me + ": all_gather: the pieces' " + std::to_string(int64_t(INT_MAX) + n - 1) +
                " elements in all exceed MPI's int counts; use smaller gradient buckets");
  const int64_t other = INT_MAX / (n - 1);
  std::vector<int64_t> sum_too_big(size_t(n), other);
  sum_too_big[size_t(r)] = 2;
  EXPECT_EQ(error_of([&] { comm->ireduce_scatter_sum(data.data(), sum_too_big); }),
            me + ": reduce_scatter: the pieces' " + std::to_string(other * (n - 1) + 2) +
                " elements in all exceed MPI's int counts; use smaller gradient buckets");
  EXPECT_EQ(error_of([&] { comm->broadcast(data.data(), 8, n); }), me + ": MPI_Ibcast: MPI_ERR_ROOT: invalid root");
  double d[1] = {1};
  EXPECT_EQ(error_of([&] { comm->all_reduce_sum(d, -1); }),
            me + ": MPI_Iallreduce: MPI_ERR_COUNT: invalid count argument");
  EXPECT_EQ(comm->all_reduce_sum(1.0), double(n));
}

// One collective that rank 0 alone starts (KILN_TEST_MPI_STALL names it: double, reduce_scatter
// or broadcast) while the other ranks sleep: rank 0's watchdog ends it after KILN_COMM_TIMEOUT=1,
// naming the collective and its size.
// (On a second communicator: the first one's MPI_Init, under a loaded machine, may take longer.)
// "abort" has rank 1 end the job instead while rank 0 waits at a barrier.
TEST(CommMpiStall, TheWatchdogNamesWhatRank0WaitedFor) {
  const char* stall = std::getenv("KILN_TEST_MPI_STALL");
  if (!stall) GTEST_SKIP() << "KILN_TEST_MPI_STALL not set";
  MPI_WORLD_OR_SKIP(first);
  ScopedEnv timeout("KILN_COMM_TIMEOUT", "1");
  auto comm = make_communicator(CommBackend::Mpi, "cpu");
  const std::string op = stall;
  if (op == "abort") {
    if (comm->rank() == 1) comm->abort("rank 1 gives up");
    first->barrier();
  } else if (comm->rank() == 0) {
    std::vector<float> f(5);
    double d[2] = {};
    if (op == "double") comm->all_reduce_sum(d, 1);
    if (op == "reduce_scatter") comm->ireduce_scatter_sum(f.data(), {2, 3})->wait();
    if (op == "broadcast") comm->broadcast(d, 16, 1);
  } else {
    ::sleep(60);
  }
  ADD_FAILURE() << "rank " << comm->rank() << " was not ended";
}

}  // namespace
}  // namespace kiln
