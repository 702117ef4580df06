// Embedding + LayerNorm + dropout forward and backward (see embedding_layernorm.h for the math, the
// layouts and what out-of-range ids do): the launchers. The kernels live under kernels/detail/
// (embedding_layernorm_forward.cuh, _backward_sorted.cuh, _backward_split.cuh, _backward_unsorted.cuh,
// _table_gradients.cuh; what they share in _common.cuh).
//
// Design: LayerNorm's row kernels (layernorm_common.cuh) whose loads gather three table rows. The
// row lives in registers; e is summed with rounded adds so the backward's recomputation is the
// forward's bit for bit; the dropout words are drawn per vector (kernels/detail/philox.cuh), never
// stored.
//
// The backward of rows of 33..256 16-byte vectors (BERT's 768 and 1024 columns) sorts the tokens by
// position first, so that neither table gradient needs an atomic per token:
//   1. one kernel zeroes the counters; a thread a token counts the tokens of each word and position
//      id, ranks each token within its position, and notes each word's second token (whose float
//      row will sum the word if it is used more than once). In training the forward, given the
//      backward's workspace, counts while its rows load (the zeroing kernel before it, the counts by
//      a row group's first thread), and the backward starts at step 2;
//   2. the blocks of the scatter each scan the position counts in shared memory and write the
//      tokens' ids in position order; beside them, two blocks an SM zero the float rows of the
//      repeated words and the position and type float sums;
//   3. the row kernel (16-bit types at 768 and 1024 columns: a group of 3 or 4 warps a token, a
//      16-byte vector a lane, on a run of the order; other rows: G row groups a block, each on
//      every G-th token of the block's run):
//      LayerNorm backward; de of a word used once (most words of a batch) is stored, rounded once,
//      straight into dword; de of a word used more than once is added with float atomics into its
//      float row; the de of a run of one position are summed in registers and added once per run;
//      the token types and dgamma/dbeta are summed per warp or per block in shared memory. The
//      block also zeroes the dword rows of its share of the vocabulary that no token uses;
//   4. the dword rows of repeated words and the position and type rows are converted from their
//      float sums; the dgamma/dbeta partial rows are summed.
// Sorting pays because the unsorted backward adds every de with float atomics (H100, fp16,
// 8192 x 768: 80.7 against 107.3 us). Other rows (and position tables of more than
// kMaxSortedPositions rows) take that unsorted backward:
//   1. zero the accumulators; mark the word ids in use; give each marked id a compact slot (an
//      accumulator row) from a counter, one atomic per warp (slot order is arbitrary: the sums in a
//      slot do not depend on it);
//   2. the row kernel: LayerNorm backward, dgamma/dbeta partials per block (no atomics), de added
//      with float atomics (16-byte float4 atomics on sm_90) into the slot of its word id and into the
//      position rows; the token-type rows (a handful, hit by every token) are summed per block in
//      shared memory first, so that their atomics do not all land on the same few addresses;
//   3. one pass writes every row of the three gradient tables once, converted or zero; a second
//      sums the dgamma/dbeta partials.
// Rows too long for the register configurations take looping kernels (a block per row, e gathered
// again in each pass).
#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/detail/dispatch.h"
#include "kernels/detail/embedding_layernorm_backward_sorted.cuh"
#include "kernels/detail/embedding_layernorm_backward_split.cuh"
#include "kernels/detail/embedding_layernorm_backward_unsorted.cuh"
#include "kernels/detail/embedding_layernorm_common.cuh"
#include "kernels/detail/embedding_layernorm_forward.cuh"
#include "kernels/detail/embedding_layernorm_table_gradients.cuh"
#include "kernels/embedding_layernorm.h"

namespace fusekit::kernels {
namespace {

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

// The backward's workspace, in floats, each part a whole number of 16-byte units. The sorted
// backward zeroes count .. small_sums (the counters) with one kernel and small_sums in its ordering
// kernel, the unsorted one small_sums .. counter with a memset.
struct WorkspaceLayout {
  size_t partial, count, pcount, repeated, small_sums, word_sums, mark, counter, slot, second, rank, entries,
      entry_rows, pairs, total;
  explicit WorkspaceLayout(const EmbeddingLayerNormSizes& s) {
    auto round4 = [](size_t n) { return (n + 3) / 4 * 4; };
    const size_t C = s.hidden, tokens = static_cast<size_t>(s.tokens);
    partial = 0;
    count = partial + round4(2 * C * backward_block_limit(std::max(s.tokens, 1)));
    pcount = count + round4(s.vocab);
    repeated = pcount + round4(static_cast<size_t>(s.max_positions) + 1);
    small_sums = repeated + 4;
    word_sums = small_sums + round4((static_cast<size_t>(s.max_positions) + s.token_types) * C);
    // A row per distinct word (unsorted: slots) or per token (sorted: a token's row sums its word).
    mark = word_sums + round4(tokens * C);
    counter = mark + round4(s.vocab);  // one int, zeroed with the marks
    slot = counter + 4;
    second = slot + round4(s.vocab);
    rank = second + round4(s.vocab);
    entries = rank + round4(tokens);
    entry_rows = entries + 4 * tokens;
    pairs = entry_rows + round4(tokens);
    total = pairs + 2 * static_cast<size_t>(s.vocab);
  }
};

template <class T>
void forward_typed(const ForwardArgs<T>& a, cudaStream_t stream) {
  // Counting, the forward follows the kernel that zeroed the counters as its programmatic dependent.
  auto launch = [&](auto kernel, auto counting_kernel, int blocks, int threads) {
    if (a.count_ids)
      launch_after_prior(counting_kernel, dim3(blocks), dim3(threads), 0, stream, a);
    else
      kernel<<<blocks, threads, 0, stream>>>(a);
  };
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
            launch(embedding_layernorm_forward_kernel<T, VEC, NV, TPR, NV * TPR * VEC>,
                   embedding_layernorm_forward_kernel<T, VEC, NV, TPR, NV * TPR * VEC, true>, blocks, threads);
            return;
          }
        }
        launch(embedding_layernorm_forward_kernel<T, VEC, NV, TPR>,
               embedding_layernorm_forward_kernel<T, VEC, NV, TPR, 0, true>, blocks, threads);
      }
    });
    if (!done) {
      const int blocks = std::min(a.rows, 64 * multiprocessors());
      launch(embedding_layernorm_forward_looping_kernel<T>, embedding_layernorm_forward_looping_kernel<T>, blocks,
             1024);
    }
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
}

// The shape of the table-gradient kernels' launches over `rows` rows of C columns in vectors of VEC:
// blocks of (x, y) = (a warp-multiple of threads covering a row, up to 256 threads in all).
struct TableLaunch {
  dim3 block, grid;
  TableLaunch(int C, int vec, int rows) {
    const int x = std::min(256, ceil_div(ceil_div(C, vec), kWarpSize) * kWarpSize);
    block = dim3(x, std::max(1, 256 / x));
    grid = dim3(std::min(ceil_div(rows, static_cast<int>(block.y)), 32 * multiprocessors()));
  }
};

// The sorted backward's counts and order in the workspace.
SortedTokens sorted_tokens(float* base, const WorkspaceLayout& layout) {
  auto ints = [&](size_t at) { return reinterpret_cast<int*>(base + at); };
  return {ints(layout.count),
          ints(layout.pcount),
          ints(layout.second),
          ints(layout.rank),
          reinterpret_cast<int4*>(base + layout.entries),
          ints(layout.entry_rows),
          ints(layout.repeated),
          reinterpret_cast<int2*>(base + layout.pairs)};
}

// Zeroes the counters (count, pcount, repeated: count .. small_sums; the float sums are zeroed by the
// ordering kernel). A kernel, not a memset, so that the counting kernel (or the counting forward)
// launches as its programmatic dependent.
void zero_counters(float* base, const WorkspaceLayout& layout, cudaStream_t stream) {
  const int threads = 256, n = static_cast<int>((layout.small_sums - layout.count) / 4);  // whole float4s
  launch_after_prior(zero_float4s_kernel, dim3(std::clamp(ceil_div(n, threads), 1, 4 * multiprocessors())),
                     dim3(threads), 0, stream, reinterpret_cast<float4*>(base + layout.count), n);
}

// Position tables of up to this many rows take the sorted backward (every block of its ordering
// kernel scans the position counts in shared memory).
constexpr int kMaxSortedPositions = 8192;
// Row groups a block of the sorted backward (see its kernel): 4 measured fastest of 2, 4 and 8.
constexpr int kSortedGroups = 4;

// The sorted backward, where it applies (rows of 33..256 16-byte vectors, and some tokens): returns
// false, having done nothing, where it does not.
template <class T>
bool backward_sorted(const BackwardArgs<T>& a, float* base, const WorkspaceLayout& layout, bool counted, T* dword,
                     T* dposition, T* dtype, T* dgamma, T* dbeta, cudaStream_t stream) {
  const Lookup& l = a.lookup;
  const int vec = vector_width<T>(a.C, {a.dy, a.tables.word, a.tables.position, a.tables.type, a.gamma, dword});
  const Config config = vec > 1 ? block_row_config(a.C / vec) : Config{0, 0};
  if (a.rows == 0 || config.tpr == 0 || l.positions > kMaxSortedPositions) return false;
  const int threads = 256;
  const SortedTokens s = sorted_tokens(base, layout);
  if (!counted) {
    zero_counters(base, layout, stream);
    launch_after_prior(count_tokens_kernel, dim3(std::min(ceil_div(a.rows, 128), 16 * multiprocessors())), dim3(128), 0,
                       stream, l, a.rows, s);
  }
  // The scatter's blocks (a token a thread) and two blocks an SM sweeping the vocabulary.
  const int token_blocks = std::min(ceil_div(a.rows, threads), 4 * multiprocessors());
  launch_after_prior(order_tokens_kernel, dim3(token_blocks + 2 * multiprocessors()), dim3(threads),
                     sizeof(int) * (l.positions + 1), stream, l, a.rows, s, a.word_sums, a.C,
                     reinterpret_cast<float4*>(a.small_sums),
                     static_cast<int>((layout.word_sums - layout.small_sums) / 4), token_blocks);
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
  int blocks = 0;
  if constexpr (sizeof(T) == 2) {
    // Rows of 3 or 4 x 32 16-byte vectors: a group of 3 or 4 warps a token, a vector a lane.
    const int warps_a_row = vec == 8 && a.C % (kWarpSize * 8) == 0 ? a.C / (kWarpSize * 8) : 0;
    auto launch_split = [&](auto w_c) {
      constexpr int NV = 1, W = decltype(w_c)::value;
      auto kernel = embedding_layernorm_backward_split_kernel<T, NV, W>;
      BackwardArgs<T> args = a;
      const bool shared_types = l.types <= kTypeSumsInShared;
      args.type_sums_offset = shared_types ? 0 : -1;
      const size_t shared = sizeof(float) * kTokenGroups * (2 + (shared_types ? l.types : 0)) * a.C;
      // Past 48 KB with the static row_sums, the limit is raised.
      if (shared + sizeof(float2) * kTokenGroups * 2 * W > 48 * 1024) {
        FUSEKIT_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
      }
      // One wave of groups, each on a run of consecutive entries; at most backward_block_limit
      // blocks (the dgamma/dbeta partial rows).
      const int threads = kTokenGroups * W * kWarpSize;
      int resident = 0;
      FUSEKIT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, threads, shared));
      const int groups =
          kTokenGroups * std::max(1, std::min(backward_block_limit(a.rows), std::max(resident, 1) * multiprocessors()));
      const int per_group = ceil_div(a.rows, groups);
      blocks = ceil_div(ceil_div(a.rows, per_group), kTokenGroups);
      launch_after_prior(kernel, dim3(blocks), dim3(threads), shared, stream, args, s, dword, per_group);
    };
    if (warps_a_row == 3) launch_split(std::integral_constant<int, 3>{});
    if (warps_a_row == 4) launch_split(std::integral_constant<int, 4>{});
  }
  if (blocks == 0)
    dispatch_vector_width<T>(vec, [&](auto vec_c) {
      constexpr int VEC = decltype(vec_c)::value;
      if constexpr (VEC > 1) {
        dispatch_block_row_config(config, [&](auto tpr_c, auto) {
          constexpr int TPR = decltype(tpr_c)::value;
          constexpr int G = std::min(kSortedGroups, 1024 / TPR);
          auto kernel = embedding_layernorm_backward_sorted_kernel<T, VEC, TPR, G>;
          BackwardArgs<T> args = a;
          const size_t column_bytes = sizeof(float) * G * 2 * a.C;
          const size_t type_bytes = sizeof(float) * G * static_cast<size_t>(l.types) * a.C;
          args.type_sums_offset = type_bytes <= kTypeSumsSharedBytes ? G * 2 * a.C : -1;
          const size_t shared = column_bytes + (args.type_sums_offset >= 0 ? type_bytes : 0);
          const size_t static_bytes = sizeof(float) * G * 2 * (TPR / kWarpSize) + sizeof(int) * TPR * G;
          if (shared + static_bytes > 48 * 1024) {
            FUSEKIT_CUDA_CHECK(
                cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
          }
          // One wave, each block on a run of consecutive entries.
          int resident = 0;
          FUSEKIT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, TPR * G, shared));
          blocks = std::max(1, std::min({backward_block_limit(a.rows), std::max(resident, 1) * multiprocessors(),
                                         ceil_div(a.rows, G)}));
          const int per_block = ceil_div(a.rows, blocks);
          blocks = ceil_div(a.rows, per_block);
          launch_after_prior(kernel, dim3(blocks), dim3(TPR * G), shared, stream, args, s, dword, per_block);
        });
      }
    });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());

  const int table_vec = vector_width<T>(a.C, {dword, dposition, dtype});
  dispatch_vector_width<T>(table_vec, [&](auto vec_c) {
    constexpr int VEC = decltype(vec_c)::value;
    // At most one repeated word per two tokens.
    const int table_rows = std::min(a.rows / 2, l.vocab) + l.positions + l.types;
    const int row_threads = TableLaunch(a.C, VEC, table_rows).block.x;
    const int tiles = ceil_div(a.C, kGradientColumns);
    const int row_blocks =
        std::min(ceil_div(table_rows, kRowsAtOnce * (kGradientThreads / row_threads)), 32 * multiprocessors());
    launch_after_prior(sorted_gradients_kernel<T, VEC>, dim3(tiles + row_blocks), dim3(kGradientThreads), 0, stream, s,
                       a.word_sums, a.small_sums, dword, dposition, dtype, l.positions, l.types, a.C, a.partial, blocks,
                       ParameterGradients<T, 2>{{dgamma, dbeta}}, row_threads, l.vocab);
  });
  FUSEKIT_CUDA_CHECK(cudaGetLastError());
  return true;
}

// Where vec > 1, rows of 33..256 vectors take block_row_config, so choose_row_config gives the
// unsorted backward 16 or 32 lanes a row only with vec == 1 (longer rows: 128 threads and more).
// The unreached lanes-per-row kernels are not built.
template <int VEC, int TPR>
constexpr bool kUnsortedLanesReached = VEC == 1 || TPR <= 8 || TPR > kWarpSize;

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
    // (block_row_config), which measured faster than a warp per row with its sums in shared memory and
    // shared atomics for the token types.
    const Config block_config = vec > 1 ? block_row_config(a.C / vec) : Config{0, 0};
    const Config config =
        block_config.tpr > 0 ? block_config : choose_row_config(a.C / vec, kBackwardMaxThreadsPerRow, vec);
    const int limit = backward_block_limit(a.rows);
    blocks = limit;
    dispatch_vector_width<T>(vec, [&](auto vec_c) {
      constexpr int VEC = decltype(vec_c)::value;
      auto launch = [&](auto tpr_c, auto nv_c) {
        constexpr int TPR = decltype(tpr_c)::value, NV = decltype(nv_c)::value;
        if constexpr (TPR <= kBackwardMaxThreadsPerRow && kRowConfigBuilt<VEC, NV> && kUnsortedLanesReached<VEC, TPR>) {
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
    const TableLaunch launch(a.C, VEC, l.vocab + l.positions + l.types);
    launch_after_prior(table_gradient_kernel<T, VEC>, launch.grid, launch.block, 0, stream, tables);
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
  const bool count_ids = tensors.backward_workspace != nullptr;
  SortedTokens sort{};
  if (count_ids) {
    const WorkspaceLayout layout(sizes);
    float* base = static_cast<float*>(tensors.backward_workspace);
    sort = sorted_tokens(base, layout);
    zero_counters(base, layout, stream);
  }
  dispatch_dtype(dtype, "embedding_layernorm", [&](auto type) {
    using T = typename decltype(type)::type;
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
                              dropout_stream(dropout.p, dropout.seed, dropout.offset, dropout.counter),
                              sort,
                              count_ids};
    forward_typed<T>(args, stream);
  });
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
  const Lookup lookup{tensors.word_ids, tensors.position_ids, tensors.token_type_ids,
                      sizes.vocab,      sizes.max_positions,  sizes.token_types};
  int* mark = reinterpret_cast<int*>(base + layout.mark);
  int* slot = reinterpret_cast<int*>(base + layout.slot);
  dispatch_dtype(dtype, "embedding_layernorm", [&](auto type) {
    using T = typename decltype(type)::type;
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
                               dropout_stream(dropout.p, dropout.seed, dropout.offset, dropout.counter)};
    T* const dword = static_cast<T*>(tensors.dword);
    T* const dposition = static_cast<T*>(tensors.dposition);
    T* const dtoken_type = static_cast<T*>(tensors.dtoken_type);
    T* const dgamma = static_cast<T*>(tensors.dgamma);
    T* const dbeta = static_cast<T*>(tensors.dbeta);
    if (!backward_sorted<T>(args, base, layout, tensors.ids_counted, dword, dposition, dtoken_type, dgamma, dbeta,
                            stream)) {
      // The accumulators and the marks are contiguous: one memset clears them.
      FUSEKIT_CUDA_CHECK(
          cudaMemsetAsync(base + layout.small_sums, 0, sizeof(float) * (layout.slot - layout.small_sums), stream));
      backward_typed<T>(args, mark, reinterpret_cast<int*>(base + layout.counter), slot, dword, dposition, dtoken_type,
                        dgamma, dbeta, stream);
    }
  });
}

}  // namespace fusekit::kernels
