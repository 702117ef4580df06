// Bias + dropout + residual + LayerNorm forward and backward against the float64 reference, with the
// reference's mask regenerated from the same Philox stream, on fresh random inputs and with every
// output poisoned (NaN) before the run: fp32, fp16 and bf16; both orders; p = 0, 0.1 and 0.5; row
// lengths 1, 31, 512, 768, 1000, 1024, 1536, 4096, 12288 and one past the register paths; a single row, a
// million rows, and misaligned pointers (the one-element general path).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "device_buffers.h"
#include "gpu_test_support.h"
#include "kernels/bias_dropout_residual_layernorm.h"
#include "kernels/reference/bias_dropout_residual_layernorm.h"
#include "kernels/reference/layernorm.h"

namespace fusekit::kernels {
namespace {

struct Shape {
  int rows;
  int columns;
  bool misaligned = false;  // x and dy one element past a 16-byte boundary
};

using Param = std::tuple<DType, Shape, float, ResidualOrder>;

// Random values, uploaded to a device buffer (optionally one element in) and rounded in place to what
// was stored.
struct Operand {
  Buffer buffer;
  size_t skip;
  size_t element_bytes;
  Operand(std::vector<double>& values, DType dtype, bool misaligned = false)
      : buffer(values.size() + (misaligned ? 1 : 0), dtype),
        skip(misaligned ? 1 : 0),
        element_bytes(dtype_size(dtype)) {
    std::vector<double> stored(skip, 0.0);
    stored.insert(stored.end(), values.begin(), values.end());
    buffer.upload(stored);
    values.assign(stored.begin() + skip, stored.end());
  }
  void* get() const { return static_cast<char*>(buffer.get()) + skip * element_bytes; }
};

struct FloatBuffer {  // [count] floats, poisoned
  float* data = nullptr;
  size_t count;
  explicit FloatBuffer(size_t n) : count(n) {
    EXPECT_EQ(cudaMalloc(&data, std::max<size_t>(n, 1) * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemset(data, 0xFF, std::max<size_t>(n, 1) * sizeof(float)), cudaSuccess);
  }
  ~FloatBuffer() { cudaFree(data); }
};

double norm(const std::vector<double>& v) {
  double s = 0;
  for (double e : v) s += e * e;
  return std::sqrt(s);
}

class BiasDropoutResidualLayerNormTest : public ::testing::TestWithParam<Param> {};

TEST_P(BiasDropoutResidualLayerNormTest, ForwardAndBackwardMatchFloat64Reference) {
  FUSEKIT_REQUIRE_GPU();
  const auto [dtype, shape, p, order] = GetParam();
  const bool pre_ln = order == ResidualOrder::pre_ln;
  const int rows = shape.rows, C = shape.columns;
  const size_t n = static_cast<size_t>(rows) * C;
  const double eps = 1e-5;
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> x(n), bias(C), residual(n), gamma(C), beta(C), dy(n), dh_extra(pre_ln ? n : 0);
  for (auto& v : x) v = normal(rng);
  for (auto& v : bias) v = 0.5 * normal(rng);
  for (auto& v : residual) v = 0.5 + 2.0 * normal(rng);  // an offset mean, as real activations have
  for (auto& v : gamma) v = 1.0 + 0.2 * normal(rng);
  for (auto& v : beta) v = 0.1 * normal(rng);
  for (auto& v : dy) v = normal(rng);
  for (auto& v : dh_extra) v = normal(rng);
  const Dropout dropout{p, rng(), rng() >> 16};

  Operand x_d(x, dtype, shape.misaligned), bias_d(bias, dtype), residual_d(residual, dtype), gamma_d(gamma, dtype),
      beta_d(beta, dtype), dy_d(dy, dtype, shape.misaligned), extra_d(dh_extra, dtype);
  Buffer h(n, dtype), y(n, dtype), dx(n, dtype), dresidual(n, dtype), dbias(C, dtype), dgamma(C, dtype),
      dbeta(C, dtype);
  FloatBuffer mean(rows), rstd(rows);
  const size_t workspace_bytes = bias_dropout_residual_layernorm_backward_workspace_bytes(rows, C);
  void* workspace = nullptr;
  CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
  CHECK_CUDA(cudaMemset(workspace, 0xFF, workspace_bytes));

  BiasDropoutResidualForwardTensors forward;
  forward.x = x_d.get();
  forward.bias = bias_d.get();
  forward.residual = residual_d.get();
  forward.gamma = gamma_d.get();
  forward.beta = beta_d.get();
  forward.h = pre_ln ? h.get() : nullptr;
  forward.y = y.get();
  forward.mean = mean.data;
  forward.rstd = rstd.data;
  bias_dropout_residual_layernorm_forward(dtype, order, forward, dropout, rows, C, static_cast<float>(eps), nullptr);
  BiasDropoutResidualBackwardTensors backward;
  backward.dy = dy_d.get();
  if (pre_ln) {
    backward.dh_extra = extra_d.get();
    backward.h = h.get();
  } else {
    backward.x = x_d.get();
    backward.bias = bias_d.get();
    backward.residual = residual_d.get();
  }
  backward.gamma = gamma_d.get();
  backward.mean = mean.data;
  backward.rstd = rstd.data;
  backward.dx = dx.get();
  backward.dresidual = dresidual.get();
  backward.dbias = dbias.get();
  backward.dgamma = dgamma.get();
  backward.dbeta = dbeta.get();
  bias_dropout_residual_layernorm_backward(dtype, order, backward, dropout, rows, C, workspace, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaFree(workspace);

  const std::vector<double> m = reference::dropout_multipliers(rows, C, p, dropout.seed, dropout.offset);
  const auto ref = reference::bias_dropout_residual_layernorm_forward(x, bias, residual, gamma, beta, m, rows, C, eps);
  const double tol = tolerance(dtype);
  // Outputs whose reference is exactly 0 (one column: xhat = 0) are compared absolutely.
  auto bound = [&](const std::vector<double>& reference_values) { return norm(reference_values) > 0 ? tol : 1e-6; };

  // Post-LN normalizes h in float, as the reference does in double. Pre-LN normalizes the h it
  // writes (rounded to the storage type): y, mean, rstd and the backward are checked against the
  // reference on that h, and h itself against the exact one.
  std::vector<double> h_used = ref.h;
  if (pre_ln) {
    const std::vector<double> h_out = h.download();
    EXPECT_LT(relative_error(h_out, ref.h), tol) << "h";
    h_used = h_out;
  }
  const auto ln = reference::layernorm_forward(h_used, gamma, beta, rows, C, eps);
  EXPECT_LT(relative_error(y.download(), ln.y), tol) << "y";
  EXPECT_LT(mean_error(download_floats(mean.data, rows), ln.mean, ln.rstd), 1e-5) << "mean";
  EXPECT_LT(relative_error(download_floats(rstd.data, rows), ln.rstd), 1e-5) << "rstd";

  const auto grad = reference::bias_dropout_residual_layernorm_backward(dy, pre_ln ? dh_extra : std::vector<double>{},
                                                                        h_used, gamma, m, rows, C, eps);
  const std::vector<double> dx_out = dx.download(), dresidual_out = dresidual.download();
  EXPECT_LT(relative_error(dx_out, grad.dx), bound(grad.dx)) << "dx";
  EXPECT_LT(relative_error(dresidual_out, grad.dresidual), bound(grad.dresidual)) << "dresidual";
  // dbias, dgamma and dbeta are column sums over the rows, accumulated in float in every dtype. A
  // float sum's rounding follows its partial sums, which for terms of random sign are of the size of
  // the terms' root-sum-square, not of the final sum. Where the terms cancel (one column: 257 values
  // of mixed sign, whose sum is now and then under 1% of that size) ||ref|| understates that scale,
  // and an fp32 error of a few float roundings broke 1e-5 (in about 0.5% of runs). So the error is
  // measured against the larger of ||ref|| and the terms' norm: on random inputs the two are alike
  // and the bound is unchanged; only a sum that cancels is measured against its terms.
  std::vector<double> dgamma_terms(n);
  for (size_t i = 0; i < n; ++i) dgamma_terms[i] = dy[i] * (h_used[i] - ln.mean[i / C]) * ln.rstd[i / C];
  auto sum_bound = [&](const std::vector<double>& reference_values, const std::vector<double>& terms) {
    const double scale = norm(reference_values);
    return scale > 0 ? tol * std::max(1.0, norm(terms) / scale) : bound(reference_values);
  };
  EXPECT_LT(relative_error(dbias.download(), grad.dbias), sum_bound(grad.dbias, grad.dx)) << "dbias";
  EXPECT_LT(relative_error(dgamma.download(), grad.dgamma), sum_bound(grad.dgamma, dgamma_terms)) << "dgamma";
  EXPECT_LT(relative_error(dbeta.download(), grad.dbeta), sum_bound(grad.dbeta, dy)) << "dbeta";

  // The mask itself: dropped elements have exactly zero gradient, and kept ones are dresidual / (1 - p)
  // (exactly dresidual at p = 0, in every storage type).
  size_t wrong_zeros = 0, wrong_identity = 0;
  for (size_t i = 0; i < n; ++i) {
    if (m[i] == 0 ? dx_out[i] != 0 : dresidual_out[i] != 0 && dx_out[i] == 0) ++wrong_zeros;
    if (p == 0 && dx_out[i] != dresidual_out[i]) ++wrong_identity;
  }
  EXPECT_EQ(wrong_zeros, 0u) << "dx not zero where the mask drops, or zero where it keeps";
  EXPECT_EQ(wrong_identity, 0u) << "p = 0: dx must equal dresidual";
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto [dtype, shape, p, order] = info.param;
  return std::string(dtype_name(dtype)) + "_" + std::to_string(shape.rows) + "x" + std::to_string(shape.columns) +
         (shape.misaligned ? "_misaligned" : "") + "_p" + std::to_string(static_cast<int>(p * 100)) +
         (order == ResidualOrder::pre_ln ? "_pre" : "_post");
}

const auto kDtypes = ::testing::Values(DType::f32, DType::f16, DType::bf16);
const auto kOrders = ::testing::Values(ResidualOrder::post_ln, ResidualOrder::pre_ln);

// 4099 x 128 and 513 x 96: 16-bit rows of 16 and 12 vectors, 4 lanes x 4 and x 3 in the forward
// (whose loads go first there), 16 lanes x 1 in the backward (fp32: 8 lanes x 4 and x 3 forward).
INSTANTIATE_TEST_SUITE_P(Shapes, BiasDropoutResidualLayerNormTest,
                         ::testing::Combine(kDtypes,
                                            ::testing::Values(Shape{257, 1}, Shape{300, 31}, Shape{1000, 768},
                                                              Shape{77, 1000}, Shape{64, 1536}, Shape{1, 4096},
                                                              Shape{33, 4096}, Shape{9, 12288}, Shape{3, 70000},
                                                              Shape{2, 33}, Shape{129, 768, true}, Shape{1001, 384},
                                                              Shape{301, 200}, Shape{4099, 128}, Shape{513, 96},
                                                              Shape{333, 1024}, Shape{77, 500}, Shape{129, 512}),
                                            ::testing::Values(0.f, 0.1f, 0.5f), kOrders),
                         param_name);
// A million short rows: the lanes-per-row path over many blocks, and the two-stage reduction of
// thousands of partial rows.
INSTANTIATE_TEST_SUITE_P(MillionRows, BiasDropoutResidualLayerNormTest,
                         ::testing::Combine(kDtypes, ::testing::Values(Shape{1'000'000, 32}), ::testing::Values(0.1f),
                                            kOrders),
                         param_name);

// Rows of 1024 columns (128 16-byte vectors in 16-bit types) take the rows kernels, which copy a
// block's next rows into shared memory while it computes: enough rows that every block runs several
// batches (an odd count, so one batch is half full), not one.
INSTANTIATE_TEST_SUITE_P(ManyRows1024, BiasDropoutResidualLayerNormTest,
                         ::testing::Combine(kDtypes, ::testing::Values(Shape{9001, 1024}), ::testing::Values(0.1f),
                                            kOrders),
                         param_name);

// The test-only mask is the reference's stream: the same flags, element for element, at odd sizes.
TEST(BiasDropoutResidualLayerNormMask, IsTheReferenceStream) {
  FUSEKIT_REQUIRE_GPU();
  std::mt19937_64 rng(std::random_device{}());
  const int rows = 37, columns = 1001;
  for (float p : {0.f, 0.1f, 0.5f}) {
    const Dropout dropout{p, rng(), rng() >> 16};
    Buffer mask(static_cast<size_t>(rows) * columns, DType::f16);
    bias_dropout_residual_layernorm_mask(DType::f16, dropout, mask.get(), rows, columns, nullptr);
    CHECK_CUDA(cudaDeviceSynchronize());
    const std::vector<double> out = mask.download();
    const std::vector<double> m = reference::dropout_multipliers(rows, columns, p, dropout.seed, dropout.offset);
    size_t differ = 0;
    for (size_t i = 0; i < m.size(); ++i) differ += out[i] != (m[i] > 0 ? 1.0 : 0.0);
    EXPECT_EQ(differ, 0u) << "p = " << p;
  }
}

// Bad arguments are refused before anything runs (no GPU needed).
TEST(BiasDropoutResidualLayerNormArguments, AreChecked) {
  BiasDropoutResidualForwardTensors forward;
  int fake = 0;
  forward.x = forward.bias = forward.residual = forward.gamma = forward.beta = &fake;
  forward.y = &fake;
  forward.mean = forward.rstd = reinterpret_cast<float*>(&fake);
  auto run = [&](ResidualOrder order, float p, int rows, int columns) {
    bias_dropout_residual_layernorm_forward(DType::f16, order, forward, Dropout{p, 1, 2}, rows, columns, 1e-5f,
                                            nullptr);
  };
  EXPECT_THROW(run(ResidualOrder::post_ln, 1.f, 0, 8), std::invalid_argument);
  EXPECT_THROW(run(ResidualOrder::post_ln, -0.1f, 0, 8), std::invalid_argument);
  EXPECT_THROW(run(ResidualOrder::post_ln, NAN, 0, 8), std::invalid_argument);
  EXPECT_THROW(run(ResidualOrder::post_ln, 0.1f, 4, 0), std::invalid_argument);
  EXPECT_THROW(run(ResidualOrder::pre_ln, 0.1f, 0, 8), std::invalid_argument);  // pre-LN without h
  EXPECT_NO_THROW(run(ResidualOrder::post_ln, 0.1f, 0, 8));                     // no rows: nothing to do
  BiasDropoutResidualBackwardTensors backward;
  backward.dy = backward.gamma = &fake;
  backward.mean = backward.rstd = reinterpret_cast<float*>(&fake);
  backward.dx = backward.dresidual = backward.dbias = backward.dgamma = backward.dbeta = &fake;
  backward.x = backward.bias = backward.residual = backward.dh_extra = &fake;
  EXPECT_THROW(bias_dropout_residual_layernorm_backward(DType::f16, ResidualOrder::post_ln, backward,
                                                        Dropout{0.1f, 1, 2}, 4, 8, &fake, nullptr),
               std::invalid_argument);  // dh_extra in post-LN
  EXPECT_THROW(bias_dropout_residual_layernorm_backward(DType::f16, ResidualOrder::pre_ln, backward,
                                                        Dropout{0.1f, 1, 2}, 4, 8, &fake, nullptr),
               std::invalid_argument);  // pre-LN without h
}

}  // namespace
}  // namespace fusekit::kernels
