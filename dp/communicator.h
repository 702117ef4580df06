// One NCCL communicator of a data-parallel job, one process per GPU: the rank, the world size, the
// local GPU, a stream of its own, and the ncclComm_t, created from the launch environment
// (rendezvous.h) without libtorch.
//
// Joining: read_launch_environment() says who this process is; it takes the GPU of its local rank
// (local_device), rank 0 creates NCCL's unique id and hands it to the others with broadcast_blob
// (TCP, rendezvous.h), and every rank calls ncclCommInitRank. One rank alone needs no rendezvous.
// The collectives of dp/sparse_collective.h run on stream(); the destructor waits for it, then
// destroys the communicator.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include "dp/rendezvous.h"

namespace fusekit::dp {

class Communicator {
 public:
  // Joins the job `launch` describes; throws std::runtime_error (one line) where the environment,
  // the GPU, the rendezvous or NCCL fails.
  explicit Communicator(const LaunchEnvironment& launch);
  // Joins the job this process's environment describes.
  Communicator();
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return launch_.rank; }
  int size() const { return launch_.world_size; }
  int local_rank() const { return launch_.local_rank; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  ncclComm_t comm() const { return comm_; }
  const LaunchEnvironment& launch() const { return launch_; }

 private:
  LaunchEnvironment launch_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
};

}  // namespace fusekit::dp
