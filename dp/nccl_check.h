// The one checking macro for NCCL: file, line, the call, NCCL's error string and, where NCCL keeps
// one, its last error message, thrown as std::runtime_error. Host-only.
#pragma once

#include <nccl.h>

#include <stdexcept>
#include <string>

namespace fusekit::dp {

// NCCL's own words for a failed call: the error string, and the last error message where the
// library has one (NCCL 2.13 and later).
inline std::string nccl_error_text(ncclResult_t status) {
  std::string text = ncclGetErrorString(status);
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && last[0] != '\0') text += std::string(" (") + last + ")";
#endif
  return text;
}

}  // namespace fusekit::dp

#define FUSEKIT_NCCL_CHECK(call)                                                                      \
  do {                                                                                                \
    ncclResult_t fusekit_nccl_status_ = (call);                                                       \
    if (fusekit_nccl_status_ != ncclSuccess) {                                                        \
      throw std::runtime_error(std::string("NCCL error: ") + #call + " failed at " + __FILE__ + ":" + \
                               std::to_string(__LINE__) + ": " +                                      \
                               ::fusekit::dp::nccl_error_text(fusekit_nccl_status_));                 \
    }                                                                                                 \
  } while (0)
