// Cross-entropy forward and backward (see cross_entropy.h for the math, layouts and edge cases).
//
// Design: a block per row, streaming. The forward reads each logit once: every thread keeps a
// running maximum and the sum of exp(x - maximum) over its share of the row (the online-softmax
// recurrence: a new maximum rescales the sum), plus the plain sum of logits for the smoothing term;
// the block then merges the threads' (maximum, sum) pairs. Rescaling once per kUnroll vectors rather
// than per element keeps the exponentials at about one per logit. The backward is elementwise given
// the saved logsumexp: it reads the row once and writes dlogits once; an ignored row is only written.
//
// Rows of odd length start at any element, so a row splits into a scalar head up to the first
// 16-byte boundary, 16-byte vectors, and a scalar tail. The backward's dlogits rows must then sit at
// the same offset from a 16-byte boundary as the logits rows (true for buffers of one allocator);
// otherwise it takes the one-element path.
#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/common.cuh"
#include "kernels/cross_entropy.h"
#include "kernels/detail/dispatch.h"

namespace fusekit::kernels {
namespace {

// ---- CUDA kernels

constexpr int kUnroll = 4;  // vectors in flight per thread per iteration
constexpr int kMaxThreads = 512;
// Blocks of kMaxThreads per multiprocessor, each thread with kUnroll 16-byte loads in flight: the
// forward fits 40 registers, three blocks (96 KB in flight per multiprocessor, and a block streams
// while another merges its row); the backward's bf16 variant spills at 40, so two (64 KB).
constexpr int kForwardMinBlocks = 3;
constexpr int kBackwardMinBlocks = 2;

// Where the 16-byte vectors of a row begin and end: [0, head) and [tail, V) are single elements
// (fewer than VEC each), [head, tail) is `vectors` whole vectors.
template <class T, int VEC>
struct RowSplit {
  int head, vectors, tail;
  __device__ RowSplit(const T* row, int V) {
    const int misaligned = static_cast<int>(reinterpret_cast<uintptr_t>(row) % (VEC * sizeof(T)) / sizeof(T));
    head = min((VEC - misaligned) % VEC, V);
    vectors = (V - head) / VEC;
    tail = head + vectors * VEC;
  }
};

// The largest element of a vector; 16-bit types compare two at a time.
template <class T, int VEC>
__device__ __forceinline__ float vector_max(const Vec<T, VEC>& a) {
  if constexpr (std::is_same_v<T, float>) {
    float m = a.v[0];
#pragma unroll
    for (int k = 1; k < VEC; ++k) m = fmaxf(m, a.v[k]);
    return m;
  } else {
    using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
    static_assert(VEC % 2 == 0, "16-bit vectors hold pairs");
    const T2* pairs = reinterpret_cast<const T2*>(a.v);
    T2 m = pairs[0];
#pragma unroll
    for (int k = 1; k < VEC / 2; ++k) m = __hmax2(m, pairs[k]);
    return fmaxf(__low2float(m), __high2float(m));
  }
}

// A thread's share of a row: the maximum so far, sum of exp(x - max), and the sum of the logits.
// The maximum starts at -FLT_MAX, not -inf, so that exp(max_old - max_new) is never exp(-inf + inf)
// while only -inf logits have been seen.
struct RowState {
  float max = -FLT_MAX;
  float sum = 0.f;
  float total = 0.f;

  __device__ void add(float x) {
    const float m = fmaxf(max, x);
    sum = sum * __expf(max - m) + __expf(x - m);
    max = m;
    total += x;
  }
  __device__ static RowState merge(const RowState& a, const RowState& b) {
    RowState out;
    out.max = fmaxf(a.max, b.max);
    out.sum = a.sum * __expf(a.max - out.max) + b.sum * __expf(b.max - out.max);
    out.total = a.total + b.total;
    return out;
  }
};

__device__ __forceinline__ RowState warp_merge(RowState s) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    RowState other;
    other.max = __shfl_xor_sync(0xffffffffu, s.max, offset);
    other.sum = __shfl_xor_sync(0xffffffffu, s.sum, offset);
    other.total = __shfl_xor_sync(0xffffffffu, s.total, offset);
    s = RowState::merge(s, other);
  }
  return s;
}

// Merges the block's states; the result is valid in thread 0 only.
__device__ __forceinline__ RowState block_merge(RowState s, RowState* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  s = warp_merge(s);
  if (lane == 0) scratch[warp] = s;
  __syncthreads();
  if (warp == 0) {
    s = lane < ceil_div(blockDim.x, kWarpSize) ? scratch[lane] : RowState{};
    s = warp_merge(s);
  }
  return s;
}

// One block per row: losses[row] and logsumexp[row].
template <class T, int VEC>
__global__ void __launch_bounds__(kMaxThreads, kForwardMinBlocks)
    cross_entropy_forward_kernel(const T* __restrict__ logits, const int64_t* __restrict__ labels,
                                 float* __restrict__ losses, float* __restrict__ logsumexp, int V, int64_t ignore_index,
                                 float smoothing) {
  __shared__ RowState scratch[kWarpSize];
  using Vector = Vec<T, VEC>;
  const int row = blockIdx.x, t = threadIdx.x, threads = blockDim.x;
  const T* x = logits + static_cast<size_t>(row) * V;
  const int64_t label = labels[row];
  const bool ignored = label == ignore_index, in_range = label >= 0 && label < V;
  // The label's logit: one extra element read, issued first so that its latency hides behind the row.
  float label_logit = 0.f;
  if (t == 0 && !ignored && in_range) label_logit = to_float(x[label]);

  const RowSplit<T, VEC> split(x, V);
  RowState state;
  if (t < split.head) state.add(to_float(x[t]));
  if (split.tail + t < V) state.add(to_float(x[split.tail + t]));
  const T* body = x + split.head;
  for (int first = t; first < split.vectors; first += kUnroll * threads) {
    Vector in[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (first + u * threads < split.vectors) in[u] = Vector::load_stream(body + (first + u * threads) * VEC);
    }
    // The maximum is taken in the storage type (exact: comparisons do not round), so each element
    // is converted to float once, in the second loop; converting in both loops let the compiler
    // keep all the floats alive, spilling at the register budget of three blocks per multiprocessor.
    float local_max = -FLT_MAX;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (first + u * threads < split.vectors) local_max = fmaxf(local_max, vector_max(in[u]));
    }
    const float m = fmaxf(state.max, local_max);
    float sum = state.sum * __expf(state.max - m), total = 0.f;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (first + u * threads < split.vectors) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float v = to_float(in[u].v[k]);
          sum += __expf(v - m);
          total += v;
        }
      }
    }
    state.max = m;
    state.sum = sum;
    state.total += total;
  }

  state = block_merge(state, scratch);
  if (t == 0) {
    // A row of -inf only: max stays -FLT_MAX, sum 0, lse -inf, and the loss NaN (as PyTorch).
    const float lse = state.max + logf(state.sum);
    float loss = 0.f;
    if (!ignored) {
      if (!in_range) {
        loss = NAN;
      } else {
        loss = (1.f - smoothing) * (lse - label_logit);
        // Only with smoothing: 0 * (-inf) would turn a masked row's loss into NaN.
        if (smoothing > 0.f) loss += smoothing * (lse - state.total / V);
      }
    }
    losses[row] = loss;
    logsumexp[row] = lse;
  }
}

// One block: the mean of the losses over the rows not ignored, summed in float64 in a fixed order
// (the same result on every run), and their count.
constexpr int kMeanThreads = 512;

__global__ void __launch_bounds__(kMeanThreads)
    cross_entropy_mean_kernel(const float* __restrict__ losses, const int64_t* __restrict__ labels, int rows,
                              int64_t ignore_index, float* __restrict__ mean_loss, int* __restrict__ valid_rows) {
  __shared__ double sums[kMeanThreads / kWarpSize];
  __shared__ int counts[kMeanThreads / kWarpSize];
  double sum = 0.0;
  int count = 0;
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    if (labels[r] != ignore_index) {
      sum += losses[r];
      ++count;
    }
  }
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    count += __shfl_xor_sync(0xffffffffu, count, offset);
  }
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) {
    sums[warp] = sum;
    counts[warp] = count;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < ceil_div(blockDim.x, kWarpSize); ++w) {
      sum += sums[w];
      count += counts[w];
    }
    *mean_loss = count > 0 ? static_cast<float>(sum / count) : 0.f;
    *valid_rows = count;
  }
}

// One block per row: dlogits = (softmax - target) * dloss / count, or zeros for an ignored row.
template <class T, int VEC>
__global__ void __launch_bounds__(kMaxThreads, kBackwardMinBlocks)
    cross_entropy_backward_kernel(const T* __restrict__ logits, const int64_t* __restrict__ labels,
                                  const float* __restrict__ logsumexp, const int* __restrict__ valid_rows,
                                  const float* __restrict__ dloss, T* __restrict__ dlogits, int V, int64_t ignore_index,
                                  float smoothing) {
  using Vector = Vec<T, VEC>;
  const int row = blockIdx.x, t = threadIdx.x, threads = blockDim.x;
  const size_t offset = static_cast<size_t>(row) * V;
  const T* x = logits + offset;
  T* dx = dlogits + offset;
  const RowSplit<T, VEC> split(x, V);  // dx shares x's alignment (the launcher checks)
  const int64_t label = labels[row];

  if (label == ignore_index) {
    Vector zero;
#pragma unroll
    for (int k = 0; k < VEC; ++k) zero.v[k] = from_float<T>(0.f);
    if (t < split.head) dx[t] = zero.v[0];
    if (split.tail + t < V) dx[split.tail + t] = zero.v[0];
    for (int i = t; i < split.vectors; i += threads) zero.store(dx + split.head + i * VEC);
    return;
  }

  const int count = *valid_rows;  // >= 1: this row counts
  const float scale = *dloss / count;
  const bool in_range = label >= 0 && label < V;
  // An out-of-range label has a NaN loss; a NaN lse gives its row NaN gradients to match.
  const float lse = in_range ? logsumexp[row] : NAN;
  const int y = in_range ? static_cast<int>(label) : -1;
  const float off_label = smoothing / V, on_label = 1.f - smoothing + off_label;
  auto gradient = [&](float v, bool at_label) { return (__expf(v - lse) - (at_label ? on_label : off_label)) * scale; };

  if (t < split.head) dx[t] = from_float<T>(gradient(to_float(x[t]), t == y));
  if (split.tail + t < V)
    dx[split.tail + t] = from_float<T>(gradient(to_float(x[split.tail + t]), split.tail + t == y));
  const T* body = x + split.head;
  T* out_body = dx + split.head;
  for (int first = t; first < split.vectors; first += kUnroll * threads) {
    Vector in[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (first + u * threads < split.vectors) in[u] = Vector::load_stream(body + (first + u * threads) * VEC);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = first + u * threads;
      if (i < split.vectors) {
        const int label_at = y - (split.head + i * VEC);  // the label's place in this vector, if in [0, VEC)
        Vector out;
#pragma unroll
        for (int k = 0; k < VEC; ++k) out.v[k] = from_float<T>(gradient(to_float(in[u].v[k]), k == label_at));
        out.store(out_body + i * VEC);
      }
    }
  }
}

// ---- kernel launchers

// Threads per row: enough for about two unrolled iterations per thread, one warp at least (V = 1000
// takes a warp per row), kMaxThreads at most (long rows loop).
int row_threads(int V, int vec) {
  const int per_thread = 2 * kUnroll * vec;
  const int threads = ceil_div(ceil_div(V, per_thread), kWarpSize) * kWarpSize;
  return std::clamp(threads, kWarpSize, kMaxThreads);
}

void check_arguments(int rows, int V, float smoothing) {
  if (rows < 0 || V <= 0) {
    throw std::invalid_argument("cross_entropy: rows must be >= 0 and vocab > 0 (got " + std::to_string(rows) + " x " +
                                std::to_string(V) + ")");
  }
  if (!(smoothing >= 0.f && smoothing < 1.f)) {
    throw std::invalid_argument("cross_entropy: label_smoothing must be in [0, 1) (got " + std::to_string(smoothing) +
                                ")");
  }
}

template <class T>
void forward_typed(const T* logits, const int64_t* labels, float* losses, float* logsumexp, float* mean_loss,
                   int* valid_rows, int rows, int V, int64_t ignore_index, float smoothing, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  if (rows > 0) {
    cross_entropy_forward_kernel<T, kVec>
        <<<rows, row_threads(V, kVec), 0, stream>>>(logits, labels, losses, logsumexp, V, ignore_index, smoothing);
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
  }
  cross_entropy_mean_kernel<<<1, kMeanThreads, 0, stream>>>(losses, labels, rows, ignore_index, mean_loss, valid_rows);
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

template <class T>
void backward_typed(const T* logits, const int64_t* labels, const float* logsumexp, const int* valid_rows,
                    const float* dloss, T* dlogits, int rows, int V, int64_t ignore_index, float smoothing,
                    cudaStream_t stream) {
  if (rows == 0) return;
  constexpr int kVec = 16 / sizeof(T);
  const auto distance = reinterpret_cast<uintptr_t>(logits) - reinterpret_cast<uintptr_t>(dlogits);
  if (distance % 16 == 0) {
    cross_entropy_backward_kernel<T, kVec><<<rows, row_threads(V, kVec), 0, stream>>>(
        logits, labels, logsumexp, valid_rows, dloss, dlogits, V, ignore_index, smoothing);
  } else {
    cross_entropy_backward_kernel<T, 1><<<rows, row_threads(V, 1), 0, stream>>>(
        logits, labels, logsumexp, valid_rows, dloss, dlogits, V, ignore_index, smoothing);
  }
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void cross_entropy_forward(DType dtype, const void* logits, const int64_t* labels, float* losses, float* logsumexp,
                           float* mean_loss, int* valid_rows, int rows, int vocab, int64_t ignore_index,
                           float label_smoothing, cudaStream_t stream) {
  check_arguments(rows, vocab, label_smoothing);
  dispatch_dtype(dtype, "cross_entropy", [&](auto type) {
    using T = typename decltype(type)::type;
    forward_typed<T>(static_cast<const T*>(logits), labels, losses, logsumexp, mean_loss, valid_rows, rows, vocab,
                     ignore_index, label_smoothing, stream);
  });
}

void cross_entropy_backward(DType dtype, const void* logits, const int64_t* labels, const float* logsumexp,
                            const int* valid_rows, const float* dloss, void* dlogits, int rows, int vocab,
                            int64_t ignore_index, float label_smoothing, cudaStream_t stream) {
  check_arguments(rows, vocab, label_smoothing);
  dispatch_dtype(dtype, "cross_entropy", [&](auto type) {
    using T = typename decltype(type)::type;
    backward_typed<T>(static_cast<const T*>(logits), labels, logsumexp, valid_rows, dloss, static_cast<T*>(dlogits),
                      rows, vocab, ignore_index, label_smoothing, stream);
  });
}

}  // namespace fusekit::kernels
