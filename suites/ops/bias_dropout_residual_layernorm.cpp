// Operator-suite cases for bias + dropout + residual + LayerNorm, post-LN order (BERT), p = 0.1:
// forward, and forward + backward, fused and (where libtorch is built in) the libtorch baseline,
// on rotated input sets. Each repetition draws a fresh mask (the Philox offset is the repetition).
//
// Bytes that must move: forward reads x, residual, bias, gamma, beta and writes y, mean, rstd;
// backward reads dy, x, residual (post-LN recomputes h from them), bias, gamma, mean, rstd and
// writes dx, dresidual, dbias, dgamma, dbeta. The mask moves no bytes: it is regenerated.
#include <memory>
#include <optional>
#include <vector>

#include "kernels/bias_dropout_residual_layernorm.h"
#include "suites/ops/operands.h"
#include "suites/ops/ops_suite.h"

#include "suites/ops/torch_operands.h"

#ifdef FUSEKIT_WITH_TORCH
#include "baselines/bias_dropout_residual_layernorm.h"
#endif

namespace fusekit::suites {
namespace {

constexpr float kEps = 1e-5f;
constexpr float kDropout = 0.1f;
constexpr uint64_t kSeed = 0x5eed;

// The operands of one case, allocated by setup and freed by release.
struct BiasDropoutResidualLayerNormOperands {
  int sets = 0;
  std::vector<DeviceBuffer> x, residual, y, mean, rstd, dy, dx, dresidual;
  DeviceBuffer bias, gamma, beta, dbias, dgamma, dbeta, workspace;

  BiasDropoutResidualLayerNormOperands(Shape2 shape, kernels::DType dtype, bool backward, cudaStream_t stream) {
    const size_t n = static_cast<size_t>(shape.rows) * shape.columns;
    const size_t bytes = n * kernels::dtype_size(dtype);
    sets = rotation_sets(bytes * (backward ? 6 : 3));
    for (int s = 0; s < sets; ++s) {
      x.emplace_back(bytes);
      residual.emplace_back(bytes);
      y.emplace_back(bytes);
      mean.emplace_back(shape.rows * sizeof(float));
      rstd.emplace_back(shape.rows * sizeof(float));
      fill_random(x.back().get(), n, dtype, 1000 + s, 1.0f, 0.0f, stream);
      fill_random(residual.back().get(), n, dtype, 5000 + s, 2.0f, 0.5f, stream);
      if (backward) {
        dy.emplace_back(bytes);
        dx.emplace_back(bytes);
        dresidual.emplace_back(bytes);
        fill_random(dy.back().get(), n, dtype, 2000 + s, 1.0f, 0.0f, stream);
      }
    }
    const size_t parameter_bytes = shape.columns * kernels::dtype_size(dtype);
    bias = DeviceBuffer(parameter_bytes);
    gamma = DeviceBuffer(parameter_bytes);
    beta = DeviceBuffer(parameter_bytes);
    fill_random(bias.get(), shape.columns, dtype, 5, 0.5f, 0.0f, stream);
    fill_random(gamma.get(), shape.columns, dtype, 3, 0.2f, 1.0f, stream);
    fill_random(beta.get(), shape.columns, dtype, 4, 0.1f, 0.0f, stream);
    if (backward) {
      dbias = DeviceBuffer(parameter_bytes);
      dgamma = DeviceBuffer(parameter_bytes);
      dbeta = DeviceBuffer(parameter_bytes);
      workspace =
          DeviceBuffer(kernels::bias_dropout_residual_layernorm_backward_workspace_bytes(shape.rows, shape.columns));
    }
    FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
};

double bytes_moved(Shape2 shape, kernels::DType dtype, bool backward) {
  const double n = static_cast<double>(shape.rows) * shape.columns, s = kernels::dtype_size(dtype);
  const double forward = 3 * n * s + 3 * shape.columns * s + 2.0 * shape.rows * 4;
  const double back = 5 * n * s + 5 * shape.columns * s + 2.0 * shape.rows * 4;
  return backward ? forward + back : forward;
}

std::vector<Case> bias_dropout_residual_layernorm_cases(Shape2 shape, kernels::DType dtype, bool backward) {
  store::CaseInfo info = make_case_info("bias_dropout_residual_layernorm",
                                        std::to_string(shape.rows) + "x" + std::to_string(shape.columns), dtype,
                                        backward, bytes_moved(shape, dtype, backward));
  auto operands = std::make_shared<std::optional<BiasDropoutResidualLayerNormOperands>>();
  auto setup = [operands, shape, dtype, backward](cudaStream_t stream) {
    operands->emplace(shape, dtype, backward, stream);
  };
  auto release = [operands] { operands->reset(); };

  std::vector<Case> cases;
  info.variant = "fused";
  cases.push_back({info,
                   [operands, shape, dtype, backward](cudaStream_t stream, int rep) {
                     BiasDropoutResidualLayerNormOperands& o = **operands;
                     const int s = rep % o.sets;
                     const kernels::Dropout dropout{kDropout, kSeed, static_cast<uint64_t>(rep)};
                     kernels::BiasDropoutResidualForwardTensors forward;
                     forward.x = o.x[s].get();
                     forward.bias = o.bias.get();
                     forward.residual = o.residual[s].get();
                     forward.gamma = o.gamma.get();
                     forward.beta = o.beta.get();
                     forward.y = o.y[s].get();
                     forward.mean = o.mean[s].as<float>();
                     forward.rstd = o.rstd[s].as<float>();
                     kernels::bias_dropout_residual_layernorm_forward(dtype, kernels::ResidualOrder::post_ln, forward,
                                                                      dropout, shape.rows, shape.columns, kEps, stream);
                     if (backward) {
                       kernels::BiasDropoutResidualBackwardTensors grads;
                       grads.dy = o.dy[s].get();
                       grads.x = o.x[s].get();
                       grads.bias = o.bias.get();
                       grads.residual = o.residual[s].get();
                       grads.gamma = o.gamma.get();
                       grads.mean = o.mean[s].as<float>();
                       grads.rstd = o.rstd[s].as<float>();
                       grads.dx = o.dx[s].get();
                       grads.dresidual = o.dresidual[s].get();
                       grads.dbias = o.dbias.get();
                       grads.dgamma = o.dgamma.get();
                       grads.dbeta = o.dbeta.get();
                       kernels::bias_dropout_residual_layernorm_backward(dtype, kernels::ResidualOrder::post_ln, grads,
                                                                         dropout, shape.rows, shape.columns,
                                                                         o.workspace.get(), stream);
                     }
                   },
                   setup, release});
#ifdef FUSEKIT_WITH_TORCH
  info.variant = "baseline";
  cases.push_back({info,
                   [operands, shape, dtype, backward](cudaStream_t stream, int rep) {
                     BiasDropoutResidualLayerNormOperands& o = **operands;
                     const int s = rep % o.sets;
                     TorchStream on_stream(stream);
                     const at::ScalarType type = torch_type(dtype);
                     const at::Tensor x = wrap(o.x[s], {shape.rows, shape.columns}, type);
                     const at::Tensor residual = wrap(o.residual[s], {shape.rows, shape.columns}, type);
                     const at::Tensor bias = wrap(o.bias, {shape.columns}, type);
                     const at::Tensor gamma = wrap(o.gamma, {shape.columns}, type);
                     const at::Tensor beta = wrap(o.beta, {shape.columns}, type);
                     if (backward) {
                       baselines::bias_dropout_residual_layernorm_forward_backward(
                           x, bias, residual, gamma, beta, wrap(o.dy[s], {shape.rows, shape.columns}, type),
                           at::Tensor(), kDropout, kEps);
                     } else {
                       baselines::bias_dropout_residual_layernorm_forward(x, bias, residual, gamma, beta, kDropout,
                                                                          kEps);
                     }
                   },
                   setup, release});
#endif
  return cases;
}

}  // namespace

OpDefinition bias_dropout_residual_layernorm_op() {
  OpDefinition op;
  op.name = "bias_dropout_residual_layernorm";
  op.shape_syntax = "ROWSxCOLUMNS";
  // Token counts x hidden sizes: BERT-base and -large at batch 64 x seq 128 and 32 x 512; Swin
  // stages at batch 128 (224 x 224 input: 56^2, 28^2, 14^2, 7^2 tokens per image).
  op.shapes = {"8192x768", "8192x1024", "16384x1024", "401408x96", "401408x128", "100352x384", "6272x768"};
  op.cases = [](const std::string& shape, kernels::DType dtype, bool backward) {
    return bias_dropout_residual_layernorm_cases(parse_shape2(shape), dtype, backward);
  };
  return op;
}

}  // namespace fusekit::suites
