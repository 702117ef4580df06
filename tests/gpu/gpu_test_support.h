// Shared by the GPU tests: skip visibly where no GPU is present.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "profiler/environment.h"

#define FUSEKIT_REQUIRE_GPU()                                                        \
  do {                                                                               \
    const std::string fusekit_reason_ = fusekit::profiler::gpu_unavailable_reason(); \
    if (!fusekit_reason_.empty()) GTEST_SKIP() << "no GPU: " << fusekit_reason_;     \
  } while (0)

namespace fusekit::test_support {

// Sets an environment variable for a scope and restores what was there, also when a test body is
// left early (a failed ASSERT, an exception).
class ScopedEnvironment {
 public:
  ScopedEnvironment(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnvironment() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnvironment(const ScopedEnvironment&) = delete;
  ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace fusekit::test_support
