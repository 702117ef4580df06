#include "kernels/step_counter.h"

#include "kernels/cuda_check.h"

namespace fusekit::kernels {
namespace {

__global__ void advance_step_counter_kernel(unsigned long long* counter) { *counter += 1; }

}  // namespace

void advance_step_counter(uint64_t* counter, cudaStream_t stream) {
  advance_step_counter_kernel<<<1, 1, 0, stream>>>(reinterpret_cast<unsigned long long*>(counter));
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fusekit::kernels
