// The one checking macro for the CUDA runtime: file, line, the call and CUDA's own message, thrown
// as std::runtime_error. Host-only, so plain C++ files include it as well as CUDA ones.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#define FUSEKIT_CUDA_CHECK(call)                                                                       \
  do {                                                                                                 \
    cudaError_t fusekit_status_ = (call);                                                              \
    if (fusekit_status_ != cudaSuccess) {                                                              \
      throw std::runtime_error(std::string("CUDA error: ") + #call + " failed at " + __FILE__ + ":" +  \
                               std::to_string(__LINE__) + ": " + cudaGetErrorString(fusekit_status_)); \
    }                                                                                                  \
  } while (0)
