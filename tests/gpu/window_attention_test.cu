// Swin window attention forward and backward against the float64 reference, on fresh random inputs
// with every output (out, lse, the gathered bias, dqkv, dtable, and the backward's workspace)
// poisoned (NaN) before the run: fp16 and bf16; windows of 7 (49 tokens, padded to 64) and 12 (144);
// head dims 32 and 64; one window, a few heads, 40 heads (the table gradient's second lane per
// head); with and without the shift mask (0 or -100, Swin's values); and window counts larger than
// the backward's resident blocks, so its blocks add several windows into their bias slices.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "device_buffers.h"
#include "gpu_test_support.h"
#include "kernels/reference/window_attention.h"
#include "kernels/window_attention.h"

namespace fusekit::kernels {
namespace {

// A float device buffer poisoned with NaN.
class FloatBuffer {
 public:
  explicit FloatBuffer(size_t count) : count_(count) {
    EXPECT_EQ(cudaMalloc(&data_, std::max<size_t>(1, count * sizeof(float))), cudaSuccess);
    cudaMemset(data_, 0xFF, count * sizeof(float));
  }
  ~FloatBuffer() { cudaFree(data_); }
  void upload(const std::vector<double>& values) {
    const std::vector<float> f(values.begin(), values.end());
    cudaMemcpy(data_, f.data(), f.size() * sizeof(float), cudaMemcpyHostToDevice);
  }
  float* get() const { return data_; }
  std::vector<double> download() const { return download_floats(data_, count_); }

 private:
  float* data_ = nullptr;
  size_t count_;
};

struct Case {
  int windows;
  int heads;
  int tokens;
  int head_dim;
  int mask_windows;  // 0: no mask
};

class WindowAttentionTest : public ::testing::TestWithParam<std::tuple<DType, Case>> {};

TEST_P(WindowAttentionTest, ForwardAndBackwardMatchFloat64Reference) {
  FUSEKIT_REQUIRE_GPU();
  const auto [dtype, c] = GetParam();
  const WindowAttentionShape shape{c.windows, c.heads, c.tokens, c.head_dim, c.mask_windows};
  const reference::WindowAttentionSizes sizes{c.windows, c.heads, c.tokens, c.head_dim, c.mask_windows};
  const int window = c.tokens == 49 ? 7 : 12;
  const size_t entries = static_cast<size_t>(2 * window - 1) * (2 * window - 1);
  const size_t pairs = static_cast<size_t>(c.tokens) * c.tokens;
  const size_t rows = static_cast<size_t>(c.windows) * c.tokens;
  const size_t qkv_count = rows * 3 * c.heads * c.head_dim, out_count = rows * c.heads * c.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> normal(0.0, 1.0);

  std::vector<double> qkv(qkv_count), table(entries * c.heads), dout(out_count), mask;
  for (auto& v : qkv) v = normal(rng);
  for (auto& v : table) v = normal(rng);  // Swin's are small; unit values make the bias count
  for (auto& v : dout) v = normal(rng);
  if (c.mask_windows > 0) {
    std::bernoulli_distribution far(0.3);
    mask.resize(c.mask_windows * pairs);
    for (auto& v : mask) v = far(rng) ? -100.0 : 0.0;
  }
  const std::vector<int32_t> index = relative_position_index(window);

  Buffer qkv_buffer(qkv_count, dtype), table_buffer(table.size(), dtype), dout_buffer(out_count, dtype);
  Buffer out_buffer(out_count, dtype), dqkv_buffer(qkv_count, dtype), dtable_buffer(table.size(), dtype);
  qkv_buffer.upload(qkv);  // qkv, table and dout now hold the values stored in the dtype
  table_buffer.upload(table);
  dout_buffer.upload(dout);
  FloatBuffer mask_buffer(mask.size()), bias_buffer(c.heads * pairs), lse_buffer(rows * c.heads);
  FloatBuffer workspace(window_attention_backward_workspace_bytes(shape) / sizeof(float));
  mask_buffer.upload(mask);
  int32_t* index_buffer = nullptr;
  CHECK_CUDA(cudaMalloc(&index_buffer, pairs * sizeof(int32_t)));
  CHECK_CUDA(cudaMemcpy(index_buffer, index.data(), pairs * sizeof(int32_t), cudaMemcpyHostToDevice));

  const float* mask_pointer = c.mask_windows > 0 ? mask_buffer.get() : nullptr;
  window_attention_forward(dtype, qkv_buffer.get(), table_buffer.get(), index_buffer, mask_pointer, out_buffer.get(),
                           bias_buffer.get(), lse_buffer.get(), shape, static_cast<float>(scale), nullptr);
  window_attention_backward(dtype, qkv_buffer.get(), bias_buffer.get(), mask_pointer, out_buffer.get(),
                            lse_buffer.get(), dout_buffer.get(), index_buffer, dqkv_buffer.get(), dtable_buffer.get(),
                            workspace.get(), shape, static_cast<float>(scale), nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaFree(index_buffer);

  std::vector<int> index_int(index.begin(), index.end());
  const auto ref = reference::window_attention_forward(qkv, table, index_int, mask, sizes, scale);
  const auto grads = reference::window_attention_backward(qkv, table, index_int, mask, dout, sizes, scale);

  // The gathered bias is a copy of table entries: exact.
  const std::vector<double> bias = bias_buffer.download();
  size_t wrong_bias = 0;
  for (int h = 0; h < c.heads; ++h) {
    for (size_t ij = 0; ij < pairs; ++ij) wrong_bias += bias[h * pairs + ij] != table[index[ij] * c.heads + h];
  }
  EXPECT_EQ(wrong_bias, 0u) << "gathered bias entries";

  const std::vector<double> out = out_buffer.download(), lse = lse_buffer.download();
  const std::vector<double> dqkv = dqkv_buffer.download(), dtable = dtable_buffer.download();
  EXPECT_LT(relative_error(out, ref.out), storage_tolerance(ref.out, dtype)) << "out";
  // lse is float, from scores of stored inputs with float accumulation: float's bound.
  EXPECT_LT(relative_error(lse, ref.lse), tolerance(DType::f32)) << "lse";
  EXPECT_LT(relative_error(dqkv, grads.dqkv), storage_tolerance(grads.dqkv, dtype)) << "dqkv";
  EXPECT_LT(relative_error(dtable, grads.dtable), storage_tolerance(grads.dtable, dtype)) << "dtable";

  // Each part of dqkv on its own, so that a wrong dq, dk or dv shows by name.
  const char* names[3] = {"dq", "dk", "dv"};
  const size_t per_row = static_cast<size_t>(c.heads) * c.head_dim;
  for (int part = 0; part < 3; ++part) {
    std::vector<double> got, want;
    for (size_t r = 0; r < rows; ++r) {
      for (size_t e = 0; e < per_row; ++e) {
        got.push_back(dqkv[(r * 3 + part) * per_row + e]);
        want.push_back(grads.dqkv[(r * 3 + part) * per_row + e]);
      }
    }
    EXPECT_LT(relative_error(got, want), storage_tolerance(want, dtype)) << names[part];
  }
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<DType, Case>>& info) {
  const auto [dtype, c] = info.param;
  return std::string(dtype_name(dtype)) + "_" + std::to_string(c.windows) + "x" + std::to_string(c.heads) + "x" +
         std::to_string(c.tokens) + "x" + std::to_string(c.head_dim) +
         (c.mask_windows ? "_mask" + std::to_string(c.mask_windows) : "");
}

INSTANTIATE_TEST_SUITE_P(Shapes, WindowAttentionTest,
                         ::testing::Combine(::testing::Values(DType::f16, DType::bf16),
                                            ::testing::Values(Case{1, 1, 49, 32, 0}, Case{1, 3, 49, 32, 1},
                                                              Case{6, 3, 49, 32, 2}, Case{4, 2, 49, 64, 4},
                                                              Case{2, 40, 49, 32, 0}, Case{2, 2, 144, 32, 2},
                                                              Case{3, 2, 144, 64, 0}, Case{1, 1, 144, 64, 1},
                                                              Case{600, 2, 49, 32, 4}, Case{160, 2, 144, 32, 8})),
                         case_name);

TEST(WindowAttentionErrors, UnsupportedShapesAndDtypesAreOneClearError) {
  const WindowAttentionShape good{8, 3, 49, 32, 4};
  EXPECT_NO_THROW(check_window_attention(DType::f16, good));
  EXPECT_NO_THROW(check_window_attention(DType::bf16, good));
  auto message = [](DType dtype, WindowAttentionShape s) {
    try {
      check_window_attention(dtype, s);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(DType::f32, good).find("dtype fp32"), std::string::npos);
  EXPECT_NE(message(DType::f16, {8, 3, 64, 32, 0}).find("tokens"), std::string::npos);
  EXPECT_NE(message(DType::f16, {8, 3, 49, 48, 0}).find("head_dim"), std::string::npos);
  EXPECT_NE(message(DType::f16, {8, 65, 49, 32, 0}).find("heads"), std::string::npos);
  EXPECT_NE(message(DType::f16, {8, 3, 49, 32, 3}).find("mask_windows"), std::string::npos);
  // Checked before any launch (so no GPU is needed here): 16-byte alignment, a mask where one is named.
  char* aligned = reinterpret_cast<char*>(uintptr_t{1} << 20);
  const WindowAttentionShape unmasked{8, 3, 49, 32, 0};
  EXPECT_THROW(window_attention_forward(DType::f16, aligned + 2, aligned, nullptr, nullptr, aligned, nullptr, nullptr,
                                        unmasked, 0.125f, nullptr),
               std::invalid_argument);
  EXPECT_THROW(window_attention_forward(DType::f16, aligned, aligned, nullptr, nullptr, aligned, nullptr, nullptr, good,
                                        0.125f, nullptr),
               std::invalid_argument);
  EXPECT_THROW(window_attention_backward(DType::bf16, aligned, nullptr, nullptr, aligned, nullptr, aligned + 8, nullptr,
                                         aligned, aligned, nullptr, unmasked, 0.125f, nullptr),
               std::invalid_argument);
}

}  // namespace
}  // namespace fusekit::kernels
