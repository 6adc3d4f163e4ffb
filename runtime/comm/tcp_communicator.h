// The TCP backend: the environment rendezvous of torchrun-style launchers (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT, LOCAL_RANK), for runs without MPI.
//
// Rank 0 listens on MASTER_PORT (all interfaces); every other rank connects to
// MASTER_ADDR:MASTER_PORT, retrying until the timeout, and says hello (protocol version, rank,
// world size), which rank 0 checks; once all have arrived rank 0 answers each. Collectives are a
// star through rank 0: it receives every rank's buffer, sums in rank order (so every rank gets
// the same bits) and sends the result back. Rank 0 moves (world-1) times the buffer each way:
// right for loopback, a LAN and a few ranks; use MPI or NCCL for anything bigger.
//
// Every message carries a header (sequence number, operation, byte count) that the receiver
// checks, so ranks that issue different collectives fail with a message instead of mixing data.
// Collectives run in order on one I/O thread, which is what makes the i*() calls non-blocking.
// A peer that exits shows up at once ("rank 0 of 2 (TCP): all_reduce of 4096 floats: rank 1
// (127.0.0.1:50112) disconnected"); one that stops answering, after the timeout.
#pragma once
#include <memory>
#include <string>

#include "runtime/comm/communicator.h"

namespace kiln {

struct TcpOptions {
  int rank = 0, world_size = 1, local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool port_given = true;  // false: MASTER_PORT unset, the default (torchrun's) taken
  double timeout_s = 600;  // connecting, and any collective making no progress
};

// Connects (rank 0 waits for the others); kiln::Error when it cannot within the timeout.
std::unique_ptr<Communicator> make_tcp_communicator(const TcpOptions& options);

}  // namespace kiln
