// The device memory of the fused BERT MLM training step, planned once for the config's (largest)
// batch x sequence: every buffer the step uses, at an aligned offset in one arena, so that a step
// allocates nothing.
//
// Saved by the forward for the backward (per layer, for all layers at once):
//   qkv [N, 3H]                 the packed projection's output: the attention backward reads Q, K, V
//   attention.context [N, H]    the attention output: the attention backward's `out`, the output
//                               projection's input (its weight gradient)
//   attention.lse [B, heads, S] float: the softmax's log-sum-exp; probabilities are recomputed from
//                               it (kernels/bert_attention.h), never stored
//   attention.dense [N, H]      the output projection without its bias: the post-LN backward of
//                               bias + dropout + residual + LayerNorm recomputes h from it, the bias
//                               and the residual (kernels/bias_dropout_residual_layernorm.h)
//   attention.layernorm [N, H]  y, the residual stream: the FFN's input and the next residual
//   ffn.up [N, I]               the up projection without its bias: bias + GELU's backward recomputes
//                               the pre-activation from it (kernels/bias_gelu.h)
//   ffn.gelu [N, I]             GELU's output: the down projection's input (its weight gradient)
//   ffn.down [N, H]             the down projection without its bias (as attention.dense)
//   output.layernorm [N, H]     the layer's output, the next layer's input
//   *.mean, *.rstd [N]          float, each LayerNorm's statistics
// The embeddings save their LayerNorm output and statistics; the word/position/type sum is
// recomputed from the tables by the backward (kernels/embedding_layernorm.h).
// The MLM head runs on the M masked rows only, gathered (M = batch x max_masked_per_sequence;
// models/mlm_data.h's gathered_rows pads a batch's rows to M with distinct unmasked positions and
// ignored labels, so that kernels/gather_rows.h's scatter back has distinct indices): gathered,
// dense, gelu and layernorm [M, H], logits [M, vocab] (the cross-entropy backward reads the logits
// and the log-sum-exp: kernels/cross_entropy.h), losses and logsumexp [M] float, the mean loss and
// the count of rows.
//
// Recomputed, never stored: every dropout mask (regenerated from its Philox seed and offset by the
// backward kernels), the attention scores and probabilities, the LayerNorm inputs h.
//
// Gradients of activations are scratch shared by all layers (the backward walks the layers one at a
// time): four [N, H] buffers (the residual stream's gradient, ping-ponged, and the two branch
// gradients that are summed into it), one [N, I], one [N, 3H], and the head's [M, vocab] and two
// [M, H]. One backward workspace is shared by the kernels that take one (they run one after another
// on one stream), except the embedding's: its forward writes id counts there for its backward.
//
// Not in the arena: parameters and their gradients (two flat buffers of the layout's size) and the
// AdamW state (fp32 moments, optionally fp32 master weights), which kernels/adamw.h's AdamWTrainer
// owns; and the LinearContext's cuBLASLt workspace and scratch (kernels/linear.h). The plan counts
// the trainer's buffers in total_bytes() so that a report shows the whole step's memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "models/bert_config.h"

namespace fusekit::models {

enum class BufferKind { input, saved, output, gradient, workspace };
const char* buffer_kind_name(BufferKind kind);  // "input", "saved", "output", "gradient", "workspace"

enum class ElementType { storage, f32, i32, i64 };  // storage: the config's fp16 or bf16

struct PlannedBuffer {
  std::string name;  // "layer.3.qkv", "head.logits", "grad.hidden.0"
  BufferKind kind = BufferKind::saved;
  int layer = -1;              // the encoder layer, or -1
  std::vector<int64_t> shape;  // elements; empty for a workspace (bytes only)
  ElementType type = ElementType::storage;
  size_t bytes = 0;   // unpadded
  size_t offset = 0;  // into the arena, a multiple of MemoryPlan::kAlignment
};

// Buffers laid end to end in one arena, each at a multiple of kAlignment: what every model's plan
// (BERT's MemoryPlan below, models/swin_memory_plan.h) is built of.
class BufferArena {
 public:
  static constexpr size_t kAlignment = 256;  // cudaMalloc's alignment: every buffer as if allocated alone

  explicit BufferArena(kernels::DType storage) : storage_(storage) {}
  void add(std::string name, BufferKind kind, int layer, std::vector<int64_t> shape, ElementType type);
  void add_workspace(std::string name, size_t bytes);

  const std::vector<PlannedBuffer>& buffers() const { return buffers_; }
  const PlannedBuffer& buffer(std::string_view name) const;  // throws std::out_of_range
  size_t arena_bytes() const { return arena_bytes_; }
  size_t bytes_of(BufferKind kind) const;  // unpadded sum
  // One row per buffer (name, kind, shape, type, bytes, offset), then the totals per kind and the arena.
  std::string table() const;

 private:
  kernels::DType storage_;
  std::vector<PlannedBuffer> buffers_;
  size_t arena_bytes_ = 0;
};

std::string mebibytes(size_t bytes);  // "12.34 MiB"

// The AdamW trainer's buffers outside a plan's arena (kernels/adamw.h): parameters and gradients in
// the storage type, exp_avg and exp_avg_sq (and the master weights) in fp32.
size_t adamw_trainer_bytes(size_t parameter_bytes, size_t parameter_elements, bool master_weights);
// A plan table's closing lines: the trainer's bytes without and with master weights, and the totals.
std::string trainer_and_total_lines(size_t arena_bytes, size_t parameter_bytes, size_t parameter_elements);

// Bytes of the kernels' backward workspaces for the plan's shapes, from their *_workspace_bytes
// functions (kernels/*.h), which the GPU step calls: they depend on the device. Zero leaves one out.
// bert_attention's is known from its header (a float per sequence, head and query) and is always
// counted.
struct KernelWorkspaces {
  size_t embedding_layernorm = 0;  // embedding_layernorm_backward_workspace_bytes({N, H, vocab, positions, types})
  size_t layernorm = 0;            // layernorm_backward_workspace_bytes(M, H)
  size_t bias_dropout_residual_layernorm = 0;  // ..._backward_workspace_bytes(N, H)
  size_t bias_gelu = 0;                        // bias_gelu_backward_workspace_bytes(N, I) (and (M, H))
};

class MemoryPlan {
 public:
  static constexpr size_t kAlignment = BufferArena::kAlignment;

  MemoryPlan(const BertConfig& config, const KernelWorkspaces& workspaces = {});

  const BertConfig& config() const { return config_; }
  int masked_rows() const { return masked_rows_; }  // M
  const std::vector<PlannedBuffer>& buffers() const { return arena_.buffers(); }
  const PlannedBuffer& buffer(std::string_view name) const { return arena_.buffer(name); }
  size_t arena_bytes() const { return arena_.arena_bytes(); }
  size_t bytes_of(BufferKind kind) const { return arena_.bytes_of(kind); }
  // Parameters, gradients and the AdamW state outside the arena (see above), for the report.
  size_t parameter_bytes() const { return parameter_bytes_; }
  size_t trainer_bytes(bool master_weights) const;
  size_t total_bytes(bool master_weights) const { return arena_bytes() + trainer_bytes(master_weights); }

  // A table for reports: one row per buffer (name, kind, shape, type, bytes, offset), then totals.
  std::string table() const;

 private:
  void add(std::string name, BufferKind kind, int layer, std::vector<int64_t> shape, ElementType type) {
    arena_.add(std::move(name), kind, layer, std::move(shape), type);
  }
  void add_workspace(std::string name, size_t bytes) { arena_.add_workspace(std::move(name), bytes); }

  BertConfig config_;
  BufferArena arena_;
  int masked_rows_ = 0;
  size_t parameter_bytes_ = 0;
  size_t parameter_elements_ = 0;
};

}  // namespace fusekit::models
