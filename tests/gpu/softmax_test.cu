// Scale, mask and softmax forward and backward against the float64 reference, on fresh random
// inputs, with every output poisoned (NaN) before the run: fp32, fp16 and bf16; every mask kind;
// key counts 1, 31, 49, 77, 100, 127, 128, 333, 512, 1000, 1536, 4096, 12288, 16384, the largest register
// configurations (6001, 24000) and past them (20001, 40000); a single row; rows that keep no key (lengths of 0, causal
// with more queries than keys, a window mask row of -inf), which must come out as exact zeros in y and dx; removed keys
// exactly 0; scores one element off 16-byte alignment, with the element before the output left untouched; and a bias
// that repeats within a block's share of a staged tile (1 head x 3 queries x 5 keys).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "device_buffers.h"
#include "gpu_test_support.h"
#include "kernels/reference/softmax.h"
#include "kernels/softmax.h"

namespace fusekit::kernels {
namespace {

struct Case {
  int batch;
  int heads;
  int queries;
  int keys;
  SoftmaxMask mask;
  int windows = 0;          // bias: the window mask's count, 0 for none
  bool misaligned = false;  // x, y, dy, dx one element past a 16-byte boundary
};

class SoftmaxTest : public ::testing::TestWithParam<std::tuple<DType, Case>> {};

TEST_P(SoftmaxTest, ForwardAndBackwardMatchFloat64Reference) {
  FUSEKIT_REQUIRE_GPU();
  const auto [dtype, c] = GetParam();
  const int rows = c.batch * c.heads * c.queries, keys = c.keys;
  const size_t n = static_cast<size_t>(rows) * keys;
  const size_t pad = c.misaligned ? 1 : 0;  // elements before the tensors in their buffers
  const double scale = 0.125;               // 1 / sqrt(64), exact in float
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> normal(0.0, 1.0);

  // Scores of dot products of 64-dimensional unit-variance vectors: standard deviation 8.
  std::vector<double> x(pad + n), dy(pad + n);
  for (auto& v : x) v = 8.0 * normal(rng);
  for (auto& v : dy) v = normal(rng);
  Buffer x_buffer(pad + n, dtype), y_buffer(pad + n, dtype), dy_buffer(pad + n, dtype), dx_buffer(pad + n, dtype);
  x_buffer.upload(x);
  dy_buffer.upload(dy);
  const size_t element = dtype_size(dtype);
  auto at = [&](const Buffer& b) { return static_cast<char*>(b.get()) + pad * element; };

  reference::SoftmaxMasks masks;
  SoftmaxMasking masking;
  masking.kind = c.mask;
  masks.kind = static_cast<reference::SoftmaxMasks::Kind>(static_cast<int>(c.mask));
  int32_t* lengths = nullptr;
  Buffer bias_buffer(static_cast<size_t>(c.heads) * c.queries * keys, dtype);
  Buffer window_buffer(static_cast<size_t>(std::max(c.windows, 1)) * c.queries * keys, dtype);
  if (c.mask == SoftmaxMask::padding) {
    // Random lengths in [0, keys], with a 0, one past keys (clamped) and exactly keys where the batch
    // has room for them.
    std::uniform_int_distribution<int> length(0, keys);
    masks.lengths.resize(c.batch);
    for (auto& v : masks.lengths) v = length(rng);
    if (c.batch >= 2) {
      masks.lengths[0] = 0;
      masks.lengths[c.batch - 1] = keys;
    }
    if (c.batch >= 3) masks.lengths[1] = keys + 5;
    ASSERT_EQ(cudaMalloc(&lengths, c.batch * sizeof(int32_t)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(lengths, masks.lengths.data(), c.batch * sizeof(int32_t), cudaMemcpyHostToDevice),
              cudaSuccess);
    masking.lengths = lengths;
  }
  if (c.mask == SoftmaxMask::bias) {
    masks.bias.resize(static_cast<size_t>(c.heads) * c.queries * keys);
    for (auto& v : masks.bias) v = 2.0 * normal(rng);
    bias_buffer.upload(masks.bias);
    masking.bias = bias_buffer.get();
    if (c.windows > 0) {
      // Swin's shift mask: 0 or -100; and window 0's first query keeps no key at all.
      std::bernoulli_distribution far(0.3);
      masks.window_mask.resize(static_cast<size_t>(c.windows) * c.queries * keys);
      for (auto& v : masks.window_mask) v = far(rng) ? -100.0 : 0.0;
      for (int k = 0; k < keys; ++k) masks.window_mask[k] = -INFINITY;
      window_buffer.upload(masks.window_mask);
      masking.window_mask = window_buffer.get();
      masking.windows = masks.windows = c.windows;
    }
  }

  const SoftmaxShape shape{c.batch, c.heads, c.queries, keys};
  softmax_forward(dtype, at(x_buffer), at(y_buffer), shape, static_cast<float>(scale), masking, nullptr);
  softmax_backward(dtype, at(y_buffer), at(dy_buffer), at(dx_buffer), shape, static_cast<float>(scale), nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());

  const std::vector<double> x_used(x.begin() + pad, x.end()), dy_used(dy.begin() + pad, dy.end());
  const std::vector<double> y_all = y_buffer.download(), dx_all = dx_buffer.download();
  if (c.misaligned) {
    EXPECT_TRUE(std::isnan(y_all[0])) << "the forward wrote before y";
    EXPECT_TRUE(std::isnan(dx_all[0])) << "the backward wrote before dx";
  }
  const std::vector<double> y(y_all.begin() + pad, y_all.end()), dx(dx_all.begin() + pad, dx_all.end());
  const std::vector<double> ref_y = reference::softmax_forward(x_used, c.batch, c.heads, c.queries, keys, scale, masks);
  // The backward's inputs are the stored y and dy, so its reference starts from the same values.
  const std::vector<double> ref_dx = reference::softmax_backward(y, dy_used, rows, keys, scale);
  EXPECT_LT(relative_error(y, ref_y), storage_tolerance(ref_y, dtype)) << "y";
  EXPECT_LT(relative_error(dx, ref_dx), storage_tolerance(ref_dx, dtype)) << "dx";

  // Removed keys are exact zeros in y and dx; a row with no key left is zeros throughout.
  size_t removed = 0, empty_rows = 0, wrong = 0;
  for (int r = 0; r < rows; ++r) {
    bool empty = true;
    for (int k = 0; k < keys; ++k) {
      const size_t i = static_cast<size_t>(r) * keys + k;
      if (ref_y[i] != 0.0) {
        empty = false;
        continue;
      }
      ++removed;
      if (y[i] != 0.0 || dx[i] != 0.0) ++wrong;
    }
    empty_rows += empty;
  }
  EXPECT_EQ(wrong, 0u) << "of " << removed << " removed keys, nonzero in y or dx";
  // The cases built to have rows without keys must have them (else the check above tested nothing).
  const bool expect_empty = (c.mask == SoftmaxMask::padding && c.batch >= 2) ||
                            (c.mask == SoftmaxMask::causal && c.queries > keys) ||
                            (c.mask == SoftmaxMask::bias && c.windows > 0);
  if (expect_empty) {
    EXPECT_GT(empty_rows, 0u);
  }
  cudaFree(lengths);
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<DType, Case>>& info) {
  const auto [dtype, c] = info.param;
  return std::string(dtype_name(dtype)) + "_" + std::to_string(c.batch) + "x" + std::to_string(c.heads) + "x" +
         std::to_string(c.queries) + "x" + std::to_string(c.keys) + "_" + softmax_mask_name(c.mask) +
         (c.windows ? "_w" + std::to_string(c.windows) : "") + (c.misaligned ? "_misaligned" : "");
}

using M = SoftmaxMask;
INSTANTIATE_TEST_SUITE_P(
    Shapes, SoftmaxTest,
    ::testing::Combine(
        ::testing::Values(DType::f32, DType::f16, DType::bf16),
        ::testing::Values(
            Case{1, 1, 1, 1, M::none}, Case{1, 1, 1, 16384, M::none}, Case{3, 2, 5, 31, M::padding},
            Case{6, 3, 49, 49, M::bias, 4}, Case{2, 2, 77, 77, M::causal}, Case{5, 2, 128, 128, M::padding},
            Case{3, 2, 128, 128, M::padding, 0, true}, Case{2, 3, 40, 333, M::causal}, Case{3, 2, 64, 512, M::padding},
            Case{1, 2, 200, 1000, M::causal}, Case{2, 1, 16, 1536, M::bias}, Case{3, 2, 8, 4096, M::padding},
            Case{1, 1, 4, 12288, M::none}, Case{1, 2, 3, 16384, M::causal}, Case{2, 1, 9, 5, M::causal},
            Case{3, 1, 2, 20001, M::padding}, Case{2, 2, 3, 40000, M::bias, 2}, Case{4, 2, 7, 1000, M::none, 0, true},
            Case{1, 1, 3, 6001, M::causal}, Case{1, 1, 2, 24000, M::none}, Case{600, 3, 49, 49, M::bias, 4},
            Case{7, 2, 33, 100, M::padding}, Case{3, 1, 70, 127, M::causal}, Case{5, 2, 49, 49, M::bias, 0, true},
            Case{40, 1, 3, 5, M::bias, 4}, Case{12, 2, 7, 100, M::bias, 3}, Case{9, 2, 49, 49, M::bias, 0},
            Case{3, 1, 7, 128, M::padding}, Case{5, 3, 11, 64, M::causal}, Case{2, 1, 9, 256, M::padding})),
    case_name);

}  // namespace
}  // namespace fusekit::kernels
