// Input checks of fusekit's torch.ops: each failure raises one Python exception whose message
// names the operator, the argument and what was wrong (dtype, device, contiguity, shape), so that
// a bad call never reaches a kernel. Also the small conversions every operator needs: the storage
// type of a tensor, the current stream, the Philox (seed, offset) pair of a dropout.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "kernels/bias_gelu.h"
#include "kernels/dtype.h"

namespace fusekit::torch_ops {

// ---- messages
// An error message from parts (text, numbers, shapes, dtypes, devices), built with std::to_string
// and string appends, never by streaming a number into an ostream: in a Python process that loaded
// this library, inserting a number into an ostream from this library's code crashed (H100 machine,
// PyTorch 2.11: a segmentation fault on the first numeric field of a message), while strings and
// std::to_string did not. TORCH_CHECK_* then receives one std::string.
namespace detail {
inline void append(std::string& s, const char* v) { s += v; }
inline void append(std::string& s, const std::string& v) { s += v; }
inline void append(std::string& s, std::string_view v) { s.append(v.data(), v.size()); }
template <typename T>
requires std::is_integral_v<T>
inline void append(std::string& s, T v) { s += std::to_string(v); }
inline void append(std::string& s, double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", v);
  s += buffer;
}
inline void append(std::string& s, c10::IntArrayRef v) {
  s += "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  s += "]";
}
inline void append(std::string& s, at::ScalarType v) { s += c10::toString(v); }
inline void append(std::string& s, const c10::Device& v) { s += v.str(); }
}  // namespace detail

template <typename... Parts>
std::string text(const Parts&... parts) {
  std::string s;
  (detail::append(s, parts), ...);
  return s;
}

// The storage type of a float32, float16 or bfloat16 tensor; a TypeError otherwise.
inline kernels::DType dtype_of(const at::Tensor& t, const char* op, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return kernels::DType::f32;
    case at::kHalf:
      return kernels::DType::f16;
    case at::kBFloat16:
      return kernels::DType::bf16;
    default:
      TORCH_CHECK_TYPE(
          false, text("fusekit::", op, ": ", name, " must be float32, float16 or bfloat16, not ", t.scalar_type()));
  }
}

// A defined, contiguous CUDA tensor.
inline void check_cuda(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.defined(), text("fusekit::", op, ": ", name, " is missing"));
  TORCH_CHECK_VALUE(t.is_cuda(), text("fusekit::", op, ": ", name, " must be a CUDA tensor, not on ", t.device()));
  TORCH_CHECK_VALUE(t.is_contiguous(), text("fusekit::", op, ": ", name, " must be contiguous (call .contiguous())"));
}

// A CUDA tensor of one given scalar type.
inline void check_cuda(const at::Tensor& t, at::ScalarType type, const char* op, const char* name) {
  check_cuda(t, op, name);
  TORCH_CHECK_TYPE(t.scalar_type() == type,
                   text("fusekit::", op, ": ", name, " must be ", type, ", not ", t.scalar_type()));
}

// Every tensor of `others` has the storage type of `first` and lives on its device.
inline void check_same(const at::Tensor& first, const char* first_name,
                       std::initializer_list<std::pair<const at::Tensor*, const char*>> others, const char* op) {
  for (const auto& [t, name] : others) {
    TORCH_CHECK_TYPE(t->scalar_type() == first.scalar_type(),
                     text("fusekit::", op, ": ", name, " is ", t->scalar_type(), " but ", first_name, " is ",
                          first.scalar_type(), " (all must have one dtype)"));
    TORCH_CHECK_VALUE(t->device() == first.device(), text("fusekit::", op, ": ", name, " is on ", t->device(), " but ",
                                                          first_name, " is on ", first.device()));
  }
}

// The number of elements of t, which must be `expected`.
inline void check_numel(const at::Tensor& t, int64_t expected, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.numel() == expected, text("fusekit::", op, ": ", name, " has ", t.numel(), " elements, expected ",
                                                expected, " (shape ", t.sizes(), ")"));
}

// A row count or feature size that the kernels take as int.
inline int int_size(int64_t value, const char* op, const char* what) {
  TORCH_CHECK_VALUE(value >= 0 && value <= INT32_MAX,
                    text("fusekit::", op, ": ", what, " ", value, " is out of the kernels' range [0, 2^31)"));
  return static_cast<int>(value);
}

inline void check_dropout(double p, const char* op) {
  TORCH_CHECK_VALUE(p >= 0.0 && p < 1.0, text("fusekit::", op, ": dropout p must be in [0, 1), not ", p));
}

// A dropout call's Philox stream, from its `philox` tensor: int64, 2 elements. On the CPU, (seed,
// offset) read here (eager calls: PyTorch's CPU generator drew them). On the device of `like`
// (calls traced by torch.compile, which keeps host tensors out of a CUDA graph): the kernels read
// the offset, element 1, from device memory when they run (kernels/detail/philox.cuh's counter),
// and the key is the fixed kDevicePhiloxKey: each call's random 62-bit offset picks its stream.
struct PhiloxStream {
  uint64_t seed = 0, offset = 0;
  const uint64_t* counter = nullptr;  // device, or null
};
constexpr uint64_t kDevicePhiloxKey = 0x66757365'6b697421ull;

inline PhiloxStream philox_of(const at::Tensor& philox, const at::Tensor& like, const char* op) {
  TORCH_CHECK_VALUE(philox.defined() && philox.scalar_type() == at::kLong && philox.numel() == 2 &&
                        (philox.device().is_cpu() || (philox.device() == like.device() && philox.is_contiguous())),
                    text("fusekit::", op, ": philox must be an int64 tensor of 2 elements (seed, offset) on the CPU, ",
                         "or a contiguous one on ", like.device(), " (offset read by the kernels)"));
  if (!philox.device().is_cpu()) {
    return {kDevicePhiloxKey, 0, reinterpret_cast<const uint64_t*>(philox.data_ptr<int64_t>() + 1)};
  }
  const at::Tensor c = philox.contiguous();
  const int64_t* v = c.data_ptr<int64_t>();
  return {static_cast<uint64_t>(v[0]), static_cast<uint64_t>(v[1]), nullptr};
}

// A GELU form by PyTorch's name for it ("none": erf, "tanh"); a ValueError naming `op` otherwise.
inline kernels::GeluApproximation gelu_approximation_of(std::string_view name, const char* op) {
  if (name == "none") return kernels::GeluApproximation::none;
  if (name == "tanh") return kernels::GeluApproximation::tanh;
  TORCH_CHECK_VALUE(false, text("fusekit::", op, ": approximate must be 'none' or 'tanh', not '", name, "'"));
}

inline cudaStream_t current_stream(const at::Tensor& on) {
  return at::cuda::getCurrentCUDAStream(on.device().index()).stream();
}

// Scratch memory for a kernel's workspace, from PyTorch's caching allocator.
inline at::Tensor workspace(size_t bytes, const at::Tensor& like) {
  return at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
}

}  // namespace fusekit::torch_ops
