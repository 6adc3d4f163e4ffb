// Data parallelism: backend selection, the single-process and TCP communicators (ranks as
// threads of this process, over loopback), and the gradient bucket / ZeRO-1 piece plan. The MPI
// path runs under mpirun in test/e2e/test_ranks.py.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <memory>
#include <regex>
#include <thread>

#include "runtime/comm/communicator.h"
#include "runtime/comm/tcp_communicator.h"
#include "runtime/data_loader.h"
#include "runtime/data_parallel.h"
#include "runtime/error.h"
#include "runtime/executor.h"
#include "runtime/rank_agreement.h"
#include "test/unit/error_of.h"
#include "test/unit/module_builder.h"
#include "test/unit/param_module.h"
#include "test/unit/tcp_ranks.h"
#include "test/unit/temp_dir_fixture.h"

namespace kiln {
namespace {

using testing::free_port;
using testing::on_tcp_ranks;
using testing::ScopedEnv;

using testing::error_of;
TEST(Comm, SelectionFollowsTheLauncher) {
  ScopedEnv a("OMPI_COMM_WORLD_SIZE", nullptr), b("PMI_SIZE", nullptr), c("PMIX_RANK", nullptr),
      d("WORLD_SIZE", nullptr);
  EXPECT_EQ(select_comm_backend(CommBackend::Auto, "cpu"), CommBackend::Single);
  {
    ScopedEnv w("WORLD_SIZE", "2");
    EXPECT_EQ(select_comm_backend(CommBackend::Auto, "cpu"), CommBackend::Tcp);
    EXPECT_THROW(select_comm_backend(CommBackend::Single, "cpu"), Error);
  }
  {
    ScopedEnv w("WORLD_SIZE", "1");
    EXPECT_EQ(select_comm_backend(CommBackend::Auto, "cpu"), CommBackend::Single);
  }
  try {
    select_comm_backend(CommBackend::Nccl, "cpu");
    FAIL() << "NCCL for a cpu module";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--comm nccl: NCCL reduces GPU buffers, but the module targets 'cpu'"),
              std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_comm_backend("gloo"), Error);
  // "gpu" is a GPU target as "cuda..." is: not refused as a host one.
  EXPECT_EQ(error_of([] { select_comm_backend(CommBackend::Nccl, "gpu"); }).find("but the module targets"),
            std::string::npos);
}

// KILN_COMM_TIMEOUT: a positive number in full, at most a billion seconds; 600 when unset.
TEST(Comm, TimeoutFromTheEnvironment) {
  const auto timeout = [](const char* v) {
    ScopedEnv t("KILN_COMM_TIMEOUT", v);
    try {
      return std::to_string(comm_timeout_seconds());
    } catch (const Error& e) {
      return std::string(e.what());
    }
  };
  EXPECT_EQ(timeout(nullptr), "600.000000");
  EXPECT_EQ(timeout("2.5"), "2.500000");
  EXPECT_EQ(timeout("1e12"), "1000000000.000000");
  EXPECT_EQ(timeout("0"), "environment: KILN_COMM_TIMEOUT='0' is not a positive number of seconds");
  EXPECT_EQ(timeout("5x"), "environment: KILN_COMM_TIMEOUT='5x' is not a positive number of seconds");
}

// The rank and world a launcher set: MPI's variables (srun's PMIX_RANK with SLURM_NTASKS, not the
// task count alone), else RANK and WORLD_SIZE, which must fit together.
TEST(Comm, LauncherRankReadsTheLaunchersVariables) {
  ScopedEnv a("OMPI_COMM_WORLD_SIZE", nullptr), b("PMI_SIZE", nullptr), c("PMIX_RANK", nullptr),
      d("WORLD_SIZE", nullptr), e("RANK", nullptr), f("SLURM_NTASKS", "4"), g("OMPI_NUM_APP_CTX", nullptr),
      h("OMPI_COMM_WORLD_RANK", nullptr), i("PMI_RANK", nullptr);
  const auto rank = [] {
    try {
      const auto [r, w] = launcher_rank();
      return std::to_string(r) + " of " + std::to_string(w);
    } catch (const Error& e) {
      return std::string(e.what());
    }
  };
  EXPECT_EQ(rank(), "0 of 1");
  {
    ScopedEnv bad("WORLD_SIZE", "2x");
    EXPECT_EQ(rank(), "environment: WORLD_SIZE='2x' is not a rank count or index");
  }
  {
    ScopedEnv huge("WORLD_SIZE", "1048577");  // (2^20 ranks at most)
    EXPECT_EQ(rank(), "environment: WORLD_SIZE='1048577' is not a rank count or index");
  }
  {
    ScopedEnv pmix("PMIX_RANK", "2");
    EXPECT_EQ(rank(), "2 of 4");
  }
  {
    ScopedEnv w("WORLD_SIZE", "1");
    EXPECT_EQ(rank(), "0 of 1");  // (RANK unset is rank 0 of a world of one)
  }
  ScopedEnv w("WORLD_SIZE", "3");
  EXPECT_EQ(rank(), "environment: WORLD_SIZE=3 but RANK is not set (a launcher sets both, as torchrun does)");
  {
    ScopedEnv r("RANK", "2");
    EXPECT_EQ(rank(), "2 of 3");
  }
  {
    ScopedEnv r("RANK", "3");
    EXPECT_EQ(rank(), "environment: RANK=3 is not in [0, WORLD_SIZE=3)");
  }
  {
    ScopedEnv zero("WORLD_SIZE", "0");
    EXPECT_EQ(error_of([] { select_comm_backend(CommBackend::Auto, "cpu"); }),
              "environment: WORLD_SIZE=0: a world has at least one rank");
  }
  ScopedEnv ompi("OMPI_COMM_WORLD_SIZE", "2");
  EXPECT_EQ(rank(), "0 of 2");  // (no rank variable: rank 0, not RANK's world)
  EXPECT_FALSE(launcher_same_command());
  ScopedEnv one_app("OMPI_NUM_APP_CTX", "1");
  EXPECT_TRUE(launcher_same_command());
  ScopedEnv two_apps("OMPI_NUM_APP_CTX", "2");
  EXPECT_FALSE(launcher_same_command());
  ScopedEnv ompi_rank("OMPI_COMM_WORLD_RANK", "0"), pmi_rank("PMI_RANK", "1");
  EXPECT_EQ(rank(), "0 of 2");  // the first one set, even at 0
}

// What a launcher's variables choose, and the refusals that name them (what the runtime prints
// on stderr included): mpirun -np 1 is a launcher, so --comm mpi adds no note there and auto runs
// alone; under mpirun -np 2 auto picks MPI, whatever RANK a wrapper exports, and --comm single is
// refused; WORLD_SIZE=2 without a launcher refuses --comm mpi; a RANK without WORLD_SIZE says so.
// (Where the runtime was built without MPI, what needs it is refused instead.)
TEST(Comm, SelectionUnderAnMpiLauncherAndItsRefusals) {
  ScopedEnv a("OMPI_COMM_WORLD_SIZE", nullptr), b("PMI_SIZE", nullptr), c("PMIX_RANK", nullptr),
      d("WORLD_SIZE", nullptr), e("RANK", nullptr);
  const auto chosen = [](CommBackend requested) {
    ::testing::internal::CaptureStderr();
    std::string r;
    try {
      r = comm_backend_name(select_comm_backend(requested, "cpu"));
    } catch (const Error& e) {
      r = e.what();
    }
    const std::string err = ::testing::internal::GetCapturedStderr();
    return err.empty() ? r : r + " | " + err;
  };
  const bool mpi = chosen(CommBackend::Mpi).find("built without MPI") == std::string::npos;
  const std::string no_mpi = "--comm mpi: this runtime was built without MPI (no MPI found by CMake)";
  EXPECT_EQ(chosen(CommBackend::Mpi),
            mpi ? "mpi | note: --comm mpi: no MPI launcher started this process: it runs alone, an MPI world of one "
                  "rank (mpirun -np N starts N)\n"
                : no_mpi);
  {
    ScopedEnv one("OMPI_COMM_WORLD_SIZE", "1");
    EXPECT_EQ(chosen(CommBackend::Mpi), mpi ? "mpi" : no_mpi);
    EXPECT_EQ(chosen(CommBackend::Auto), "single");
  }
  {
    ScopedEnv two("OMPI_COMM_WORLD_SIZE", "2");
    const std::string auto_mpi =
        mpi ? "mpi" : "data parallel: started by an MPI launcher with 2 processes, but this runtime was built without MPI";
    EXPECT_EQ(chosen(CommBackend::Auto), auto_mpi);
    EXPECT_EQ(chosen(CommBackend::Single), "--comm single: this process is one of 2 started by a launcher; every one "
                                           "would run alone (and write the same files)");
    ScopedEnv rank("RANK", "5");  // (MPI numbers the ranks)
    EXPECT_EQ(chosen(CommBackend::Auto), auto_mpi);
  }
  {
    ScopedEnv world("WORLD_SIZE", "2");
    EXPECT_EQ(chosen(CommBackend::Mpi), mpi ? "--comm mpi: WORLD_SIZE=2 but no MPI launcher started this process (run it "
                                              "under mpirun, or use --comm tcp)"
                                            : no_mpi);
  }
  ScopedEnv rank("RANK", "1");
  EXPECT_EQ(chosen(CommBackend::Auto), "environment: RANK=1 is not in [0, WORLD_SIZE=1) (WORLD_SIZE is not set)");
}

TEST(Comm, SingleProcessIsANoOp) {
  auto c = make_single_process_communicator();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->world_size(), 1);
  float x[3] = {1, 2, 3};
  c->all_reduce_sum(x, 3);
  c->reduce_scatter_sum(x, {3});
  c->all_gather(x, {3});
  EXPECT_EQ(x[2], 3.0f);
  EXPECT_EQ(c->all_reduce_sum(2.5), 2.5);
  EXPECT_THROW(c->reduce_scatter_sum(x, {1, 2}), Error);
  EXPECT_EQ(error_of([&] { c->broadcast(x, 4, 0); }), "(no error)");
  EXPECT_EQ(error_of([&] { c->broadcast(x, 4, 1); }), "broadcast: root 1 is not a rank of 1");
}

TEST(Comm, RanksOnThisMachineCountsTheRanksOfOneHost) {
  auto single = make_single_process_communicator();
  EXPECT_EQ(ranks_on_this_machine(*single), 1);
  std::vector<int> counted(3, 0);
  auto errors = on_tcp_ranks(3, [&](int r, Communicator& c) { counted[size_t(r)] = ranks_on_this_machine(c); });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
    EXPECT_EQ(counted[size_t(r)], 3) << "rank " << r;  // the threads share this host's name
  }
}

TEST(Comm, TcpCollectives) {
  const int world = 3;
  auto errors = on_tcp_ranks(world, [&](int r, Communicator& c) {
    ASSERT_EQ(c.rank(), r);
    ASSERT_EQ(c.world_size(), world);
    // all-reduce, two in flight at once
    std::vector<float> a(1000), b(7);
    for (size_t i = 0; i < a.size(); ++i) a[i] = float(r * 1000 + int(i));
    for (size_t i = 0; i < b.size(); ++i) b[i] = float(r + 1);
    auto ra = c.iall_reduce_sum(a.data(), int64_t(a.size()));
    auto rb = c.iall_reduce_sum(b.data(), int64_t(b.size()));
    rb->wait();
    ra->wait();
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], float(3000 + 3 * int(i)));
    for (float x : b) ASSERT_EQ(x, 6.0f);
    // reduce-scatter with uneven pieces: rank r's piece holds the sum
    std::vector<int64_t> counts = {3, 2, 4};
    std::vector<float> v(9);
    for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) + float(r) * 100;
    c.reduce_scatter_sum(v.data(), counts);
    const int64_t off = piece_offset(counts, r);
    for (int64_t i = off; i < off + counts[size_t(r)]; ++i) ASSERT_EQ(v[size_t(i)], float(3 * i + 300));
    // all-gather of the pieces
    std::vector<float> g(9, -1.0f);
    for (int64_t i = off; i < off + counts[size_t(r)]; ++i) g[size_t(i)] = float(r * 10 + i);
    c.all_gather(g.data(), counts);
    for (int q = 0; q < world; ++q)
      for (int64_t i = piece_offset(counts, q); i < piece_offset(counts, q) + counts[size_t(q)]; ++i)
        ASSERT_EQ(g[size_t(i)], float(q * 10 + i));
    // doubles, broadcast from a non-zero root, barrier
    double d[2] = {double(r), 0.5};
    c.all_reduce_sum(d, 2);
    ASSERT_EQ(d[0], 3.0);
    ASSERT_EQ(d[1], 1.5);
    char msg[6] = "?????";
    if (r == 2) std::snprintf(msg, sizeof msg, "hello");
    c.broadcast(msg, sizeof msg, 2);
    ASSERT_STREQ(msg, "hello");
    c.barrier();
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
}

TEST(Comm, TcpPeerThatLeavesIsNamed) {
  auto errors = on_tcp_ranks(2, [](int r, Communicator& c) {
    if (r == 1) return;  // closes its connection
    float x[4] = {};
    c.all_reduce_sum(x, 4);
  });
  EXPECT_NE(errors[0].find("rank 0 of 2 (TCP): all_reduce of 4 floats: rank 1 (127.0.0.1:"), std::string::npos)
      << errors[0];
  EXPECT_NE(errors[0].find(") disconnected"), std::string::npos) << errors[0];
  EXPECT_EQ(errors[1], "");
}

TEST(Comm, TcpMismatchedCollectivesFail) {
  auto errors = on_tcp_ranks(2, [](int r, Communicator& c) {
    std::vector<float> x(static_cast<size_t>(4 + r));
    c.all_reduce_sum(x.data(), int64_t(x.size()));
  });
  EXPECT_NE(errors[0].find("the ranks are not running the same collectives"), std::string::npos) << errors[0];
}

TEST(Comm, TcpConnectTimesOut) {
  TcpOptions o;
  o.rank = 1, o.world_size = 2, o.master_port = free_port(), o.timeout_s = 0.5;
  try {
    make_tcp_communicator(o);
    FAIL() << "connected to nobody";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 of 2 (TCP): connecting to rank 0 at 127.0.0.1:"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("no connection within 0.5 s"), std::string::npos) << e.what();
  }
}

TEST(Comm, TcpRootWaitsForMissingRanksWithinTheTimeout) {
  TcpOptions o;
  o.rank = 0, o.world_size = 3, o.master_port = free_port(), o.timeout_s = 0.3;
  ::testing::internal::CaptureStderr();
  const std::string error = error_of([&] { make_tcp_communicator(o); });
  // The timeout ends before the note that rank 0 waits on (after 10 s): it fails without one.
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  EXPECT_NE(error.find("only 1 of 3 ranks connected within 0.3 s (missing rank 1, 2)"), std::string::npos) << error;
}

// The fingerprint ranks compare at start reads every byte: the 8-byte words and a tail of 1 to 7
// (token counts and uint16 tokens end in one), and the hash it continues from.
TEST(RankAgreement, FingerprintReadsEveryByteAndTheHashBefore) {
  for (size_t n = 1; n <= 17; ++n) {
    std::vector<uint8_t> bytes(n, 7);
    const uint64_t h = fingerprint(bytes.data(), n);
    EXPECT_NE(fingerprint(bytes.data(), n, h), h) << n;
    EXPECT_NE(fingerprint(bytes.data(), n, 1), h) << n;
    for (size_t i = 0; i < n; ++i) {
      bytes[i] ^= 1;
      EXPECT_NE(fingerprint(bytes.data(), n), h) << "byte " << i << " of " << n;
      bytes[i] ^= 1;
    }
  }
  EXPECT_EQ(fingerprint(nullptr, 0, 42), 42u);
}

// Every rank learns how many differ about the first thing any differs about, so all stop alike;
// only those that differ say they are among them.
TEST(RankAgreement, EveryRankStopsNamingTheFirstDifferenceAndItsCount) {
  const std::vector<std::string> what = {"a", "b", "c"};
  const auto errors = on_tcp_ranks(3, [&](int r, Communicator& comm) {
    require_ranks_agree(comm, {false, false, false}, what, "x");  // all agree: nobody stops
    require_ranks_agree(comm, {false, r == 2, r >= 1}, what, "x");
  });
  const std::string b = "x: 1 rank(s) disagree with rank 0 about b", end = "; every rank must run the same command";
  EXPECT_EQ(errors, std::vector<std::string>({b + end, b + end, b + ", this one among them" + end}));
  const auto two = on_tcp_ranks(3, [&](int r, Communicator& comm) {
    require_ranks_agree(comm, {false, false, r >= 1}, what, "x");
  });
  EXPECT_EQ(two[0], "x: 2 rank(s) disagree with rank 0 about c" + end);
  EXPECT_EQ(two[2], "x: 2 rank(s) disagree with rank 0 about c, this one among them" + end);
}

// check_ranks_agree on 2 in-process ranks, each set up by `per_rank` (options, data, weights),
// for what test_ranks.py's processes do not reach.
class CheckRanksAgree : public kiln::testing::TempDirTest {
 protected:
  struct Rank {
    TrainOptions o;
    int64_t total = 64, first_step = 0, val_steps = 10;
    std::vector<std::string> data, val;
    bool compiled_buckets = false;
    std::function<void(const Module&, Executor&)> weights = [](const Module&, Executor&) {};
  };

  std::string shard(const std::string& name, std::vector<uint16_t> tokens) {
    write_token_shard(path(name), tokens);
    return path(name);
  }
  static std::vector<uint16_t> tokens(size_t n, uint16_t last = 0) {
    std::vector<uint16_t> t(n);
    for (size_t i = 0; i < n; ++i) t[i] = uint16_t(i % 50);
    if (last) t.back() = last;
    return t;
  }

  std::vector<std::string> run(const std::function<void(int, Rank&)>& per_rank) {
    const Module m = Module::from_bytes(testing::param_module(), "agree.kiln");
    const std::string a = shard("a.bin", tokens(32));
    return on_tcp_ranks(2, [&](int r, Communicator& comm) {
      Rank k;
      k.data = {a};
      per_rank(r, k);
      Executor ex(m);
      for (const fb::Parameter* p : *m.fb().parameters())  // the same weights on both ranks ...
        for (int64_t i = 0; i < numel(m.buffer(p->value())); ++i) ex.f32(p->value())[i] = 0.25f * float(i % 5);
      k.weights(m, ex);                                      // ... unless a rank changes them
      DataLoader data(k.data, 1, 4, r, 2);
      std::unique_ptr<DataLoader> val;
      if (!k.val.empty()) val = std::make_unique<DataLoader>(k.val, 1, 4, r, 2);
      check_ranks_agree(comm, m, k.o, k.total, k.first_step, ex, data, val.get(), k.val_steps, k.compiled_buckets);
    });
  }
  // Rank 0's and rank 1's messages when rank 1 alone differs about `about`.
  static std::vector<std::string> refused(const std::string& about, const std::string& about_at_1) {
    const std::string head = "data parallel: 1 rank(s) disagree with rank 0 about ";
    const std::string end = "; every rank must run the same command";
    return {head + about + end, head + about_at_1 + ", this one among them" + end};
  }
};

// The options test_ranks.py does not vary, each named with rank 0's value and rank 1's own; a
// float in as many digits as read back (17 here).
TEST_F(CheckRanksAgree, NamesEveryOptionThatDiffers) {
  const auto errors = run([](int r, Rank& k) {
    if (r == 0) return;
    k.first_step = 3, k.total = 128, k.o.bucket_mb = 50, k.o.val_data = {"v.bin"}, k.o.val_steps = 20;
    k.o.dump_grads = "g.safetensors", k.o.resume = true, k.o.schedule.min_lr_ratio = 0.1 + 0.2;
    k.o.checkpoint_dir = "ck";
  });
  const std::string mine =
      "the step resumed at (rank 0: 0, this one: 3), --total-batch (tokens per step) (rank 0: 64, this one: 128), "
      "--bucket-mb (rank 0: 25, this one: 50), --min-lr-ratio (rank 0: 0.1, this one: 0.30000000000000004), "
      "--val-data (rank 0: not given, this one: given), --val-steps (rank 0: 10, this one: 20), "
      "--dump-grads (rank 0: not given, this one: given), --checkpoint-dir (rank 0: not given, this one: given), "
      "--resume (rank 0: not given, this one: given)";
  const std::string root = std::regex_replace(mine, std::regex(", this one: [^)]*"), "");
  EXPECT_EQ(errors, refused("the training options: " + root, "the training options: " + mine));
}

// --bucket-mb places the buckets only where the module compiled none: there it may differ.
TEST_F(CheckRanksAgree, BucketMbOfCompiledBucketsIsNotCompared) {
  EXPECT_EQ(run([](int r, Rank& k) { k.compiled_buckets = true, k.o.bucket_mb = r ? 50 : 25; }),
            std::vector<std::string>(2));
}

// Every element of every parameter counts (the first parameter's last one here): at start, and
// from checkpoints when resumed.
TEST_F(CheckRanksAgree, WeightsDifferingInOneElement) {
  auto last_of_first = [](int r, Rank& k) {
    if (r == 1)
      k.weights = [](const Module& m, Executor& ex) {
        const fb::Parameter* p = m.fb().parameters()->Get(0);
        ex.f32(p->value())[numel(m.buffer(p->value())) - 1] += 1;
      };
  };
  const std::string start = "the initial weights (a different --seed, or --init files that differ)";
  EXPECT_EQ(run(last_of_first), refused(start, start));
  const std::string resumed =
      "the weights resumed (checkpoints that differ: a --checkpoint-dir that is not the same folder on every rank?)";
  EXPECT_EQ(run([&](int r, Rank& k) { last_of_first(r, k), k.first_step = 1; }), refused(resumed, resumed));
}

// The data: shards of other sizes (the one read being the same), or the one read differing in
// its last token; the same shards at other paths agree.
TEST_F(CheckRanksAgree, DataOfOtherSizesOrTokens) {
  const std::string b = shard("b.bin", tokens(40)), c = shard("c.bin", tokens(48)), a2 = shard("a2.bin", tokens(32, 7));
  const std::string same = shard("same.bin", tokens(32));
  const std::string data = "the training data (--data: other shards, or shards of other sizes)";
  EXPECT_EQ(run([&](int r, Rank& k) { k.data.push_back(r ? c : b); }), refused(data, data));
  EXPECT_EQ(run([&](int r, Rank& k) { k.data = {r ? a2 : path("a.bin")}; }), refused(data, data));
  EXPECT_EQ(run([&](int r, Rank& k) { k.data = {r ? same : path("a.bin")}; }), std::vector<std::string>(2));
  // Validation data alike, and the batches each evaluation reads of it.
  const std::string val = "the validation data (--val-data: other shards, or shards of other sizes)";
  EXPECT_EQ(run([&](int r, Rank& k) { k.val = {r ? a2 : same}; }), refused(val, val));
  EXPECT_EQ(run([&](int r, Rank& k) { k.val = {same}, k.val_steps = r ? 3 : 4; }), refused(val, val));
}

// Rank 0 alone writes --save and --log and prints samples: it may have them alone, but another
// rank given one it lacks would be dropped without a word (--log here: test_ranks.py tries the others).
TEST_F(CheckRanksAgree, OutputsOnlyRankZeroLacks) {
  EXPECT_EQ(run([](int r, Rank& k) {
              if (r == 0) k.o.save = "w.safetensors", k.o.log = "l.jsonl", k.o.sample_every = 2;
            }),
            std::vector<std::string>(2));
  const std::string out = "the outputs (--save, --log or --sample-every, which rank 0 alone writes or prints, given to "
                          "another rank but not to it)";
  EXPECT_EQ(run([](int r, Rank& k) {
              k.o.save = "w.safetensors";
              if (r == 1) k.o.log = "l.jsonl";
            }),
            refused(out, out));
}

TEST(DataParallel, BucketsRunFromTheLastParameterAndCoverEveryElementOnce) {
  // 25 floats per bucket: [p3] (larger than a bucket: alone), [p2 p1], [p0]
  BucketPlan plan = plan_buckets({10, 20, 5, 40}, 100, 3);
  ASSERT_EQ(plan.buckets.size(), 3u);
  EXPECT_EQ(plan.buckets[0].params, std::vector<size_t>({3}));
  EXPECT_EQ(plan.buckets[1].params, std::vector<size_t>({2, 1}));
  EXPECT_EQ(plan.buckets[2].params, std::vector<size_t>({0}));
  EXPECT_EQ(plan.total, 75);
  EXPECT_EQ(plan.params[3].flat, 0);
  EXPECT_EQ(plan.params[2].flat, 40);
  EXPECT_EQ(plan.params[1].flat, 45);
  EXPECT_EQ(plan.params[0].flat, 65);
  EXPECT_EQ(plan.buckets[0].pieces, std::vector<int64_t>({14, 13, 13}));
  EXPECT_EQ(plan.buckets[1].pieces, std::vector<int64_t>({9, 8, 8}));
  // ZeRO-1: every element of every parameter is owned by exactly one rank
  const std::vector<int64_t> sizes = {10, 20, 5, 40};
  for (size_t p = 0; p < sizes.size(); ++p) {
    std::vector<int> owners(size_t(sizes[p]));
    for (int r = 0; r < 3; ++r) {
      auto [b, e] = plan.owned(p, r);
      for (int64_t i = b; i < e; ++i) ++owners[size_t(i)];
    }
    for (int n : owners) EXPECT_EQ(n, 1) << "parameter " << p;
  }
  // small parameters at a bucket's end lie wholly on the last rank: the others own none of them
  BucketPlan tail = plan_buckets({1, 1, 10}, 1 << 20, 3);  // one bucket [p2 p1 p0], pieces 4 4 4
  EXPECT_EQ(tail.buckets[0].pieces, std::vector<int64_t>({4, 4, 4}));
  EXPECT_EQ(tail.owned(0, 0), std::make_pair(int64_t(0), int64_t(0)));
  EXPECT_EQ(tail.owned(1, 1), std::make_pair(int64_t(0), int64_t(0)));
  EXPECT_EQ(tail.owned(0, 2), std::make_pair(int64_t(0), int64_t(1)));
  EXPECT_EQ(tail.owned(2, 2), std::make_pair(int64_t(8), int64_t(10)));
  // one rank owns everything; an empty parameter is harmless
  BucketPlan one = plan_buckets({3, 0, 4}, 1 << 20, 1);
  EXPECT_EQ(one.buckets.size(), 1u);
  EXPECT_EQ(one.owned(2, 0), std::make_pair(int64_t(0), int64_t(4)));
}

// Two ranks reduce their gradients where the executor laid them out (data_parallel_state: in
// bucket order, as the flat vector), with no copy; an executor laid out otherwise, or keeping
// moment slices that --zero 0 would overrun, is refused before any collective.
TEST(DataParallel, ReducesInTheArenaAndRefusesAnExecutorLaidOutOtherwise) {
  testing::ModelSpec spec;
  spec.params = {{"a.weight", {64, 16}, true}, {"b.bias", {48}, false}, {"c.weight", {300}, true}};
  const Module m = Module::from_bytes(testing::param_module(spec), "dp.kiln");
  std::vector<std::vector<float>> got(2);
  const auto errors = on_tcp_ranks(2, [&](int r, Communicator& comm) {
    Executor ex(m, {}, data_parallel_state(m, 2, r, 0, 1 << 20));
    for (const fb::Parameter* p : *m.fb().parameters()) {
      float* g = ex.f32(p->grad());
      for (int64_t i = 0; i < numel(m.buffer(p->grad())); ++i) g[i] = float(r + 1) * float(i % 7 + 1);
    }
    DataParallel dp(ex, comm, 0, 1 << 20);
    EXPECT_NE(dp.describe().find("reduced in place"), std::string::npos) << dp.describe();
    dp.start_gradient_reduction();
    dp.finish_gradient_reduction();
    for (const fb::Parameter* p : *m.fb().parameters())
      got[size_t(r)].insert(got[size_t(r)].end(), ex.f32(p->grad()), ex.f32(p->grad()) + numel(m.buffer(p->grad())));
  });
  EXPECT_EQ(errors, std::vector<std::string>(2));
  ASSERT_EQ(got[0].size(), 1024u + 48 + 300);
  EXPECT_EQ(got[0], got[1]);
  size_t k = 0;
  for (int64_t n : {1024, 48, 300})  // 1 * x + 2 * x
    for (int64_t i = 0; i < n; ++i, ++k) ASSERT_EQ(got[0][k], 3.0f * float(i % 7 + 1)) << k;

  const auto unplanned = on_tcp_ranks(2, [&](int, Communicator& comm) {
    Executor ex(m);  // the module's layout: gradients between values and moments
    DataParallel dp(ex, comm, 0, 1 << 20);
  });
  for (const std::string& e : unplanned)
    EXPECT_NE(e.find("dp.kiln: data parallel: the executor's gradients and values do not lie in bucket order"),
              std::string::npos) << e;
  const auto sliced = on_tcp_ranks(2, [&](int r, Communicator& comm) {
    Executor ex(m, {}, data_parallel_state(m, 2, r, 1, 1 << 20));  // ZeRO-1's moments ...
    DataParallel dp(ex, comm, 0, 1 << 20);                          // ... but a plain all-reduce
  });
  for (const std::string& e : sliced)
    EXPECT_NE(e.find("which --zero 0 on rank"), std::string::npos) << e;
  // One parameter: rank 1 keeps its moments' tail, which --zero 0 would overrun as well.
  testing::ModelSpec single;
  single.params = {{"a.weight", {64, 16}, true}};
  const Module one = Module::from_bytes(testing::param_module(single), "one.kiln");
  const auto tail = on_tcp_ranks(2, [&](int r, Communicator& comm) {
    Executor ex(one, {}, data_parallel_state(one, 2, r, 1, 1 << 20));
    DataParallel dp(ex, comm, 0, 1 << 20);
  });
  EXPECT_EQ(tail[1], "one.kiln: data parallel: the executor keeps elements [512, 1024) of a.weight.AdamM, which --zero 0 "
                     "on rank 1 does not update (build it with data_parallel_state)");
}

// Both ranks call start_gradient_reduction twice (a bucket the program started, then the
// rest): each bucket is summed once a step, and again the next step.
TEST(DataParallel, ReducesEachBucketOnceAStepAndAgainTheNext) {
  testing::ModelSpec spec;
  spec.params = {{"a.weight", {64, 16}, true}, {"b.bias", {48}, false}};
  const Module m = Module::from_bytes(testing::param_module(spec), "dp.kiln");
  std::vector<std::vector<float>> got(2);
  const auto errors = on_tcp_ranks(2, [&](int r, Communicator& comm) {
    Executor ex(m, {}, data_parallel_state(m, 2, r, 0, 256));  // buckets of 64 floats: several
    DataParallel dp(ex, comm, 0, 256);
    for (float scale : {1.0f, 10.0f})
      for (int round = 0; round < 2; ++round) {
        for (const fb::Parameter* p : *m.fb().parameters())
          std::fill_n(ex.f32(p->grad()), numel(m.buffer(p->grad())), scale * float(r + 1));
        dp.start_gradient_reduction();
        dp.start_gradient_reduction();
        dp.finish_gradient_reduction();
        for (const fb::Parameter* p : *m.fb().parameters()) got[size_t(r)].push_back(ex.f32(p->grad())[5]);
      }
  });
  EXPECT_EQ(errors, std::vector<std::string>(2));
  const std::vector<float> want = {3, 3, 3, 3, 30, 30, 30, 30};
  EXPECT_EQ(got[0], want);
  EXPECT_EQ(got[1], want);
}

// Two parameters and the optimizer program kilnc emits without fusion (GlobalNorm over the
// gradients, ClipCoef, one AdamW per parameter), after `damage` edits it.
using testing::Ins;
Module optimizer_module(const std::function<void(std::vector<Ins>&)>& damage = {}) {
  using testing::K;
  using testing::O;
  const auto F = fb::DType::F32;
  std::vector<testing::Buf> bufs;
  for (const char* p : {"a", "b"})
    for (K k : {K::Parameter, K::Gradient, K::AdamM, K::AdamV}) bufs.push_back({p, k, F, {p[0] == 'a' ? 64 : 40}});
  for (const char* h : {"max_norm", "lr", "beta1", "beta2", "eps", "weight_decay", "step"})  // 8..14
    bufs.push_back({h, K::Input, F, {}});
  bufs.push_back({"norm", K::Activation, F, {}});  // 15
  bufs.push_back({"coef", K::Activation, F, {}});  // 16
  std::vector<Ins> prog = {{O::GlobalNorm, {1, 5}, {15}, {64, 40}},
                           {O::ClipCoef, {15, 8}, {16}, {}},
                           {O::AdamW, {1, 16, 9, 10, 11, 12, 13, 14}, {0, 2, 3}, {64, 1}},
                           {O::AdamW, {5, 16, 9, 10, 11, 12, 13, 14}, {4, 6, 7}, {40, 0}}};
  if (damage) damage(prog);
  return Module::from_bytes(testing::build(bufs, {{"optimizer_step", prog, 15}}, {{"a", 0, 1, 2, 3}, {"b", 4, 5, 6, 7}}),
                            "opt.kiln");
}

// Values, gradients (rank r's scaled by r + 1) and hyperparameters, the same for every run.
void fill_step(Executor& ex, float grad_scale) {
  const float hyper[] = {0.0f /*no clipping*/, 0.01f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
  for (uint32_t h = 0; h < 7; ++h) *ex.f32(8 + h) = hyper[h];
  for (uint32_t p : {0u, 4u}) {
    const int64_t n = numel(ex.module().buffer(p));
    for (int64_t i = 0; i < n; ++i) {
      ex.f32(p)[i] = 0.01f * float(i % 13) - 0.05f;
      ex.f32(p + 1)[i] = grad_scale * (0.002f * float(i % 7) - 0.006f + 0.001f * float(p));
    }
  }
}

// ZeRO-1 over two ranks (gradients reduce-scattered, each rank's AdamW on its pieces, values
// gathered) gives bitwise the values of one process stepping on the summed gradients.
TEST(DataParallel, ZeroOneStepIsThePlainStepOnTheSummedGradients) {
  const Module m = optimizer_module();
  Executor one(m);
  fill_step(one, 3.0f);  // 1x + 2x
  const float want_norm = one.run("optimizer_step");
  std::vector<std::vector<float>> grads(2), values(2), moments;
  float norms[2] = {0, 0};
  const auto errors = on_tcp_ranks(2, [&](int r, Communicator& comm) {
    Executor ex(m, {}, data_parallel_state(m, 2, r, 1, 1 << 20));
    DataParallel dp(ex, comm, 1, 1 << 20);
    EXPECT_NE(dp.describe().find("1 gradient bucket(s) of <= 1.04858 MB after the backward pass, reduced in place, "
                                 "ZeRO-1 (optimizer sharded; this rank keeps 1/2 of the AdamW moments: its arena is "),
              std::string::npos)
        << dp.describe();
    fill_step(ex, float(r + 1));
    dp.start_gradient_reduction();
    dp.finish_gradient_reduction();
    dp.gather_gradients();
    norms[size_t(r)] = ex.run("optimizer_step");  // the norm of the summed gradients, on each rank
    dp.gather_parameters();
    for (uint32_t p : {0u, 4u}) {
      const int64_t n = numel(m.buffer(p));
      grads[size_t(r)].insert(grads[size_t(r)].end(), ex.f32(p + 1), ex.f32(p + 1) + n);
      values[size_t(r)].insert(values[size_t(r)].end(), ex.f32(p), ex.f32(p) + n);
    }
    // Before a checkpoint: rank 0 receives both whole moments.
    const WholeMoments whole = dp.gather_optimizer_state();
    EXPECT_EQ(whole.empty(), r != 0);
    if (r == 0)
      for (size_t k = 0; k < 2; ++k) {
        const int64_t n = numel(m.buffer(k ? 4 : 0));
        moments.emplace_back(whole.adam_m[k], whole.adam_m[k] + n);
        moments.emplace_back(whole.adam_v[k], whole.adam_v[k] + n);
      }
  });
  ASSERT_EQ(errors, std::vector<std::string>(2));
  for (int r = 0; r < 2; ++r) EXPECT_NEAR(norms[size_t(r)], want_norm, 1e-6 * want_norm) << "rank " << r;
  ASSERT_EQ(moments.size(), 4u);
  for (uint32_t p : {0u, 4u})
    for (uint32_t k : {2u, 3u}) {
      const int64_t n = numel(m.buffer(p));
      EXPECT_EQ(moments[p / 2 + k - 2], std::vector<float>(one.f32(p + k), one.f32(p + k) + n)) << "buffer " << p + k;
    }
  std::vector<float> want_grads, want_values;
  for (uint32_t p : {0u, 4u}) {
    const int64_t n = numel(m.buffer(p));
    Executor fresh(m);
    fill_step(fresh, 3.0f);
    want_grads.insert(want_grads.end(), fresh.f32(p + 1), fresh.f32(p + 1) + n);
    want_values.insert(want_values.end(), one.f32(p), one.f32(p) + n);
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(grads[size_t(r)], want_grads) << "rank " << r;
    EXPECT_EQ(values[size_t(r)], want_values) << "rank " << r;
  }
}

// ZeRO-1 shards what it knows: anything else in optimizer_step is refused on every rank before
// a collective, naming what it found.
TEST(DataParallel, ZeroOneRefusesAnOptimizerProgramItDoesNotKnow) {
  auto refusal = [](const std::function<void(std::vector<Ins>&)>& damage) {
    const Module m = optimizer_module(damage);
    const auto errors = on_tcp_ranks(2, [&](int r, Communicator& comm) {
      Executor ex(m, {}, data_parallel_state(m, 2, r, 1, 1 << 20));
      DataParallel dp(ex, comm, 1, 1 << 20);
    });
    EXPECT_EQ(errors[0], errors[1]);
    return errors[0];
  };
  const std::string at = "opt.kiln: optimizer_step: --zero 1: ";
  EXPECT_EQ(refusal({}), "");
  EXPECT_EQ(refusal([](std::vector<Ins>& p) { p[0].in = {1, 4}; }), at + "GlobalNorm reads buffer 4, not a gradient");
  EXPECT_EQ(refusal([](std::vector<Ins>& p) { p[3].in[0] = 4; }),
            at + "an AdamW does not update a parameter from its gradient");
  EXPECT_EQ(refusal([](std::vector<Ins>& p) { p.pop_back(); }), at + "1 AdamW updates for 2 parameters");
  EXPECT_EQ(refusal([](std::vector<Ins>& p) { p.push_back(p[2]); }), at + "3 AdamW updates for 2 parameters");
  EXPECT_EQ(refusal([](std::vector<Ins>& p) { p.push_back({testing::O::Copy, {15}, {16}, {1}}); }),
            at + "the program has a Copy, which ZeRO-1's sharding does not know");
}

// Only 0 and 1 are ZeRO stages; one process has nothing to exchange and needs no layout.
TEST(DataParallel, OneProcessNeedsNoLayoutAndZeroIsZeroOrOne) {
  const Module m = Module::from_bytes(testing::param_module(), "dp.kiln");
  auto comm = make_single_process_communicator();
  Executor ex(m);
  EXPECT_NO_THROW(DataParallel(ex, *comm, 0, 1 << 20));
  for (int zero : {-1, 2}) {
    try {
      DataParallel dp(ex, *comm, zero, 1 << 20);
      ADD_FAILURE() << "--zero " << zero << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), "--zero: " + std::to_string(zero) + " is not 0 or 1");
    }
  }
}

}  // namespace
}  // namespace kiln
