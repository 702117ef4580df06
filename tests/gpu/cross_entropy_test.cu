// Cross-entropy forward and backward against the float64 reference, on fresh random inputs, with
// every output poisoned (NaN) before the run: fp32, fp16 and bf16; vocabularies 1, 8, 31, 1000,
// 30522, 50257, 65536 and 100003; one row and thousands; label smoothing 0 and 0.1; about 10% of
// the labels ignored; then every row ignored, -inf logits, rows that start off a 16-byte boundary,
// and labels out of range.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "device_buffers.h"
#include "gpu_test_support.h"
#include "kernels/cross_entropy.h"
#include "kernels/reference/cross_entropy.h"

namespace fusekit::kernels {
namespace {

constexpr int64_t kIgnore = -100;

struct Shape {
  int rows;
  int vocab;
};

struct Inputs {
  std::vector<double> logits;
  std::vector<int64_t> labels;
};

// Logits 3 * N(0, 1) (a softmax neither flat nor one-hot); labels uniform, each ignored with
// probability 0.1.
Inputs random_inputs(Shape shape, std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<int64_t> label(0, shape.vocab - 1);
  std::bernoulli_distribution ignored(0.1);
  Inputs in{std::vector<double>(static_cast<size_t>(shape.rows) * shape.vocab), std::vector<int64_t>(shape.rows)};
  for (auto& v : in.logits) v = 3.0 * normal(rng);
  for (auto& l : in.labels) l = ignored(rng) ? kIgnore : label(rng);
  return in;
}

// dloss such that dloss / count is in [0.5, 2), as a loss scaler makes it in fp16 training: the
// gradients of order 1 / (V * count) would otherwise fall into fp16's subnormals in the fused
// result and PyTorch's alike.
double random_dloss(const std::vector<int64_t>& labels, std::mt19937_64& rng) {
  int count = 0;
  for (int64_t l : labels) count += l != kIgnore;
  return std::uniform_real_distribution<double>(0.5, 2.0)(rng) * std::max(count, 1);
}

struct Fused {
  std::vector<double> losses, logsumexp, dlogits;
  double mean = 0;
  int valid_rows = -1;
};

// Forward and backward into buffers poisoned first. logits_shift and dlogits_shift move the
// pointers that many elements past the allocation's 16-byte boundary. `logits` becomes the values
// as stored (rounded to the dtype).
void run_fused(DType dtype, Shape shape, std::vector<double>& logits, const std::vector<int64_t>& labels, float eps,
               float dloss, Fused* out, int logits_shift = 0, int dlogits_shift = 0) {
  const size_t n = static_cast<size_t>(shape.rows) * shape.vocab, size = dtype_size(dtype);
  std::vector<double> shifted(logits_shift, 0.0);
  shifted.insert(shifted.end(), logits.begin(), logits.end());
  Buffer x(n + logits_shift, dtype), dx(n + dlogits_shift, dtype);
  x.upload(shifted);
  logits.assign(shifted.begin() + logits_shift, shifted.end());
  const int rows = std::max(shape.rows, 1);
  Buffer losses(rows, DType::f32), lse(rows, DType::f32), mean(1, DType::f32), grad(1, DType::f32);
  std::vector<double> dloss_value{dloss};
  grad.upload(dloss_value);
  int64_t* label_buffer = nullptr;
  int* valid_rows = nullptr;
  CHECK_CUDA(cudaMalloc(&label_buffer, rows * sizeof(int64_t)));
  CHECK_CUDA(cudaMemcpy(label_buffer, labels.data(), shape.rows * sizeof(int64_t), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMalloc(&valid_rows, sizeof(int)));
  CHECK_CUDA(cudaMemset(valid_rows, 0xFF, sizeof(int)));  // -1

  auto floats = [](const Buffer& b) { return static_cast<float*>(b.get()); };
  void* logits_ptr = static_cast<char*>(x.get()) + logits_shift * size;
  void* dlogits_ptr = static_cast<char*>(dx.get()) + dlogits_shift * size;
  cross_entropy_forward(dtype, logits_ptr, label_buffer, floats(losses), floats(lse), floats(mean), valid_rows,
                        shape.rows, shape.vocab, kIgnore, eps, nullptr);
  cross_entropy_backward(dtype, logits_ptr, label_buffer, floats(lse), valid_rows, floats(grad), dlogits_ptr,
                         shape.rows, shape.vocab, kIgnore, eps, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());

  out->losses = losses.download();
  out->losses.resize(shape.rows);
  out->logsumexp = lse.download();
  out->logsumexp.resize(shape.rows);
  out->mean = mean.download()[0];
  const std::vector<double> all = dx.download();
  out->dlogits.assign(all.begin() + dlogits_shift, all.end());
  CHECK_CUDA(cudaMemcpy(&out->valid_rows, valid_rows, sizeof(int), cudaMemcpyDeviceToHost));
  cudaFree(label_buffer);
  cudaFree(valid_rows);
}

// Where the reference is not finite (+inf or NaN) the output must be the same; over the rest,
// ||out - ref|| / ||ref||, infinite if an output there is not finite.
double error_against(const std::vector<double>& out, const std::vector<double>& ref) {
  std::vector<double> finite_out, finite_ref;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isfinite(ref[i])) {
      finite_out.push_back(out[i]);
      finite_ref.push_back(ref[i]);
    } else if (!(out[i] == ref[i] || (std::isnan(out[i]) && std::isnan(ref[i])))) {
      return INFINITY;
    }
  }
  return relative_error(finite_out, finite_ref);
}

// Losses, logsumexp and the mean are float results of float arithmetic on the stored logits, so
// fp32's bound applies in every dtype; dlogits is stored in the dtype and takes its bound.
void expect_matches_reference(DType dtype, Shape shape, const std::vector<double>& logits,
                              const std::vector<int64_t>& labels, double eps, double dloss, const Fused& fused) {
  const auto ref = reference::cross_entropy_forward(logits, labels, shape.rows, shape.vocab, kIgnore, eps);
  const auto ref_dlogits =
      reference::cross_entropy_backward(logits, labels, shape.rows, shape.vocab, kIgnore, eps, dloss);
  EXPECT_LT(error_against(fused.losses, ref.losses), 1e-5) << "losses";
  EXPECT_LT(error_against(fused.logsumexp, ref.logsumexp), 1e-5) << "logsumexp";
  EXPECT_LT(error_against({fused.mean}, {ref.mean}), 1e-5) << "mean " << fused.mean << ", reference " << ref.mean;
  EXPECT_EQ(fused.valid_rows, ref.valid_rows);
  EXPECT_LT(error_against(fused.dlogits, ref_dlogits), tolerance(dtype)) << "dlogits";
}

class CrossEntropyTest : public ::testing::TestWithParam<std::tuple<DType, Shape, float>> {};

TEST_P(CrossEntropyTest, ForwardAndBackwardMatchFloat64Reference) {
  FUSEKIT_REQUIRE_GPU();
  const auto [dtype, shape, eps] = GetParam();
  std::mt19937_64 rng(std::random_device{}());
  Inputs in = random_inputs(shape, rng);
  const double dloss = random_dloss(in.labels, rng);
  Fused fused;
  ASSERT_NO_FATAL_FAILURE(run_fused(dtype, shape, in.logits, in.labels, eps, static_cast<float>(dloss), &fused));
  expect_matches_reference(dtype, shape, in.logits, in.labels, eps, static_cast<float>(dloss), fused);
}

std::string dtype_shape_name(DType dtype, Shape shape) {
  return std::string(dtype_name(dtype)) + "_" + std::to_string(shape.rows) + "x" + std::to_string(shape.vocab);
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<DType, Shape, float>>& info) {
  const auto [dtype, shape, eps] = info.param;
  return dtype_shape_name(dtype, shape) + (eps > 0 ? "_smoothing" : "");
}

INSTANTIATE_TEST_SUITE_P(Shapes, CrossEntropyTest,
                         ::testing::Combine(::testing::Values(DType::f32, DType::f16, DType::bf16),
                                            ::testing::Values(Shape{300, 1}, Shape{3000, 8}, Shape{257, 31},
                                                              Shape{64, 1000}, Shape{4096, 1000}, Shape{40, 30522},
                                                              Shape{1, 50257}, Shape{17, 50257}, Shape{9, 65536},
                                                              Shape{3, 100003}),
                                            ::testing::Values(0.0f, 0.1f)),
                         case_name);

class CrossEntropyCasesTest : public ::testing::TestWithParam<DType> {};

// PyTorch's mean is 0/0 = NaN here; fusekit's is 0, with zero gradients (cross_entropy.h).
TEST_P(CrossEntropyCasesTest, EveryRowIgnoredGivesZeroLossAndZeroGradients) {
  FUSEKIT_REQUIRE_GPU();
  const DType dtype = GetParam();
  const Shape shape{33, 1000};
  std::mt19937_64 rng(std::random_device{}());
  Inputs in = random_inputs(shape, rng);
  for (auto& l : in.labels) l = kIgnore;
  Fused fused;
  ASSERT_NO_FATAL_FAILURE(run_fused(dtype, shape, in.logits, in.labels, 0.1f, 1.0f, &fused));
  EXPECT_EQ(fused.valid_rows, 0);
  EXPECT_EQ(fused.mean, 0.0);
  for (int r = 0; r < shape.rows; ++r) EXPECT_EQ(fused.losses[r], 0.0) << "row " << r;
  int nonzero = 0;
  for (double g : fused.dlogits) nonzero += g != 0.0;  // NaN (an unwritten element) counts too
  EXPECT_EQ(nonzero, 0);
  const auto ref = reference::cross_entropy_forward(in.logits, in.labels, shape.rows, shape.vocab, kIgnore, 0.1);
  EXPECT_LT(relative_error(fused.logsumexp, ref.logsumexp), 1e-5) << "logsumexp is written for ignored rows too";
}

// Masked vocabulary entries (-inf): they take no probability. Rows 0 and 1 have their label masked
// (loss +inf, as PyTorch); row 2 is masked throughout (NaN loss and gradients, as PyTorch). With
// smoothing every row holding a -inf has loss +inf; the gradients of the other rows stay finite.
TEST_P(CrossEntropyCasesTest, NegativeInfinityLogits) {
  FUSEKIT_REQUIRE_GPU();
  const DType dtype = GetParam();
  for (const Shape shape : {Shape{64, 1000}, Shape{12, 30522}}) {
    for (const float eps : {0.0f, 0.1f}) {
      std::mt19937_64 rng(std::random_device{}());
      Inputs in = random_inputs(shape, rng);
      std::bernoulli_distribution masked(0.1);
      for (int r = 0; r < shape.rows; ++r) {
        double* row = &in.logits[static_cast<size_t>(r) * shape.vocab];
        if (in.labels[r] == kIgnore) in.labels[r] = r % shape.vocab;
        for (int c = 0; c < shape.vocab; ++c) {
          if (masked(rng) && c != in.labels[r]) row[c] = -INFINITY;
        }
        if (r < 2) row[in.labels[r]] = -INFINITY;
        if (r == 2) std::fill(row, row + shape.vocab, -INFINITY);
      }
      const double dloss = random_dloss(in.labels, rng);
      Fused fused;
      ASSERT_NO_FATAL_FAILURE(run_fused(dtype, shape, in.logits, in.labels, eps, static_cast<float>(dloss), &fused));
      SCOPED_TRACE(dtype_shape_name(dtype, shape) + " smoothing " + std::to_string(eps));
      EXPECT_EQ(fused.losses[0], INFINITY);
      EXPECT_TRUE(std::isnan(fused.losses[2]));
      EXPECT_EQ(std::isinf(fused.losses[3]), eps > 0);
      expect_matches_reference(dtype, shape, in.logits, in.labels, eps, static_cast<float>(dloss), fused);
    }
  }
}

// Rows that start off a 16-byte boundary even where V is a multiple of 8; dlogits at the same
// offset (the vector path with a head) and at another one (the one-element path).
TEST_P(CrossEntropyCasesTest, RowsOffSixteenByteBoundaries) {
  FUSEKIT_REQUIRE_GPU();
  const DType dtype = GetParam();
  for (const Shape shape : {Shape{50, 1000}, Shape{7, 30522}}) {
    for (const auto& [logits_shift, dlogits_shift] : {std::pair{1, 1}, std::pair{3, 0}, std::pair{0, 1}}) {
      std::mt19937_64 rng(std::random_device{}());
      Inputs in = random_inputs(shape, rng);
      const double dloss = random_dloss(in.labels, rng);
      Fused fused;
      ASSERT_NO_FATAL_FAILURE(run_fused(dtype, shape, in.logits, in.labels, 0.1f, static_cast<float>(dloss), &fused,
                                        logits_shift, dlogits_shift));
      SCOPED_TRACE(dtype_shape_name(dtype, shape) + " shifts " + std::to_string(logits_shift) + ", " +
                   std::to_string(dlogits_shift));
      expect_matches_reference(dtype, shape, in.logits, in.labels, 0.1f, static_cast<float>(dloss), fused);
    }
  }
}

// A label outside [0, V) that is not ignore_index: NaN loss and gradients for its row (and a NaN
// mean), the other rows untouched.
TEST_P(CrossEntropyCasesTest, LabelOutOfRangeGivesNaN) {
  FUSEKIT_REQUIRE_GPU();
  const DType dtype = GetParam();
  const Shape shape{20, 31};
  std::mt19937_64 rng(std::random_device{}());
  Inputs in = random_inputs(shape, rng);
  in.labels[4] = shape.vocab;
  in.labels[9] = -1;
  const double dloss = random_dloss(in.labels, rng);
  Fused fused;
  ASSERT_NO_FATAL_FAILURE(run_fused(dtype, shape, in.logits, in.labels, 0.0f, static_cast<float>(dloss), &fused));
  EXPECT_TRUE(std::isnan(fused.losses[4]));
  EXPECT_TRUE(std::isnan(fused.losses[9]));
  EXPECT_TRUE(std::isnan(fused.mean));
  EXPECT_TRUE(std::isnan(fused.dlogits[4 * shape.vocab + 7]));
  expect_matches_reference(dtype, shape, in.logits, in.labels, 0.0, static_cast<float>(dloss), fused);
}

INSTANTIATE_TEST_SUITE_P(DTypes, CrossEntropyCasesTest, ::testing::Values(DType::f32, DType::f16, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(CrossEntropyArguments, RejectsUnsupportedSizesAndSmoothing) {
  EXPECT_THROW(cross_entropy_forward(DType::f16, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 4, 0, kIgnore,
                                     0.f, nullptr),
               std::invalid_argument);
  EXPECT_THROW(cross_entropy_forward(DType::f16, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 4, 10, kIgnore,
                                     1.f, nullptr),
               std::invalid_argument);
  EXPECT_THROW(cross_entropy_backward(DType::bf16, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, -1, 10,
                                      kIgnore, 0.f, nullptr),
               std::invalid_argument);
}

}  // namespace
}  // namespace fusekit::kernels
