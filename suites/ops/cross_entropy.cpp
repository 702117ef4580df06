// Operator-suite cases for cross-entropy over logits: forward, and forward + backward, fused and
// (where libtorch is built in) the libtorch baseline, on rotated input sets. Label smoothing 0.1 and
// ignore_index -100, with about 10% of the labels ignored.
//
// Bytes that must move: forward reads logits and labels and writes losses and logsumexp; backward
// reads logits, labels and logsumexp and writes dlogits. (The scalars, the mean loss, the count and
// dloss, are left out; an ignored row's logits need not be read by the backward, but are counted.)
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "kernels/cross_entropy.h"
#include "suites/ops/operands.h"
#include "suites/ops/ops_suite.h"

#include "suites/ops/torch_operands.h"

#ifdef FUSEKIT_WITH_TORCH
#include "baselines/cross_entropy.h"
#endif

namespace fusekit::suites {
namespace {

constexpr float kSmoothing = 0.1f;
constexpr int64_t kIgnore = -100;
constexpr double kIgnoredShare = 0.1;

// Labels uniform over the vocabulary, about kIgnoredShare of them ignore_index, from a fixed seed.
std::vector<int64_t> suite_labels(int rows, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> label(0, vocab - 1);
  std::bernoulli_distribution ignored(kIgnoredShare);
  std::vector<int64_t> labels(rows);
  for (auto& l : labels) l = ignored(rng) ? kIgnore : label(rng);
  return labels;
}

// The operands of one case, allocated by setup and freed by release.
struct CrossEntropyOperands {
  int sets = 0;
  std::vector<DeviceBuffer> logits, labels, losses, logsumexp, dlogits;
  DeviceBuffer mean_loss, valid_rows, dloss, dloss_storage;

  CrossEntropyOperands(Shape2 shape, kernels::DType dtype, bool backward, cudaStream_t stream) {
    const size_t n = static_cast<size_t>(shape.rows) * shape.columns;
    const size_t bytes = n * kernels::dtype_size(dtype);
    sets = rotation_sets(bytes * (backward ? 2 : 1));
    for (int s = 0; s < sets; ++s) {
      logits.emplace_back(bytes);
      // Logits uniform in [-4, 4): a softmax that is neither flat nor one-hot.
      fill_random(logits.back().get(), n, dtype, 5000 + s, 4.0f, 0.0f, stream);
      const std::vector<int64_t> host = suite_labels(shape.rows, shape.columns, 6000 + s);
      labels.emplace_back(host.size() * sizeof(int64_t));
      FUSEKIT_CUDA_CHECK(cudaMemcpyAsync(labels.back().get(), host.data(), host.size() * sizeof(int64_t),
                                         cudaMemcpyHostToDevice, stream));
      FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));  // `host` goes out of scope
      losses.emplace_back(shape.rows * sizeof(float));
      logsumexp.emplace_back(shape.rows * sizeof(float));
      if (backward) dlogits.emplace_back(bytes);
    }
    mean_loss = DeviceBuffer(sizeof(float));
    valid_rows = DeviceBuffer(sizeof(int));
    // The gradient of the mean loss: 1, as a float for the fused backward and in the storage type
    // (the loss's dtype) for the baseline's, which would otherwise add a cast kernel.
    dloss = DeviceBuffer(sizeof(float));
    fill_random(dloss.get(), 1, kernels::DType::f32, 7, 0.0f, 1.0f, stream);
    dloss_storage = DeviceBuffer(kernels::dtype_size(dtype));
    fill_random(dloss_storage.get(), 1, dtype, 7, 0.0f, 1.0f, stream);
    FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
};

double bytes_moved(Shape2 shape, kernels::DType dtype, bool backward) {
  const double n = static_cast<double>(shape.rows) * shape.columns, s = kernels::dtype_size(dtype);
  const double rows = shape.rows;
  const double forward = n * s + rows * 8 + 2 * rows * 4;
  const double back = n * s + rows * 8 + rows * 4 + n * s;
  return backward ? forward + back : forward;
}

std::vector<Case> cross_entropy_cases(Shape2 shape, kernels::DType dtype, bool backward) {
  store::CaseInfo info =
      make_case_info("cross_entropy", std::to_string(shape.rows) + "x" + std::to_string(shape.columns), dtype, backward,
                     bytes_moved(shape, dtype, backward));
  auto operands = std::make_shared<std::optional<CrossEntropyOperands>>();
  auto setup = [operands, shape, dtype, backward](cudaStream_t stream) {
    operands->emplace(shape, dtype, backward, stream);
  };
  auto release = [operands] { operands->reset(); };

  std::vector<Case> cases;
  info.variant = "fused";
  cases.push_back(
      {info,
       [operands, shape, dtype, backward](cudaStream_t stream, int rep) {
         CrossEntropyOperands& o = **operands;
         const int s = rep % o.sets;
         kernels::cross_entropy_forward(dtype, o.logits[s].get(), o.labels[s].as<int64_t>(), o.losses[s].as<float>(),
                                        o.logsumexp[s].as<float>(), o.mean_loss.as<float>(), o.valid_rows.as<int>(),
                                        shape.rows, shape.columns, kIgnore, kSmoothing, stream);
         if (backward) {
           kernels::cross_entropy_backward(dtype, o.logits[s].get(), o.labels[s].as<int64_t>(),
                                           o.logsumexp[s].as<float>(), o.valid_rows.as<int>(), o.dloss.as<float>(),
                                           o.dlogits[s].get(), shape.rows, shape.columns, kIgnore, kSmoothing, stream);
         }
       },
       setup, release});
#ifdef FUSEKIT_WITH_TORCH
  info.variant = "baseline";
  cases.push_back({info,
                   [operands, shape, dtype, backward](cudaStream_t stream, int rep) {
                     CrossEntropyOperands& o = **operands;
                     const int s = rep % o.sets;
                     TorchStream on_stream(stream);
                     const at::Tensor logits = wrap(o.logits[s], {shape.rows, shape.columns}, torch_type(dtype));
                     const at::Tensor labels = wrap(o.labels[s], {shape.rows}, at::kLong);
                     if (backward) {
                       baselines::cross_entropy_forward_backward(logits, labels, kIgnore, kSmoothing,
                                                                 wrap(o.dloss_storage, {}, torch_type(dtype)));
                     } else {
                       baselines::cross_entropy_forward(logits, labels, kIgnore, kSmoothing);
                     }
                   },
                   setup, release});
#endif
  return cases;
}

}  // namespace

OpDefinition cross_entropy_op() {
  OpDefinition op;
  op.name = "cross_entropy";
  op.shape_syntax = "ROWSxVOCAB";
  // Rows x vocabulary: BERT MLM at batch 64 x 128 tokens, every position and the 15% masked ones;
  // GPT-2's vocabulary at 8192 tokens; a 64K vocabulary; Swin classification at batch 128 on
  // ImageNet-1K and -22K.
  op.shapes = {"8192x30522", "1280x30522", "8192x50257", "4096x65536", "128x1000", "128x21841"};
  op.cases = [](const std::string& shape, kernels::DType dtype, bool backward) {
    return cross_entropy_cases(parse_shape2(shape), dtype, backward);
  };
  return op;
}

}  // namespace fusekit::suites
