// The TCP backend; see tcp_communicator.h for the protocol.
#include "runtime/comm/tcp_communicator.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "runtime/comm/backends.h"
#include "runtime/error.h"

namespace kiln {
namespace {

constexpr uint32_t kMagic = 0x4b494c4e;  // "KILN"
constexpr uint32_t kProtocol = 1;

enum class Op : uint32_t { Hello = 1, Welcome, AllReduceF32, AllReduceF64, ReduceScatter, AllGather, Broadcast };

const char* op_name(Op op) {
  switch (op) {
    case Op::Hello: return "hello";
    case Op::Welcome: return "welcome";
    case Op::AllReduceF32: return "all_reduce (float)";
    case Op::AllReduceF64: return "all_reduce (double)";
    case Op::ReduceScatter: return "reduce_scatter";
    case Op::AllGather: return "all_gather";
    case Op::Broadcast: return "broadcast";
  }
  return "?";
}

struct Header {
  uint32_t magic = kMagic;
  uint32_t op = 0;
  uint64_t seq = 0;    // the collective's number, counted alike on every rank
  uint64_t bytes = 0;  // payload that follows
  uint64_t arg = 0;    // hello: rank | world << 32; otherwise 0
};
static_assert(sizeof(Header) == 32, "wire header");

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

// How long a rank waits at the rendezvous before it says so.
constexpr double kWaitNoteAfterS = 10;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string address_of(const sockaddr_storage& a) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (a.ss_family == AF_INET) {
    auto* s = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &s->sin_addr, host, sizeof host);
    port = ntohs(s->sin_port);
  } else if (a.ss_family == AF_INET6) {
    auto* s = reinterpret_cast<const sockaddr_in6*>(&a);
    // An IPv4 peer of the dual-stack listener arrives as ::ffff:a.b.c.d: shown as a.b.c.d.
    if (IN6_IS_ADDR_V4MAPPED(&s->sin6_addr)) inet_ntop(AF_INET, &s->sin6_addr.s6_addr[12], host, sizeof host);
    else inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof host);
    port = ntohs(s->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

struct Peer {
  int fd = -1;
  std::string name;  // "rank 1 (127.0.0.1:50112)"
  double wait_s = 0;  // its send and receive timeout (set_timeout), for messages
};

class TcpCommunicator final : public Communicator {
 public:
  explicit TcpCommunicator(const TcpOptions& o);
  ~TcpCommunicator() override;

  int rank() const override { return o_.rank; }
  int world_size() const override { return o_.world_size; }
  int local_rank() const override { return o_.local_rank; }
  std::string describe() const override {
    return "TCP (rendezvous at " + o_.master_addr + ":" + std::to_string(o_.master_port) +
           (o_.port_given ? ")" : ", MASTER_PORT unset: the default port)");
  }

  std::unique_ptr<CommRequest> iall_reduce_sum(float* data, int64_t n) override {
    const std::string what = "all_reduce of " + std::to_string(n) + " floats";
    return submit([this, data, n, what](uint64_t seq) { reduce<float>(Op::AllReduceF32, seq, what, data, n, nullptr); });
  }
  std::unique_ptr<CommRequest> ireduce_scatter_sum(float* data, const std::vector<int64_t>& counts) override {
    check_counts(counts, "reduce_scatter");
    const std::string what = "reduce_scatter of " + std::to_string(piece_offset(counts, world_size())) + " floats";
    return submit([this, data, counts, what](uint64_t seq) {
      reduce<float>(Op::ReduceScatter, seq, what, data, piece_offset(counts, world_size()), &counts);
    });
  }
  std::unique_ptr<CommRequest> iall_gather(float* data, const std::vector<int64_t>& counts) override {
    check_counts(counts, "all_gather");
    const std::string what = "all_gather of " + std::to_string(piece_offset(counts, world_size())) + " floats";
    return submit([this, data, counts, what](uint64_t seq) { gather(seq, what, data, counts); });
  }
  void all_reduce_sum(double* data, int64_t n) override {
    const std::string what = "all_reduce of " + std::to_string(n) + (n == 1 ? " double" : " doubles");
    submit([this, data, n, what](uint64_t seq) { reduce<double>(Op::AllReduceF64, seq, what, data, n, nullptr); })->wait();
  }
  void broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= world_size())
      throw Error(who() + ": broadcast: root " + std::to_string(root) + " is not a rank");
    const std::string what = "broadcast of " + std::to_string(bytes) + " bytes from rank " + std::to_string(root);
    submit([this, data, bytes, root, what](uint64_t seq) { bcast(seq, what, static_cast<char*>(data), bytes, root); })->wait();
  }
  void barrier() override {
    double x = 0;
    all_reduce_sum(&x, 1);
  }
  [[noreturn]] void abort(const std::string& message) override {
    std::fprintf(stderr, "error: %s\n", message.c_str());
    std::fflush(stderr);
    // The peers see the connections close and stop with "rank N (...) disconnected".
    for (Peer& p : peers_)
      if (p.fd >= 0) ::shutdown(p.fd, SHUT_RDWR);
    std::_Exit(1);
  }

 private:
  struct Task {
    std::function<void(uint64_t)> run;
    std::promise<void> done;
  };
  class Request final : public CommRequest {
   public:
    explicit Request(std::future<void> f) : f_(std::move(f)) {}
    ~Request() override {
      if (f_.valid()) f_.wait();
    }
    void wait() override {
      if (f_.valid()) f_.get();
    }

   private:
    std::future<void> f_;
  };

  // A peer that closed its connection. The other ranks reach each other through rank 0, which
  // ends them all when any one fails: on them, rank 0's going names no culprit.
  std::string gone(const Peer& p, const char* why = nullptr) const {
    return p.name + " disconnected" + (why ? std::string(" (") + why + ")" : "") +
           (o_.rank != 0 ? "; rank 0 also disconnects every rank when another fails, and then its message names which" : "");
  }
  std::string who() const {
    return "rank " + std::to_string(o_.rank) + " of " + std::to_string(o_.world_size) + " (TCP)";
  }
  void check_counts(const std::vector<int64_t>& counts, const char* what) const {
    if (counts.size() != size_t(world_size()))
      throw Error(who() + ": " + what + ": " + std::to_string(counts.size()) + " pieces for " +
                  std::to_string(world_size()) + " ranks");
    for (int64_t c : counts)
      if (c < 0) throw Error(who() + ": " + what + ": negative piece size");
  }

  std::unique_ptr<CommRequest> submit(std::function<void(uint64_t)> run);
  void worker();

  // Socket I/O that fails with a message naming the peer: "disconnected", or no progress
  // within the timeout.
  void send_all(Peer& p, const void* data, size_t n, const std::string& what);
  void recv_all(Peer& p, void* data, size_t n, const std::string& what);
  void send_msg(Peer& p, Op op, uint64_t seq, const void* data, size_t n, const std::string& what) {
    Header h;
    h.op = uint32_t(op), h.seq = seq, h.bytes = n;
    send_all(p, &h, sizeof h, what);
    send_all(p, data, n, what);
  }
  // Reads a header and checks it is the one expected.
  void expect(Peer& p, Op op, uint64_t seq, size_t n, const std::string& what);

  template <typename T>
  void reduce(Op op, uint64_t seq, const std::string& what, T* data, int64_t n,
              const std::vector<int64_t>* scatter);
  void gather(uint64_t seq, const std::string& what, float* data, const std::vector<int64_t>& counts);
  void bcast(uint64_t seq, const std::string& what, char* data, size_t bytes, int root);

  void rendezvous_root();
  void rendezvous_peer();
  void close_peers() {
    for (Peer& p : peers_)
      if (p.fd >= 0) ::close(p.fd);
  }

  TcpOptions o_;
  // Rank 0: peers_[r] is rank r (peers_[0] unused). Other ranks: peers_[0] is rank 0.
  std::vector<Peer> peers_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Task>> queue_;
  bool stop_ = false;
  std::string broken_;  // the first failure: every later collective fails with it
  uint64_t seq_ = 0;
  std::thread thread_;
};

void set_socket_options(int fd, double timeout_s) {  // (before the fd is a Peer's: set_timeout)
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  timeval tv;
  tv.tv_sec = time_t(timeout_s);
  tv.tv_usec = suseconds_t((timeout_s - double(tv.tv_sec)) * 1e6);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

void set_timeout(Peer& p, double timeout_s) {
  set_socket_options(p.fd, timeout_s);
  p.wait_s = timeout_s;
}

TcpCommunicator::TcpCommunicator(const TcpOptions& o) : o_(o) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size)
    throw Error("TCP rendezvous: RANK=" + std::to_string(o.rank) + " is not in [0, WORLD_SIZE=" +
                std::to_string(o.world_size) + ")");
  if (o.master_port <= 0 || o.master_port > 65535)
    throw Error("TCP rendezvous: MASTER_PORT=" + std::to_string(o.master_port) + " is not a port");
  if (o.world_size > 1) {
    try {
      if (o.rank == 0)
        rendezvous_root();
      else
        rendezvous_peer();
    } catch (...) {
      // No destructor runs after a constructor throws: close the ranks that arrived, which
      // would otherwise wait for a welcome (twice the timeout) instead of seeing rank 0 go.
      close_peers();
      throw;
    }
  }
  thread_ = std::thread([this] { worker(); });
}

TcpCommunicator::~TcpCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  close_peers();
}

void TcpCommunicator::rendezvous_root() {
  const std::string at = who() + ": listening on port " + std::to_string(o_.master_port) +
                         (o_.port_given ? " (MASTER_PORT)" : " (MASTER_PORT unset: the default)");
  // Dual-stack where the host has IPv6 (peers may name rank 0 by an IPv4 or an IPv6 address),
  // else IPv4 alone.
  int lfd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const bool v6 = lfd >= 0;
  if (!v6) lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (lfd < 0) throw Error(at + ": socket: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{lfd};
  int one = 1, zero = 0;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_storage addr{};
  socklen_t addr_len = 0;
  if (v6) {
    setsockopt(lfd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&addr);
    a6->sin6_family = AF_INET6;
    a6->sin6_addr = in6addr_any;
    a6->sin6_port = htons(uint16_t(o_.master_port));
    addr_len = sizeof(sockaddr_in6);
  } else {
    auto* a4 = reinterpret_cast<sockaddr_in*>(&addr);
    a4->sin_family = AF_INET;
    a4->sin_addr.s_addr = htonl(INADDR_ANY);
    a4->sin_port = htons(uint16_t(o_.master_port));
    addr_len = sizeof(sockaddr_in);
  }
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&addr), addr_len) != 0 || ::listen(lfd, o_.world_size) != 0)
    throw Error(at + ": " + std::strerror(errno));

  peers_.resize(size_t(o_.world_size));
  const double deadline = now_s() + o_.timeout_s;
  // Connections accepted whose Hello has not arrived yet. All are polled together, so one that
  // stays silent (a port scanner, a stale client) holds up no rank that did say hello.
  struct Pending {
    int fd;
    sockaddr_storage from;
  };
  std::vector<Pending> pending;
  struct PendingCloser {
    std::vector<Pending>& list;
    ~PendingCloser() {
      for (const Pending& c : list) ::close(c.fd);
    }
  } pending_closer{pending};
  int arrived = 1;
  // A wait of more than a few seconds (a rank not started yet, or started with another
  // MASTER_PORT) is said once, so that a silent run is not taken for a hung one.
  const double said_after = now_s() + kWaitNoteAfterS;
  bool said = false;
  while (arrived < o_.world_size) {
    const double left = deadline - now_s();
    std::vector<pollfd> fds{{lfd, POLLIN, 0}};
    for (const Pending& c : pending) fds.push_back({c.fd, POLLIN, 0});
    const double wait = said ? left : std::min(left, std::max(0.0, said_after - now_s()));
    int rc = left > 0 ? ::poll(fds.data(), nfds_t(fds.size()), int(std::min(wait, 1e6) * 1000) + 1) : 0;
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0 && !said && deadline - now_s() > 0) {
      said = true;
      std::fprintf(stderr, "note: %s: %d of %d ranks have connected; waiting for the others (up to %s; "
                   "KILN_COMM_TIMEOUT sets the limit)\n", at.c_str(), arrived, o_.world_size, seconds(o_.timeout_s).c_str());
      continue;
    }
    if (rc <= 0) {
      std::string missing;
      for (int r = 1; r < o_.world_size; ++r)
        if (peers_[size_t(r)].fd < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      throw Error(at + ": only " + std::to_string(arrived) + " of " + std::to_string(o_.world_size) +
                  " ranks connected within " + seconds(o_.timeout_s) + " (missing rank " + missing + ")");
    }
    // Hellos first (their fds are in `pending`, after the listener's entry), then new connections.
    std::vector<Pending> ready;
    for (size_t i = fds.size() - 1; i >= 1; --i)
      if (fds[i].revents) {
        ready.push_back(pending[i - 1]);
        pending.erase(pending.begin() + std::ptrdiff_t(i - 1));
      }
    if (fds[0].revents & POLLIN) {
      Pending c{};
      socklen_t len = sizeof c.from;
      c.fd = ::accept4(lfd, reinterpret_cast<sockaddr*>(&c.from), &len, SOCK_CLOEXEC);
      if (c.fd >= 0) {
        set_socket_options(c.fd, o_.timeout_s);
        pending.push_back(c);
      }
    }
    // Closed here unless they become peers (or are closed first): an error below must not leak them.
    PendingCloser ready_closer{ready};
    while (!ready.empty()) {
      const Pending c = ready.back();
      ready.pop_back();
      Peer p{c.fd, "a peer at " + address_of(c.from)};
      Header h;
      // A rank's Hello is one small segment: a sender that stops part-way (not a Kiln rank) is
      // given two seconds, not the whole timeout, before it is dropped.
      set_timeout(p, std::min(o_.timeout_s, 2.0));
      try {
        recv_all(p, &h, sizeof h, "rendezvous");
      } catch (const Error&) {
        ::close(c.fd);  // a stray connection: not fatal
        continue;
      }
      set_timeout(p, o_.timeout_s);
      struct CloseUnlessPeer {
        int fd;
        bool kept = false;
        ~CloseUnlessPeer() {
          if (!kept) ::close(fd);
        }
      } this_one{c.fd};
      if (h.magic != kMagic || h.op != uint32_t(Op::Hello)) {
        std::fprintf(stderr, "warning: %s: ignored a connection from %s that is not a Kiln rank\n", at.c_str(),
                     address_of(c.from).c_str());
        continue;
      }
      const int r = int(h.arg & 0xffffffffu), w = int(h.arg >> 32);
      if (h.seq != kProtocol)
        throw Error(at + ": " + p.name + " speaks protocol " + std::to_string(h.seq) + ", this rank " +
                    std::to_string(kProtocol) + " (different Kiln versions)");
      if (w != o_.world_size)
        throw Error(at + ": " + p.name + " (RANK=" + std::to_string(r) + ") has WORLD_SIZE=" + std::to_string(w) +
                    ", this rank " + std::to_string(o_.world_size));
      if (r <= 0 || r >= o_.world_size || peers_[size_t(r)].fd >= 0)
        throw Error(at + ": " + p.name + " says RANK=" + std::to_string(r) +
                    (r > 0 && r < o_.world_size ? ", which another process already has" : ", which is not in [1, WORLD_SIZE)"));
      p.name = "rank " + std::to_string(r) + " (" + address_of(c.from) + ")";
      peers_[size_t(r)] = p;
      this_one.kept = true;
      ++arrived;
    }
  }
  for (int r = 1; r < o_.world_size; ++r) send_msg(peers_[size_t(r)], Op::Welcome, 0, nullptr, 0, "rendezvous");
}

void TcpCommunicator::rendezvous_peer() {
  const std::string target = o_.master_addr + ":" + std::to_string(o_.master_port);
  const std::string at = who() + ": connecting to rank 0 at " + target +
                         (o_.port_given ? " (MASTER_ADDR:MASTER_PORT)" : " (MASTER_ADDR; MASTER_PORT unset: the default port)");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const double deadline = now_s() + o_.timeout_s;
  std::string last = "no attempt";
  int fd = -1;
  const double said_after = now_s() + kWaitNoteAfterS;
  bool said = false;
  while (fd < 0) {
    if (!said && now_s() > said_after) {
      said = true;
      std::fprintf(stderr, "note: %s: waiting for rank 0 (%s; up to %s, KILN_COMM_TIMEOUT sets the limit)\n",
                   at.c_str(), last.c_str(), seconds(o_.timeout_s).c_str());
    }
    if (now_s() > deadline)
      throw Error(at + ": no connection within " + seconds(o_.timeout_s) + " (" + last +
                  "); is rank 0 running, and are MASTER_ADDR and MASTER_PORT right?");
    int g = ::getaddrinfo(o_.master_addr.c_str(), std::to_string(o_.master_port).c_str(), &hints, &res);
    if (g != 0) {
      last = std::string("cannot resolve MASTER_ADDR: ") + gai_strerror(g);
      ::usleep(200000);
      continue;
    }
    for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
      int s = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
      if (s < 0) continue;
      int rc = ::connect(s, a->ai_addr, a->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        pollfd pfd{s, POLLOUT, 0};
        const double left = std::max(0.0, std::min(deadline - now_s(), 5.0));
        if (::poll(&pfd, 1, int(left * 1000) + 1) == 1) {
          int err = 0;
          socklen_t len = sizeof err;
          getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
          rc = err ? -1 : 0;
          errno = err ? err : ETIMEDOUT;
        } else {
          errno = ETIMEDOUT;
        }
      }
      if (rc == 0) {
        fcntl(s, F_SETFL, fcntl(s, F_GETFL) & ~O_NONBLOCK);
        fd = s;
      } else {
        last = std::strerror(errno);
        ::close(s);
      }
    }
    ::freeaddrinfo(res);
    if (fd < 0) ::usleep(200000);
  }
  peers_.push_back(Peer{fd, "rank 0 (" + target + ")"});
  set_timeout(peers_[0], o_.timeout_s);
  Header h;
  h.op = uint32_t(Op::Hello), h.seq = kProtocol;
  h.arg = uint64_t(uint32_t(o_.rank)) | uint64_t(uint32_t(o_.world_size)) << 32;
  send_all(peers_[0], &h, sizeof h, "rendezvous");
  // Rank 0 answers once every rank has arrived; it may wait for the others up to the timeout.
  set_timeout(peers_[0], double(time_t(o_.timeout_s) * 2 + 1));
  expect(peers_[0], Op::Welcome, 0, 0, "rendezvous (waiting for all ranks to connect)");
  set_timeout(peers_[0], o_.timeout_s);
}

void TcpCommunicator::send_all(Peer& p, const void* data, size_t n, const std::string& what) {
  auto* c = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = ::send(p.fd, c, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      throw Error(who() + ": " + what + ": " + p.name + " took no data for " + seconds(p.wait_s) +
                  " (hung or unreachable; KILN_COMM_TIMEOUT sets the limit)");
    if (k < 0)
      throw Error(who() + ": " + what + ": " + gone(p, std::strerror(errno)));
    c += k;
    n -= size_t(k);
  }
}

void TcpCommunicator::recv_all(Peer& p, void* data, size_t n, const std::string& what) {
  auto* c = static_cast<char*>(data);
  while (n > 0) {
    ssize_t k = ::recv(p.fd, c, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      throw Error(who() + ": " + what + ": nothing from " + p.name + " for " + seconds(p.wait_s) +
                  " (hung or unreachable; KILN_COMM_TIMEOUT sets the limit)");
    if (k == 0) throw Error(who() + ": " + what + ": " + gone(p));
    if (k < 0) throw Error(who() + ": " + what + ": " + gone(p, std::strerror(errno)));
    c += k;
    n -= size_t(k);
  }
}

void TcpCommunicator::expect(Peer& p, Op op, uint64_t seq, size_t n, const std::string& what) {
  Header h;
  recv_all(p, &h, sizeof h, what);
  if (h.magic != kMagic)
    throw Error(who() + ": " + what + ": garbage from " + p.name + " (not a Kiln message)");
  if (h.op != uint32_t(op) || h.seq != seq || h.bytes != n)
    throw Error(who() + ": " + what + " (collective #" + std::to_string(seq) + "): " + p.name + " sent " +
                (h.op >= 1 && h.op <= uint32_t(Op::Broadcast) ? op_name(Op(h.op)) : "an unknown message") +
                " #" + std::to_string(h.seq) + " of " + std::to_string(h.bytes) +
                " bytes; the ranks are not running the same collectives (different options or modules?)");
}

std::unique_ptr<CommRequest> TcpCommunicator::submit(std::function<void(uint64_t)> run) {
  auto task = std::make_unique<Task>();
  task->run = std::move(run);
  auto f = task->done.get_future();
  if (o_.world_size == 1) {  // nothing to exchange
    task->done.set_value();
    return std::make_unique<Request>(std::move(f));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_all();
  return std::make_unique<Request>(std::move(f));
}

void TcpCommunicator::worker() {
  for (;;) {
    std::unique_ptr<Task> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ with nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    const uint64_t seq = ++seq_;
    try {
      if (!broken_.empty()) throw Error(broken_);
      task->run(seq);
      task->done.set_value();
    } catch (const Error& e) {
      if (broken_.empty()) broken_ = e.what();
      task->done.set_exception(std::current_exception());
    } catch (...) {
      if (broken_.empty()) broken_ = who() + ": collective failed";
      task->done.set_exception(std::current_exception());
    }
  }
}

// All-reduce, or with `scatter` a reduce-scatter: every rank sends its whole vector to rank 0,
// which adds them in rank order and sends back the sum (or each rank's piece of it).
template <typename T>
void TcpCommunicator::reduce(Op op, uint64_t seq, const std::string& what, T* data, int64_t n,
                             const std::vector<int64_t>* scatter) {
  const size_t bytes = size_t(n) * sizeof(T);
  if (o_.rank != 0) {
    Peer& root = peers_[0];
    send_msg(root, op, seq, data, bytes, what);
    int64_t off = 0, count = n;
    if (scatter) off = piece_offset(*scatter, o_.rank), count = (*scatter)[size_t(o_.rank)];
    expect(root, op, seq, size_t(count) * sizeof(T), what);
    recv_all(root, data + off, size_t(count) * sizeof(T), what);
    return;
  }
  constexpr int64_t kChunk = 1 << 20;  // elements received and added at a time
  std::vector<T> tmp(size_t(std::min(n, kChunk)));
  for (int r = 1; r < o_.world_size; ++r) {
    Peer& p = peers_[size_t(r)];
    expect(p, op, seq, bytes, what);
    for (int64_t at = 0; at < n; at += kChunk) {
      const int64_t k = std::min(kChunk, n - at);
      recv_all(p, tmp.data(), size_t(k) * sizeof(T), what);
      T* d = data + at;
      for (int64_t i = 0; i < k; ++i) d[i] += tmp[size_t(i)];
    }
  }
  for (int r = 1; r < o_.world_size; ++r) {
    int64_t off = 0, count = n;
    if (scatter) off = piece_offset(*scatter, r), count = (*scatter)[size_t(r)];
    send_msg(peers_[size_t(r)], op, seq, data + off, size_t(count) * sizeof(T), what);
  }
}

void TcpCommunicator::gather(uint64_t seq, const std::string& what, float* data, const std::vector<int64_t>& counts) {
  const int64_t total = piece_offset(counts, o_.world_size);
  if (o_.rank != 0) {
    Peer& root = peers_[0];
    send_msg(root, Op::AllGather, seq, data + piece_offset(counts, o_.rank),
             size_t(counts[size_t(o_.rank)]) * sizeof(float), what);
    expect(root, Op::AllGather, seq, size_t(total) * sizeof(float), what);
    recv_all(root, data, size_t(total) * sizeof(float), what);
    return;
  }
  for (int r = 1; r < o_.world_size; ++r) {
    const size_t bytes = size_t(counts[size_t(r)]) * sizeof(float);
    expect(peers_[size_t(r)], Op::AllGather, seq, bytes, what);
    recv_all(peers_[size_t(r)], data + piece_offset(counts, r), bytes, what);
  }
  for (int r = 1; r < o_.world_size; ++r)
    send_msg(peers_[size_t(r)], Op::AllGather, seq, data, size_t(total) * sizeof(float), what);
}

void TcpCommunicator::bcast(uint64_t seq, const std::string& what, char* data, size_t bytes, int root) {
  if (o_.rank != 0) {
    if (o_.rank == root) {
      send_msg(peers_[0], Op::Broadcast, seq, data, bytes, what);
    } else {
      expect(peers_[0], Op::Broadcast, seq, bytes, what);
      recv_all(peers_[0], data, bytes, what);
    }
    return;
  }
  if (root != 0) {
    expect(peers_[size_t(root)], Op::Broadcast, seq, bytes, what);
    recv_all(peers_[size_t(root)], data, bytes, what);
  }
  for (int r = 1; r < o_.world_size; ++r)
    if (r != root) send_msg(peers_[size_t(r)], Op::Broadcast, seq, data, bytes, what);
}

int env_or(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end || x < 0 || x > 1 << 20)
    throw Error(std::string("environment: ") + name + "='" + v + "' is not a non-negative integer");
  return int(x);
}

}  // namespace

std::unique_ptr<Communicator> make_tcp_communicator(const TcpOptions& options) {
  return std::make_unique<TcpCommunicator>(options);
}

namespace comm {
std::unique_ptr<Communicator> make_tcp_communicator_from_env() {
  TcpOptions o;
  if (!std::getenv("RANK") || !std::getenv("WORLD_SIZE"))
    throw Error("TCP rendezvous: RANK and WORLD_SIZE must be set (as torchrun sets them), with MASTER_ADDR "
                "and MASTER_PORT");
  o.rank = env_or("RANK", 0);
  o.world_size = env_or("WORLD_SIZE", 1);
  o.local_rank = env_or("LOCAL_RANK", o.rank);
  if (const char* a = std::getenv("MASTER_ADDR"); a && *a) o.master_addr = a;
  o.master_port = env_or("MASTER_PORT", 29500);
  const char* port = std::getenv("MASTER_PORT");
  o.port_given = port && *port;  // (env_or takes an empty value as unset)
  o.timeout_s = comm_timeout_seconds();
  return make_tcp_communicator(o);
}
}  // namespace comm

}  // namespace kiln
