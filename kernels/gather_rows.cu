// Row gather and scatter (see gather_rows.h for the math, layouts and bad indices).
//
// Design: both directions are one copy kernel over the rows_out x (columns / VEC) vectors of the
// gathered side, flattened into one grid-stride index, so that a row of any length keeps every
// thread busy; a thread finds its row j and the index indices[j] (a broadcast load its neighbours
// share), then moves one vector between row j of the gathered side and row indices[j] of the other.
#include "kernels/gather_rows.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/common.cuh"
#include "kernels/detail/dispatch.h"
#include "kernels/detail/launch.h"

namespace fusekit::kernels {
namespace {

constexpr int kThreads = 256;

// kScatter false (forward): dst = out, row j of out from row indices[j] of `in` (NaN if out of range).
// kScatter true (backward): row j of `in` (dy) into row indices[j] of `out` (dsrc; skipped if out of range).
template <class T, int VEC, bool kScatter>
__global__ void __launch_bounds__(kThreads)
    gather_rows_kernel(const T* __restrict__ in, const int32_t* __restrict__ indices, T* __restrict__ out, int rows_in,
                       long long vectors, int row_vectors) {
  using V = Vec<T, VEC>;
  // 32-bit division where the tensor allows it: a 64-bit one is a long instruction sequence.
  const bool small = vectors <= 0xffffffffLL;
  const long long columns = static_cast<long long>(row_vectors) * VEC;
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors; i += stride) {
    const long long j = small ? static_cast<unsigned>(i) / static_cast<unsigned>(row_vectors) : i / row_vectors;
    const long long column = (i - j * row_vectors) * VEC;
    const int32_t index = indices[j];
    const bool valid = index >= 0 && index < rows_in;
    if constexpr (kScatter) {
      if (valid) V::load(in + j * columns + column).store(out + index * columns + column);
    } else {
      V v;
      if (valid) {
        v = V::load(in + index * columns + column);
      } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) v.v[k] = from_float<T>(NAN);
      }
      v.store(out + j * columns + column);
    }
  }
}

void check_sizes(const char* op, int rows_in, int rows_out, int columns) {
  if (rows_in < 0 || rows_out < 0 || columns < 1) {
    throw std::invalid_argument(std::string(op) + ": need rows_in, rows_out >= 0 and columns >= 1 (got " +
                                std::to_string(rows_in) + ", " + std::to_string(rows_out) + ", " +
                                std::to_string(columns) + ")");
  }
}

void check_pointer(const char* op, const void* p, const char* name) {
  if (p == nullptr) throw std::invalid_argument(std::string(op) + ": " + name + " is null");
}

// One launch of the copy kernel over rows_out rows: 16-byte vectors where the row length and the
// pointers allow, elements otherwise.
template <bool kScatter>
void launch(DType dtype, const char* op, const void* in, const int32_t* indices, void* out, int rows_in, int rows_out,
            int columns, cudaStream_t stream) {
  dispatch_dtype(dtype, op, [&](auto type) {
    using T = typename decltype(type)::type;
    const int vec = vector_width<T>(columns, {in, out});
    const int row_vectors = columns / vec;
    const long long vectors = static_cast<long long>(rows_out) * row_vectors;
    const int blocks =
        static_cast<int>(std::min<long long>((vectors + kThreads - 1) / kThreads, 32LL * multiprocessors()));
    const T* typed_in = static_cast<const T*>(in);
    T* typed_out = static_cast<T*>(out);
    if (vec == 16 / static_cast<int>(sizeof(T))) {
      gather_rows_kernel<T, 16 / sizeof(T), kScatter>
          <<<blocks, kThreads, 0, stream>>>(typed_in, indices, typed_out, rows_in, vectors, row_vectors);
    } else {
      gather_rows_kernel<T, 1, kScatter>
          <<<blocks, kThreads, 0, stream>>>(typed_in, indices, typed_out, rows_in, vectors, row_vectors);
    }
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

// ---- kernel launchers

void gather_rows_forward(DType dtype, const void* src, const int32_t* indices, void* dst, int rows_in, int rows_out,
                         int columns, cudaStream_t stream) {
  constexpr const char* op = "gather_rows_forward";
  check_sizes(op, rows_in, rows_out, columns);
  if (rows_out == 0) return;
  check_pointer(op, indices, "indices");
  check_pointer(op, dst, "dst");
  if (rows_in > 0) check_pointer(op, src, "src");
  launch<false>(dtype, op, src, indices, dst, rows_in, rows_out, columns, stream);
}

void gather_rows_backward(DType dtype, const void* dy, const int32_t* indices, void* dsrc, int rows_in, int rows_out,
                          int columns, cudaStream_t stream) {
  constexpr const char* op = "gather_rows_backward";
  check_sizes(op, rows_in, rows_out, columns);
  if (rows_in > 0) check_pointer(op, dsrc, "dsrc");
  if (rows_out > 0) {
    check_pointer(op, indices, "indices");
    check_pointer(op, dy, "dy");
  }
  if (rows_in == 0) return;  // no row to write: every index is out of range
  // Zero bits: 0.0 in every dtype.
  FUSEKIT_CUDA_CHECK(cudaMemsetAsync(dsrc, 0, static_cast<size_t>(rows_in) * columns * dtype_size(dtype), stream));
  if (rows_out == 0) return;
  launch<true>(dtype, op, dy, indices, dsrc, rows_in, rows_out, columns, stream);
}

}  // namespace fusekit::kernels
