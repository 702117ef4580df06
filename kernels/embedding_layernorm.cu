// Embedding + LayerNorm + dropout forward and backward (see embedding_layernorm.h for the math, the
// layouts and what out-of-range ids do).
//
// Design: LayerNorm's row kernels (layernorm_common.cuh) whose loads gather three table rows. The
// row lives in registers; e is summed with rounded adds so the backward's recomputation is the
// forward's bit for bit; the dropout words are drawn per vector (kernels/philox.cuh), never stored.
// The backward keeps de in registers and adds it, in float, into the table accumulators:
//   1. zero the accumulators; mark the word ids in use; give each marked id a compact slot (an
//      accumulator row) from a counter, one atomic per warp (slot order is arbitrary: the sums in a
//      slot do not depend on it);
//   2. the row kernel: LayerNorm backward, dgamma/dbeta partials per block (no atomics), de added
//      with float atomics (16-byte float4 atomics on sm_90) into the slot of its word id and into the
//      position rows; the token-type rows (a handful, hit by every token) are summed per block in
//      shared memory first, so that their atomics do not all land on the same few addresses. Rows of
//      BERT's widths take a block per row (one vector a thread, block_row_config): the dgamma/dbeta
//      sums stay in registers and the type sums are plain adds by each column's owner thread;
//   3. one pass writes every row of the three gradient tables once, converted or zero; a second
//      sums the dgamma/dbeta partials.
// Rows too long for the register configurations take looping kernels (a block per row, e gathered
// again in each pass).
#include "kernels/embedding_layernorm.h"
#include "kernels/layernorm_common.cuh"
#include "kernels/philox.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace fusekit::kernels {
namespace {

using namespace layernorm_rows;

// The ids of one token, and whether all three are inside their tables.
struct TokenIds {
  int64_t word, position, type;
  bool in_range;
};

struct Lookup {
  const int64_t* word_ids;
  const int64_t* position_ids;
  const int64_t* type_ids;
  int vocab;
  int positions;
  int types;
  __device__ __forceinline__ TokenIds at(int row) const {
    TokenIds ids{word_ids[row], position_ids[row], type_ids[row], false};
    ids.in_range = ids.word >= 0 && ids.word < vocab && ids.position >= 0 && ids.position < positions &&
                   ids.type >= 0 && ids.type < types;
    return ids;
  }
};

// e = word + position + type with rounded adds: the forward and the backward agree to the bit.
__device__ __forceinline__ float embedding_sum(float word, float position, float type) {
  return __fadd_rn(__fadd_rn(word, position), type);
}

template <class T>
struct Tables {
  const T* word;
  const T* position;
  const T* type;
  // Element c of token `ids`' e.
  __device__ __forceinline__ float e_at(const TokenIds& ids, int C, int c) const {
    return embedding_sum(to_float(word[ids.word * C + c]), to_float(position[ids.position * C + c]),
                         to_float(type[ids.type * C + c]));
  }
};

template <class T>
struct ForwardArgs {
  Lookup lookup;
  Tables<T> tables;
  const T* gamma;
  const T* beta;
  T* y;
  float* mean;
  float* rstd;
  int rows;
  int C;
  float eps;
  DropoutStream dropout;
};

template <class T>
struct BackwardArgs {
  Lookup lookup;
  Tables<T> tables;
  const T* dy;
  const T* gamma;
  const float* mean;
  const float* rstd;
  const int* slot;    // [vocab]: the accumulator row of a word id
  float* word_sums;   // [slots, C]
  float* small_sums;  // [positions + types, C]: position rows, then token-type rows
  float* partial;     // [gridDim.x][2][C]: per block, sums of dy' * xhat (dgamma) and dy' (dbeta)
  int rows;
  int C;
  int type_sums_offset;  // floats into dynamic shared memory of the per-block token-type sums; -1: none
  DropoutStream dropout;
};

// Adds N floats to global memory at `to` (16-byte aligned where N is a multiple of 4).
template <int N>
__device__ __forceinline__ void add_floats(float* to, const float* values) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool kFloat4 = N % 4 == 0;
#else
  constexpr bool kFloat4 = false;
#endif
  if constexpr (kFloat4) {
#pragma unroll
    for (int q = 0; q < N / 4; ++q)
      atomicAdd(reinterpret_cast<float4*>(to) + q,
                make_float4(values[4 * q], values[4 * q + 1], values[4 * q + 2], values[4 * q + 3]));
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) atomicAdd(to + k, values[k]);
  }
}

// ---- CUDA kernels

// COLUMNS > 0: the row length compiled in (BERT's 768 and 1024 with a warp a row): the row's loads
// are all issued first, with no branch around them, and its dropout flags drawn while they fly.
// With a run-time length the same order took 96 registers against 60 (and was slower).
template <class T, int VEC, int NV, int TPR, int COLUMNS = 0>
__global__ void __launch_bounds__(TPR <= kWarpSize ? 256 : TPR)
    embedding_layernorm_forward_kernel(const ForwardArgs<T> a) {
  __shared__ float scratch[kWarpSize];
  using V = Vec<T, VEC>;
  const RowGroups<TPR> rg;
  const int groups = rg.count, group = rg.index, t = rg.thread;
  auto reduce = [&](float v) { return rg.sum(v, scratch); };
  const int C = COLUMNS > 0 ? COLUMNS : a.C;

  // The whole warp runs every iteration (its shuffles need every lane); a row group past the last
  // row, or on a token with an id out of range, gathers nothing.
  for (int first = blockIdx.x * groups; first < a.rows; first += gridDim.x * groups) {
    const int row = first + group;
    const bool valid = row < a.rows;
    const TokenIds ids = valid ? a.lookup.at(row) : TokenIds{0, 0, 0, false};
    const bool gather = valid && ids.in_range;
    const size_t base = static_cast<size_t>(row) * C;
    const DropoutStream& dropout = a.dropout;
    uint32_t kept[NV];
    float v[NV][VEC];
    float sum = 0.f;
    if constexpr (COLUMNS > 0) {
      const T* word = a.tables.word + (gather ? ids.word : 0) * C;
      const T* position = a.tables.position + (gather ? ids.position : 0) * C;
      const T* type = a.tables.type + (gather ? ids.type : 0) * C;
      V w[NV], p[NV], ty[NV];
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const int c = (j * TPR + t) * VEC;
        w[j] = V::load(word + c);
        p[j] = V::load(position + c);
        ty[j] = V::load(type + c);
      }
#pragma unroll
      for (int j = 0; j < NV; ++j) kept[j] = dropout.template kept_bits<VEC>(base + (j * TPR + t) * VEC);
#pragma unroll
      for (int j = 0; j < NV; ++j) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          v[j][k] = gather ? embedding_sum(to_float(w[j].v[k]), to_float(p[j].v[k]), to_float(ty[j].v[k])) : 0.f;
          sum += v[j][k];
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const int c = (j * TPR + t) * VEC;
        if (gather && c < C) {
          const V w = V::load(a.tables.word + ids.word * C + c);
          const V p = V::load(a.tables.position + ids.position * C + c);
          const V ty = V::load(a.tables.type + ids.type * C + c);
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            v[j][k] = embedding_sum(to_float(w.v[k]), to_float(p.v[k]), to_float(ty.v[k]));
            sum += v[j][k];
          }
        } else {
#pragma unroll
          for (int k = 0; k < VEC; ++k) v[j][k] = 0.f;
        }
      }
      // The dropout flags are drawn here, before the reductions, where Philox's multiplies overlap
      // their shuffles (they were drawn at the stores, after both).
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const int c = (j * TPR + t) * VEC;
        kept[j] = c < C ? dropout.template kept_bits<VEC>(base + c) : 0u;
      }
    }
    const float mu = reduce(sum) / C;
    float squares = 0.f;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      if (gather && (j * TPR + t) * VEC < C) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) squares += (v[j][k] - mu) * (v[j][k] - mu);
      }
    }
    const float rs = rsqrtf(reduce(squares) / C + a.eps);
    if (!valid) continue;  // after the reductions: every lane took part in them
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int c = (j * TPR + t) * VEC;
      if (c < C) {
        const V g = V::load(a.gamma + c), b = V::load(a.beta + c);
        V out;
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float ln = (v[j][k] - mu) * rs * to_float(g.v[k]) + to_float(b.v[k]);
          out.v[k] = from_float<T>(gather ? ln * dropout.multiplier(kept[j], k) : NAN);
        }
        out.store(a.y + base + c);
      }
    }
    if (t == 0) {
      a.mean[row] = gather ? mu : NAN;
      a.rstd[row] = gather ? rs : NAN;
    }
  }
}

// Any row length: a block per row; e is gathered again in each pass.
template <class T>
__global__ void embedding_layernorm_forward_looping_kernel(const ForwardArgs<T> a) {
  __shared__ float scratch[kWarpSize];
  const int C = a.C;
  for (int row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const size_t base = static_cast<size_t>(row) * C;
    const TokenIds ids = a.lookup.at(row);
    if (!ids.in_range) {  // the whole block takes this branch
      for (int c = threadIdx.x; c < C; c += blockDim.x) a.y[base + c] = from_float<T>(NAN);
      if (threadIdx.x == 0) a.mean[row] = a.rstd[row] = NAN;
      continue;
    }
    float sum = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) sum += a.tables.e_at(ids, C, c);
    const float mu = block_sum(sum, scratch) / C;
    float squares = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const float d = a.tables.e_at(ids, C, c) - mu;
      squares += d * d;
    }
    const float rs = rsqrtf(block_sum(squares, scratch) / C + a.eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const float ln = (a.tables.e_at(ids, C, c) - mu) * rs * to_float(a.gamma[c]) + to_float(a.beta[c]);
      const float m = a.dropout.multiplier(a.dropout.template kept_bits<1>(base + c), 0);
      a.y[base + c] = from_float<T>(ln * m);
    }
    if (threadIdx.x == 0) {
      a.mean[row] = mu;
      a.rstd[row] = rs;
    }
  }
}

// mark[word id] = 1 for every token whose ids are in range.
__global__ void mark_words_kernel(Lookup lookup, int rows, int* mark) {
  for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x) {
    const TokenIds ids = lookup.at(r);
    if (ids.in_range) mark[ids.word] = 1;
  }
}

// slot[v] for every marked v: 0, 1, ... from `counter` (zeroed with the marks), one atomicAdd per
// warp. Unmarked entries are left as they are (no reader looks at them).
__global__ void word_slots_kernel(const int* __restrict__ mark, int* __restrict__ slot, int n, int* counter) {
  wait_for_prior_grid();  // the marks: launch_after_prior
  const int lane = threadIdx.x % kWarpSize;
  for (int first = blockIdx.x * blockDim.x; first < n; first += gridDim.x * blockDim.x) {
    const int v = first + threadIdx.x;  // the whole warp runs every iteration (its ballot needs it)
    const bool marked = v < n && mark[v] != 0;
    const unsigned ballot = __ballot_sync(0xffffffffu, marked);
    if (ballot == 0) continue;
    int base = 0;
    if (lane == 0) base = atomicAdd(counter, __popc(ballot));
    base = __shfl_sync(0xffffffffu, base, 0);
    if (marked) slot[v] = base + __popc(ballot & ((1u << lane) - 1u));
  }
}

template <class T, int VEC, int NV, int TPR>
__global__ void __launch_bounds__(TPR <= kWarpSize ? 256 : TPR)
    embedding_layernorm_backward_kernel(const BackwardArgs<T> a) {
  wait_for_prior_grid();  // the slots: launch_after_prior
  __shared__ float scratch[kWarpSize];
  extern __shared__ float dynamic_shared[];  // [warps][2][C] (lanes per row), then [types][C] type sums
  using V = Vec<T, VEC>;
  const RowGroups<TPR> rg;
  const int groups = rg.count, group = rg.index, t = rg.thread;
  auto reduce = [&](float v) { return rg.sum(v, scratch); };
  const int C = a.C;
  const int types = a.lookup.types, positions = a.lookup.positions;
  float* type_sums = a.type_sums_offset >= 0 ? dynamic_shared + a.type_sums_offset : nullptr;
  if (type_sums) {
    for (int i = threadIdx.x; i < types * C; i += blockDim.x) type_sums[i] = 0.f;
    __syncthreads();
  }

  // dgamma, dbeta of this thread's columns; a warp per row keeps them in shared memory (ColumnSums).
  ColumnSums<2, NV, VEC, TPR, TPR == kWarpSize> sums(dynamic_shared, C);
  for (int first = blockIdx.x * groups; first < a.rows; first += gridDim.x * groups) {
    const int row = first + group;
    const TokenIds ids = row < a.rows ? a.lookup.at(row) : TokenIds{0, 0, 0, false};
    const bool valid = row < a.rows && ids.in_range;  // out of range: no gradient at all
    const size_t base = static_cast<size_t>(row) * C;
    const float mu = valid ? a.mean[row] : 0.f, rs = valid ? a.rstd[row] : 0.f;
    // e in float and the kept flags stay in registers; dy is loaded again by the second pass (plain
    // loads, so it is an L1 hit) rather than held, which keeps bf16 rows of 768 free of spills.
    float ev[NV][VEC];
    uint32_t kept[NV];
    float sum_g = 0.f, sum_gx = 0.f;
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int c = (j * TPR + t) * VEC;
      kept[j] = 0;
      if (valid && c < C) {
        kept[j] = a.dropout.template kept_bits<VEC>(base + c);
        const V w = V::load(a.tables.word + ids.word * C + c);
        const V p = V::load(a.tables.position + ids.position * C + c);
        const V ty = V::load(a.tables.type + ids.type * C + c);
        const V dyv = V::load(a.dy + base + c);
        const V gv = V::load(a.gamma + c);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          ev[j][k] = embedding_sum(to_float(w.v[k]), to_float(p.v[k]), to_float(ty.v[k]));
          const float d = __fmul_rn(to_float(dyv.v[k]), a.dropout.multiplier(kept[j], k));
          const float xhat = (ev[j][k] - mu) * rs;
          // Rounded products, so both passes see the same g (no FMA contraction in one of them).
          const float g = __fmul_rn(d, to_float(gv.v[k]));
          sum_g += g;
          sum_gx += g * xhat;
          sums.add(0, j, k, d * xhat);
          sums.add(1, j, k, d);
        }
      }
    }
    const float mean_g = reduce(sum_g) / C;
    const float mean_gx = reduce(sum_gx) / C;
    if (valid) {
      float* word_to = a.word_sums + static_cast<size_t>(a.slot[ids.word]) * C;
      float* position_to = a.small_sums + static_cast<size_t>(ids.position) * C;
      float* type_to =
          type_sums ? type_sums + ids.type * C : a.small_sums + static_cast<size_t>(positions + ids.type) * C;
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const int c = (j * TPR + t) * VEC;
        if (c < C) {
          const V gv = V::load(a.gamma + c), dyv = V::load(a.dy + base + c);
          float de[VEC];
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            const float d = __fmul_rn(to_float(dyv.v[k]), a.dropout.multiplier(kept[j], k));
            const float xhat = (ev[j][k] - mu) * rs;
            const float g = __fmul_rn(d, to_float(gv.v[k]));
            de[k] = rs * (g - mean_g - xhat * mean_gx);
          }
          add_floats<VEC>(word_to + c, de);
          add_floats<VEC>(position_to + c, de);
          if (type_sums) {
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
              if constexpr (RowGroups<TPR>::kLanesPerRow)
                atomicAdd(type_to + c + k, de[k]);  // the block's warps share the rows
              else
                type_to[c + k] += de[k];  // the block is on one row: each column has one owner thread
            }
          } else {
            add_floats<VEC>(type_to + c, de);
          }
        }
      }
    }
  }

  sums.write(a.partial + static_cast<size_t>(blockIdx.x) * 2 * C, dynamic_shared, C, t);
  if (type_sums) {
    __syncthreads();
    float* to = a.small_sums + static_cast<size_t>(positions) * C;
    for (int i = threadIdx.x; i < types * C; i += blockDim.x) {
      if (type_sums[i] != 0.f) atomicAdd(to + i, type_sums[i]);
    }
  }
}

// Any row length: a block per row. The block's partial rows accumulate in global memory, which only
// this block touches (each column has one owner thread in every row); de goes straight to the
// accumulators.
template <class T>
__global__ void embedding_layernorm_backward_looping_kernel(const BackwardArgs<T> a) {
  __shared__ float scratch[kWarpSize];
  const int C = a.C;
  float* block_partial = a.partial + static_cast<size_t>(blockIdx.x) * 2 * C;
  for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) block_partial[c] = 0.f;
  __syncthreads();
  for (int row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const TokenIds ids = a.lookup.at(row);
    if (!ids.in_range) continue;  // the whole block takes this branch
    const size_t base = static_cast<size_t>(row) * C;
    const float mu = a.mean[row], rs = a.rstd[row];
    auto d_at = [&](int c) {
      return __fmul_rn(to_float(a.dy[base + c]), a.dropout.multiplier(a.dropout.template kept_bits<1>(base + c), 0));
    };
    float sum_g = 0.f, sum_gx = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const float d = d_at(c), xhat = (a.tables.e_at(ids, C, c) - mu) * rs;
      const float g = __fmul_rn(d, to_float(a.gamma[c]));
      sum_g += g;
      sum_gx += g * xhat;
      block_partial[c] += d * xhat;
      block_partial[C + c] += d;
    }
    const float mean_g = block_sum(sum_g, scratch) / C;
    const float mean_gx = block_sum(sum_gx, scratch) / C;
    float* word_to = a.word_sums + static_cast<size_t>(a.slot[ids.word]) * C;
    float* position_to = a.small_sums + static_cast<size_t>(ids.position) * C;
    float* type_to = a.small_sums + static_cast<size_t>(a.lookup.positions + ids.type) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const float xhat = (a.tables.e_at(ids, C, c) - mu) * rs;
      const float g = __fmul_rn(d_at(c), to_float(a.gamma[c]));
      const float de = rs * (g - mean_g - xhat * mean_gx);
      atomicAdd(word_to + c, de);
      atomicAdd(position_to + c, de);
      atomicAdd(type_to + c, de);
    }
  }
}

template <class T>
struct TableGradientArgs {
  const int* mark;
  const int* slot;
  const float* word_sums;
  const float* small_sums;
  T* dword;
  T* dposition;
  T* dtype;
  int vocab;
  int positions;
  int types;
  int C;
};

// Writes every row of the three gradient tables once: rows of word ids not in use are zero. Thread
// (x, y) of a block: columns x * VEC.. of row y of the block's rows.
template <class T, int VEC>
__global__ void table_gradient_kernel(const TableGradientArgs<T> a) {
  wait_for_prior_grid();  // the sums: launch_after_prior
  const int total = a.vocab + a.positions + a.types, C = a.C;
  for (int row = blockIdx.x * blockDim.y + threadIdx.y; row < total; row += gridDim.x * blockDim.y) {
    const float* from;
    T* to;
    if (row < a.vocab) {
      from = a.mark[row] ? a.word_sums + static_cast<size_t>(a.slot[row]) * C : nullptr;
      to = a.dword + static_cast<size_t>(row) * C;
    } else {
      from = a.small_sums + static_cast<size_t>(row - a.vocab) * C;
      to = row < a.vocab + a.positions ? a.dposition + static_cast<size_t>(row - a.vocab) * C
                                       : a.dtype + static_cast<size_t>(row - a.vocab - a.positions) * C;
    }
    for (int c = threadIdx.x * VEC; c < C; c += blockDim.x * VEC) {
      float v[VEC];
      if (from == nullptr) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] = 0.f;
      } else if constexpr (VEC % 4 == 0) {
#pragma unroll
        for (int q = 0; q < VEC / 4; ++q) {
          const float4 f = __ldcs(reinterpret_cast<const float4*>(from + c) + q);
          v[4 * q] = f.x;
          v[4 * q + 1] = f.y;
          v[4 * q + 2] = f.z;
          v[4 * q + 3] = f.w;
        }
      } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] = from[c + k];
      }
      Vec<T, VEC> out;
#pragma unroll
      for (int k = 0; k < VEC; ++k) out.v[k] = from_float<T>(v[k]);
      out.store(to + c);
    }
  }
}

// ---- kernel launchers

// The backward holds three floats per element (e and two accumulators) and the dy vectors: longer
// rows than 256 threads x 4 vectors take the looping kernel.
constexpr int kBackwardMaxThreadsPerRow = 256;
// Token-type sums go through shared memory where they fit in this much of it.
constexpr size_t kTypeSumsSharedBytes = 32 * 1024;

int backward_block_limit(int rows) {
  const int sms = multiprocessors();
  return std::max(1, std::min(rows, std::max(sms, std::min(rows / 8, 16 * sms))));
}

// The backward's workspace, in floats, each part a whole number of 16-byte units.
struct WorkspaceLayout {
  size_t partial, small_sums, word_sums, mark, counter, slot, total;
  explicit WorkspaceLayout(const EmbeddingLayerNormSizes& s) {
    auto round4 = [](size_t n) { return (n + 3) / 4 * 4; };
    const size_t C = s.hidden;
    partial = 0;
    small_sums = partial + round4(2 * C * backward_block_limit(std::max(s.tokens, 1)));
    word_sums = small_sums + round4((static_cast<size_t>(s.max_positions) + s.token_types) * C);
    mark = word_sums + round4(static_cast<size_t>(std::min(s.tokens, s.vocab)) * C);
    counter = mark + round4(s.vocab);  // one int, zeroed with the marks
    slot = counter + 4;
    total = slot + round4(s.vocab);
  }
};

template <class T>
void forward_typed(const ForwardArgs<T>& a, cudaStream_t stream) {
  const int vec = vector_width<T>(a.C, {a.tables.word, a.tables.position, a.tables.type, a.gamma, a.beta, a.y});
  const Config config = choose_row_config(a.C / vec, 1024, vec);
  dispatch_vector_width<T>(vec, [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    const bool done = dispatch_config(config, [&](auto tpr_c, auto nv_c) {
      constexpr int TPR = decltype(tpr_c)::value, NV = decltype(nv_c)::value;
      if constexpr (kRowConfigBuilt<VEC, NV>) {
        // Lanes of a warp a row: 64-thread blocks, for finer residency.
        const int threads = TPR <= kWarpSize ? 64 : TPR;
        const int blocks = std::min(ceil_div(a.rows, threads / TPR), 256 * multiprocessors());
        if constexpr (TPR == kWarpSize && VEC * sizeof(T) == 16 && (NV == 3 || NV == 4)) {
          if (a.C == NV * TPR * VEC) {
            embedding_layernorm_forward_kernel<T, VEC, NV, TPR, NV * TPR * VEC><<<blocks, threads, 0, stream>>>(a);
            return;
          }
        }
        embedding_layernorm_forward_kernel<T, VEC, NV, TPR><<<blocks, threads, 0, stream>>>(a);
      }
    });
    if (!done) {
      const int blocks = std::min(a.rows, 64 * multiprocessors());
      embedding_layernorm_forward_looping_kernel<T><<<blocks, 1024, 0, stream>>>(a);
    }
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

template <class T>
void backward_typed(BackwardArgs<T> a, int* mark, int* slot_counter, int* slot, T* dword, T* dposition, T* dtype,
                    T* dgamma, T* dbeta, cudaStream_t stream) {
  const Lookup& l = a.lookup;
  int blocks = 0;  // partial rows written
  if (a.rows > 0) {
    const int threads = 256;
    mark_words_kernel<<<std::min(ceil_div(a.rows, threads), 16 * multiprocessors()), threads, 0, stream>>>(l, a.rows,
                                                                                                           mark);
    launch_after_prior(word_slots_kernel, dim3(std::min(ceil_div(l.vocab, threads), 4 * multiprocessors())),
                       dim3(threads), 0, stream, mark, slot, l.vocab, slot_counter);
    FUSEKIT_CUDA_CHECK(cudaGetLastError());

    const int vec = vector_width<T>(a.C, {a.dy, a.tables.word, a.tables.position, a.tables.type, a.gamma});
    // Rows of 33..256 vectors (BERT's 768 and 1024 columns): a block per row, one vector a thread
    // (block_row_config), against a warp per row with its sums in shared memory and shared atomics
    // for the token types. H100, fp16, the backward (all its kernels): 8192 x 768 135.5 -> 113.9 us,
    // 16384 x 1024 276.4 -> 236.4 us; the suite's forward + backward 155.5 -> 133.0 us and
    // 322.9 -> 283.2 us.
    const Config block_config = vec > 1 ? block_row_config(a.C / vec) : Config{0, 0};
    const Config config =
        block_config.tpr > 0 ? block_config : choose_row_config(a.C / vec, kBackwardMaxThreadsPerRow, vec);
    const int limit = backward_block_limit(a.rows);
    blocks = limit;
    dispatch_vector_width<T>(vec, [&](auto vec_c) {
      constexpr int VEC = decltype(vec_c)::value;
      auto launch = [&](auto tpr_c, auto nv_c) {
        constexpr int TPR = decltype(tpr_c)::value, NV = decltype(nv_c)::value;
        if constexpr (TPR <= kBackwardMaxThreadsPerRow && kRowConfigBuilt<VEC, NV>) {
          const int threads = TPR <= kWarpSize ? kLaneKernelThreads : TPR;
          const size_t warp_bytes = TPR <= kWarpSize ? sizeof(float) * 2 * a.C * (threads / kWarpSize) : 0;
          const size_t type_bytes = sizeof(float) * static_cast<size_t>(l.types) * a.C;
          BackwardArgs<T> args = a;
          args.type_sums_offset =
              type_bytes <= kTypeSumsSharedBytes ? static_cast<int>(warp_bytes / sizeof(float)) : -1;
          const size_t shared = warp_bytes + (args.type_sums_offset >= 0 ? type_bytes : 0);
          auto kernel = embedding_layernorm_backward_kernel<T, VEC, NV, TPR>;
          if (shared > 48 * 1024) {
            FUSEKIT_CUDA_CHECK(
                cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
          }
          // One wave (each block's partial row is written once, after all its rows), within the
          // limit the workspace was sized for.
          int resident = 0;
          FUSEKIT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, threads, shared));
          blocks = std::max(
              1, std::min({limit, std::max(resident, 1) * multiprocessors(), ceil_div(a.rows, threads / TPR)}));
          launch_after_prior(kernel, dim3(blocks), dim3(threads), shared, stream, args);
        }
      };
      const bool done = dispatch_block_row_config(config, launch) || dispatch_config(config, launch);
      if (!done) {
        BackwardArgs<T> args = a;
        args.type_sums_offset = -1;
        embedding_layernorm_backward_looping_kernel<T><<<blocks, 1024, 0, stream>>>(args);
      }
    });
    FUSEKIT_CUDA_CHECK(cudaGetLastError());
  }

  const TableGradientArgs<T> tables{mark,  slot,    a.word_sums, a.small_sums, dword, dposition,
                                    dtype, l.vocab, l.positions, l.types,      a.C};
  const int vec = vector_width<T>(a.C, {dword, dposition, dtype});
  dispatch_vector_width<T>(vec, [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    const int x = std::min(256, ceil_div(ceil_div(a.C, VEC), kWarpSize) * kWarpSize);
    const dim3 threads(x, std::max(1, 256 / x));
    const int rows = l.vocab + l.positions + l.types;
    const int grid = std::min(ceil_div(rows, static_cast<int>(threads.y)), 32 * multiprocessors());
    launch_after_prior(table_gradient_kernel<T, VEC>, dim3(grid), threads, 0, stream, tables);
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
  launch_parameter_gradients<T, 2>(a.partial, blocks, a.C, {{dgamma, dbeta}}, stream);
}

void check_sizes(const EmbeddingLayerNormSizes& s) {
  if (s.tokens < 0 || s.hidden <= 0 || s.vocab <= 0 || s.max_positions <= 0 || s.token_types <= 0) {
    throw std::invalid_argument(
        "embedding_layernorm: tokens must be >= 0 and hidden, vocab, max_positions, "
        "token_types > 0 (got tokens " +
        std::to_string(s.tokens) + ", hidden " + std::to_string(s.hidden) + ", vocab " + std::to_string(s.vocab) +
        ", max_positions " + std::to_string(s.max_positions) + ", token_types " + std::to_string(s.token_types) + ")");
  }
}

void check_dropout(Dropout dropout) {
  if (!(dropout.p >= 0.f && dropout.p < 1.f)) {
    throw std::invalid_argument("embedding_layernorm: dropout probability must be in [0, 1) (got " +
                                std::to_string(dropout.p) + ")");
  }
}

void require(bool present, const char* what) {
  if (!present) throw std::invalid_argument(std::string("embedding_layernorm: ") + what);
}

}  // namespace

void embedding_layernorm_forward(DType dtype, const EmbeddingLayerNormForwardTensors& tensors, Dropout dropout,
                                 EmbeddingLayerNormSizes sizes, float eps, cudaStream_t stream) {
  check_sizes(sizes);
  check_dropout(dropout);
  require(tensors.word_ids && tensors.position_ids && tensors.token_type_ids && tensors.word && tensors.position &&
              tensors.token_type && tensors.gamma && tensors.beta && tensors.y && tensors.mean && tensors.rstd,
          "forward needs the three id arrays, the three tables, gamma, beta, y, mean and rstd");
  if (sizes.tokens == 0) return;
  const Lookup lookup{tensors.word_ids, tensors.position_ids, tensors.token_type_ids,
                      sizes.vocab,      sizes.max_positions,  sizes.token_types};
  FUSEKIT_DTYPE_SWITCH(dtype, {
    const ForwardArgs<T> args{lookup,
                              {static_cast<const T*>(tensors.word), static_cast<const T*>(tensors.position),
                               static_cast<const T*>(tensors.token_type)},
                              static_cast<const T*>(tensors.gamma),
                              static_cast<const T*>(tensors.beta),
                              static_cast<T*>(tensors.y),
                              tensors.mean,
                              tensors.rstd,
                              sizes.tokens,
                              sizes.hidden,
                              eps,
                              dropout_stream(dropout.p, dropout.seed, dropout.offset)};
    forward_typed<T>(args, stream);
  })
}

size_t embedding_layernorm_backward_workspace_bytes(EmbeddingLayerNormSizes sizes) {
  check_sizes(sizes);
  return sizeof(float) * WorkspaceLayout(sizes).total;
}

void embedding_layernorm_backward(DType dtype, const EmbeddingLayerNormBackwardTensors& tensors, Dropout dropout,
                                  EmbeddingLayerNormSizes sizes, void* workspace, cudaStream_t stream) {
  check_sizes(sizes);
  check_dropout(dropout);
  require(tensors.dy && tensors.word_ids && tensors.position_ids && tensors.token_type_ids && tensors.word &&
              tensors.position && tensors.token_type && tensors.gamma && tensors.mean && tensors.rstd &&
              tensors.dword && tensors.dposition && tensors.dtoken_type && tensors.dgamma && tensors.dbeta && workspace,
          "backward needs dy, the three id arrays, the three tables, gamma, mean, rstd, dword, dposition, "
          "dtoken_type, dgamma, dbeta and a workspace");
  const WorkspaceLayout layout(sizes);
  float* base = static_cast<float*>(workspace);
  // The accumulators and the marks are contiguous: one memset clears them.
  FUSEKIT_CUDA_CHECK(
      cudaMemsetAsync(base + layout.small_sums, 0, sizeof(float) * (layout.slot - layout.small_sums), stream));
  const Lookup lookup{tensors.word_ids, tensors.position_ids, tensors.token_type_ids,
                      sizes.vocab,      sizes.max_positions,  sizes.token_types};
  int* mark = reinterpret_cast<int*>(base + layout.mark);
  int* slot = reinterpret_cast<int*>(base + layout.slot);
  FUSEKIT_DTYPE_SWITCH(dtype, {
    const BackwardArgs<T> args{lookup,
                               {static_cast<const T*>(tensors.word), static_cast<const T*>(tensors.position),
                                static_cast<const T*>(tensors.token_type)},
                               static_cast<const T*>(tensors.dy),
                               static_cast<const T*>(tensors.gamma),
                               tensors.mean,
                               tensors.rstd,
                               slot,
                               base + layout.word_sums,
                               base + layout.small_sums,
                               base + layout.partial,
                               sizes.tokens,
                               sizes.hidden,
                               -1,
                               dropout_stream(dropout.p, dropout.seed, dropout.offset)};
    backward_typed<T>(args, mark, reinterpret_cast<int*>(base + layout.counter), slot, static_cast<T*>(tensors.dword),
                      static_cast<T*>(tensors.dposition), static_cast<T*>(tensors.dtoken_type),
                      static_cast<T*>(tensors.dgamma), static_cast<T*>(tensors.dbeta), stream);
  })
}

}  // namespace fusekit::kernels
