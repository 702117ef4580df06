// A step counter on the device: one 64-bit word a stream advances by one, so that kernels read
// their step (a dropout stream's Philox offset, kernels/detail/philox.cuh) when they run, not when
// they are launched, and a training step captured once in a CUDA graph draws fresh masks at every
// replay.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fusekit::kernels {

// *counter += 1, in stream order (one thread).
void advance_step_counter(uint64_t* counter, cudaStream_t stream);

}  // namespace fusekit::kernels
