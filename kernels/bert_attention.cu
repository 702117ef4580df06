// BERT attention forward and backward (see bert_attention.h for the math and the layouts): the
// launchers. The kernels live under kernels/detail/: bert_attention_forward.cuh, the two-kernel
// bert_attention_backward.cuh and bert_attention_head_backward.cuh, on what
// bert_attention_common.cuh shares.
//
// Design (FlashAttention-2 on mma.sync, kernels/detail/mma_fragments.cuh): the forward, dQ and dK/dV kernels
// run 128 threads (4 warps) per block over tiles of 64 rows, warp w owning rows 16w .. 16w + 15 of
// the block's own tile (queries in the forward and dQ kernels, keys in the dK/dV kernel); the
// block-per-head backward runs 4 or 8 warps over one tile of 64 or 128 rows. Scores, probabilities,
// their gradients and every accumulator (O, dQ, dK, dV) stay in mma fragments: lane 4g + t holds
// rows g and g + 8 of its warp's 16 at columns 8n + 2t, 2t + 1 of each 8-column tile n, and a
// product's scores become the next product's left operand without leaving registers. Shared
// memory holds only the tiles of T ([64][head_dim + 8], rows past the end zero, so ldmatrix reads
// them without bank conflicts); the tiles a kernel walks are double-buffered with cp.async, the
// next tile's copies in flight while the current one is computed.
//
// Forward (a block per (sequence, head, 64 queries), 4 blocks an SM where D <= 64): for each key
// tile up to the valid length, S = Q K^T, the running max (log2 domain) and sum per row updated over
// the 4 lanes of a quad, O scaled by exp2(m_old - m_new), P = exp2(S * scale log2(e) - m_new) in one
// FMA an element, dropped elements zeroed and O += P V. O / l (times 1 / (1 - p)) and the lse are
// written once at the end.
//
// Backward, no atomics (deterministic), P recomputed as exp2(S - lse). Where seq <= 128 and D <=
// 64, bert_attention_head_backward_kernel holds a whole head per block (see there). Otherwise two
// kernels: bert_attention_query_kernel per (sequence, head, 64 queries) computes D = rowsum(dO * O)
// (into the workspace) and walks the key tiles for dQ; bert_attention_key_kernel per (sequence,
// head, 64 keys) walks the query tiles for dK and dV, computing S^T = K Q^T and dP^T = V dO^T
// directly, so P^T and dS^T are left operands in registers too.
//
// Dropout: element (i, j) of the Philox stream is ((b * heads + h) * seq + i) * seq + j. In the
// forward and dQ kernels, the lanes of a quad draw the 16 (row, 8-key tile) pairs of their rows once
// each, 8 flags a Philox call (dropout_kept_bits8: one call, or two where the 8 straddle two of the
// stream's groups of 8), and exchange the flags with shuffles (row_dropout_bits); in the dK/dV
// kernel the 8 lanes that hold the same queries draw their (query, 8 keys) pairs once each
// (column_dropout_bits). Each element's draw is made once per kernel, and the round keys are kernel
// parameters (KeyedDropout::keys), read from the constant bank.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/bert_attention.h"
#include "kernels/common.cuh"
#include "kernels/detail/bert_attention_backward.cuh"
#include "kernels/detail/bert_attention_common.cuh"
#include "kernels/detail/bert_attention_forward.cuh"
#include "kernels/detail/bert_attention_head_backward.cuh"
#include "kernels/detail/dispatch.h"
#include "kernels/detail/launch.h"  // allow_shared

namespace fusekit::kernels {
namespace {

// ---- kernel launchers

// Calls fn(TypeTag<T>, head dim) with compile-time values; the shape is checked before.
template <class FN>
void dispatch(DType dtype, int head_dim, FN&& fn) {
  auto by_dim = [&](auto type) {
    if (head_dim == 32)
      fn(type, std::integral_constant<int, 32>{});
    else if (head_dim == 64)
      fn(type, std::integral_constant<int, 64>{});
    else
      fn(type, std::integral_constant<int, 128>{});
  };
  dispatch_16bit_dtype(dtype, "bert_attention", by_dim);
}

void check_aligned(const void* p, const char* name) {
  if (!aligned16(p)) throw std::invalid_argument(std::string("bert_attention: ") + name + " must be 16-byte aligned");
}

// The forward takes the running max of the raw scores and scales it, which needs scale > 0; a
// subnormal scale would flush to 0 in the kernels (-inf * 0 = NaN for masked keys).
void check_scale(float scale) {
  if (!(scale >= std::numeric_limits<float>::min() && std::isfinite(scale)))
    throw std::invalid_argument("bert_attention: scale must be a positive normal finite float, got " +
                                std::to_string(scale));
}

}  // namespace

void check_bert_attention(DType dtype, const BertAttentionShape& s, float p) {
  std::string problem;
  if (dtype != DType::f16 && dtype != DType::bf16) {
    problem = std::string("dtype ") + dtype_name(dtype) + " is not supported (fp16, bf16)";
  } else if (s.head_dim != 32 && s.head_dim != 64 && s.head_dim != 128) {
    problem = "head_dim must be 32, 64 or 128, got " + std::to_string(s.head_dim);
  } else if (s.heads < 1 || s.heads > kMaxHeads) {
    problem = "heads must be in [1, " + std::to_string(kMaxHeads) + "], got " + std::to_string(s.heads);
  } else if (s.seq < 1 || s.seq > kMaxSeq) {
    problem = "seq must be in [1, " + std::to_string(kMaxSeq) + "], got " + std::to_string(s.seq);
  } else if (s.batch < 0) {
    problem = "batch must be >= 0, got " + std::to_string(s.batch);
  } else if (static_cast<long long>(s.batch) * s.heads * ceil_div(s.seq, kTile) > (1LL << 31) - 1) {
    problem = "batch x heads x ceil(seq / 64) must be below 2^31";
  } else if (!(p >= 0.f && p < 1.f)) {
    problem = "dropout p must be in [0, 1), got " + std::to_string(p);
  }
  if (!problem.empty()) throw std::invalid_argument("bert_attention: " + problem);
}

void bert_attention_forward(DType dtype, const void* qkv, const int32_t* valid_lengths, void* out, float* lse,
                            const BertAttentionShape& s, float scale, const BertAttentionDropout& dropout,
                            cudaStream_t stream) {
  check_bert_attention(dtype, s, dropout.p);
  check_scale(scale);
  check_aligned(qkv, "qkv");
  check_aligned(out, "out");
  if (s.batch == 0) return;
  const KeyedDropout stream_of_dropout = keyed_dropout(dropout);
  const int blocks = s.batch * s.heads * ceil_div(s.seq, kTile);
  dispatch(dtype, s.head_dim, [&](auto type, auto d) {
    using T = typename decltype(type)::type;
    constexpr int D = decltype(d)::value;
    using C = Config<T, D>;
    allow_shared<bert_attention_forward_kernel<T, D>>(C::kForwardBytes);
    bert_attention_forward_kernel<T, D><<<blocks, kThreads, C::kForwardBytes, stream>>>(
        static_cast<const T*>(qkv), valid_lengths, static_cast<T*>(out), lse, s.heads, s.seq, scale, stream_of_dropout);
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
  });
}

size_t bert_attention_backward_workspace_bytes(const BertAttentionShape& s) {
  return sizeof(float) * static_cast<size_t>(std::max(s.batch, 0)) * std::max(s.heads, 0) * std::max(s.seq, 0);
}

void bert_attention_backward(DType dtype, const void* qkv, const int32_t* valid_lengths, const void* out,
                             const float* lse, const void* dout, void* dqkv, void* workspace,
                             const BertAttentionShape& s, float scale, const BertAttentionDropout& dropout,
                             cudaStream_t stream) {
  check_bert_attention(dtype, s, dropout.p);
  check_scale(scale);
  check_aligned(qkv, "qkv");
  check_aligned(out, "out");
  check_aligned(dout, "dout");
  check_aligned(dqkv, "dqkv");
  if (s.batch == 0) return;
  const KeyedDropout stream_of_dropout = keyed_dropout(dropout);
  const int blocks = s.batch * s.heads * ceil_div(s.seq, kTile);
  float* row_dots = static_cast<float*>(workspace);
  dispatch(dtype, s.head_dim, [&](auto type, auto d) {
    using T = typename decltype(type)::type;
    constexpr int D = decltype(d)::value;
    using C = Config<T, D>;
    if constexpr (D <= 64) {
      if (s.seq <= kHeadMaxSeq) {  // the whole head in one block
        auto launch = [&](auto warps) {
          constexpr int W = decltype(warps)::value;
          using H = HeadConfig<T, D, W>;
          allow_shared<bert_attention_head_backward_kernel<T, D, W>>(H::kBytes);
          bert_attention_head_backward_kernel<T, D, W><<<s.batch * s.heads, H::kThreads, H::kBytes, stream>>>(
              static_cast<const T*>(qkv), valid_lengths, static_cast<const T*>(out), lse, static_cast<const T*>(dout),
              static_cast<T*>(dqkv), s.heads, s.seq, scale, stream_of_dropout);
          FUSEKIT_CUDA_CHECK(cudaGetLastError());
        };
        if (s.seq <= kHeadMaxSeq / 2)
          launch(std::integral_constant<int, kHeadMaxSeq / 32>{});
        else
          launch(std::integral_constant<int, kHeadMaxSeq / 16>{});
        return;
      }
    }
    allow_shared<bert_attention_query_kernel<T, D>>(C::kQueryBytes);
    bert_attention_query_kernel<T, D><<<blocks, kThreads, C::kQueryBytes, stream>>>(
        static_cast<const T*>(qkv), valid_lengths, static_cast<const T*>(out), lse, static_cast<const T*>(dout),
        static_cast<T*>(dqkv), row_dots, s.heads, s.seq, scale, stream_of_dropout);
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
    allow_shared<bert_attention_key_kernel<T, D>>(C::kKeyBytes);
    bert_attention_key_kernel<T, D><<<blocks, kThreads, C::kKeyBytes, stream>>>(
        static_cast<const T*>(qkv), valid_lengths, lse, static_cast<const T*>(dout), row_dots, static_cast<T*>(dqkv),
        s.heads, s.seq, scale, stream_of_dropout);
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace fusekit::kernels
