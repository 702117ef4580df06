// libtorch views of the suite's device buffers, for the baseline cases (only where libtorch is
// built in). The tensors wrap fusekit's memory: the baseline reads the same inputs as the fused
// kernels, and the caller keeps the buffers alive.
#pragma once

#ifdef FUSEKIT_WITH_TORCH
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <vector>

#include "kernels/dtype.h"
#include "suites/ops/operands.h"

namespace fusekit::suites {

inline at::ScalarType torch_type(kernels::DType dtype) {
  return dtype == kernels::DType::f32 ? at::kFloat : dtype == kernels::DType::f16 ? at::kHalf : at::kBFloat16;
}

inline at::Tensor wrap(const DeviceBuffer& buffer, std::vector<int64_t> sizes, at::ScalarType type) {
  return at::from_blob(buffer.get(), sizes, at::TensorOptions().dtype(type).device(at::kCUDA));
}

// Makes PyTorch enqueue on the runner's stream for the guard's lifetime.
class TorchStream {
 public:
  explicit TorchStream(cudaStream_t stream) : guard_(c10::cuda::getStreamFromExternal(stream, 0)) {}

 private:
  c10::cuda::CUDAStreamGuard guard_;
};

}  // namespace fusekit::suites
#endif
