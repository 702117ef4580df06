// A scoped NVTX push/pop range for fusekit's own code: the tracer attributes kernels launched
// inside it to it, and Nsight Systems shows it the same way.
#pragma once

#include <nvtx3/nvToolsExt.h>

#include <string>

namespace fusekit::profiler {

class ScopedRange {
 public:
  explicit ScopedRange(const char* name) { nvtxRangePushA(name); }
  explicit ScopedRange(const std::string& name) : ScopedRange(name.c_str()) {}
  ~ScopedRange() { nvtxRangePop(); }
  ScopedRange(const ScopedRange&) = delete;
  ScopedRange& operator=(const ScopedRange&) = delete;
};

}  // namespace fusekit::profiler
