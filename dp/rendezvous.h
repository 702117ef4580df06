// The launch of a data-parallel job without libtorch: which rank this process is, read from the
// environment that torchrun or mpirun sets, the GPU it takes, and a blob of bytes (NCCL's unique
// id) that rank 0 hands to every other rank over one TCP connection each. Plain C++ and POSIX
// sockets: no CUDA, no NCCL, so the CPU tests run it with threads on localhost.
//
// The environment, first name found wins:
//   rank         RANK, OMPI_COMM_WORLD_RANK
//   world size   WORLD_SIZE, OMPI_COMM_WORLD_SIZE
//   local rank   LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK
//   address      MASTER_ADDR (mpirun: pass it with -x MASTER_ADDR=<host of rank 0>)
//   port         FUSEKIT_RENDEZVOUS_PORT, else MASTER_PORT (+ 1 under torchrun, below)
//   timeout      FUSEKIT_RENDEZVOUS_TIMEOUT, seconds (default 300)
// Neither a rank nor a world size set: one rank alone (rank 0 of 1), no rendezvous. Where the world
// has more than one rank, every variable but the timeout is required; a missing or malformed one is
// one line of std::runtime_error naming it.
//
// The non-obvious choice: torchrun's agent already listens on MASTER_ADDR:MASTER_PORT (its own
// c10d TCPStore, which it shares with the workers and says so with TORCHELASTIC_USE_AGENT_STORE=True),
// so under torchrun rank 0 listens on MASTER_PORT + 1 instead; FUSEKIT_RENDEZVOUS_PORT overrides both.
//
// The exchange (broadcast_blob): rank 0 listens on every interface at the port; each other rank
// connects to MASTER_ADDR:port (retrying until the deadline: rank 0 may start later) and sends a
// 16-byte hello (magic "fkdp", protocol version, its rank, the world size, u32 little-endian each);
// once every rank has said hello, rank 0 sends each one the blob's length (u32) and its bytes. A
// connection whose first bytes are not the magic is dropped and waited past; a duplicate rank, a
// rank out of range or a different world size is an error.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace fusekit::dp {

struct LaunchEnvironment {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr;  // empty for one rank alone
  uint16_t port = 0;        // where rank 0 listens; 0 for one rank alone
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
  std::string launcher;  // "torchrun", "environment" (RANK etc. without torchrun), "mpirun", "single"
};

// Reads the variables above through `lookup` (nullopt: not set).
LaunchEnvironment read_launch_environment(const std::function<std::optional<std::string>(const char*)>& lookup);
// The same from this process's environment.
LaunchEnvironment read_launch_environment();

// The GPU of a local rank among `device_count` visible ones: the local rank itself, or 0 where one
// GPU is visible (a launcher that gives each process its own CUDA_VISIBLE_DEVICES). Throws where
// no GPU is visible or the local rank has none of its own (two ranks on one GPU: NCCL refuses it).
int local_device(int local_rank, int device_count);

// Rank 0 sends `root_blob` (of `bytes` bytes) to every other rank and returns it; the other ranks
// return what they received (their `root_blob` is not read). Throws std::runtime_error with one
// line saying which rank failed how: a port that cannot be bound, ranks that did not connect before
// the deadline (named), rank 0 not reachable before it, a closed connection, a size mismatch.
std::vector<uint8_t> broadcast_blob(const LaunchEnvironment& launch, std::span<const uint8_t> root_blob, size_t bytes);

}  // namespace fusekit::dp
