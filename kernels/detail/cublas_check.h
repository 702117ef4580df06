// The one checking macro for cuBLASLt: file, line, the call and cuBLAS's own status string, thrown
// as std::runtime_error. Host-only.
#pragma once

#include <cublasLt.h>

#include <stdexcept>
#include <string>

#define FUSEKIT_CUBLAS_CHECK(call)                                                                          \
  do {                                                                                                      \
    cublasStatus_t fusekit_status_ = (call);                                                                \
    if (fusekit_status_ != CUBLAS_STATUS_SUCCESS) {                                                         \
      throw std::runtime_error(std::string("cuBLAS error: ") + #call + " failed at " + __FILE__ + ":" +     \
                               std::to_string(__LINE__) + ": " + cublasLtGetStatusString(fusekit_status_)); \
    }                                                                                                       \
  } while (0)
