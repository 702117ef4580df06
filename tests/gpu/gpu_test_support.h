// Shared by the GPU tests: skip visibly where no GPU is present.
#pragma once

#include <gtest/gtest.h>

#include "profiler/environment.h"

#define FUSEKIT_REQUIRE_GPU()                                                        \
  do {                                                                               \
    const std::string fusekit_reason_ = fusekit::profiler::gpu_unavailable_reason(); \
    if (!fusekit_reason_.empty()) GTEST_SKIP() << "no GPU: " << fusekit_reason_;     \
  } while (0)
