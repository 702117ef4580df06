// Image patches as GEMM rows (see patch_columns.h for the map).
//
// Design: one thread per output element, in output order, so that the stores are coalesced; the
// loads follow: consecutive threads read consecutive pixels of one patch row (patch of them), then
// jump a row. Memory-bound and small (Swin-T at batch 128: 38.5 MB in fp16).
#include "kernels/patch_columns.h"

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

#include "kernels/common.cuh"
#include "kernels/detail/dispatch.h"
#include "kernels/detail/launch.h"

namespace fusekit::kernels {
namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void __launch_bounds__(kThreads)
    patch_columns_kernel(const T* __restrict__ images, T* __restrict__ columns, PatchColumnsShape s, long long total) {
  const int grid_h = s.height / s.patch, grid_w = s.width / s.patch, area = s.patch * s.patch, k = s.channels * area;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long o = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += stride) {
    const long long row = o / k;
    const int column = static_cast<int>(o - row * k);
    const int c = column / area, y = (column / s.patch) % s.patch, x = column % s.patch;
    const int j = static_cast<int>(row % grid_w);
    const long long bi = row / grid_w;
    const int i = static_cast<int>(bi % grid_h);
    const long long b = bi / grid_h;
    columns[o] = images[((b * s.channels + c) * s.height + static_cast<long long>(i) * s.patch + y) * s.width +
                        static_cast<long long>(j) * s.patch + x];
  }
}

}  // namespace

// ---- kernel launcher

void patch_columns_forward(DType dtype, const void* images, void* columns, const PatchColumnsShape& s,
                           cudaStream_t stream) {
  constexpr const char* op = "patch_columns_forward";
  const std::string got = " (got " + std::to_string(s.batch) + "x" + std::to_string(s.channels) + "x" +
                          std::to_string(s.height) + "x" + std::to_string(s.width) + ", patch " +
                          std::to_string(s.patch) + ")";
  if (s.batch < 1 || s.channels < 1 || s.height < 1 || s.width < 1 || s.patch < 1) {
    throw std::invalid_argument(std::string(op) + ": every size must be positive" + got);
  }
  if (s.height % s.patch != 0 || s.width % s.patch != 0) {
    throw std::invalid_argument(std::string(op) + ": H and W must be multiples of the patch" + got);
  }
  const long long total = s.rows() * s.columns();
  if (static_cast<long long>(s.batch) * s.channels * s.height * s.width > INT_MAX || total > INT_MAX) {
    throw std::invalid_argument(std::string(op) + ": more than 2^31 - 1 elements" + got);
  }
  if (images == nullptr || columns == nullptr) throw std::invalid_argument(std::string(op) + ": a null pointer");
  dispatch_dtype(dtype, op, [&](auto type) {
    using T = typename decltype(type)::type;
    const int blocks =
        static_cast<int>(std::min<long long>((total + kThreads - 1) / kThreads, 32LL * multiprocessors()));
    patch_columns_kernel<T>
        <<<blocks, kThreads, 0, stream>>>(static_cast<const T*>(images), static_cast<T*>(columns), s, total);
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fusekit::kernels
