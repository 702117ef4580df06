// Attention-suite cases for the QKV projection: the query, key and value projections of an
// attention layer, fused and (where libtorch is built in) the libtorch baseline, on rotated sets.
//
//   fused:    one GEMM with cuBLASLt's bias epilogue over the weights packed once, at load
//             (kernels/linear.h, pack_qkv_projection), writing [tokens, 3, heads, head_dim], the
//             layout the attention kernels read; backward: one dW GEMM with the bias gradient in
//             its epilogue (BGRADB) and one dx GEMM, from dqkv as the fused attention writes it.
//   baseline: three at::linear calls as HuggingFace's BertSelfAttention makes them (three GEMMs
//             reading x three times), and their autograd backward (three dW, three db, three dx
//             GEMMs summed).
//
// Shapes: "TOKENSxHIDDEN" (in_features = hidden, out = 3 x hidden): BERT-base and -large at 64 x 128
// and 32 x 512 tokens. Bytes that must move: forward reads x, W (3 hidden x hidden), b and writes
// qkv; backward reads dqkv, x, W and writes dx, dW, db. FLOPs: 2 x tokens x 3 hidden x hidden per GEMM
// pass (forward 1, backward 2).
#include <cuda_runtime.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cuda_check.h"
#include "kernels/linear.h"
#include "suites/ops/operands.h"
#include "suites/ops/ops_suite.h"
#include "suites/ops/torch_operands.h"

#ifdef FUSEKIT_WITH_TORCH
#include "baselines/linear.h"
#endif

namespace fusekit::suites {
namespace {

struct QkvOperands {
  int sets = 0;
  std::vector<DeviceBuffer> x, qkv, dqkv, dx;  // per set
  DeviceBuffer weights[3], biases[3];          // as a checkpoint holds them (the baseline's)
  DeviceBuffer weight, bias, dweight, dbias;   // packed once (the fused variant's)
  std::unique_ptr<kernels::LinearContext> context;

  QkvOperands(Shape2 shape, kernels::DType dtype, bool backward, cudaStream_t stream) {
    const size_t tokens = shape.rows, hidden = shape.columns, s = kernels::dtype_size(dtype);
    const size_t x_bytes = tokens * hidden * s, qkv_bytes = 3 * x_bytes;
    sets = rotation_sets(x_bytes + qkv_bytes + (backward ? qkv_bytes + x_bytes : 0));
    for (int i = 0; i < sets; ++i) {
      x.emplace_back(x_bytes);
      fill_random(x.back().get(), tokens * hidden, dtype, 5100 + i, 1.0f, 0.0f, stream);
      qkv.emplace_back(qkv_bytes);
      if (backward) {
        dqkv.emplace_back(qkv_bytes);
        fill_random(dqkv.back().get(), 3 * tokens * hidden, dtype, 6100 + i, 1.0f, 0.0f, stream);
        dx.emplace_back(x_bytes);
      }
    }
    const void* w[3];
    const void* b[3];
    for (int part = 0; part < 3; ++part) {
      weights[part] = DeviceBuffer(hidden * hidden * s);
      fill_random(weights[part].get(), hidden * hidden, dtype, 70 + part, 1.0f / std::sqrt(float(hidden)), 0.0f,
                  stream);
      biases[part] = DeviceBuffer(hidden * s);
      fill_random(biases[part].get(), hidden, dtype, 80 + part, 0.5f, 0.0f, stream);
      w[part] = weights[part].get();
      b[part] = biases[part].get();
    }
    weight = DeviceBuffer(3 * hidden * hidden * s);
    bias = DeviceBuffer(3 * hidden * s);
    kernels::pack_qkv_projection(dtype, static_cast<int>(hidden), static_cast<int>(hidden), w, b, weight.get(),
                                 bias.get(), stream);
    if (backward) {
      dweight = DeviceBuffer(3 * hidden * hidden * s);
      dbias = DeviceBuffer(3 * hidden * s);
    }
    context = std::make_unique<kernels::LinearContext>();
    FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
};

double bytes_moved(Shape2 shape, kernels::DType dtype, bool backward) {
  const double t = shape.rows, h = shape.columns, s = kernels::dtype_size(dtype);
  const double forward = (t * h + 3 * h * h + 3 * h + 3 * t * h) * s;
  const double back = (3 * t * h + t * h + 3 * h * h + t * h + 3 * h * h + 3 * h) * s;
  return backward ? forward + back : forward;
}

std::vector<Case> qkv_projection_cases(Shape2 shape, kernels::DType dtype, bool backward) {
  store::CaseInfo info =
      make_case_info("qkv_projection", std::to_string(shape.rows) + "x" + std::to_string(shape.columns), dtype,
                     backward, bytes_moved(shape, dtype, backward));
  info.flops = 2.0 * shape.rows * 3.0 * shape.columns * shape.columns * (backward ? 3 : 1);
  auto operands = std::make_shared<std::optional<QkvOperands>>();
  auto setup = [operands, shape, dtype, backward](cudaStream_t stream) {
    operands->emplace(shape, dtype, backward, stream);
  };
  auto release = [operands] { operands->reset(); };
  const kernels::LinearShape linear{shape.rows, 3 * shape.columns, shape.columns, false};

  std::vector<Case> cases;
  info.variant = "fused";
  cases.push_back({info,
                   [operands, linear, dtype, backward](cudaStream_t stream, int rep) {
                     QkvOperands& o = **operands;
                     const int s = rep % o.sets;
                     kernels::linear_forward(*o.context, dtype, kernels::LinearEpilogue::bias, linear, o.x[s].get(),
                                             o.weight.get(), o.bias.get(), o.qkv[s].get(), nullptr, stream);
                     if (backward) {
                       kernels::linear_backward(*o.context, dtype, linear, o.dqkv[s].get(), o.x[s].get(),
                                                o.weight.get(), o.dx[s].get(), o.dweight.get(), o.dbias.get(), stream);
                     }
                   },
                   setup, release});
#ifdef FUSEKIT_WITH_TORCH
  info.variant = "baseline";
  cases.push_back(
      {info,
       [operands, shape, dtype, backward](cudaStream_t stream, int rep) {
         QkvOperands& o = **operands;
         const int s = rep % o.sets;
         TorchStream on_stream(stream);
         const at::ScalarType type = torch_type(dtype);
         const int64_t t = shape.rows, h = shape.columns;
         const at::Tensor x = wrap(o.x[s], {t, h}, type);
         const at::Tensor weights[3] = {wrap(o.weights[0], {h, h}, type), wrap(o.weights[1], {h, h}, type),
                                        wrap(o.weights[2], {h, h}, type)};
         const at::Tensor biases[3] = {wrap(o.biases[0], {h}, type), wrap(o.biases[1], {h}, type),
                                       wrap(o.biases[2], {h}, type)};
         if (backward) {
           baselines::qkv_projection_forward_backward(x, weights, biases, wrap(o.dqkv[s], {t, 3 * h}, type));
         } else {
           baselines::qkv_projection_forward(x, weights, biases);
         }
       },
       setup, release});
#endif
  return cases;
}

}  // namespace

OpDefinition qkv_projection_op() {
  OpDefinition op;
  op.name = "qkv_projection";
  op.suite = "attention";
  op.shape_syntax = "TOKENSxHIDDEN";
  // BERT-base and -large at 64 x 128 and 32 x 512 tokens.
  op.shapes = {"8192x768", "16384x768", "8192x1024", "16384x1024"};
  op.cases = [](const std::string& shape, kernels::DType dtype, bool backward) {
    return qkv_projection_cases(parse_shape2(shape), dtype, backward);
  };
  return op;
}

}  // namespace fusekit::suites
