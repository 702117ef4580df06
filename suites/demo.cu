#include "suites/demo.h"

#include <random>

#include "profiler/range.h"

namespace fusekit::suites {
namespace {

// ---- CUDA kernels

__global__ void scale_kernel(const float* __restrict__ x, float* __restrict__ y, float a, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    y[i] = a * x[i];
}

__global__ void add_kernel(float* __restrict__ y, float b, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) y[i] += b;
}

__global__ void scale_add_fused_kernel(const float4* __restrict__ x, float4* __restrict__ y, float a, float b,
                                       size_t n4) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n4; i += size_t{gridDim.x} * blockDim.x) {
    float4 v = x[i];
    y[i] = make_float4(a * v.x + b, a * v.y + b, a * v.z + b, a * v.w + b);
  }
}

// ---- kernel launchers

int grid_for(size_t n, int threads) {
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  size_t blocks = (n + threads - 1) / threads;
  return static_cast<int>(std::min<size_t>(blocks, size_t(sms) * 16));
}

}  // namespace

DemoSuite::DemoSuite(size_t elements) : elements_((elements + 3) / 4 * 4) {
  int device = 0, l2 = 0;
  FUSEKIT_CUDA_CHECK(cudaGetDevice(&device));
  FUSEKIT_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  const size_t set_bytes = 2 * elements_ * sizeof(float);
  sets_ = static_cast<int>(std::max<size_t>(2, (2 * size_t(l2) + set_bytes - 1) / set_bytes + 1));
  std::random_device seed;
  std::mt19937 rng(seed());
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  for (int s = 0; s < sets_; ++s) {
    float *x = nullptr, *y = nullptr;
    FUSEKIT_CUDA_CHECK(cudaMalloc(&x, elements_ * sizeof(float)));
    FUSEKIT_CUDA_CHECK(cudaMalloc(&y, elements_ * sizeof(float)));
    x_.push_back(x);
    y_.push_back(y);
    std::vector<float> h(elements_);
    for (float& v : h) v = uniform(rng);
    host_x_.push_back(std::move(h));
  }
}

DemoSuite::~DemoSuite() {
  for (float* p : x_) cudaFree(p);
  for (float* p : y_) cudaFree(p);
}

void DemoSuite::upload(cudaStream_t stream) {
  profiler::ScopedRange range("setup");
  for (int s = 0; s < sets_; ++s) {
    FUSEKIT_CUDA_CHECK(
        cudaMemcpyAsync(x_[s], host_x_[s].data(), elements_ * sizeof(float), cudaMemcpyHostToDevice, stream));
    FUSEKIT_CUDA_CHECK(cudaMemsetAsync(y_[s], 0xFF, elements_ * sizeof(float), stream));  // NaN: poisoned
  }
  FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void DemoSuite::run_baseline(cudaStream_t stream, int set) {
  const int s = set % sets_;
  const int threads = 256;
  scale_kernel<<<grid_for(elements_, threads), threads, 0, stream>>>(x_[s], y_[s], kScale, elements_);
  add_kernel<<<grid_for(elements_, threads), threads, 0, stream>>>(y_[s], kBias, elements_);
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

void DemoSuite::run_fused(cudaStream_t stream, int set) {
  const int s = set % sets_;
  const int threads = 256;
  const size_t n4 = elements_ / 4;
  scale_add_fused_kernel<<<grid_for(n4, threads), threads, 0, stream>>>(
      reinterpret_cast<const float4*>(x_[s]), reinterpret_cast<float4*>(y_[s]), kScale, kBias, n4);
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

std::vector<float> DemoSuite::download(int set) {
  std::vector<float> out(elements_);
  FUSEKIT_CUDA_CHECK(cudaMemcpy(out.data(), y_[set % sets_], elements_ * sizeof(float), cudaMemcpyDeviceToHost));
  return out;
}

std::vector<float> DemoSuite::input(int set) const { return host_x_[set % sets_]; }

std::vector<Case> DemoSuite::cases() {
  const std::string shape = std::to_string(elements_);
  store::CaseInfo info;
  info.name = "demo/scale_add/" + shape + "/fp32";
  info.op = "scale_add";
  info.shape = shape;
  info.dtype = "fp32";
  info.bytes = 2.0 * static_cast<double>(elements_) * sizeof(float);  // read x once, write y once
  info.flops = 2.0 * static_cast<double>(elements_);
  std::vector<Case> out;
  info.variant = "baseline";
  out.push_back({info, [this](cudaStream_t stream, int rep) { run_baseline(stream, rep); }, {}, {}});
  info.variant = "fused";
  out.push_back({info, [this](cudaStream_t stream, int rep) { run_fused(stream, rep); }, {}, {}});
  return out;
}

}  // namespace fusekit::suites
