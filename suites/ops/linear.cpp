// Operator-suite cases for the linear layer (cuBLASLt GEMMs with fused epilogues): forward, and
// forward + backward, fused and (where libtorch is built in) the libtorch baseline, on rotated sets.
//
// Shapes: "MxNxK[:bias|:bias_gelu][:padded]", M tokens, N out_features, K in_features; the
// epilogue defaults to bias; ":padded" rounds N and K up to multiples of 8 (kernels/linear.h), and
// the baseline then runs on the same padded tensors. The bias_gelu backward starts at the next
// layer's output gradient dz [M, K] and weight [K, N] (an FFN's down projection back to width K).
//
// Bytes that must move (logical sizes, padded or not, so the two read against each other): forward
// reads x, W, b and writes y (and pre for bias_gelu); backward with bias reads dy, x, W and writes
// dx, dW, db; backward with bias_gelu reads dz, W_next, pre, x, W and writes dpre, db, dW, dx.
// FLOPs (CaseInfo::flops, logical sizes): 2MNK per GEMM; forward 1 GEMM, backward 2 (bias) or 3
// (bias_gelu: the next layer's input gradient carries the GELU backward).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
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

struct LinearCaseShape {
  kernels::LinearShape shape;
  kernels::LinearEpilogue epilogue = kernels::LinearEpilogue::bias;
};

LinearCaseShape parse_linear_shape(const std::string& text) {
  const std::string usage =
      "unsupported shape '" + text + "': expected MxNxK[:bias|:bias_gelu][:padded], e.g. 8192x3072x768:bias_gelu";
  LinearCaseShape out;
  const size_t colon = text.find(':');
  const std::vector<long> values = parse_sizes(text.substr(0, colon), 3, 1L << 30, usage);
  out.shape = {static_cast<int>(values[0]), static_cast<int>(values[1]), static_cast<int>(values[2]), false};
  std::string rest = colon == std::string::npos ? "" : text.substr(colon + 1);
  bool epilogue_seen = false;
  while (!rest.empty()) {
    const size_t next = rest.find(':');
    const std::string option = rest.substr(0, next);
    rest = next == std::string::npos ? "" : rest.substr(next + 1);
    if (!epilogue_seen && !out.shape.padded && (option == "bias" || option == "bias_gelu")) {
      out.epilogue = option == "bias" ? kernels::LinearEpilogue::bias : kernels::LinearEpilogue::bias_gelu;
      epilogue_seen = true;
    } else if (option == "padded" && !out.shape.padded) {
      out.shape.padded = true;
    } else {
      throw std::invalid_argument(usage);
    }
  }
  if (out.epilogue == kernels::LinearEpilogue::bias_gelu && out.shape.out_stride() % 8 != 0) {
    throw std::invalid_argument("unsupported shape '" + text +
                                "': bias_gelu needs N divisible by 8 (cuBLASLt's GELU aux matrix); add :padded");
  }
  return out;
}

// A [rows, columns] matrix stored with `stride` columns: random where it holds values, zero in its
// pad columns and in rows past `filled_rows` (a padded weight's pad rows).
void fill_matrix(const DeviceBuffer& buffer, int rows, int filled_rows, int columns, int stride, kernels::DType dtype,
                 uint64_t seed, float scale, cudaStream_t stream) {
  const size_t s = kernels::dtype_size(dtype);
  fill_random(buffer.get(), static_cast<size_t>(rows) * stride, dtype, seed, scale, 0.0f, stream);
  if (stride > columns) {
    FUSEKIT_CUDA_CHECK(cudaMemset2DAsync(static_cast<char*>(buffer.get()) + columns * s, stride * s, 0,
                                         (stride - columns) * s, rows, stream));
  }
  if (rows > filled_rows) {
    FUSEKIT_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(buffer.get()) + static_cast<size_t>(filled_rows) * stride * s,
                                       0, static_cast<size_t>(rows - filled_rows) * stride * s, stream));
  }
}

struct LinearOperands {
  int sets = 0;
  // Per set: the activations and their gradients; once: the parameters and their gradients.
  std::vector<DeviceBuffer> x, y, pre, dy, dz, dpre, dx;
  DeviceBuffer weight, bias, weight_next, dweight, dbias;
  std::unique_ptr<kernels::LinearContext> context;

  LinearOperands(const LinearCaseShape& c, kernels::DType dtype, bool backward, cudaStream_t stream) {
    const kernels::LinearShape& sh = c.shape;
    const bool gelu = c.epilogue == kernels::LinearEpilogue::bias_gelu;
    const int M = sh.rows, N = sh.out_features, K = sh.in_features, Ns = sh.out_stride(), Ks = sh.in_stride();
    const size_t s = kernels::dtype_size(dtype);
    const size_t mk = static_cast<size_t>(M) * Ks * s, mn = static_cast<size_t>(M) * Ns * s;
    size_t per_set = mk + mn + (gelu ? mn : 0);
    if (backward) per_set += gelu ? mk + mn + mk : mn + mk;
    sets = rotation_sets(per_set);
    for (int i = 0; i < sets; ++i) {
      x.emplace_back(mk);
      fill_matrix(x.back(), M, M, K, Ks, dtype, 3100 + i, 1.0f, stream);
      y.emplace_back(mn);
      if (gelu) pre.emplace_back(mn);
      if (backward) {
        dx.emplace_back(mk);
        if (gelu) {
          dz.emplace_back(mk);
          fill_matrix(dz.back(), M, M, K, Ks, dtype, 4100 + i, 1.0f, stream);
          dpre.emplace_back(mn);
        } else {
          dy.emplace_back(mn);
          fill_matrix(dy.back(), M, M, N, Ns, dtype, 4100 + i, 1.0f, stream);
        }
      }
    }
    // Weights of scale 1/sqrt(fan-in) keep the outputs near unit scale (no fp16 overflow at K = 3072).
    weight = DeviceBuffer(static_cast<size_t>(Ns) * Ks * s);
    fill_matrix(weight, Ns, N, K, Ks, dtype, 7, 1.0f / std::sqrt(static_cast<float>(K)), stream);
    bias = DeviceBuffer(Ns * s);
    fill_matrix(bias, 1, 1, N, Ns, dtype, 8, 0.5f, stream);
    if (backward) {
      dweight = DeviceBuffer(static_cast<size_t>(Ns) * Ks * s);
      dbias = DeviceBuffer(Ns * s);
      if (gelu) {
        weight_next = DeviceBuffer(static_cast<size_t>(Ks) * Ns * s);
        fill_matrix(weight_next, Ks, K, N, Ns, dtype, 9, 1.0f / std::sqrt(static_cast<float>(N)), stream);
      }
    }
    context = std::make_unique<kernels::LinearContext>();
    FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
};

double bytes_moved(const LinearCaseShape& c, kernels::DType dtype, bool backward) {
  const double M = c.shape.rows, N = c.shape.out_features, K = c.shape.in_features, s = kernels::dtype_size(dtype);
  const bool gelu = c.epilogue == kernels::LinearEpilogue::bias_gelu;
  const double forward = s * (M * K + N * K + N + M * N + (gelu ? M * N : 0));
  const double back = gelu ? s * (M * K + K * N + M * N + M * N + N + M * K + N * K + M * K + N * K)
                           : s * (M * N + M * K + N * K + M * K + N * K + N);
  return backward ? forward + back : forward;
}

double flops(const LinearCaseShape& c, bool backward) {
  const double gemm = 2.0 * c.shape.rows * c.shape.out_features * c.shape.in_features;
  const int backward_gemms = c.epilogue == kernels::LinearEpilogue::bias_gelu ? 3 : 2;
  return gemm * (1 + (backward ? backward_gemms : 0));
}

std::vector<Case> linear_cases(const std::string& shape_text, kernels::DType dtype, bool backward) {
  const LinearCaseShape c = parse_linear_shape(shape_text);
  store::CaseInfo info = make_case_info("linear", shape_text, dtype, backward, bytes_moved(c, dtype, backward));
  info.flops = flops(c, backward);
  auto operands = std::make_shared<std::optional<LinearOperands>>();
  auto setup = [operands, c, dtype, backward](cudaStream_t stream) { operands->emplace(c, dtype, backward, stream); };
  auto release = [operands] { operands->reset(); };
  const bool gelu = c.epilogue == kernels::LinearEpilogue::bias_gelu;

  // The fused step; `path` picks how the GELU backward runs (kernels/linear.h).
  auto fused = [operands, c, dtype, backward, gelu](kernels::GeluBackwardPath path) {
    return [operands, c, dtype, backward, gelu, path](cudaStream_t stream, int rep) {
      LinearOperands& o = **operands;
      const int s = rep % o.sets;
      kernels::linear_forward(*o.context, dtype, c.epilogue, c.shape, o.x[s].get(), o.weight.get(), o.bias.get(),
                              o.y[s].get(), gelu ? o.pre[s].get() : nullptr, stream);
      if (!backward) return;
      if (gelu) {
        const kernels::LinearShape next{c.shape.rows, c.shape.in_features, c.shape.out_features, c.shape.padded};
        kernels::linear_gelu_backward_input(*o.context, dtype, next, o.dz[s].get(), o.weight_next.get(), o.pre[s].get(),
                                            o.dpre[s].get(), o.dbias.get(), stream, path);
        kernels::linear_backward(*o.context, dtype, c.shape, o.dpre[s].get(), o.x[s].get(), o.weight.get(),
                                 o.dx[s].get(), o.dweight.get(), nullptr, stream);
      } else {
        kernels::linear_backward(*o.context, dtype, c.shape, o.dy[s].get(), o.x[s].get(), o.weight.get(), o.dx[s].get(),
                                 o.dweight.get(), o.dbias.get(), stream);
      }
    };
  };
  std::vector<Case> cases;
  info.variant = "fused";
  cases.push_back({info, fused(kernels::GeluBackwardPath::kernel), setup, release});
  if (gelu && backward) {
    // The same step with cuBLASLt's DGELU_BGRAD epilogue instead: measured, not the default.
    info.variant = "fused:dgelu-epilogue";
    cases.push_back({info, fused(kernels::GeluBackwardPath::cublaslt_epilogue), setup, release});
  }
#ifdef FUSEKIT_WITH_TORCH
  info.variant = "baseline";
  cases.push_back({info,
                   [operands, c, dtype, backward, gelu](cudaStream_t stream, int rep) {
                     LinearOperands& o = **operands;
                     const int s = rep % o.sets;
                     TorchStream on_stream(stream);
                     const at::ScalarType type = torch_type(dtype);
                     const int64_t M = c.shape.rows, Ns = c.shape.out_stride(), Ks = c.shape.in_stride();
                     const at::Tensor x = wrap(o.x[s], {M, Ks}, type);
                     const at::Tensor weight = wrap(o.weight, {Ns, Ks}, type);
                     const at::Tensor bias = wrap(o.bias, {Ns}, type);
                     if (!backward) {
                       baselines::linear_forward(x, weight, bias, gelu);
                     } else if (gelu) {
                       baselines::linear_gelu_forward_backward(x, weight, bias, wrap(o.dz[s], {M, Ks}, type),
                                                               wrap(o.weight_next, {Ks, Ns}, type));
                     } else {
                       baselines::linear_forward_backward(x, weight, bias, wrap(o.dy[s], {M, Ns}, type));
                     }
                   },
                   setup, release});
#endif
  return cases;
}

}  // namespace

OpDefinition linear_op() {
  OpDefinition op;
  op.name = "linear";
  op.shape_syntax = "MxNxK[:bias|:bias_gelu][:padded]";
  // BERT-base FFN at 64 x 128 tokens: up projection with GELU, down projection; BERT-large's up
  // projection. Then the odd sizes of Swin's 7 x 7 windows at Swin-T stage 1, batch 128 (401408 =
  // 128 x 56 x 56 tokens), plain and padded to 56: N = 49 outputs per token from K = 32 (a head's
  // width: the shape of window attention's scores), and K = 49 inputs to N = 32 (the shape of its
  // probabilities times values), as single GEMMs over all tokens.
  op.shapes = {"8192x3072x768:bias_gelu",  "8192x768x3072:bias", "8192x4096x1024:bias_gelu", "401408x49x32:bias",
               "401408x49x32:bias:padded", "401408x32x49:bias",  "401408x32x49:bias:padded"};
  op.cases = [](const std::string& shape, kernels::DType dtype, bool backward) {
    return linear_cases(shape, dtype, backward);
  };
  return op;
}

}  // namespace fusekit::suites
