#include <random>
#include <stdexcept>

#include "kernels/common.cuh"
#include "suites/ops/operands.h"

namespace fusekit::suites {
namespace {

__device__ __forceinline__ uint64_t mix(uint64_t z) {  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

template <class T>
__global__ void fill_random_kernel(T* data, size_t count, uint64_t seed, float scale, float offset) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count; i += size_t{gridDim.x} * blockDim.x) {
    const uint64_t bits = mix(seed ^ mix(i + 0x9e3779b97f4a7c15ull));
    const float uniform = static_cast<float>(bits >> 40) * (2.0f / 16777216.0f) - 1.0f;
    data[i] = kernels::from_float<T>(offset + scale * uniform);
  }
}

}  // namespace

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  FUSEKIT_CUDA_CHECK(cudaMalloc(&data_, std::max<size_t>(bytes, 1)));
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept : data_(other.data_), bytes_(other.bytes_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) cudaFree(data_);
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}
DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);
}

void fill_random(void* data, size_t count, kernels::DType dtype, uint64_t seed, float scale, float offset,
                 cudaStream_t stream) {
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<size_t>((count + threads - 1) / threads, 4096));
  if (count == 0) return;
  switch (dtype) {
    case kernels::DType::f32:
      fill_random_kernel<<<blocks, threads, 0, stream>>>(static_cast<float*>(data), count, seed, scale, offset);
      break;
    case kernels::DType::f16:
      fill_random_kernel<<<blocks, threads, 0, stream>>>(static_cast<__half*>(data), count, seed, scale, offset);
      break;
    case kernels::DType::bf16:
      fill_random_kernel<<<blocks, threads, 0, stream>>>(static_cast<__nv_bfloat16*>(data), count, seed, scale, offset);
      break;
  }
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

int rotation_sets(size_t bytes_per_set) {
  int device = 0, l2 = 0;
  FUSEKIT_CUDA_CHECK(cudaGetDevice(&device));
  FUSEKIT_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  const size_t needed = 2 * static_cast<size_t>(l2) / std::max<size_t>(bytes_per_set, 1) + 1;
  return static_cast<int>(std::max<size_t>(2, needed));
}

std::vector<long> parse_sizes(const std::string& text, int count, long limit, const std::string& usage) {
  std::vector<long> sizes(count);
  size_t at = 0;
  for (int i = 0; i < count; ++i) {
    const size_t end = i + 1 < count ? text.find('x', at) : text.size();
    if (end == std::string::npos || end <= at) throw std::invalid_argument(usage);
    // Digits only: std::stol alone would take a sign or leading blanks.
    for (size_t c = at; c < end; ++c) {
      if (text[c] < '0' || text[c] > '9') throw std::invalid_argument(usage);
    }
    try {
      sizes[i] = std::stol(text.substr(at, end - at));
    } catch (const std::exception&) {  // out of range
      throw std::invalid_argument(usage);
    }
    if (sizes[i] <= 0 || sizes[i] > limit) throw std::invalid_argument(usage);
    at = end + 1;
  }
  return sizes;
}

Shape2 parse_shape2(const std::string& text) {
  const std::vector<long> sizes =
      parse_sizes(text, 2, 1L << 30, "unsupported shape '" + text + "': expected ROWSxCOLUMNS, e.g. 8192x768");
  return {static_cast<int>(sizes[0]), static_cast<int>(sizes[1])};
}

kernels::DType parse_dtype(const std::string& text) {
  if (text == "fp32") return kernels::DType::f32;
  if (text == "fp16") return kernels::DType::f16;
  if (text == "bf16") return kernels::DType::bf16;
  throw std::invalid_argument("unsupported dtype '" + text + "': expected fp32, fp16 or bf16");
}

double device_bytes_in_use() {
  size_t free = 0, total = 0;
  FUSEKIT_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return static_cast<double>(total - free);
}

}  // namespace fusekit::suites
