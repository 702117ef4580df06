// A CUDA stream of a test's own, for the GPU tests that enqueue work on a stream they pass.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

namespace fusekit::test_support {

// A non-blocking stream. Declare it before the models that run on it: their destructors wait for
// their last step on it, so it must outlive them (a destroyed stream's handle is freed memory).
struct NonBlockingStream {
  NonBlockingStream() { EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess); }
  ~NonBlockingStream() { cudaStreamDestroy(stream); }
  NonBlockingStream(const NonBlockingStream&) = delete;
  NonBlockingStream& operator=(const NonBlockingStream&) = delete;
  cudaStream_t stream = nullptr;
};

}  // namespace fusekit::test_support
