// BERT's embedding layer fused: three table lookups summed, LayerNorm, dropout; forward and backward.
//
//   forward:  e[r,:] = word[word_ids[r],:] + position[position_ids[r],:] + token_type[type_ids[r],:]
//             (summed in float), y = LayerNorm(e; gamma, beta) * m, mean and rstd of e saved,
//             m[r,c] = kept(r, c) / (1 - p)   (kernels/detail/philox.cuh: element r * H + c of the dropout
//             stream, the same stream as bias_dropout_residual_layernorm; never stored)
//   backward: de = LayerNorm-backward(dy * m)  (e recomputed from the tables, never stored)
//             dword[v,:] = sum of de over the tokens whose word id is v (0 for rows never used),
//             likewise dposition and dtoken_type; dgamma, dbeta as LayerNorm's.
//
// Ids are int64 (PyTorch's index type), device pointers, [tokens] each. Tables, their gradients,
// gamma, beta and their gradients: row-major of one storage type (float, half or bfloat16); y, dy:
// [tokens, H]. mean, rstd: [tokens] float. Arithmetic is in float.
//
// Out-of-range ids: a token with any id outside its table (< 0 or >= the table's rows) is never
// read from a table; its y row, mean and rstd are NaN (visibly wrong, as PyTorch's device assert
// would stop), and it contributes no gradient anywhere. The host API checks only the sizes.
//
// The table gradients are accumulated in float, never in the storage type. Rows of 33..256 16-byte
// vectors (BERT's widths) take a backward that first sorts the tokens by position id: the de row of a
// word id used by one token is rounded once, from float, straight into dword; the rows of a word id
// used more than once, and the position and token-type rows, are summed in float (registers, shared
// memory, float atomics into a float workspace) and rounded once at the end; unused rows are zero.
// Other rows add every de with float atomics into a float workspace (the word table's compact: a
// row per distinct word id of the batch, not per vocabulary row), then one pass writes every row of
// the three tables once (converted, or zero). Sums are exact to float rounding but their order is
// not fixed (atomics): two runs may differ in the last bits of float before the final rounding.
// dgamma and dbeta are reduced in two stages without atomics, as LayerNorm's.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/bias_dropout_residual_layernorm.h"  // Dropout
#include "kernels/dtype.h"

namespace fusekit::kernels {

struct EmbeddingLayerNormSizes {
  int tokens = 0;         // rows of y (batch x sequence)
  int hidden = 0;         // H
  int vocab = 0;          // rows of the word table
  int max_positions = 0;  // rows of the position table
  int token_types = 0;    // rows of the token-type table
};

struct EmbeddingLayerNormForwardTensors {
  const int64_t* word_ids = nullptr;        // [tokens]
  const int64_t* position_ids = nullptr;    // [tokens]
  const int64_t* token_type_ids = nullptr;  // [tokens]
  const void* word = nullptr;               // [vocab, H]
  const void* position = nullptr;           // [max_positions, H]
  const void* token_type = nullptr;         // [token_types, H]
  const void* gamma = nullptr;              // [H]
  const void* beta = nullptr;               // [H]
  void* y = nullptr;                        // [tokens, H]
  float* mean = nullptr;                    // [tokens]
  float* rstd = nullptr;                    // [tokens]
  // Training: the workspace that embedding_layernorm_backward will be given (its bytes from
  // embedding_layernorm_backward_workspace_bytes for these sizes), or null. Given it, the forward
  // also counts the ids for the backward's sort (the count of each word and position id, each
  // token's rank within its position), so that the backward, called with ids_counted on the same
  // workspace and ids, does not count them again (two kernels fewer after the forward's). Between
  // the two, nothing else may use the workspace.
  void* backward_workspace = nullptr;
};

struct EmbeddingLayerNormBackwardTensors {
  const void* dy = nullptr;           // [tokens, H]
  const int64_t* word_ids = nullptr;  // the forward's
  const int64_t* position_ids = nullptr;
  const int64_t* token_type_ids = nullptr;
  const void* word = nullptr;  // the forward's tables, to recompute e
  const void* position = nullptr;
  const void* token_type = nullptr;
  const void* gamma = nullptr;  // [H]
  const float* mean = nullptr;  // [tokens], from the forward
  const float* rstd = nullptr;  // [tokens], from the forward
  void* dword = nullptr;        // [vocab, H], every row written
  void* dposition = nullptr;    // [max_positions, H], every row written
  void* dtoken_type = nullptr;  // [token_types, H], every row written
  void* dgamma = nullptr;       // [H]
  void* dbeta = nullptr;        // [H]
  // The forward was given this backward's workspace (backward_workspace) with the same ids and
  // sizes, and nothing but backwards has used it since: its counts are used (by this backward and
  // any more on the same forward). Otherwise the backward counts the ids.
  bool ids_counted = false;
};

// Throws std::invalid_argument for p outside [0, 1), a size out of range or a missing tensor.
void embedding_layernorm_forward(DType dtype, const EmbeddingLayerNormForwardTensors& tensors, Dropout dropout,
                                 EmbeddingLayerNormSizes sizes, float eps, cudaStream_t stream);

// Bytes of workspace embedding_layernorm_backward needs for these sizes.
size_t embedding_layernorm_backward_workspace_bytes(EmbeddingLayerNormSizes sizes);

// The same `dropout` as the forward's: the mask is regenerated from it. `workspace` needs no
// initialization (unless ids_counted: then the forward wrote its counts there).
void embedding_layernorm_backward(DType dtype, const EmbeddingLayerNormBackwardTensors& tensors, Dropout dropout,
                                  EmbeddingLayerNormSizes sizes, void* workspace, cudaStream_t stream);

}  // namespace fusekit::kernels
