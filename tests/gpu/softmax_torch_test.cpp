// Scale + mask + softmax, fused forward and backward, against libtorch autograd of the baseline.
// The fused result may be at most twice as far from a float64 computation as PyTorch's own result
// in the same dtype (the FlashAttention rule), with a floor for fp32, where both are at rounding
// level. Rows that keep no key are NaN in PyTorch: they are left out of the comparison, and the
// fused y and dx must be exact zeros there.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "baselines/softmax.h"
#include "gpu_test_support.h"
#include "kernels/softmax.h"
#include "torch_test_support.h"

namespace fusekit {
namespace {

using kernels::SoftmaxMask;

struct Param {
  kernels::DType dtype;
  int batch;
  int heads;
  int queries;
  int keys;
  SoftmaxMask mask;
  int windows = 0;  // bias: the window mask's count, 0 for none
};

class SoftmaxTorchTest : public ::testing::TestWithParam<Param> {};

TEST_P(SoftmaxTorchTest, MatchesAutogradOfTheBaseline) {
  FUSEKIT_REQUIRE_GPU();
  const Param p = GetParam();
  const double scale = 0.125;
  const auto options = at::TensorOptions().dtype(torch_type(p.dtype)).device(at::kCUDA);
  const auto int_options = at::TensorOptions().dtype(at::kInt).device(at::kCUDA);
  const at::Tensor x = at::randn({p.batch, p.heads, p.queries, p.keys}, options) * 8;
  const at::Tensor dy = at::randn({p.batch, p.heads, p.queries, p.keys}, options);

  // The same mask for the fused kernels, the eager baseline and its float64 run.
  baselines::SoftmaxMaskTensors mask, mask64;
  mask.kind = mask64.kind = static_cast<baselines::SoftmaxMaskKind>(static_cast<int>(p.mask));  // same order
  kernels::SoftmaxMasking masking;
  masking.kind = p.mask;
  at::Tensor lengths, bias, window_mask;
  if (p.mask == SoftmaxMask::padding) {
    // Random lengths in [0, keys], with a 0 (a sequence that keeps no key) and exactly `keys`.
    lengths = at::randint(0, p.keys + 1, {p.batch}, int_options);
    if (p.batch >= 2) {
      lengths[0].fill_(0);
      lengths[p.batch - 1].fill_(p.keys);
    }
    mask.lengths = mask64.lengths = lengths;
    masking.lengths = lengths.data_ptr<int32_t>();
  }
  if (p.mask == SoftmaxMask::bias) {
    bias = at::randn({p.heads, p.queries, p.keys}, options) * 2;
    mask.bias = bias;
    mask64.bias = bias.to(at::kDouble);
    masking.bias = bias.data_ptr();
    if (p.windows > 0) {
      // Swin's shift mask (0 or -100), and window 0's first query keeps no key at all.
      window_mask = at::where(at::rand({p.windows, p.queries, p.keys}, options) < 0.3, -100.0, 0.0).to(options.dtype());
      window_mask[0][0].fill_(-INFINITY);
      mask.window_mask = window_mask;
      mask64.window_mask = window_mask.to(at::kDouble);
      masking.window_mask = window_mask.data_ptr();
      masking.windows = p.windows;
    }
  }

  const auto ref = baselines::softmax_forward_backward(x.to(at::kDouble), scale, mask64, dy.to(at::kDouble));
  const auto eager = baselines::softmax_forward_backward(x, scale, mask, dy);

  at::Tensor y = at::full_like(x, NAN), dx = at::full_like(x, NAN);
  const kernels::SoftmaxShape shape{p.batch, p.heads, p.queries, p.keys};
  cudaStream_t stream = nullptr;  // the legacy default stream, which torch's ops above used too
  kernels::softmax_forward(p.dtype, x.data_ptr(), y.data_ptr(), shape, static_cast<float>(scale), masking, stream);
  kernels::softmax_backward(p.dtype, y.data_ptr(), dy.data_ptr(), dx.data_ptr(), shape, static_cast<float>(scale),
                            stream);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  // Rows PyTorch leaves NaN in float64 are those that keep no key.
  const at::Tensor empty = at::isnan(ref.y).any(-1);
  const at::Tensor kept = empty.logical_not();
  const int64_t empty_rows = empty.sum().item<int64_t>();
  const bool expect_empty = (p.mask == SoftmaxMask::padding && p.batch >= 2) ||
                            (p.mask == SoftmaxMask::causal && p.queries > p.keys) ||
                            (p.mask == SoftmaxMask::bias && p.windows > 0);
  if (expect_empty) {
    EXPECT_GT(empty_rows, 0);
  }
  if (empty_rows > 0) {
    EXPECT_TRUE(y.index({empty}).eq(0).all().item<bool>()) << "y of rows without keys";
    EXPECT_TRUE(dx.index({empty}).eq(0).all().item<bool>()) << "dx of rows without keys";
  }

  const double floor = p.dtype == kernels::DType::f32 ? 1e-5 : 0.0;
  expect_within_twice_eager("y", y.index({kept}), eager.y.index({kept}), ref.y.index({kept}), floor);
  expect_within_twice_eager("dx", dx.index({kept}), eager.dx.index({kept}), ref.dx.index({kept}), floor);
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const Param& p = info.param;
  return std::string(kernels::dtype_name(p.dtype)) + "_" + std::to_string(p.batch) + "x" + std::to_string(p.heads) +
         "x" + std::to_string(p.queries) + "x" + std::to_string(p.keys) + "_" + kernels::softmax_mask_name(p.mask) +
         (p.windows ? "_w" + std::to_string(p.windows) : "");
}

using kernels::DType;
using M = SoftmaxMask;
INSTANTIATE_TEST_SUITE_P(
    Shapes, SoftmaxTorchTest,
    ::testing::Values(Param{DType::f32, 3, 2, 16, 31, M::padding}, Param{DType::f16, 16, 12, 128, 128, M::padding},
                      Param{DType::bf16, 16, 12, 128, 128, M::padding}, Param{DType::f16, 4, 16, 512, 512, M::padding},
                      Param{DType::bf16, 2, 4, 1024, 1024, M::causal}, Param{DType::f16, 3, 2, 100, 333, M::causal},
                      Param{DType::f32, 1, 2, 9, 5, M::causal}, Param{DType::f16, 3, 2, 7, 77, M::causal},
                      Param{DType::f16, 128, 3, 49, 49, M::bias, 64}, Param{DType::bf16, 32, 6, 49, 49, M::bias, 16},
                      Param{DType::f32, 4, 24, 49, 49, M::bias}, Param{DType::f32, 2, 1, 8, 4096, M::none},
                      Param{DType::f16, 2, 2, 4, 16384, M::none}, Param{DType::bf16, 3, 2, 3, 20001, M::padding}),
    param_name);

}  // namespace
}  // namespace fusekit
