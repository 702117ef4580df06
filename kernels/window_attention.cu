// Swin window attention forward and backward (see window_attention.h for the math and layouts):
// the launchers. The kernels live under kernels/detail/: window_attention_small.cuh (49-token
// windows) and window_attention_large.cuh (144-token windows) keep their scores in mma.sync register
// fragments; window_attention_bias_table.cuh gathers the bias from the table and folds its gradient
// back. A block works through a run of windows that share one head and one mask window, so the bias
// + mask it adds are loaded once per block; the backward's bias gradient is summed per block into
// the block's own slice of the workspace before the two small kernels sum the slices and fold them
// into the table.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/common.cuh"
#include "kernels/detail/dispatch.h"
#include "kernels/detail/launch.h"  // allow_shared
#include "kernels/detail/window_attention_bias_table.cuh"
#include "kernels/detail/window_attention_common.cuh"
#include "kernels/detail/window_attention_large.cuh"
#include "kernels/detail/window_attention_small.cuh"
#include "kernels/window_attention.h"

namespace fusekit::kernels {
namespace {

// ---- kernel launchers

// Calls fn(TypeTag<T>, tokens, head dim) with compile-time values; the shape is checked before.
template <class FN>
void dispatch(DType dtype, int tokens, int head_dim, FN&& fn) {
  auto by_dim = [&](auto type, auto n) {
    if (head_dim == 32)
      fn(type, n, std::integral_constant<int, 32>{});
    else
      fn(type, n, std::integral_constant<int, 64>{});
  };
  auto by_tokens = [&](auto type) {
    if (tokens == 49)
      by_dim(type, std::integral_constant<int, 49>{});
    else
      by_dim(type, std::integral_constant<int, 144>{});
  };
  dispatch_16bit_dtype(dtype, "window_attention", by_tokens);
}

// How the backward deals the windows of a shape to its blocks.
template <class T, int N, int D>
WindowDeal backward_deal(const WindowAttentionShape& s) {
  if constexpr (N == SmallWindow<T, D>::kN) {
    return deal_windows(s, SmallWindow<T, D>::kBackwardChunk);
  } else {
    return deal_windows(s, LargeWindow<T, D>::kBackwardChunk);
  }
}

// Slices of the backward's bias-gradient workspace per head: one per block of a head (mask windows
// x parts).
template <class T, int N, int D>
int backward_slices(const WindowAttentionShape& s) {
  if (s.windows == 0) return 0;
  const WindowDeal deal = backward_deal<T, N, D>(s);
  return deal.mask_windows * deal.parts;
}

void check_aligned(const void* p, const char* name) {
  if (!aligned16(p)) {
    throw std::invalid_argument(std::string("window_attention: ") + name + " must be 16-byte aligned");
  }
}

}  // namespace

void check_window_attention(DType dtype, const WindowAttentionShape& s) {
  std::string problem;
  if (dtype != DType::f16 && dtype != DType::bf16) {
    problem = std::string("dtype ") + dtype_name(dtype) + " is not supported (fp16, bf16)";
  } else if (s.tokens != 49 && s.tokens != 144) {
    problem = "tokens must be 49 (window 7) or 144 (window 12), got " + std::to_string(s.tokens);
  } else if (s.head_dim != 32 && s.head_dim != 64) {
    problem = "head_dim must be 32 or 64, got " + std::to_string(s.head_dim);
  } else if (s.heads < 1 || s.heads > kMaxHeads) {
    problem = "heads must be in [1, " + std::to_string(kMaxHeads) + "], got " + std::to_string(s.heads);
  } else if (s.windows < 0) {
    problem = "windows must be >= 0, got " + std::to_string(s.windows);
  } else if (s.mask_windows < 0 || (s.mask_windows > 0 && s.windows % s.mask_windows != 0)) {
    problem = "mask_windows must be 0 or divide windows (" + std::to_string(s.windows) + "), got " +
              std::to_string(s.mask_windows);
  } else if (static_cast<long long>(s.windows) * s.heads > (1LL << 30)) {
    problem = "windows x heads must be at most 2^30";
  }
  if (!problem.empty()) throw std::invalid_argument("window_attention: " + problem);
}

void window_attention_forward(DType dtype, const void* qkv, const void* table, const int32_t* index, const float* mask,
                              void* out, float* bias, float* lse, const WindowAttentionShape& s, float scale,
                              cudaStream_t stream) {
  check_window_attention(dtype, s);
  check_aligned(qkv, "qkv");
  check_aligned(out, "out");
  if (s.mask_windows > 0 && !mask) throw std::invalid_argument("window_attention: mask_windows > 0 needs a mask");
  const int pairs = s.tokens * s.tokens;
  dispatch(dtype, s.tokens, s.head_dim, [&](auto type, auto n, auto d) {
    using T = typename decltype(type)::type;
    constexpr int N = decltype(n)::value, D = decltype(d)::value;
    window_bias_gather_kernel<T>
        <<<ceil_div(s.heads * pairs, 256), 256, 0, stream>>>(static_cast<const T*>(table), index, bias, s.heads, pairs);
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
    if (s.windows == 0) return;
    if constexpr (N == SmallWindow<T, D>::kN) {
      using S = SmallWindow<T, D>;
      const WindowDeal deal = deal_windows(s, S::kForwardChunk);
      allow_shared<window_attention_forward_small_kernel<T, D>>(S::kForwardBytes);
      window_attention_forward_small_kernel<T, D><<<deal.blocks(s.heads), S::kThreads, S::kForwardBytes, stream>>>(
          static_cast<const T*>(qkv), bias, s.mask_windows > 0 ? mask : nullptr, static_cast<T*>(out), lse, s.heads,
          deal, scale);
    } else {
      using L = LargeWindow<T, D>;
      const WindowDeal deal = deal_windows(s, L::kForwardChunk);
      allow_shared<window_attention_forward_large_kernel<T, D>>(L::kForwardBytes);
      window_attention_forward_large_kernel<T, D><<<deal.blocks(s.heads), L::kThreads, L::kForwardBytes, stream>>>(
          static_cast<const T*>(qkv), bias, s.mask_windows > 0 ? mask : nullptr, static_cast<T*>(out), lse, s.heads,
          deal, scale);
    }
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
  });
}

size_t window_attention_backward_workspace_bytes(const WindowAttentionShape& s) {
  check_window_attention(DType::f16, s);  // both 16-bit types: the larger of their needs
  size_t bytes = 0;
  for (DType dtype : {DType::f16, DType::bf16}) {
    dispatch(dtype, s.tokens, s.head_dim, [&](auto type, auto n, auto d) {
      using T = typename decltype(type)::type;
      constexpr int N = decltype(n)::value, D = decltype(d)::value;
      const int slices = backward_slices<T, N, D>(s);
      bytes = std::max(bytes, sizeof(float) * (static_cast<size_t>(slices) + 1) * s.heads * N * N);
    });
  }
  return bytes;
}

void window_attention_backward(DType dtype, const void* qkv, const float* bias, const float* mask, const void* out,
                               const float* lse, const void* dout, const int32_t* index, void* dqkv, void* dtable,
                               void* workspace, const WindowAttentionShape& s, float scale, cudaStream_t stream) {
  check_window_attention(dtype, s);
  check_aligned(qkv, "qkv");
  check_aligned(out, "out");
  check_aligned(dout, "dout");
  check_aligned(dqkv, "dqkv");
  if (s.mask_windows > 0 && !mask) throw std::invalid_argument("window_attention: mask_windows > 0 needs a mask");
  const int pairs = s.tokens * s.tokens, window = s.tokens == 49 ? 7 : 12;
  const int entries = (2 * window - 1) * (2 * window - 1);
  dispatch(dtype, s.tokens, s.head_dim, [&](auto type, auto n, auto d) {
    using T = typename decltype(type)::type;
    constexpr int N = decltype(n)::value, D = decltype(d)::value;
    const int slices = backward_slices<T, N, D>(s);
    float* partials = static_cast<float*>(workspace);
    float* dbias = partials + static_cast<size_t>(slices) * s.heads * pairs;
    if (slices > 0) {
      const WindowDeal deal = backward_deal<T, N, D>(s);
      if constexpr (N == SmallWindow<T, D>::kN) {
        using S = SmallWindow<T, D>;
        allow_shared<window_attention_backward_small_kernel<T, D>>(S::kBackwardBytes);
        window_attention_backward_small_kernel<T, D><<<deal.blocks(s.heads), S::kThreads, S::kBackwardBytes, stream>>>(
            static_cast<const T*>(qkv), bias, s.mask_windows > 0 ? mask : nullptr, lse, static_cast<const T*>(dout),
            static_cast<T*>(dqkv), partials, s.heads, deal, scale);
      } else {
        using L = LargeWindow<T, D>;
        allow_shared<window_attention_backward_large_kernel<T, D>>(L::kBackwardBytes);
        window_attention_backward_large_kernel<T, D><<<deal.blocks(s.heads), L::kThreads, L::kBackwardBytes, stream>>>(
            static_cast<const T*>(qkv), bias, s.mask_windows > 0 ? mask : nullptr, static_cast<const T*>(out), lse,
            static_cast<const T*>(dout), static_cast<T*>(dqkv), partials, s.heads, deal, scale);
      }
      FUSEKIT_CUDA_CHECK(cudaGetLastError());
    }
    const int count = s.heads * pairs;
    window_bias_reduce_kernel<<<ceil_div(count, kWarpSize), dim3(kWarpSize, kSliceGroups), 0, stream>>>(partials, dbias,
                                                                                                        count, slices);
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
    window_table_gradient_kernel<T><<<ceil_div(entries * kWarpSize, 256), 256, 0, stream>>>(
        dbias, index, static_cast<T*>(dtable), entries, s.heads, pairs);
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace fusekit::kernels
