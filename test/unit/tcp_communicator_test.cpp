// The TCP communicator's checks and messages: options and arguments refused, the rendezvous
// (hellos of another protocol, world or rank, connections that are not Kiln ranks), headers
// that do not match, peers that leave or stop answering, and the environment it reads. Rank 0 or
// rank 1 is played by hand (FakeRank) where a real rank cannot send what is tested.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <regex>
#include <string>
#include <thread>

#include "runtime/comm/backends.h"
#include "runtime/error.h"
#include "test/unit/error_of.h"
#include "test/unit/tcp_ranks.h"

namespace kiln {
namespace {

using testing::free_port;
using testing::on_tcp_ranks;
using testing::ScopedEnv;

// Port numbers vary from run to run: ":50112" and "port 50112" read ":P" and "port P".
std::string without_ports(const std::string& s) {
  return std::regex_replace(s, std::regex("(:|port )[0-9]+"), "$1P");
}

// The wire header (tcp_communicator.cpp's Header).
struct WireHeader {
  uint32_t magic = 0x4b494c4e, op = 0;
  uint64_t seq = 0, bytes = 0, arg = 0;
};
enum : uint32_t { kHello = 1, kWelcome = 2, kAllReduceF64 = 4, kBroadcast = 7 };
WireHeader hello(uint64_t rank, uint64_t world, uint64_t protocol = 1) {
  WireHeader h;
  h.op = kHello, h.seq = protocol, h.arg = rank | world << 32;
  return h;
}

// A connection to rank 0 on this host, made by hand.
class FakeRank {
 public:
  explicit FakeRank(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(uint16_t(port));
    for (int tries = 0; tries < 2000; ++tries) {  // until rank 0 listens (20 s)
      fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
      if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
        timeval tv{30, 0};  // a rank 0 that neither answers nor closes fails the test, not hangs it
        ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        return;
      }
      ::close(fd_);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    fd_ = -1;
    ADD_FAILURE() << "rank 0 is not listening";
  }
  ~FakeRank() {
    if (fd_ >= 0) ::close(fd_);
  }
  void send(const void* data, size_t n) { EXPECT_EQ(::send(fd_, data, n, MSG_NOSIGNAL), ssize_t(n)); }
  void send(const WireHeader& h) { send(&h, sizeof h); }
  // Reads until rank 0 closes the connection; returns the bytes read.
  size_t read_to_end() {
    char buf[256];
    size_t total = 0;
    for (ssize_t k; (k = ::recv(fd_, buf, sizeof buf, 0)) > 0;) total += size_t(k);
    return total;
  }
  // Whether rank 0 closes the connection within `ms` milliseconds (sending nothing first).
  bool sees_close_within(int ms) {
    pollfd p{fd_, POLLIN, 0};
    char c;
    return ::poll(&p, 1, ms) == 1 && ::recv(fd_, &c, 1, 0) == 0;
  }
  void expect_welcome() {
    WireHeader h;
    ASSERT_EQ(::recv(fd_, &h, sizeof h, MSG_WAITALL), ssize_t(sizeof h));
    EXPECT_EQ(h.op, kWelcome);
  }

 private:
  int fd_ = -1;
};

// A socket listening on `port` of every address (as rank 0 does), or -1 where the port is taken.
int listening_socket(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(uint16_t(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 4) == 0) return fd;
  const int err = errno;
  ::close(fd);
  errno = err;
  return -1;
}

// Rank 0 of `world` at `port`, in a thread; its error ("" if none) once `body` has run.
std::future<std::string> rank_zero(int port, int world, std::function<void(Communicator&)> body = {},
                                   double timeout_s = 20) {
  return std::async(std::launch::async, [=] {
    try {
      TcpOptions o;
      o.world_size = world, o.master_port = port, o.timeout_s = timeout_s;
      auto comm = make_tcp_communicator(o);
      if (body) body(*comm);
      return std::string();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  });
}

using testing::error_of;
TEST(TcpCommunicator, RefusesARankOutsideTheWorldAndAPortThatIsNot) {
  TcpOptions o;
  o.rank = 2, o.world_size = 2, o.timeout_s = 1;  // (were it taken, connecting would fail within 1 s)
  EXPECT_EQ(error_of([&] { make_tcp_communicator(o); }), "TCP rendezvous: RANK=2 is not in [0, WORLD_SIZE=2)");
  o.rank = 0, o.world_size = 1, o.master_port = 0;
  EXPECT_EQ(error_of([&] { make_tcp_communicator(o); }), "TCP rendezvous: MASTER_PORT=0 is not a port");
  o.master_port = 65536;
  EXPECT_EQ(error_of([&] { make_tcp_communicator(o); }), "TCP rendezvous: MASTER_PORT=65536 is not a port");
  o.master_port = 65535;  // (a world of one does not listen)
  EXPECT_EQ(error_of([&] { make_tcp_communicator(o); }), "(no error)");
}

// Checked before anything is sent (so on a world of one, which sends nothing).
TEST(TcpCommunicator, RefusesARootOrPiecesThatDoNotFitTheWorld) {
  auto c = make_tcp_communicator(TcpOptions{});
  float x[3] = {};
  EXPECT_EQ(error_of([&] { c->broadcast(x, 4, 1); }), "rank 0 of 1 (TCP): broadcast: root 1 is not a rank");
  EXPECT_EQ(error_of([&] { c->reduce_scatter_sum(x, {1, 2}); }), "rank 0 of 1 (TCP): reduce_scatter: 2 pieces for 1 ranks");
  EXPECT_EQ(error_of([&] { c->all_gather(x, {-1}); }), "rank 0 of 1 (TCP): all_gather: negative piece size");
  EXPECT_EQ(error_of([&] { c->all_gather(x, {3}); }), "(no error)");
}

// A broadcast from each root reaches every other rank (rank 0 relays the others'); an all-reduce
// of more than rank 0's chunk (2^20 elements received and added at a time) sums the last chunk
// at its place.
TEST(TcpCommunicator, BroadcastFromEveryRootAndAnAllReduceOfMoreThanAChunk) {
  const int world = 3;
  const auto errors = on_tcp_ranks(world, [](int r, Communicator& c) {
    for (int root = 0; root < world; ++root) {
      int x = r == root ? 100 + root : -1;
      c.broadcast(&x, sizeof x, root);
      EXPECT_EQ(x, 100 + root) << "rank " << r << ", root " << root;
    }
    const size_t n = (size_t(1) << 20) + 3;
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = float(i % 1000) + float(r);
    c.all_reduce_sum(v.data(), int64_t(n));
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(v[i], float(3 * (i % 1000) + 3)) << "rank " << r << ", element " << i;
  });
  EXPECT_EQ(errors, std::vector<std::string>(world));
}

// Rank 0's message names the rank that left; another rank's adds that rank 0 may have left
// because a third failed. Every later collective fails with the first failure.
TEST(TcpCommunicator, APeerThatLeavesIsNamedAndTheFailureSticks) {
  std::string later;
  auto errors = on_tcp_ranks(2, [&](int r, Communicator& c) {
    if (r == 1) return;  // closes its connection
    float x[4] = {};
    EXPECT_THROW(c.all_reduce_sum(x, 4), Error);
    later = error_of([&] { c.barrier(); });
  });
  EXPECT_EQ(without_ports(later), "rank 0 of 2 (TCP): all_reduce of 4 floats: rank 1 (127.0.0.1:P) disconnected");
  errors = on_tcp_ranks(2, [](int r, Communicator& c) {
    if (r == 0) return;
    float x[4] = {};
    c.all_reduce_sum(x, 4);
  });
  // (Why the connection ended, a reset or an orderly close, depends on timing.)
  EXPECT_EQ(without_ports(errors[1]).rfind("rank 1 of 2 (TCP): all_reduce of 4 floats: rank 0 (127.0.0.1:P) disconnected", 0),
            0u) << errors[1];
  const std::string suffix = "; rank 0 also disconnects every rank when another fails, and then its message names which";
  EXPECT_EQ(errors[1].substr(errors[1].size() - std::min(errors[1].size(), suffix.size())), suffix);
}

// A header of another collective names what arrived: its operation, number and size.
TEST(TcpCommunicator, AMismatchedHeaderNamesWhatArrived) {
  auto errors = on_tcp_ranks(2, [](int r, Communicator& c) {
    if (r == 0) c.all_reduce_sum(1.0);
    else c.broadcast(&r, sizeof r, 1);
  });
  EXPECT_EQ(without_ports(errors[0]),
            "rank 0 of 2 (TCP): all_reduce of 1 double (collective #1): rank 1 (127.0.0.1:P) sent broadcast #1 of 4 "
            "bytes; the ranks are not running the same collectives (different options or modules?)");
}

// Rank 1 played by hand: a header of the right operation and size but a later number, then one
// that is not Kiln's.
TEST(TcpCommunicator, AHeaderOfAnotherNumberOrNotKilnsIsRefused) {
  for (const bool garbage : {false, true}) {
    const int port = free_port();
    auto root = rank_zero(port, 2, [](Communicator& c) { c.all_reduce_sum(1.0); });
    FakeRank one(port);
    one.send(hello(1, 2));
    one.expect_welcome();
    WireHeader h;
    h.op = kAllReduceF64, h.seq = 2, h.bytes = 8;
    if (garbage) h.magic = 0;
    one.send(h);
    const std::string at = "rank 0 of 2 (TCP): all_reduce of 1 double";
    EXPECT_EQ(without_ports(root.get()),
              garbage ? at + ": garbage from rank 1 (127.0.0.1:P) (not a Kiln message)"
                      : at + " (collective #1): rank 1 (127.0.0.1:P) sent all_reduce (double) #2 of 8 bytes; the "
                             "ranks are not running the same collectives (different options or modules?)");
  }
}

// A rank that stops answering is named after the timeout.
TEST(TcpCommunicator, APeerThatStopsAnsweringIsNamedAfterTheTimeout) {
  std::promise<void> done;
  std::string message;
  on_tcp_ranks(
      2,
      [&](int r, Communicator& c) {
        if (r == 1) return done.get_future().wait();  // connected, but sends nothing
        message = error_of([&] { c.all_reduce_sum(1.0); });
        done.set_value();
      },
      2);
  EXPECT_EQ(without_ports(message), "rank 0 of 2 (TCP): all_reduce of 1 double: nothing from rank 1 (127.0.0.1:P) for "
                                    "2 s (hung or unreachable; KILN_COMM_TIMEOUT sets the limit)");
}

// Rank 0 refuses the hello of another protocol version, world size or rank, naming the peer.
TEST(TcpCommunicator, RendezvousRefusesAHelloThatDoesNotFit) {
  const auto refusal = [](const WireHeader& h) {
    const int port = free_port();
    auto root = rank_zero(port, 2);
    FakeRank peer(port);
    peer.send(h);
    return without_ports(root.get());
  };
  const std::string at = "rank 0 of 2 (TCP): listening on port P (MASTER_PORT): a peer at 127.0.0.1:P";
  EXPECT_EQ(refusal(hello(1, 2, 2)), at + " speaks protocol 2, this rank 1 (different Kiln versions)");
  EXPECT_EQ(refusal(hello(1, 3)), at + " (RANK=1) has WORLD_SIZE=3, this rank 2");
  EXPECT_EQ(refusal(hello(2, 2)), at + " says RANK=2, which is not in [1, WORLD_SIZE)");
  EXPECT_EQ(refusal(hello(0, 2)), at + " says RANK=0, which is not in [1, WORLD_SIZE)");
}

TEST(TcpCommunicator, RendezvousRefusesARankThatAnotherProcessHas) {
  const int port = free_port();
  auto root = rank_zero(port, 3);
  FakeRank first(port), second(port);
  first.send(hello(1, 3));
  second.send(hello(1, 3));
  EXPECT_NE(root.get().find(" says RANK=1, which another process already has"), std::string::npos);
}

// A Kiln header that is not a hello, and a connection that stops part-way through its hello (after
// two seconds, not the whole timeout), are dropped; the ranks then still meet.
TEST(TcpCommunicator, RendezvousDropsConnectionsThatAreNotRanks) {
  const int port = free_port();
  auto root = rank_zero(port, 2, {}, 15);
  {
    FakeRank stray(port);
    WireHeader h = hello(1, 2);
    h.op = kBroadcast;
    stray.send(h);
    EXPECT_EQ(stray.read_to_end(), 0u);  // rank 0 closes it
  }
  {
    FakeRank partial(port);
    partial.send("KILN", 4);
    EXPECT_EQ(partial.read_to_end(), 0u);
  }
  FakeRank one(port);
  one.send(hello(1, 2));
  one.expect_welcome();
  EXPECT_EQ(root.get(), "");
}

// A reduce-scatter or all-gather that loses a peer names the whole vector (every rank's pieces),
// as the all-reduce does, not this rank's piece.
TEST(TcpCommunicator, APeerLostInAReduceScatterOrAllGatherNamesTheWholeVector) {
  for (const bool gather : {false, true}) {
    const auto errors = on_tcp_ranks(2, [&](int r, Communicator& c) {
      if (r == 1) return;  // closes its connection
      std::vector<float> v(9);
      if (gather) c.all_gather(v.data(), {3, 6});
      else c.reduce_scatter_sum(v.data(), {3, 6});
    });
    EXPECT_EQ(without_ports(errors[0]), std::string("rank 0 of 2 (TCP): ") + (gather ? "all_gather" : "reduce_scatter") +
                                            " of 9 floats: rank 1 (127.0.0.1:P) disconnected");
  }
}

// Rank 0 on a port that another program listens on says which port and why.
TEST(TcpCommunicator, RendezvousOnAPortInUseSaysSo) {
  const int port = free_port();
  const int other = listening_socket(port);
  ASSERT_GE(other, 0);
  EXPECT_EQ(without_ports(rank_zero(port, 2, {}, 1).get()),
            "rank 0 of 2 (TCP): listening on port P (MASTER_PORT): Address already in use");
  ::close(other);
}

// A rank 0 whose rendezvous fails closes what it opened: a connection that had not said hello
// yet sees the end at once (not after its own timeout), and the port is free to listen on again.
TEST(TcpCommunicator, AFailedRendezvousClosesItsListenerAndConnections) {
  const int port = free_port();
  auto root = rank_zero(port, 3);
  FakeRank silent(port), wrong(port);
  wrong.send(hello(1, 2));
  EXPECT_NE(root.get().find("(RANK=1) has WORLD_SIZE=2, this rank 3"), std::string::npos);
  EXPECT_TRUE(silent.sees_close_within(5000));
  const int again = listening_socket(port);
  EXPECT_GE(again, 0) << "port " << port << " still held: " << std::strerror(errno);
  if (again >= 0) ::close(again);
}

// A rank 0 that accepts but never answers: another rank waits for the welcome twice the timeout
// and a second (rank 0 itself may wait the whole timeout for the last rank), and names that wait.
TEST(TcpCommunicator, ARankZeroThatNeverWelcomesIsNamedAfterTwiceTheTimeout) {
  const int port = free_port();
  const int fake = listening_socket(port);
  ASSERT_GE(fake, 0);
  TcpOptions o;
  o.rank = 1, o.world_size = 2, o.master_port = port, o.timeout_s = 1;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(without_ports(error_of([&] { make_tcp_communicator(o); })),
            "rank 1 of 2 (TCP): rendezvous (waiting for all ranks to connect): nothing from rank 0 (127.0.0.1:P) for "
            "3 s (hung or unreachable; KILN_COMM_TIMEOUT sets the limit)");
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(2900));
  ::close(fake);
}

// A rank 0 whose rendezvous fails after another rank arrived lets that rank go at once (it sees
// rank 0 close the connection), instead of leaving it to wait for a welcome, twice the timeout.
TEST(TcpCommunicator, AFailedRendezvousReleasesTheRanksThatArrived) {
  const int port = free_port();
  auto root = rank_zero(port, 3);
  FakeRank one(port);
  one.send(hello(1, 3));
  FakeRank wrong(port);
  wrong.send(hello(2, 2));
  EXPECT_NE(root.get().find("(RANK=2) has WORLD_SIZE=2, this rank 3"), std::string::npos);
  EXPECT_TRUE(one.sees_close_within(5000));
}

// A rank 0 whose deadline passes while it waits on a hello sent part-way stops there and names
// the missing ranks (it does not wait on, with no time left, for a rank that may never come).
TEST(TcpCommunicator, RendezvousEndsAtTheDeadlineReachedDuringAHello) {
  const int port = free_port();
  auto root = rank_zero(port, 2, {}, 1);
  FakeRank partial(port);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  partial.send("KILN", 4);  // rank 0 waits 1 s for the rest: past its deadline, by about 50 ms
  if (root.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    ADD_FAILURE() << "rank 0 still waits after its deadline";
    FakeRank(port).send(hello(1, 3));  // (ends its wait, so that the test ends)
  }
  EXPECT_EQ(without_ports(root.get()), "rank 0 of 2 (TCP): listening on port P (MASTER_PORT): only 1 of 2 ranks "
                                       "connected within 1 s (missing rank 1)");
}

// make_tcp_communicator_from_env: RANK and WORLD_SIZE both required, integers in full; an empty
// MASTER_PORT is the default port, said so; LOCAL_RANK defaults to RANK.
TEST(TcpCommunicator, FromTheEnvironment) {
  ScopedEnv world("WORLD_SIZE", "1"), local("LOCAL_RANK", nullptr), addr("MASTER_ADDR", nullptr);
  {
    ScopedEnv rank("RANK", nullptr);
    EXPECT_EQ(error_of([] { comm::make_tcp_communicator_from_env(); }),
              "TCP rendezvous: RANK and WORLD_SIZE must be set (as torchrun sets them), with MASTER_ADDR and MASTER_PORT");
  }
  {
    ScopedEnv rank("RANK", "0"), unset("WORLD_SIZE", nullptr);  // (not a world of one by default)
    EXPECT_EQ(error_of([] { comm::make_tcp_communicator_from_env(); }),
              "TCP rendezvous: RANK and WORLD_SIZE must be set (as torchrun sets them), with MASTER_ADDR and MASTER_PORT");
  }
  for (const char* bad : {"0x", "-1"}) {
    ScopedEnv rank("RANK", bad);
    EXPECT_EQ(error_of([] { comm::make_tcp_communicator_from_env(); }),
              std::string("environment: RANK='") + bad + "' is not a non-negative integer");
  }
  ScopedEnv rank("RANK", "0");
  {
    ScopedEnv port("MASTER_PORT", "");
    EXPECT_EQ(comm::make_tcp_communicator_from_env()->describe(),
              "TCP (rendezvous at 127.0.0.1:29500, MASTER_PORT unset: the default port)");
  }
  ScopedEnv port("MASTER_PORT", "1234");
  EXPECT_EQ(comm::make_tcp_communicator_from_env()->describe(), "TCP (rendezvous at 127.0.0.1:1234)");
  // Rank 1 of 2, without LOCAL_RANK.
  const int free = free_port();
  auto root = rank_zero(free, 2);
  const std::string free_s = std::to_string(free);
  ScopedEnv world2("WORLD_SIZE", "2"), rank1("RANK", "1"), port2("MASTER_PORT", free_s.c_str());
  EXPECT_EQ(comm::make_tcp_communicator_from_env()->local_rank(), 1);
  EXPECT_EQ(root.get(), "");
}

}  // namespace
}  // namespace kiln
