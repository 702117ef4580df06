#include "models/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "models/bert_parameters.h"
#include "models/mlm_data.h"

namespace fusekit::models {
namespace {

size_t element_bytes(ElementType type, kernels::DType storage) {
  switch (type) {
    case ElementType::storage:
      return dtype_bytes(storage);
    case ElementType::f32:
    case ElementType::i32:
      return 4;
    case ElementType::i64:
      return 8;
  }
  return 0;
}

const char* type_name(ElementType type, kernels::DType storage) {
  switch (type) {
    case ElementType::storage:
      return dtype_spec_name(storage);
    case ElementType::f32:
      return "fp32";
    case ElementType::i32:
      return "int32";
    case ElementType::i64:
      return "int64";
  }
  return "?";
}

}  // namespace

std::string mebibytes(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

const char* buffer_kind_name(BufferKind kind) {
  switch (kind) {
    case BufferKind::input:
      return "input";
    case BufferKind::saved:
      return "saved";
    case BufferKind::output:
      return "output";
    case BufferKind::gradient:
      return "gradient";
    case BufferKind::workspace:
      return "workspace";
  }
  return "?";
}

MemoryPlan::MemoryPlan(const BertConfig& config, const KernelWorkspaces& workspaces)
    : config_(config), arena_(config.dtype) {
  validate(config);
  const int64_t B = config.batch, S = config.sequence, N = config.tokens(), H = config.hidden;
  const int64_t I = config.intermediate, V = config.vocab, heads = config.heads;
  masked_rows_ = config.batch * max_masked_per_sequence(config.sequence);
  const int64_t M = masked_rows_;
  using E = ElementType;
  using K = BufferKind;

  add("batch.input_ids", K::input, -1, {N}, E::i64);
  add("batch.token_type_ids", K::input, -1, {N}, E::i64);
  add("batch.position_ids", K::input, -1, {N}, E::i64);
  add("batch.lengths", K::input, -1, {B}, E::i32);
  add("batch.masked_positions", K::input, -1, {M}, E::i32);
  add("batch.masked_labels", K::input, -1, {M}, E::i64);

  add("embeddings.layernorm", K::saved, -1, {N, H}, E::storage);
  add("embeddings.layernorm.mean", K::saved, -1, {N}, E::f32);
  add("embeddings.layernorm.rstd", K::saved, -1, {N}, E::f32);
  for (int l = 0; l < config.layers; ++l) {
    const std::string p = "layer." + std::to_string(l) + ".";
    add(p + "qkv", K::saved, l, {N, 3 * H}, E::storage);
    add(p + "attention.context", K::saved, l, {N, H}, E::storage);
    add(p + "attention.lse", K::saved, l, {B, heads, S}, E::f32);
    add(p + "attention.dense", K::saved, l, {N, H}, E::storage);
    add(p + "attention.layernorm", K::saved, l, {N, H}, E::storage);
    add(p + "attention.layernorm.mean", K::saved, l, {N}, E::f32);
    add(p + "attention.layernorm.rstd", K::saved, l, {N}, E::f32);
    add(p + "ffn.up", K::saved, l, {N, I}, E::storage);
    add(p + "ffn.gelu", K::saved, l, {N, I}, E::storage);
    add(p + "ffn.down", K::saved, l, {N, H}, E::storage);
    add(p + "output.layernorm", K::saved, l, {N, H}, E::storage);
    add(p + "output.layernorm.mean", K::saved, l, {N}, E::f32);
    add(p + "output.layernorm.rstd", K::saved, l, {N}, E::f32);
  }
  add("head.gathered", K::saved, -1, {M, H}, E::storage);
  add("head.dense", K::saved, -1, {M, H}, E::storage);
  add("head.gelu", K::saved, -1, {M, H}, E::storage);
  add("head.layernorm", K::saved, -1, {M, H}, E::storage);
  add("head.layernorm.mean", K::saved, -1, {M}, E::f32);
  add("head.layernorm.rstd", K::saved, -1, {M}, E::f32);
  add("head.logits", K::saved, -1, {M, V}, E::storage);
  add("head.logsumexp", K::saved, -1, {M}, E::f32);
  add("head.losses", K::output, -1, {M}, E::f32);
  add("head.mean_loss", K::output, -1, {1}, E::f32);
  add("head.valid_rows", K::saved, -1, {1}, E::i32);

  add("grad.dloss", K::gradient, -1, {1}, E::f32);
  add("grad.logits", K::gradient, -1, {M, V}, E::storage);
  add("grad.head.0", K::gradient, -1, {M, H}, E::storage);
  add("grad.head.1", K::gradient, -1, {M, H}, E::storage);
  for (int i = 0; i < 4; ++i) add("grad.hidden." + std::to_string(i), K::gradient, -1, {N, H}, E::storage);
  add("grad.intermediate", K::gradient, -1, {N, I}, E::storage);
  add("grad.qkv", K::gradient, -1, {N, 3 * H}, E::storage);

  const size_t attention = sizeof(float) * static_cast<size_t>(B * heads * S);
  add_workspace("workspace.backward", std::max({attention, workspaces.layernorm,
                                                workspaces.bias_dropout_residual_layernorm, workspaces.bias_gelu}));
  if (workspaces.embedding_layernorm) add_workspace("workspace.embedding_backward", workspaces.embedding_layernorm);

  const BertParameterLayout layout(config, QkvLayout::packed, config.dtype);
  parameter_elements_ = layout.flat_elements();
  parameter_bytes_ = layout.flat_bytes();
}

void BufferArena::add(std::string name, BufferKind kind, int layer, std::vector<int64_t> shape, ElementType type) {
  size_t elements = 1;
  for (int64_t d : shape) elements *= static_cast<size_t>(d);
  PlannedBuffer b;
  b.name = std::move(name);
  b.kind = kind;
  b.layer = layer;
  b.shape = std::move(shape);
  b.type = type;
  b.bytes = elements * element_bytes(type, storage_);
  b.offset = arena_bytes_;
  arena_bytes_ += (b.bytes + kAlignment - 1) / kAlignment * kAlignment;
  buffers_.push_back(std::move(b));
}

void BufferArena::add_workspace(std::string name, size_t bytes) {
  PlannedBuffer b;
  b.name = std::move(name);
  b.kind = BufferKind::workspace;
  b.type = ElementType::f32;
  b.bytes = bytes;
  b.offset = arena_bytes_;
  arena_bytes_ += (bytes + kAlignment - 1) / kAlignment * kAlignment;
  buffers_.push_back(std::move(b));
}

const PlannedBuffer& BufferArena::buffer(std::string_view name) const {
  for (const PlannedBuffer& b : buffers_) {
    if (b.name == name) return b;
  }
  throw std::out_of_range("memory plan: no buffer '" + std::string(name) + "'");
}

size_t BufferArena::bytes_of(BufferKind kind) const {
  size_t bytes = 0;
  for (const PlannedBuffer& b : buffers_) {
    if (b.kind == kind) bytes += b.bytes;
  }
  return bytes;
}

std::string BufferArena::table() const {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-36s %-9s %-18s %-5s %14s %14s\n", "buffer", "kind", "shape", "type", "bytes",
                "offset");
  out += line;
  for (const PlannedBuffer& b : buffers_) {
    std::string shape;
    for (size_t i = 0; i < b.shape.size(); ++i) shape += (i ? "x" : "") + std::to_string(b.shape[i]);
    std::snprintf(line, sizeof line, "%-36s %-9s %-18s %-5s %14zu %14zu\n", b.name.c_str(), buffer_kind_name(b.kind),
                  shape.empty() ? "-" : shape.c_str(), type_name(b.type, storage_), b.bytes, b.offset);
    out += line;
  }
  for (BufferKind kind :
       {BufferKind::input, BufferKind::saved, BufferKind::output, BufferKind::gradient, BufferKind::workspace}) {
    out += std::string("  ") + buffer_kind_name(kind) + ": " + mebibytes(bytes_of(kind)) + "\n";
  }
  out += "  arena (aligned to " + std::to_string(kAlignment) + " bytes): " + mebibytes(arena_bytes_) + "\n";
  return out;
}

size_t adamw_trainer_bytes(size_t parameter_bytes, size_t parameter_elements, bool master_weights) {
  return 2 * parameter_bytes + (master_weights ? 3 : 2) * sizeof(float) * parameter_elements;
}

std::string trainer_and_total_lines(size_t arena_bytes, size_t parameter_bytes, size_t parameter_elements) {
  const size_t without = adamw_trainer_bytes(parameter_bytes, parameter_elements, false);
  const size_t with = adamw_trainer_bytes(parameter_bytes, parameter_elements, true);
  return "  parameters + gradients + AdamW state (outside the arena): " + mebibytes(without) +
         " (with fp32 master weights: " + mebibytes(with) + ")\n  total: " + mebibytes(arena_bytes + without) +
         " (with master weights: " + mebibytes(arena_bytes + with) + ")\n";
}

size_t MemoryPlan::trainer_bytes(bool master_weights) const {
  return adamw_trainer_bytes(parameter_bytes_, parameter_elements_, master_weights);
}

std::string MemoryPlan::table() const {
  return "memory plan: " + config_.spec() + ", " + std::to_string(masked_rows_) + " masked rows\n" + arena_.table() +
         trainer_and_total_lines(arena_bytes(), parameter_bytes_, parameter_elements_);
}

}  // namespace fusekit::models
