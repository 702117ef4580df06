// The linear layer's cuBLASLt GEMMs against the float64 reference, on fresh random inputs, with every
// output poisoned (NaN) first: fp16, bf16 (and fp32 on a few shapes), both epilogues, padded and
// unpadded; rows 1, 7, 333; out_features 8, 49, 56, 768; in_features 8, 32, 49, 768. Each stage is
// checked on the inputs it was given: the GELU backward on the pre-activation the forward stored,
// the weight and input gradients of a bias_gelu layer on the dpre the GELU backward stored. Padded
// runs must leave every pad column zero and agree with unpadded runs. Shapes whose stored extents are
// at most 64, with a feature size not a multiple of 8 or padded, take the skinny kernels
// (kernels/skinny_linear.cu; the padded ones among the shapes here too): LinearSkinnyTest checks them
// on their own, on fp32, fp16 and bf16, aligned and misaligned operands, up to 300001 rows.
// LinearWeightGradientTest checks linear_weight_gradient: dW added onto non-zero values (twice, and
// not disturbed by the timing of the plan's candidates) or overwritten, dbias always overwritten;
// fp32, fp16, bf16; odd N (BERT's vocabulary, 30522, and small ones), padded and unpadded.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "device_buffers.h"
#include "gpu_test_support.h"
#include "kernels/detail/skinny_linear.h"
#include "kernels/linear.h"
#include "kernels/reference/linear.h"

namespace fusekit::kernels {
namespace {

// A row-major [rows, columns] matrix stored with `stride` columns, the pad columns zero.
std::vector<double> pad(const std::vector<double>& v, int rows, int columns, int stride) {
  std::vector<double> out(static_cast<size_t>(rows) * stride, 0.0);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < columns; ++c)
      out[static_cast<size_t>(r) * stride + c] = v[static_cast<size_t>(r) * columns + c];
  }
  return out;
}

std::vector<double> unpad(const std::vector<double>& v, int rows, int columns, int stride) {
  std::vector<double> out(static_cast<size_t>(rows) * columns);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < columns; ++c)
      out[static_cast<size_t>(r) * columns + c] = v[static_cast<size_t>(r) * stride + c];
  }
  return out;
}

bool pads_are_zero(const std::vector<double>& v, int rows, int columns, int stride) {
  for (int r = 0; r < rows; ++r) {
    for (int c = columns; c < stride; ++c) {
      if (v[static_cast<size_t>(r) * stride + c] != 0.0) return false;
    }
  }
  return true;
}

// A device matrix in the layer's (possibly padded) layout, uploaded from or downloaded to an unpadded one.
struct Matrix {
  int rows, columns, stride;
  Buffer buffer;
  Matrix(int rows_, int columns_, int stride_, DType dtype)
      : rows(rows_), columns(columns_), stride(stride_), buffer(static_cast<size_t>(rows_) * stride_, dtype) {}
  void upload(std::vector<double>& values) {  // values: rounded to the storage type in place
    std::vector<double> padded = pad(values, rows, columns, stride);
    buffer.upload(padded);
    values = unpad(padded, rows, columns, stride);
  }
  std::vector<double> download(bool& pads_zero) const {
    const std::vector<double> padded = buffer.download();
    pads_zero = pads_zero && pads_are_zero(padded, rows, columns, stride);
    return unpad(padded, rows, columns, stride);
  }
  void* get() const { return buffer.get(); }
};

struct Inputs {
  std::vector<double> x, weight, bias, dy;  // dy: bias epilogue
  std::vector<double> weight_next, dz;      // bias_gelu: the next layer, K features back to the model width
};

struct Outputs {
  std::vector<double> y, pre, dpre, dbias, dx, dweight;
  bool pads_zero = true;
};

Inputs random_inputs(int M, int N, int K) {
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> normal(0.0, 1.0);
  auto fill = [&](size_t n, double scale) {
    std::vector<double> v(n);
    for (double& e : v) e = scale * normal(rng);
    return v;
  };
  // Weights of variance 1/K keep pre-activations near unit scale: both GELU tails and its bend.
  return {fill(size_t(M) * K, 1.0), fill(size_t(N) * K, 1.0 / std::sqrt(K)), fill(N, 0.5),
          fill(size_t(M) * N, 1.0), fill(size_t(K) * N, 1.0 / std::sqrt(N)), fill(size_t(M) * K, 1.0)};
}

// Forward, then backward (for bias_gelu: the GELU backward fused into the next layer's input
// gradient, then the weight and input gradients from the dpre it stored). `in` is rounded to the
// storage type in place.
Outputs run_linear(LinearContext& context, DType dtype, LinearEpilogue epilogue, const LinearShape& shape, Inputs& in,
                   GeluBackwardPath path = GeluBackwardPath::kernel) {
  const int M = shape.rows, N = shape.out_features, K = shape.in_features;
  const int Ns = shape.out_stride(), Ks = shape.in_stride();
  const bool gelu = epilogue == LinearEpilogue::bias_gelu;
  Matrix x(M, K, Ks, dtype), weight(Ns, K, Ks, dtype), bias(1, N, Ns, dtype);
  // Pad rows of the weight are zero too: the matrix is [N_pad, K_pad], zero outside [N, K].
  Matrix y(M, N, Ns, dtype), pre(M, N, Ns, dtype), dx(M, K, Ks, dtype), dweight(Ns, K, Ks, dtype),
      dbias(1, N, Ns, dtype), dpre(M, N, Ns, dtype), dy(M, N, Ns, dtype);
  std::vector<double> weight_rows = pad(in.weight, N, K, K);
  weight_rows.resize(size_t(Ns) * K, 0.0);
  weight.upload(weight_rows);
  in.weight = std::vector<double>(weight_rows.begin(), weight_rows.begin() + size_t(N) * K);
  x.upload(in.x);
  bias.upload(in.bias);

  Outputs out;
  linear_forward(context, dtype, epilogue, shape, x.get(), weight.get(), bias.get(), y.get(),
                 gelu ? pre.get() : nullptr, nullptr);
  if (gelu) {
    const LinearShape next{M, K, N, shape.padded};  // the FFN's down projection: N features back to K
    Matrix dz(M, K, Ks, dtype), weight_next(Ks, N, Ns, dtype);
    dz.upload(in.dz);
    std::vector<double> next_rows = pad(in.weight_next, K, N, N);
    next_rows.resize(size_t(Ks) * N, 0.0);
    weight_next.upload(next_rows);
    in.weight_next = std::vector<double>(next_rows.begin(), next_rows.begin() + size_t(K) * N);
    linear_gelu_backward_input(context, dtype, next, dz.get(), weight_next.get(), pre.get(), dpre.get(), dbias.get(),
                               nullptr, path);
    linear_backward(context, dtype, shape, dpre.get(), x.get(), weight.get(), dx.get(), dweight.get(), nullptr,
                    nullptr);
  } else {
    dy.upload(in.dy);
    linear_backward(context, dtype, shape, dy.get(), x.get(), weight.get(), dx.get(), dweight.get(), dbias.get(),
                    nullptr);
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  out.y = y.download(out.pads_zero);
  if (gelu) {
    out.pre = pre.download(out.pads_zero);
    out.dpre = dpre.download(out.pads_zero);
  }
  out.dbias = dbias.download(out.pads_zero);
  out.dx = dx.download(out.pads_zero);
  const std::vector<double> dweight_padded = dweight.buffer.download();
  for (size_t i = size_t(N) * Ks; i < dweight_padded.size(); ++i)
    out.pads_zero = out.pads_zero && dweight_padded[i] == 0.0;
  out.dweight = dweight.download(out.pads_zero);
  out.dweight.resize(size_t(N) * K);
  return out;
}

struct Shape {
  int M, N, K;
};

struct Param {
  DType dtype;
  LinearEpilogue epilogue;
  Shape shape;
  bool padded;
};

class LinearTest : public ::testing::TestWithParam<Param> {};

TEST_P(LinearTest, EveryOutputMatchesFloat64Reference) {
  FUSEKIT_REQUIRE_GPU();
  const Param p = GetParam();
  const int M = p.shape.M, N = p.shape.N, K = p.shape.K;
  const bool gelu = p.epilogue == LinearEpilogue::bias_gelu;
  LinearContext context;
  // bias_gelu: both ways of the GELU backward (kernels/linear.h), each on fresh inputs.
  std::vector<GeluBackwardPath> paths = {GeluBackwardPath::kernel};
  if (gelu) paths.push_back(GeluBackwardPath::cublaslt_epilogue);
  for (const GeluBackwardPath path : paths) {
    SCOPED_TRACE(path == GeluBackwardPath::kernel ? "GELU backward: kernel" : "GELU backward: cuBLASLt epilogue");
    Inputs in = random_inputs(M, N, K);
    const Outputs out = run_linear(context, p.dtype, p.epilogue, {M, N, K, p.padded}, in, path);

    const double tol = tolerance(p.dtype);
    const auto forward = reference::linear_forward(in.x, in.weight, in.bias, M, N, K, gelu);
    EXPECT_LT(relative_error(out.y, forward.y), tol) << "y";
    if (gelu) {
      EXPECT_LT(relative_error(out.pre, forward.pre), tol) << "pre";
      // Each stage on the inputs it was given: the stored pre, then the stored dpre.
      const auto gelu_grad = reference::linear_gelu_backward_input(in.dz, in.weight_next, out.pre, M, K, N);
      EXPECT_LT(relative_error(out.dpre, gelu_grad.dpre), tol) << "dpre";
      EXPECT_LT(relative_error(out.dbias, gelu_grad.dbias), tol) << "dbias";
      const auto grad = reference::linear_backward(out.dpre, in.x, in.weight, M, N, K);
      EXPECT_LT(relative_error(out.dx, grad.dx), tol) << "dx";
      EXPECT_LT(relative_error(out.dweight, grad.dweight), tol) << "dweight";
    } else {
      const auto grad = reference::linear_backward(in.dy, in.x, in.weight, M, N, K);
      EXPECT_LT(relative_error(out.dx, grad.dx), tol) << "dx";
      EXPECT_LT(relative_error(out.dweight, grad.dweight), tol) << "dweight";
      EXPECT_LT(relative_error(out.dbias, grad.dbias), tol) << "dbias";
    }
    EXPECT_TRUE(out.pads_zero) << "a pad column of an output is not zero";
  }
}

// The padding changes the GEMMs' sizes and leading dimensions, not the results: the same inputs,
// unpadded and padded, agree to the dtype's bound (the algorithms, hence summation orders, differ).
TEST(Linear, PaddedAndUnpaddedAgree) {
  FUSEKIT_REQUIRE_GPU();
  LinearContext context;
  for (const DType dtype : {DType::f16, DType::bf16}) {
    for (const Shape s : {Shape{333, 49, 32}, Shape{333, 32, 49}, Shape{7, 49, 49}, Shape{1, 56, 49}}) {
      Inputs in = random_inputs(s.M, s.N, s.K);
      const Outputs plain = run_linear(context, dtype, LinearEpilogue::bias, {s.M, s.N, s.K, false}, in);
      const Outputs padded = run_linear(context, dtype, LinearEpilogue::bias, {s.M, s.N, s.K, true}, in);
      const std::string at = std::string(dtype_name(dtype)) + " " + std::to_string(s.M) + "x" + std::to_string(s.N) +
                             "x" + std::to_string(s.K);
      const double tol = tolerance(dtype);
      EXPECT_LT(relative_error(padded.y, plain.y), tol) << "y " << at;
      EXPECT_LT(relative_error(padded.dx, plain.dx), tol) << "dx " << at;
      EXPECT_LT(relative_error(padded.dweight, plain.dweight), tol) << "dweight " << at;
      EXPECT_LT(relative_error(padded.dbias, plain.dbias), tol) << "dbias " << at;
      EXPECT_TRUE(padded.pads_zero) << at;
    }
  }
}

// The second call of the same shape makes no new plan (no descriptors, no heuristic query).
// The QKV projection packed once (pack_qkv_projection) and run as one linear layer writes, for each
// token, the query, key and value projections side by side: [tokens, 3, hidden], each third equal to
// its own projection x W_i^T + b_i.
TEST(Linear, PackedQkvProjectionWritesQueryKeyValueSideBySide) {
  FUSEKIT_REQUIRE_GPU();
  LinearContext context;
  for (const DType dtype : {DType::f16, DType::bf16}) {
    const int tokens = 77, hidden = 96, in = 64;
    std::mt19937_64 rng(std::random_device{}());
    std::normal_distribution<double> normal(0.0, 1.0);
    auto fill = [&](size_t n, double scale) {
      std::vector<double> v(n);
      for (double& e : v) e = scale * normal(rng);
      return v;
    };
    std::vector<double> x = fill(size_t(tokens) * in, 1.0);
    Matrix xm(tokens, in, in, dtype);
    xm.upload(x);
    std::vector<std::vector<double>> w(3), b(3);
    std::vector<std::unique_ptr<Matrix>> wm, bm;  // Matrix owns device memory: never copied
    for (int part = 0; part < 3; ++part) {
      w[part] = fill(size_t(hidden) * in, 1.0 / std::sqrt(in));
      b[part] = fill(hidden, 0.5);
      wm.push_back(std::make_unique<Matrix>(hidden, in, in, dtype));
      bm.push_back(std::make_unique<Matrix>(1, hidden, hidden, dtype));
      wm.back()->upload(w[part]);
      bm.back()->upload(b[part]);
    }
    Matrix weight(3 * hidden, in, in, dtype), bias(1, 3 * hidden, 3 * hidden, dtype),
        y(tokens, 3 * hidden, 3 * hidden, dtype);
    const void* weights[3] = {wm[0]->get(), wm[1]->get(), wm[2]->get()};
    const void* biases[3] = {bm[0]->get(), bm[1]->get(), bm[2]->get()};
    pack_qkv_projection(dtype, hidden, in, weights, biases, weight.get(), bias.get(), nullptr);
    linear_forward(context, dtype, LinearEpilogue::bias, {tokens, 3 * hidden, in, false}, xm.get(), weight.get(),
                   bias.get(), y.get(), nullptr, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    bool pads_zero = true;
    const std::vector<double> out = y.download(pads_zero);
    for (int part = 0; part < 3; ++part) {
      const auto expected = reference::linear_forward(x, w[part], b[part], tokens, hidden, in, false);
      std::vector<double> got(size_t(tokens) * hidden);
      for (int t = 0; t < tokens; ++t) {
        for (int c = 0; c < hidden; ++c) got[size_t(t) * hidden + c] = out[(size_t(t) * 3 + part) * hidden + c];
      }
      EXPECT_LT(relative_error(got, expected.y), tolerance(dtype)) << dtype_name(dtype) << " part " << part;
    }
  }
  const void* none[3] = {nullptr, nullptr, nullptr};
  EXPECT_THROW(pack_qkv_projection(DType::f16, 0, 8, none, none, nullptr, nullptr, nullptr), std::invalid_argument);
}

TEST(Linear, RepeatedCallsReuseThePlan) {
  FUSEKIT_REQUIRE_GPU();
  LinearContext context;
  Inputs in = random_inputs(64, 768, 256);
  const LinearShape shape{64, 768, 256, false};
  const Outputs first = run_linear(context, DType::f16, LinearEpilogue::bias_gelu, shape, in);
  const size_t plans = context.plans();
  EXPECT_EQ(plans, 4u);  // forward, the GELU backward, dW, dx
  const Outputs second = run_linear(context, DType::f16, LinearEpilogue::bias_gelu, shape, in);
  EXPECT_EQ(context.plans(), plans);
  EXPECT_EQ(relative_error(second.y, first.y), 0.0);  // same plan, same inputs: the same bits
}

// FUSEKIT_GEMM_ALGORITHM=heuristic: plans take the heuristic's first choice, untimed; a value it
// does not know is one clear error, not a silent default.
TEST(Linear, GemmAlgorithmChoiceFromTheEnvironment) {
  FUSEKIT_REQUIRE_GPU();
  {
    const test_support::ScopedEnvironment unset("FUSEKIT_GEMM_ALGORITHM", nullptr);
    EXPECT_TRUE(LinearContext().times_candidates());
  }
  {
    const test_support::ScopedEnvironment heuristic("FUSEKIT_GEMM_ALGORITHM", "heuristic");
    EXPECT_FALSE(LinearContext().times_candidates());
  }
  {
    const test_support::ScopedEnvironment timed("FUSEKIT_GEMM_ALGORITHM", "timed");
    EXPECT_TRUE(LinearContext().times_candidates());
  }
  const test_support::ScopedEnvironment unknown("FUSEKIT_GEMM_ALGORITHM", "fastest");
  try {
    LinearContext context;
    ADD_FAILURE() << "an unknown FUSEKIT_GEMM_ALGORITHM was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'timed' or 'heuristic', not 'fastest'"), std::string::npos) << e.what();
  }
}

TEST(Linear, RejectsBadSizes) {
  FUSEKIT_REQUIRE_GPU();
  LinearContext context;
  Buffer a(64, DType::f16), b(64, DType::f16), c(64, DType::f16), d(64, DType::f16), e(64, DType::f16);
  EXPECT_THROW(linear_forward(context, DType::f16, LinearEpilogue::bias, {0, 8, 8, false}, a.get(), b.get(), c.get(),
                              d.get(), nullptr, nullptr),
               std::invalid_argument);
  EXPECT_THROW(linear_forward(context, DType::f16, LinearEpilogue::bias, {1, 8, 8, false}, nullptr, b.get(), c.get(),
                              d.get(), nullptr, nullptr),
               std::invalid_argument);
  // cuBLASLt's GELU aux matrix needs a leading dimension divisible by 8: 7 features only padded.
  EXPECT_THROW(linear_forward(context, DType::f16, LinearEpilogue::bias_gelu, {1, 7, 8, false}, a.get(), b.get(),
                              c.get(), d.get(), e.get(), nullptr),
               std::invalid_argument);
  EXPECT_THROW(linear_gelu_backward_input(context, DType::f16, {1, 8, 7, false}, a.get(), b.get(), c.get(), d.get(),
                                          e.get(), nullptr),
               std::invalid_argument);
  EXPECT_THROW(linear_backward(context, DType::f16, {2, -1, 8, false}, a.get(), b.get(), c.get(), d.get(), e.get(),
                               nullptr, nullptr),
               std::invalid_argument);
  EXPECT_THROW(
      linear_weight_gradient(context, DType::f16, {0, 8, 8, false}, a.get(), b.get(), c.get(), d.get(), true, nullptr),
      std::invalid_argument);
  EXPECT_THROW(
      linear_weight_gradient(context, DType::f16, {1, 8, 8, false}, a.get(), b.get(), nullptr, d.get(), true, nullptr),
      std::invalid_argument);
  EXPECT_EQ(context.plans(), 0u);
}

std::vector<Param> params() {
  const Shape shapes[] = {{1, 8, 8},      {7, 49, 32},     {7, 56, 49},   {333, 49, 49}, {333, 768, 49},
                          {333, 49, 768}, {333, 768, 768}, {1, 768, 768}, {7, 8, 768},   {333, 56, 32}};
  std::vector<Param> out;
  for (const DType dtype : {DType::f16, DType::bf16}) {
    for (const LinearEpilogue epilogue : {LinearEpilogue::bias, LinearEpilogue::bias_gelu}) {
      for (const Shape s : shapes) {
        for (const bool padded : {false, true}) {
          // Padded sizes that are multiples of 8 already: the same GEMMs as unpadded, unless the padded
          // route takes the skinny kernels (extents <= 64), which then must agree with cuBLASLt's.
          if (padded && s.N % 8 == 0 && s.K % 8 == 0 && !linear_uses_skinny_path({s.M, s.N, s.K, true})) continue;
          // Unpadded GELU layers need N divisible by 8 (the leading dimension of cuBLASLt's aux matrix).
          if (!padded && epilogue == LinearEpilogue::bias_gelu && s.N % 8 != 0) continue;
          out.push_back({dtype, epilogue, s, padded});
        }
      }
    }
  }
  // fp32: plain fp32 GEMMs (no TF32), held to 1e-5; the tanh form of GELU shows at this precision.
  for (const LinearEpilogue epilogue : {LinearEpilogue::bias, LinearEpilogue::bias_gelu}) {
    out.push_back({DType::f32, epilogue, {333, 768, 768}, false});
    out.push_back({DType::f32, epilogue, {7, 49, 32}, true});
  }
  return out;
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const Param& p = info.param;
  return std::string(dtype_name(p.dtype)) + "_" + linear_epilogue_name(p.epilogue) + "_" + std::to_string(p.shape.M) +
         "x" + std::to_string(p.shape.N) + "x" + std::to_string(p.shape.K) + (p.padded ? "_padded" : "");
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearTest, ::testing::ValuesIn(params()), param_name);

// ---- linear_weight_gradient: dW (+)= dy^T x through cuBLASLt (beta = 1, C = D), dbias overwritten

struct WeightGradientParam {
  DType dtype;
  Shape shape;
  bool padded;
  bool accumulate;
  bool with_bias;
};

class LinearWeightGradientTest : public ::testing::TestWithParam<WeightGradientParam> {};

// Accumulating, dweight holds values of the gradient's own scale (sqrt(M)) before the call, which
// must be kept and added to; otherwise it is poisoned (NaN), and must be overwritten. dbias is
// poisoned: it is always overwritten. Each case has a fresh context, so its first call makes the
// plan: the candidates timed then must not add into dweight (it would hold the gradient several
// times). Accumulating, a second call adds the gradient once more onto what the first stored, with
// the same plan.
TEST_P(LinearWeightGradientTest, MatchesFloat64Reference) {
  FUSEKIT_REQUIRE_GPU();
  const WeightGradientParam p = GetParam();
  const int M = p.shape.M, N = p.shape.N, K = p.shape.K;
  const LinearShape shape{M, N, K, p.padded};
  const int Ns = shape.out_stride(), Ks = shape.in_stride();
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> normal(0.0, 1.0);
  auto fill = [&](size_t n, double scale) {
    std::vector<double> v(n);
    for (double& e : v) e = scale * normal(rng);
    return v;
  };
  std::vector<double> dy = fill(size_t(M) * N, 1.0), x = fill(size_t(M) * K, 1.0);
  Matrix dy_m(M, N, Ns, p.dtype), x_m(M, K, Ks, p.dtype), dweight(Ns, K, Ks, p.dtype), dbias(1, N, Ns, p.dtype);
  dy_m.upload(dy);
  x_m.upload(x);
  std::vector<double> before;  // empty: no accumulation
  if (p.accumulate) {
    std::vector<double> rows = fill(size_t(N) * K, std::sqrt(M));
    rows.resize(size_t(Ns) * K, 0.0);  // pad rows zero, as the layer keeps them
    dweight.upload(rows);
    before.assign(rows.begin(), rows.begin() + size_t(N) * K);
  }
  bool pads_zero = true;
  auto download_dweight = [&] {
    const std::vector<double> padded = dweight.buffer.download();
    for (size_t i = size_t(N) * Ks; i < padded.size(); ++i) pads_zero = pads_zero && padded[i] == 0.0;
    std::vector<double> out = dweight.download(pads_zero);
    out.resize(size_t(N) * K);
    return out;
  };
  const double tol = tolerance(p.dtype);
  LinearContext context;
  void* db = p.with_bias ? dbias.get() : nullptr;
  linear_weight_gradient(context, p.dtype, shape, dy_m.get(), x_m.get(), dweight.get(), db, p.accumulate, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(context.plans(), 1u);
  const auto ref = reference::linear_weight_gradient(dy, x, before, M, N, K);
  const std::vector<double> first = download_dweight();
  EXPECT_LT(relative_error(first, ref.dweight), tol) << "dweight";
  if (p.with_bias) EXPECT_LT(relative_error(dbias.download(pads_zero), ref.dbias), tol) << "dbias";
  EXPECT_TRUE(pads_zero) << "a pad entry of an output is not zero";
  if (!p.accumulate) return;

  dbias.buffer.poison();
  linear_weight_gradient(context, p.dtype, shape, dy_m.get(), x_m.get(), dweight.get(), db, true, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(context.plans(), 1u);  // the plan made by the first call
  const auto again = reference::linear_weight_gradient(dy, x, first, M, N, K);
  EXPECT_LT(relative_error(download_dweight(), again.dweight), tol) << "dweight, added twice";
  if (p.with_bias) EXPECT_LT(relative_error(dbias.download(pads_zero), ref.dbias), tol) << "dbias, second call";
  EXPECT_TRUE(pads_zero) << "a pad entry of an output is not zero";
}

// Accumulating and overwriting plans of one shape are two plans (beta is part of the key), each
// made once.
TEST(LinearWeightGradient, AccumulationIsPartOfThePlan) {
  FUSEKIT_REQUIRE_GPU();
  LinearContext context;
  const LinearShape shape{64, 96, 32, false};
  Buffer dy(64 * 96, DType::f16), x(64 * 32, DType::f16), dweight(96 * 32, DType::f16), dbias(96, DType::f16);
  for (const bool accumulate : {false, true, false, true}) {
    linear_weight_gradient(context, DType::f16, shape, dy.get(), x.get(), dweight.get(), dbias.get(), accumulate,
                           nullptr);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(context.plans(), 2u);
  // linear_backward's dW GEMM is the overwriting plan: no new one.
  Buffer weight(96 * 32, DType::f16);
  linear_backward(context, DType::f16, shape, dy.get(), x.get(), weight.get(), nullptr, dweight.get(), dbias.get(),
                  nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(context.plans(), 2u);
}

std::vector<WeightGradientParam> weight_gradient_params() {
  // BERT's MLM decoder (its rows: masked tokens; N: the vocabulary, odd); an odd N of a thousand; a
  // BERT-base layer; an odd small N; the smallest; Swin's 49 x 32 unpadded (rows 2-byte aligned:
  // cuBLASLt's align-1 kernels, which linear_backward would leave to the skinny kernels) and padded.
  const Shape shapes[] = {{77, 30522, 768}, {61, 1023, 128}, {128, 768, 768}, {19, 7, 24}, {1, 8, 8}, {7, 49, 32}};
  struct Mode {
    bool accumulate, with_bias;
  };
  const Mode modes[] = {{true, true}, {true, false}, {false, true}};
  std::vector<WeightGradientParam> out;
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (const Shape s : shapes) {
      for (const Mode m : modes) {
        out.push_back({dtype, s, false, m.accumulate, m.with_bias});
        if (s.N == 49) out.push_back({dtype, s, true, m.accumulate, m.with_bias});
      }
    }
  }
  return out;
}

std::string weight_gradient_param_name(const ::testing::TestParamInfo<WeightGradientParam>& info) {
  const WeightGradientParam& p = info.param;
  return std::string(dtype_name(p.dtype)) + "_" + std::to_string(p.shape.M) + "x" + std::to_string(p.shape.N) + "x" +
         std::to_string(p.shape.K) + (p.padded ? "_padded" : "") + (p.accumulate ? "_accumulate" : "_overwrite") +
         (p.with_bias ? "_dbias" : "");
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearWeightGradientTest, ::testing::ValuesIn(weight_gradient_params()),
                         weight_gradient_param_name);

// ---- linear_forward_no_bias (y = x W^T) and linear_input_gradient (dx (+)= dy W), through cuBLASLt

struct NoBiasParam {
  DType dtype;
  Shape shape;
};

class LinearNoBiasAndInputGradientTest : public ::testing::TestWithParam<NoBiasParam> {};

// y poisoned, then the forward; dx holding values of the gradient's own scale, then the input
// gradient added onto them (twice: the second call reuses the plan), and once more overwriting a
// poisoned dx. Against the float64 reference's forward with a zero bias and its backward's dx.
TEST_P(LinearNoBiasAndInputGradientTest, MatchesFloat64Reference) {
  FUSEKIT_REQUIRE_GPU();
  const NoBiasParam p = GetParam();
  const int M = p.shape.M, N = p.shape.N, K = p.shape.K;
  const LinearShape shape{M, N, K, false};
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> normal(0.0, 1.0);
  auto fill = [&](size_t n, double scale) {
    std::vector<double> v(n);
    for (double& e : v) e = scale * normal(rng);
    return v;
  };
  std::vector<double> x = fill(size_t(M) * K, 1.0), w = fill(size_t(N) * K, 1.0), dy = fill(size_t(M) * N, 1.0);
  bool pads_zero = true;  // no padding here: nothing to check
  Matrix x_m(M, K, K, p.dtype), w_m(N, K, K, p.dtype), y_m(M, N, N, p.dtype), dy_m(M, N, N, p.dtype),
      dx_m(M, K, K, p.dtype);
  x_m.upload(x);
  w_m.upload(w);
  dy_m.upload(dy);
  y_m.buffer.poison();
  const double tol = tolerance(p.dtype);
  LinearContext context;
  linear_forward_no_bias(context, p.dtype, shape, x_m.get(), w_m.get(), y_m.get(), nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto forward = reference::linear_forward(x, w, std::vector<double>(N, 0.0), M, N, K, false);
  EXPECT_LT(relative_error(y_m.download(pads_zero), forward.y), tol) << "y";

  const auto backward = reference::linear_backward(dy, x, w, M, N, K);
  std::vector<double> before = fill(size_t(M) * K, std::sqrt(N));
  dx_m.upload(before);
  std::vector<double> expected = before;
  for (int pass = 0; pass < 2; ++pass) {
    linear_input_gradient(context, p.dtype, shape, dy_m.get(), w_m.get(), dx_m.get(), true, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (size_t i = 0; i < expected.size(); ++i) expected[i] += backward.dx[i];
    EXPECT_LT(relative_error(dx_m.download(pads_zero), expected), tol) << "dx accumulated, pass " << pass;
  }
  dx_m.buffer.poison();
  linear_input_gradient(context, p.dtype, shape, dy_m.get(), w_m.get(), dx_m.get(), false, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_LT(relative_error(dx_m.download(pads_zero), backward.dx), tol) << "dx overwritten";
  EXPECT_EQ(context.plans(), 3u);  // forward, accumulating and overwriting input gradients
}

std::vector<NoBiasParam> no_bias_params() {
  // BERT's output projections (768 x 768, 768 x 3072), the decoder's input gradient (N = vocabulary,
  // odd rows), odd small sizes, the smallest.
  const Shape shapes[] = {{128, 768, 768}, {64, 768, 3072}, {77, 30522, 128}, {19, 7, 24}, {1, 8, 8}, {33, 40, 56}};
  std::vector<NoBiasParam> out;
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (const Shape s : shapes) out.push_back({dtype, s});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearNoBiasAndInputGradientTest, ::testing::ValuesIn(no_bias_params()),
                         [](const ::testing::TestParamInfo<NoBiasParam>& info) {
                           const NoBiasParam& p = info.param;
                           return std::string(dtype_name(p.dtype)) + "_" + std::to_string(p.shape.M) + "x" +
                                  std::to_string(p.shape.N) + "x" + std::to_string(p.shape.K);
                         });

// ---- the skinny path (kernels/skinny_linear.cu): here unpadded, N and K <= 64, N or K not a multiple of 8

// A device operand `offset` elements past a 16-byte aligned allocation (offset 1: only element-aligned,
// the kernels' fallback from 16-byte vectors), poisoned (NaN) until uploaded.
struct Operand {
  size_t count;
  int offset;
  DType dtype;
  Buffer buffer;
  Operand(size_t count_, int offset_, DType dtype_)
      : count(count_), offset(offset_), dtype(dtype_), buffer(count_ + offset_, dtype_) {}
  void upload(std::vector<double>& values) {  // values: rounded to the storage type in place
    std::vector<double> shifted(offset, 0.0);
    shifted.insert(shifted.end(), values.begin(), values.end());
    buffer.upload(shifted);
    values.assign(shifted.begin() + offset, shifted.end());
  }
  std::vector<double> download() const {
    const std::vector<double> all = buffer.download();
    return std::vector<double>(all.begin() + offset, all.end());
  }
  void* get() const { return static_cast<char*>(buffer.get()) + offset * dtype_size(dtype); }
};

struct SkinnyParam {
  DType dtype;
  Shape shape;
};

class LinearSkinnyTest : public ::testing::TestWithParam<SkinnyParam> {};

// Forward and backward (full, without dx, without db) against the float64 reference, every output
// poisoned before its call; with 16-byte aligned operands and with operands one element off (the
// element-copy fallback). No cuBLASLt plan may be made: the skinny kernels must have run.
TEST_P(LinearSkinnyTest, EveryOutputMatchesFloat64Reference) {
  FUSEKIT_REQUIRE_GPU();
  const SkinnyParam p = GetParam();
  const int M = p.shape.M, N = p.shape.N, K = p.shape.K;
  const LinearShape shape{M, N, K, false};
  ASSERT_TRUE(linear_uses_skinny_path(shape));
  const double tol = tolerance(p.dtype);
  LinearContext context;
  for (const int offset : {0, 1}) {
    SCOPED_TRACE(offset == 0 ? "16-byte aligned operands" : "operands one element off 16-byte alignment");
    Inputs in = random_inputs(M, N, K);
    Operand x(size_t(M) * K, offset, p.dtype), weight(size_t(N) * K, offset, p.dtype), bias(N, offset, p.dtype),
        dy(size_t(M) * N, offset, p.dtype);
    x.upload(in.x);
    weight.upload(in.weight);
    bias.upload(in.bias);
    dy.upload(in.dy);
    const auto forward = reference::linear_forward(in.x, in.weight, in.bias, M, N, K, false);
    const auto grad = reference::linear_backward(in.dy, in.x, in.weight, M, N, K);

    Operand y(size_t(M) * N, offset, p.dtype);
    linear_forward(context, p.dtype, LinearEpilogue::bias, shape, x.get(), weight.get(), bias.get(), y.get(), nullptr,
                   nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_LT(relative_error(y.download(), forward.y), tol) << "y";

    for (const bool with_dx : {true, false}) {
      for (const bool with_dbias : {true, false}) {
        if (!with_dx && !with_dbias) continue;
        SCOPED_TRACE(std::string(with_dx ? "dx" : "no dx") + ", " + (with_dbias ? "dbias" : "no dbias"));
        Operand dx(size_t(M) * K, offset, p.dtype), dweight(size_t(N) * K, offset, p.dtype), dbias(N, offset, p.dtype);
        linear_backward(context, p.dtype, shape, dy.get(), x.get(), weight.get(), with_dx ? dx.get() : nullptr,
                        dweight.get(), with_dbias ? dbias.get() : nullptr, nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_LT(relative_error(dweight.download(), grad.dweight), tol) << "dweight";
        if (with_dx) EXPECT_LT(relative_error(dx.download(), grad.dx), tol) << "dx";
        if (with_dbias) EXPECT_LT(relative_error(dbias.download(), grad.dbias), tol) << "dbias";
      }
    }
  }
  EXPECT_EQ(context.plans(), 0u);
}

// Which shapes take the skinny kernels (no GPU needed): extents of at most 64 where a feature size
// is not a multiple of 8 or the shape is padded; the kernels then see the stored extents.
TEST(LinearSkinny, RoutesByStoredExtents) {
  const int M = 1000;
  EXPECT_TRUE(linear_uses_skinny_path({M, 49, 32, false}));
  EXPECT_TRUE(linear_uses_skinny_path({M, 32, 49, false}));
  EXPECT_TRUE(linear_uses_skinny_path({M, 64, 63, false}));
  EXPECT_TRUE(linear_uses_skinny_path({M, 1, 1, false}));
  EXPECT_FALSE(linear_uses_skinny_path({M, 65, 49, false}));  // N past 64
  EXPECT_FALSE(linear_uses_skinny_path({M, 49, 65, false}));  // K past 64
  EXPECT_FALSE(linear_uses_skinny_path({M, 64, 8, false}));   // aligned and unpadded: cuBLASLt
  EXPECT_FALSE(linear_uses_skinny_path({M, 768, 49, false}));
  EXPECT_TRUE(linear_uses_skinny_path({M, 49, 32, true}));   // 56 x 32
  EXPECT_TRUE(linear_uses_skinny_path({M, 57, 49, true}));   // 64 x 56
  EXPECT_TRUE(linear_uses_skinny_path({M, 64, 8, true}));    // padded: the skinny kernels over 64 x 8
  EXPECT_FALSE(linear_uses_skinny_path({M, 65, 32, true}));  // 72 x 32
  const LinearShape extents = skinny_extents({M, 49, 57, true});
  EXPECT_EQ(extents.rows, M);
  EXPECT_EQ(extents.out_features, 56);
  EXPECT_EQ(extents.in_features, 64);
  EXPECT_FALSE(extents.padded);
}

// The backward adds per-block partials in a fixed order: the same inputs give the same bits (on one
// device: how the rows split into partials follows the grid, which follows the device).
TEST(LinearSkinny, BackwardIsDeterministic) {
  FUSEKIT_REQUIRE_GPU();
  const int M = 65537, N = 49, K = 32;
  const LinearShape shape{M, N, K, false};
  LinearContext context;
  for (const DType dtype : {DType::f16, DType::f32}) {
    Inputs in = random_inputs(M, N, K);
    Operand x(size_t(M) * K, 0, dtype), weight(size_t(N) * K, 0, dtype), dy(size_t(M) * N, 0, dtype);
    x.upload(in.x);
    weight.upload(in.weight);
    dy.upload(in.dy);
    std::vector<double> first_dweight, first_dbias;
    for (int run = 0; run < 2; ++run) {
      Operand dx(size_t(M) * K, 0, dtype), dweight(size_t(N) * K, 0, dtype), dbias(N, 0, dtype);
      linear_backward(context, dtype, shape, dy.get(), x.get(), weight.get(), dx.get(), dweight.get(), dbias.get(),
                      nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      if (run == 0) {
        first_dweight = dweight.download();
        first_dbias = dbias.download();
      } else {
        EXPECT_EQ(dweight.download(), first_dweight) << dtype_name(dtype);
        EXPECT_EQ(dbias.download(), first_dbias) << dtype_name(dtype);
      }
    }
  }
}

std::vector<SkinnyParam> skinny_params() {
  // One row; a partial last tile; K odd and N a multiple of 8; sizes 7 and 63; several tiles per
  // block; the smallest layer; N at the maximum with K = 17.
  const Shape shapes[] = {{1, 49, 32},     {37, 49, 32}, {1000, 32, 49}, {4099, 7, 63},
                          {65537, 49, 32}, {3, 1, 1},    {200, 64, 17}};
  std::vector<SkinnyParam> out;
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (const Shape s : shapes) out.push_back({dtype, s});
  }
  // Enough tiles that every block of the 16-bit forward's resident grid (2 blocks a multiprocessor,
  // tiles of 256 rows) walks several: the second buffer stage, its prefetch and the reuse of the
  // output stage (fp32 and the backward, with smaller tiles, reach them above already).
  for (const DType dtype : {DType::f16, DType::bf16}) {
    for (const Shape s : {Shape{300001, 49, 32}, Shape{300001, 32, 49}}) out.push_back({dtype, s});
  }
  return out;
}

std::string skinny_param_name(const ::testing::TestParamInfo<SkinnyParam>& info) {
  const SkinnyParam& p = info.param;
  return std::string(dtype_name(p.dtype)) + "_" + std::to_string(p.shape.M) + "x" + std::to_string(p.shape.N) + "x" +
         std::to_string(p.shape.K);
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearSkinnyTest, ::testing::ValuesIn(skinny_params()), skinny_param_name);

}  // namespace
}  // namespace fusekit::kernels
