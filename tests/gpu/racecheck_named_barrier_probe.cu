// Not a test: a check of compute-sanitizer racecheck itself, run by scripts/device-check.sh.
//
// Four groups of three warps write their rows of a shared table; then the whole block meets at
// __syncthreads() and every group reads every row. Every read follows every write across that
// CTA-wide barrier, so there is no race. Argument 1: group 0 first takes a named barrier of its own
// (bar.sync 1, 96), as a group of embedding_layernorm_backward_split_kernel does once a token, and
// the other groups take none; racecheck then reports a RAW hazard between group 0's writes and the
// others' reads. Argument 0 (no named barrier) and 2 (every group takes one of its own): no hazard.
// H100, CUDA 13.0: 3 of 3 runs each way. So racecheck misorders accesses across __syncthreads()
// when the block's threads have taken different numbers of barriers; the split kernel therefore
// has every group take the same number of named barriers (its tail groups take the rest after their
// tokens), without which its tests at 1 token drew that report in some runs.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

// named: 0 no named barrier; 1 group 0 takes one; 2 every group takes one of its own.
__global__ void probe(float* out, int named) {
  __shared__ float rows[4][96];
  const int warp = threadIdx.x / 32, group = warp / 3, t = threadIdx.x % 96;
  if (named == 2 || (named == 1 && group == 0)) asm volatile("bar.sync %0, 96;" ::"r"(1 + group) : "memory");
  rows[group][t] = group == 0 ? static_cast<float>(t) : 0.f;
  __syncthreads();
  float sum = 0.f;
  for (int g = 0; g < 4; ++g) sum += rows[g][(t + 7 * (group + 1)) % 96];
  out[threadIdx.x] = sum;
}

int main(int argc, char** argv) {
  const int named = argc > 1 ? std::atoi(argv[1]) : 1;
  float* out = nullptr;
  cudaError_t error = cudaMalloc(&out, 384 * sizeof(float));
  if (error == cudaSuccess) {
    probe<<<1, 384>>>(out, named);
    error = cudaDeviceSynchronize();
  }
  std::printf("racecheck_named_barrier_probe named=%d: %s\n", named, cudaGetErrorString(error));
  cudaFree(out);
  return error == cudaSuccess ? 0 : 1;
}
