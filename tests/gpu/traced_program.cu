// A plain CUDA program with known activity, traced from outside by `fusekit trace`: 4 kernels
// under NVTX ranges outer > inner, one outside, a host-to-device copy, and exit code 3.
#include <nvtx3/nvToolsExt.h>

#include <cstdio>
#include <vector>

__global__ void traced_kernel(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * 2.0f + 1.0f;
}
__global__ void untraced_range_kernel(float* x) { x[0] = 0; }

int main() {
  const int n = 1 << 20;
  std::vector<float> host(n, 1.0f);
  float* x = nullptr;
  if (cudaMalloc(&x, n * sizeof(float)) != cudaSuccess) return 1;
  nvtxRangePushA("outer");
  cudaMemcpy(x, host.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  nvtxRangePushA("inner");
  for (int i = 0; i < 4; ++i) traced_kernel<<<(n + 255) / 256, 256>>>(x, n);
  nvtxRangePop();
  nvtxRangePop();
  untraced_range_kernel<<<1, 1>>>(x);
  if (cudaDeviceSynchronize() != cudaSuccess) return 1;
  cudaFree(x);
  std::printf("traced_program: done\n");
  return 3;
}
