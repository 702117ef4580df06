// Operator-suite cases for bias + GELU (the erf form, which BERT uses): forward, and forward +
// backward, fused and (where libtorch is built in) the libtorch baseline, on rotated input sets.
//
// Bytes that must move: forward reads x and bias and writes y; backward reads dy, x and bias and
// writes dx and dbias.
#include <memory>
#include <optional>
#include <vector>

#include "kernels/bias_gelu.h"
#include "suites/ops/operands.h"
#include "suites/ops/ops_suite.h"
#include "suites/ops/torch_operands.h"

#ifdef FUSEKIT_WITH_TORCH
#include "baselines/bias_gelu.h"
#endif

namespace fusekit::suites {
namespace {

constexpr kernels::GeluApproximation kApproximation = kernels::GeluApproximation::none;

struct BiasGeluOperands {
  int sets = 0;
  std::vector<DeviceBuffer> x, y, dy, dx;
  DeviceBuffer bias, dbias, workspace;

  BiasGeluOperands(Shape2 shape, kernels::DType dtype, bool backward, cudaStream_t stream) {
    const size_t n = static_cast<size_t>(shape.rows) * shape.columns;
    const size_t bytes = n * kernels::dtype_size(dtype);
    sets = rotation_sets(bytes * (backward ? 4 : 2));
    for (int s = 0; s < sets; ++s) {
      x.emplace_back(bytes);
      y.emplace_back(bytes);
      fill_random(x.back().get(), n, dtype, 1100 + s, 3.0f, 0.0f, stream);
      if (backward) {
        dy.emplace_back(bytes);
        dx.emplace_back(bytes);
        fill_random(dy.back().get(), n, dtype, 2100 + s, 1.0f, 0.0f, stream);
      }
    }
    const size_t parameter_bytes = shape.columns * kernels::dtype_size(dtype);
    bias = DeviceBuffer(parameter_bytes);
    fill_random(bias.get(), shape.columns, dtype, 5, 0.5f, 0.0f, stream);
    if (backward) {
      dbias = DeviceBuffer(parameter_bytes);
      workspace = DeviceBuffer(kernels::bias_gelu_backward_workspace_bytes(shape.rows, shape.columns));
    }
    FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
};

double bytes_moved(Shape2 shape, kernels::DType dtype, bool backward) {
  const double n = static_cast<double>(shape.rows) * shape.columns, s = kernels::dtype_size(dtype);
  const double forward = 2 * n * s + shape.columns * s;
  const double back = 3 * n * s + 2 * shape.columns * s;
  return backward ? forward + back : forward;
}

std::vector<Case> bias_gelu_cases(Shape2 shape, kernels::DType dtype, bool backward) {
  store::CaseInfo info = make_case_info("bias_gelu", std::to_string(shape.rows) + "x" + std::to_string(shape.columns),
                                        dtype, backward, bytes_moved(shape, dtype, backward));
  auto operands = std::make_shared<std::optional<BiasGeluOperands>>();
  auto setup = [operands, shape, dtype, backward](cudaStream_t stream) {
    operands->emplace(shape, dtype, backward, stream);
  };
  auto release = [operands] { operands->reset(); };

  std::vector<Case> cases;
  info.variant = "fused";
  cases.push_back({info,
                   [operands, shape, dtype, backward](cudaStream_t stream, int rep) {
                     BiasGeluOperands& o = **operands;
                     const int s = rep % o.sets;
                     kernels::bias_gelu_forward(dtype, kApproximation, o.x[s].get(), o.bias.get(), o.y[s].get(),
                                                shape.rows, shape.columns, stream);
                     if (backward) {
                       kernels::bias_gelu_backward(dtype, kApproximation, o.dy[s].get(), o.x[s].get(), o.bias.get(),
                                                   o.dx[s].get(), o.dbias.get(), shape.rows, shape.columns,
                                                   o.workspace.get(), stream);
                     }
                   },
                   setup, release});
#ifdef FUSEKIT_WITH_TORCH
  info.variant = "baseline";
  cases.push_back(
      {info,
       [operands, shape, dtype, backward](cudaStream_t stream, int rep) {
         BiasGeluOperands& o = **operands;
         const int s = rep % o.sets;
         TorchStream on_stream(stream);
         const at::ScalarType type = torch_type(dtype);
         const at::Tensor x = wrap(o.x[s], {shape.rows, shape.columns}, type);
         const at::Tensor bias = wrap(o.bias, {shape.columns}, type);
         if (backward) {
           baselines::bias_gelu_forward_backward(x, bias, wrap(o.dy[s], {shape.rows, shape.columns}, type), "none");
         } else {
           baselines::bias_gelu_forward(x, bias, "none");
         }
       },
       setup, release});
#endif
  return cases;
}

}  // namespace

OpDefinition bias_gelu_op() {
  OpDefinition op;
  op.name = "bias_gelu";
  op.shape_syntax = "ROWSxCOLUMNS";
  // Tokens x FFN width: BERT-base and -large at 64 x 128 and 32 x 512 tokens; Swin stages at batch
  // 128 (4 x the stage's channels).
  op.shapes = {"8192x3072", "8192x4096", "16384x4096", "401408x384", "401408x512", "100352x1536", "6272x3072"};
  op.cases = [](const std::string& shape, kernels::DType dtype, bool backward) {
    return bias_gelu_cases(parse_shape2(shape), dtype, backward);
  };
  return op;
}

}  // namespace fusekit::suites
