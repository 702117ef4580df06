// The NCCL communicator of one rank (see communicator.h for the way in).
#include "dp/communicator.h"

#include <cstring>
#include <span>
#include <vector>

#include "dp/nccl_check.h"
#include "kernels/cuda_check.h"

namespace fusekit::dp {

Communicator::Communicator(const LaunchEnvironment& launch) : launch_(launch) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  device_ = local_device(launch_.local_rank, devices);
  FUSEKIT_CUDA_CHECK(cudaSetDevice(device_));
  FUSEKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  try {
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (launch_.rank == 0) FUSEKIT_NCCL_CHECK(ncclGetUniqueId(&id));
    const std::vector<uint8_t> blob =
        broadcast_blob(launch_, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&id), sizeof id), sizeof id);
    std::memcpy(&id, blob.data(), sizeof id);
    FUSEKIT_NCCL_CHECK(ncclCommInitRank(&comm_, launch_.world_size, id, launch_.rank));
  } catch (...) {
    cudaStreamDestroy(stream_);
    throw;
  }
}

Communicator::Communicator() : Communicator(read_launch_environment()) {}

Communicator::~Communicator() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (comm_ != nullptr) ncclCommDestroy(comm_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

}  // namespace fusekit::dp
