// y = a + b (see residual_add.h). Design: 16-byte vectors where every pointer is 16-byte aligned and
// the count allows (the body), elements otherwise (the tail and unaligned tensors); each thread reads
// its a and b before it writes y, so y may alias either.
#include "kernels/residual_add.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/common.cuh"
#include "kernels/detail/dispatch.h"
#include "kernels/detail/launch.h"

namespace fusekit::kernels {
namespace {

constexpr int kThreads = 256;

template <class T, int VEC>
__global__ void __launch_bounds__(kThreads)
    residual_add_kernel(const T* a, const T* b, T* y, long long vectors) {  // y may alias a or b: no __restrict__
  using V = Vec<T, VEC>;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors; i += stride) {
    const V va = V::load(a + i * VEC), vb = V::load(b + i * VEC);
    V out;
#pragma unroll
    for (int k = 0; k < VEC; ++k) out.v[k] = from_float<T>(to_float(va.v[k]) + to_float(vb.v[k]));
    out.store(y + i * VEC);
  }
}

}  // namespace

// ---- kernel launcher

void residual_add(DType dtype, const void* a, const void* b, void* y, long long elements, cudaStream_t stream) {
  constexpr const char* op = "residual_add";
  if (elements < 0) throw std::invalid_argument(std::string(op) + ": a negative count");
  if (elements == 0) return;
  if (!a || !b || !y) throw std::invalid_argument(std::string(op) + ": a null pointer");
  dispatch_dtype(dtype, op, [&](auto type) {
    using T = typename decltype(type)::type;
    constexpr int kVec = 16 / sizeof(T);
    const T *ta = static_cast<const T*>(a), *tb = static_cast<const T*>(b);
    T* ty = static_cast<T*>(y);
    long long body = 0;
    if (aligned16(a) && aligned16(b) && aligned16(y)) {
      body = elements / kVec * kVec;
      const long long vectors = body / kVec;
      if (vectors > 0) {
        const int blocks =
            static_cast<int>(std::min<long long>((vectors + kThreads - 1) / kThreads, 32LL * multiprocessors()));
        residual_add_kernel<T, kVec><<<blocks, kThreads, 0, stream>>>(ta, tb, ty, vectors);
      }
    }
    const long long rest = elements - body;
    if (rest > 0) {
      const int blocks =
          static_cast<int>(std::min<long long>((rest + kThreads - 1) / kThreads, 32LL * multiprocessors()));
      residual_add_kernel<T, 1><<<blocks, kThreads, 0, stream>>>(ta + body, tb + body, ty + body, rest);
    }
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fusekit::kernels
