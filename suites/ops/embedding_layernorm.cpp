// Operator-suite cases for BERT's embedding layer (word + position + token-type lookups, LayerNorm,
// dropout p = 0.1): forward, and forward + backward, fused and (where libtorch is built in) the
// libtorch baseline. Shapes are TOKENSxHIDDEN; the tables are BERT's: vocabulary 30522, 512
// positions, 2 token types. Word ids are uniform in [0, 30522), token types uniform in {0, 1},
// position ids r % 512. The ids, the word table, y and dy rotate through sets larger than the L2
// (a word table is about the L2's size: one set of it would serve its gathered rows from the L2,
// which a training step, running the whole model between two embedding calls, never does); the
// small position and token-type tables are one set.
// Each repetition draws a fresh mask (the Philox offset is the repetition). Forward + backward is a
// training step's: the fused forward is given the backward's workspace and counts the ids for it.
//
// Bytes that must move: forward reads the three int64 ids, a gathered word row per token, the
// position rows in use (min(tokens, 512)) and both token-type rows once, gamma, beta and writes y,
// mean, rstd; backward reads dy, the ids, the same rows again (e is recomputed), gamma, mean, rstd
// and writes every row of the three table gradients (the whole word
// table: rows no token used are zeros, and writing them is part of the cost), dgamma, dbeta. Not
// counted: the fused backward's float accumulators (at most 4 x tokens x H bytes zeroed, added to
// and read back), which are its own overhead, and the mask (regenerated).
#include <algorithm>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/embedding_layernorm.h"
#include "suites/ops/operands.h"
#include "suites/ops/ops_suite.h"

#include "suites/ops/torch_operands.h"

#ifdef FUSEKIT_WITH_TORCH
#include "baselines/embedding_layernorm.h"
#endif

namespace fusekit::suites {
namespace {

constexpr float kEps = 1e-12f;  // BERT's layer_norm_eps
constexpr float kDropout = 0.1f;
constexpr uint64_t kSeed = 0xe111;
constexpr int kVocab = 30522, kPositions = 512, kTypes = 2;

kernels::EmbeddingLayerNormSizes sizes_of(Shape2 shape) {
  return {shape.rows, shape.columns, kVocab, kPositions, kTypes};
}

DeviceBuffer upload_ids(const std::vector<int64_t>& host, cudaStream_t stream) {
  DeviceBuffer buffer(host.size() * sizeof(int64_t));
  FUSEKIT_CUDA_CHECK(
      cudaMemcpyAsync(buffer.get(), host.data(), host.size() * sizeof(int64_t), cudaMemcpyHostToDevice, stream));
  FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));  // `host` is freed on return
  return buffer;
}

double bytes_moved(Shape2 shape, kernels::DType dtype, bool backward) {
  const double n = static_cast<double>(shape.rows) * shape.columns, s = kernels::dtype_size(dtype);
  const double ids = 3.0 * 8 * shape.rows, stats = 2.0 * 4 * shape.rows, h = shape.columns;
  const double small_tables = (std::min(shape.rows, kPositions) + kTypes) * h * s;
  const double forward = ids + n * s + small_tables + 2 * h * s + n * s + stats;
  const double back =
      n * s + ids + n * s + small_tables + h * s + stats + (kVocab + kPositions + kTypes) * h * s + 2 * h * s;
  return backward ? forward + back : forward;
}

// The operands of one case, allocated by setup and freed by release.
struct EmbeddingLayerNormOperands {
  int sets = 0;
  std::vector<DeviceBuffer> word_ids, position_ids, type_ids, y, mean, rstd, dy;
  std::vector<DeviceBuffer> word;  // one word table per set
  DeviceBuffer position, type, gamma, beta, dword, dposition, dtype, dgamma, dbeta, workspace;

  EmbeddingLayerNormOperands(Shape2 shape, kernels::DType dtype_, bool backward, cudaStream_t stream) {
    const size_t n = static_cast<size_t>(shape.rows) * shape.columns, s = kernels::dtype_size(dtype_);
    sets = rotation_sets(static_cast<size_t>(bytes_moved(shape, dtype_, backward)));
    for (int set = 0; set < sets; ++set) {
      std::mt19937_64 rng(7000 + set);
      std::uniform_int_distribution<int64_t> word_id(0, kVocab - 1), type_id(0, kTypes - 1);
      std::vector<int64_t> words(shape.rows), positions(shape.rows), types(shape.rows);
      for (int r = 0; r < shape.rows; ++r) {
        words[r] = word_id(rng);
        positions[r] = r % kPositions;
        types[r] = type_id(rng);
      }
      word_ids.push_back(upload_ids(words, stream));
      word.emplace_back(static_cast<size_t>(kVocab) * shape.columns * s);
      fill_random(word.back().get(), static_cast<size_t>(kVocab) * shape.columns, dtype_, 11 + 100 * set, 0.1f, 0.0f,
                  stream);
      position_ids.push_back(upload_ids(positions, stream));
      type_ids.push_back(upload_ids(types, stream));
      y.emplace_back(n * s);
      mean.emplace_back(shape.rows * sizeof(float));
      rstd.emplace_back(shape.rows * sizeof(float));
      if (backward) {
        dy.emplace_back(n * s);
        fill_random(dy.back().get(), n, dtype_, 2000 + set, 1.0f, 0.0f, stream);
      }
    }
    const size_t row_bytes = shape.columns * s;
    position = DeviceBuffer(kPositions * row_bytes);
    type = DeviceBuffer(kTypes * row_bytes);
    fill_random(position.get(), static_cast<size_t>(kPositions) * shape.columns, dtype_, 12, 0.1f, 0.0f, stream);
    fill_random(type.get(), static_cast<size_t>(kTypes) * shape.columns, dtype_, 13, 0.1f, 0.0f, stream);
    gamma = DeviceBuffer(row_bytes);
    beta = DeviceBuffer(row_bytes);
    fill_random(gamma.get(), shape.columns, dtype_, 3, 0.2f, 1.0f, stream);
    fill_random(beta.get(), shape.columns, dtype_, 4, 0.1f, 0.0f, stream);
    if (backward) {
      dword = DeviceBuffer(kVocab * row_bytes);
      dposition = DeviceBuffer(kPositions * row_bytes);
      dtype = DeviceBuffer(kTypes * row_bytes);
      dgamma = DeviceBuffer(row_bytes);
      dbeta = DeviceBuffer(row_bytes);
      workspace = DeviceBuffer(kernels::embedding_layernorm_backward_workspace_bytes(sizes_of(shape)));
    }
    FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
};

std::vector<Case> embedding_layernorm_cases(Shape2 shape, kernels::DType dtype, bool backward) {
  store::CaseInfo info =
      make_case_info("embedding_layernorm", std::to_string(shape.rows) + "x" + std::to_string(shape.columns), dtype,
                     backward, bytes_moved(shape, dtype, backward));
  auto operands = std::make_shared<std::optional<EmbeddingLayerNormOperands>>();
  auto setup = [operands, shape, dtype, backward](cudaStream_t stream) {
    operands->emplace(shape, dtype, backward, stream);
  };
  auto release = [operands] { operands->reset(); };

  std::vector<Case> cases;
  info.variant = "fused";
  cases.push_back({info,
                   [operands, shape, dtype, backward](cudaStream_t stream, int rep) {
                     EmbeddingLayerNormOperands& o = **operands;
                     const int s = rep % o.sets;
                     const kernels::Dropout dropout{kDropout, kSeed, static_cast<uint64_t>(rep)};
                     kernels::EmbeddingLayerNormForwardTensors forward;
                     forward.word_ids = o.word_ids[s].as<int64_t>();
                     forward.position_ids = o.position_ids[s].as<int64_t>();
                     forward.token_type_ids = o.type_ids[s].as<int64_t>();
                     forward.word = o.word[s].get();
                     forward.position = o.position.get();
                     forward.token_type = o.type.get();
                     forward.gamma = o.gamma.get();
                     forward.beta = o.beta.get();
                     forward.y = o.y[s].get();
                     forward.mean = o.mean[s].as<float>();
                     forward.rstd = o.rstd[s].as<float>();
                     // Training: the forward also counts the ids for the backward.
                     if (backward) forward.backward_workspace = o.workspace.get();
                     kernels::embedding_layernorm_forward(dtype, forward, dropout, sizes_of(shape), kEps, stream);
                     if (backward) {
                       kernels::EmbeddingLayerNormBackwardTensors grads;
                       grads.dy = o.dy[s].get();
                       grads.word_ids = forward.word_ids;
                       grads.position_ids = forward.position_ids;
                       grads.token_type_ids = forward.token_type_ids;
                       grads.word = forward.word;
                       grads.position = forward.position;
                       grads.token_type = forward.token_type;
                       grads.gamma = forward.gamma;
                       grads.mean = forward.mean;
                       grads.rstd = forward.rstd;
                       grads.dword = o.dword.get();
                       grads.dposition = o.dposition.get();
                       grads.dtoken_type = o.dtype.get();
                       grads.dgamma = o.dgamma.get();
                       grads.dbeta = o.dbeta.get();
                       grads.ids_counted = true;
                       kernels::embedding_layernorm_backward(dtype, grads, dropout, sizes_of(shape), o.workspace.get(),
                                                             stream);
                     }
                   },
                   setup, release});
#ifdef FUSEKIT_WITH_TORCH
  info.variant = "baseline";
  cases.push_back({info,
                   [operands, shape, dtype, backward](cudaStream_t stream, int rep) {
                     EmbeddingLayerNormOperands& o = **operands;
                     const int s = rep % o.sets;
                     TorchStream on_stream(stream);
                     const at::ScalarType type = torch_type(dtype);
                     baselines::EmbeddingLayerNormInputs in;
                     in.word_ids = wrap(o.word_ids[s], {shape.rows}, at::kLong);
                     in.position_ids = wrap(o.position_ids[s], {shape.rows}, at::kLong);
                     in.token_type_ids = wrap(o.type_ids[s], {shape.rows}, at::kLong);
                     in.word = wrap(o.word[s], {kVocab, shape.columns}, type);
                     in.position = wrap(o.position, {kPositions, shape.columns}, type);
                     in.token_type = wrap(o.type, {kTypes, shape.columns}, type);
                     in.gamma = wrap(o.gamma, {shape.columns}, type);
                     in.beta = wrap(o.beta, {shape.columns}, type);
                     if (backward) {
                       baselines::embedding_layernorm_forward_backward(
                           in, wrap(o.dy[s], {shape.rows, shape.columns}, type), kDropout, kEps);
                     } else {
                       baselines::embedding_layernorm_forward(in, kDropout, kEps);
                     }
                   },
                   setup, release});
#endif
  return cases;
}

}  // namespace

OpDefinition embedding_layernorm_op() {
  OpDefinition op;
  op.name = "embedding_layernorm";
  op.shape_syntax = "TOKENSxHIDDEN";
  // BERT-base (768) and -large (1024) at batch 64 x sequence 128 and 32 x 512 tokens.
  op.shapes = {"8192x768", "16384x768", "8192x1024", "16384x1024"};
  op.cases = [](const std::string& shape, kernels::DType dtype, bool backward) {
    return embedding_layernorm_cases(parse_shape2(shape), dtype, backward);
  };
  return op;
}

}  // namespace fusekit::suites
