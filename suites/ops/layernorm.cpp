// Operator-suite cases for LayerNorm: forward, and forward + backward, fused and (where libtorch is
// built in) the libtorch baseline, on rotated input sets.
//
// A forward-only case is inference, as the peers time it (under no_grad): the fused forward saves no
// mean and rstd. Bytes that must move: the forward reads x, gamma, beta and writes y (and mean, rstd
// when a backward follows); the backward reads dy, x, gamma, mean, rstd and writes dx, dgamma, dbeta.
#include <memory>
#include <optional>
#include <vector>

#include "kernels/layernorm.h"
#include "suites/ops/operands.h"
#include "suites/ops/ops_suite.h"

#include "suites/ops/torch_operands.h"

#ifdef FUSEKIT_WITH_TORCH
#include "baselines/layernorm.h"
#endif

namespace fusekit::suites {
namespace {

constexpr float kEps = 1e-5f;

// The operands of one case, allocated by setup and freed by release.
struct LayerNormOperands {
  int sets = 0;
  std::vector<DeviceBuffer> x, y, dy, dx, mean, rstd;
  DeviceBuffer gamma, beta, dgamma, dbeta, workspace;

  LayerNormOperands(Shape2 shape, kernels::DType dtype, bool backward, cudaStream_t stream) {
    const size_t n = static_cast<size_t>(shape.rows) * shape.columns;
    const size_t bytes = n * kernels::dtype_size(dtype);
    sets = rotation_sets(bytes * (backward ? 4 : 2));
    for (int s = 0; s < sets; ++s) {
      x.emplace_back(bytes);
      y.emplace_back(bytes);
      mean.emplace_back(shape.rows * sizeof(float));
      rstd.emplace_back(shape.rows * sizeof(float));
      fill_random(x.back().get(), n, dtype, 1000 + s, 2.0f, 0.5f, stream);
      if (backward) {
        dy.emplace_back(bytes);
        dx.emplace_back(bytes);
        fill_random(dy.back().get(), n, dtype, 2000 + s, 1.0f, 0.0f, stream);
      }
    }
    const size_t parameter_bytes = shape.columns * kernels::dtype_size(dtype);
    gamma = DeviceBuffer(parameter_bytes);
    beta = DeviceBuffer(parameter_bytes);
    fill_random(gamma.get(), shape.columns, dtype, 3, 0.2f, 1.0f, stream);
    fill_random(beta.get(), shape.columns, dtype, 4, 0.1f, 0.0f, stream);
    if (backward) {
      dgamma = DeviceBuffer(parameter_bytes);
      dbeta = DeviceBuffer(parameter_bytes);
      workspace = DeviceBuffer(kernels::layernorm_backward_workspace_bytes(shape.rows, shape.columns));
    }
    FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
};

double bytes_moved(Shape2 shape, kernels::DType dtype, bool backward) {
  const double n = static_cast<double>(shape.rows) * shape.columns, s = kernels::dtype_size(dtype);
  const double forward = 2 * n * s + 2 * shape.columns * s;
  const double statistics = 2.0 * shape.rows * 4;  // mean and rstd, written and read once each
  const double back = 3 * n * s + 3 * shape.columns * s;
  return backward ? forward + back + 2 * statistics : forward;
}

std::vector<Case> layernorm_cases(Shape2 shape, kernels::DType dtype, bool backward) {
  store::CaseInfo info = make_case_info("layernorm", std::to_string(shape.rows) + "x" + std::to_string(shape.columns),
                                        dtype, backward, bytes_moved(shape, dtype, backward));
  auto operands = std::make_shared<std::optional<LayerNormOperands>>();
  auto setup = [operands, shape, dtype, backward](cudaStream_t stream) {
    operands->emplace(shape, dtype, backward, stream);
  };
  auto release = [operands] { operands->reset(); };

  std::vector<Case> cases;
  info.variant = "fused";
  cases.push_back({info,
                   [operands, shape, dtype, backward](cudaStream_t stream, int rep) {
                     LayerNormOperands& o = **operands;
                     const int s = rep % o.sets;
                     float* mean = backward ? o.mean[s].as<float>() : nullptr;  // null: inference
                     float* rstd = backward ? o.rstd[s].as<float>() : nullptr;
                     kernels::layernorm_forward(dtype, o.x[s].get(), o.gamma.get(), o.beta.get(), o.y[s].get(), mean,
                                                rstd, shape.rows, shape.columns, kEps, stream);
                     if (backward) {
                       kernels::layernorm_backward(dtype, o.dy[s].get(), o.x[s].get(), o.gamma.get(),
                                                   o.mean[s].as<float>(), o.rstd[s].as<float>(), o.dx[s].get(),
                                                   o.dgamma.get(), o.dbeta.get(), shape.rows, shape.columns,
                                                   o.workspace.get(), stream);
                     }
                   },
                   setup, release});
#ifdef FUSEKIT_WITH_TORCH
  info.variant = "baseline";
  cases.push_back({info,
                   [operands, shape, dtype, backward](cudaStream_t stream, int rep) {
                     LayerNormOperands& o = **operands;
                     const int s = rep % o.sets;
                     TorchStream on_stream(stream);
                     const at::ScalarType type = torch_type(dtype);
                     const at::Tensor x = wrap(o.x[s], {shape.rows, shape.columns}, type);
                     const at::Tensor gamma = wrap(o.gamma, {shape.columns}, type);
                     const at::Tensor beta = wrap(o.beta, {shape.columns}, type);
                     if (backward) {
                       baselines::layernorm_forward_backward(x, gamma, beta,
                                                             wrap(o.dy[s], {shape.rows, shape.columns}, type), kEps);
                     } else {
                       baselines::layernorm_forward(x, gamma, beta, kEps);
                     }
                   },
                   setup, release});
#endif
  return cases;
}

}  // namespace

OpDefinition layernorm_op() {
  OpDefinition op;
  op.name = "layernorm";
  op.shape_syntax = "ROWSxCOLUMNS";
  // Token counts x hidden sizes: BERT-base and -large at batch 64 x seq 128 and 32 x 512; Swin
  // stages at batch 128 (224 x 224 input: 56^2, 28^2, 14^2, 7^2 tokens per image).
  op.shapes = {"8192x768",   "8192x1024",  "16384x1024", "401408x96",
               "401408x128", "401408x192", "100352x384", "6272x768"};
  op.cases = [](const std::string& shape, kernels::DType dtype, bool backward) {
    return layernorm_cases(parse_shape2(shape), dtype, backward);
  };
  return op;
}

}  // namespace fusekit::suites
