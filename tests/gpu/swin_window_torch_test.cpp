// Swin's window operations, fused, against libtorch autograd of their baselines (Swin's own eager
// composition: layer_norm, roll, view/permute/contiguous, slicing, cat, add). Every output and
// gradient may be at most twice as far from the float64 baseline as PyTorch eager's own result in
// the same dtype (the FlashAttention rule), with a floor for fp32, where both are at rounding level.
// window_merge's shortcut gradient is dy itself (swin_window.h): checked against autograd's too.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "baselines/swin_window.h"
#include "gpu_test_support.h"
#include "kernels/swin_window.h"
#include "torch_test_support.h"

namespace fusekit {
namespace {

constexpr double kEps = 1e-5;

struct Param {
  kernels::DType dtype;
  kernels::WindowShape shape;
};

at::TensorOptions options(kernels::DType dtype) {
  return at::TensorOptions().dtype(torch_type(dtype)).device(at::kCUDA);
}

at::Tensor float_nans(int64_t n) { return at::full({n}, NAN, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA)); }

at::Tensor workspace(size_t bytes) {
  return at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
}

double floor_for(kernels::DType dtype) { return dtype == kernels::DType::f32 ? 1e-5 : 0.0; }

class WindowTorchTest : public ::testing::TestWithParam<Param> {};

TEST_P(WindowTorchTest, PartitionMatchesAutogradOfTheBaseline) {
  FUSEKIT_REQUIRE_GPU();
  const auto [dtype, s] = GetParam();
  const int64_t area = static_cast<int64_t>(s.window) * s.window;
  const at::Tensor x = at::randn({s.batch, s.height, s.width, s.channels}, options(dtype)) * 2 + 0.5;
  const at::Tensor gamma = at::randn({s.channels}, options(dtype)) * 0.2 + 1;
  const at::Tensor beta = at::randn({s.channels}, options(dtype)) * 0.1;
  const at::Tensor dwindows = at::randn({s.tokens() / area, area, s.channels}, options(dtype));

  const auto ref =
      baselines::window_partition_forward_backward(x.to(at::kDouble), gamma.to(at::kDouble), beta.to(at::kDouble),
                                                   dwindows.to(at::kDouble), s.window, s.shift, kEps);
  const auto eager = baselines::window_partition_forward_backward(x, gamma, beta, dwindows, s.window, s.shift, kEps);

  at::Tensor windows = at::full_like(dwindows, NAN), dx = at::full_like(x, NAN);
  at::Tensor dgamma = at::full_like(gamma, NAN), dbeta = at::full_like(beta, NAN);
  at::Tensor mean = float_nans(s.tokens()), rstd = float_nans(s.tokens());
  at::Tensor space = workspace(kernels::window_partition_backward_workspace_bytes(s));
  cudaStream_t stream = nullptr;  // the legacy default stream, which torch's ops above used too
  kernels::window_partition_forward(dtype, x.data_ptr(), gamma.data_ptr(), beta.data_ptr(), windows.data_ptr(),
                                    mean.data_ptr<float>(), rstd.data_ptr<float>(), s, static_cast<float>(kEps),
                                    stream);
  kernels::window_partition_backward(dtype, dwindows.data_ptr(), x.data_ptr(), gamma.data_ptr(), mean.data_ptr<float>(),
                                     rstd.data_ptr<float>(), dx.data_ptr(), dgamma.data_ptr(), dbeta.data_ptr(), s,
                                     space.data_ptr(), stream);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const double floor = floor_for(dtype);
  expect_within_twice_eager("windows", windows, eager.windows, ref.windows, floor);
  expect_within_twice_eager("dx", dx, eager.dx, ref.dx, floor);
  expect_within_twice_eager("dgamma", dgamma, eager.dgamma, ref.dgamma, floor);
  expect_within_twice_eager("dbeta", dbeta, eager.dbeta, ref.dbeta, floor);
}

TEST_P(WindowTorchTest, MergeMatchesAutogradOfTheBaseline) {
  FUSEKIT_REQUIRE_GPU();
  const auto [dtype, s] = GetParam();
  const int64_t area = static_cast<int64_t>(s.window) * s.window;
  const at::Tensor windows = at::randn({s.tokens() / area, area, s.channels}, options(dtype));
  const at::Tensor shortcut = at::randn({s.batch, s.height, s.width, s.channels}, options(dtype));
  const at::Tensor dy = at::randn({s.batch, s.height, s.width, s.channels}, options(dtype));

  const auto ref = baselines::window_merge_forward_backward(windows.to(at::kDouble), shortcut.to(at::kDouble),
                                                            dy.to(at::kDouble), s.window, s.shift);
  const auto eager = baselines::window_merge_forward_backward(windows, shortcut, dy, s.window, s.shift);

  at::Tensor y = at::full_like(shortcut, NAN), dwindows = at::full_like(windows, NAN);
  kernels::window_merge_forward(dtype, windows.data_ptr(), shortcut.data_ptr(), y.data_ptr(), s, nullptr);
  kernels::window_merge_backward(dtype, dy.data_ptr(), dwindows.data_ptr(), s, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const double floor = floor_for(dtype);
  expect_within_twice_eager("y", y, eager.y, ref.y, floor);
  expect_within_twice_eager("dwindows", dwindows, eager.dwindows, ref.dwindows, floor);
  expect_within_twice_eager("dshortcut (dy itself)", dy, eager.dshortcut, ref.dshortcut, floor);
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto& s = info.param.shape;
  return std::string(kernels::dtype_name(info.param.dtype)) + "_" + std::to_string(s.batch) + "x" +
         std::to_string(s.height) + "x" + std::to_string(s.width) + "x" + std::to_string(s.channels) + "_ws" +
         std::to_string(s.window) + "_shift" + std::to_string(s.shift);
}

INSTANTIATE_TEST_SUITE_P(Shapes, WindowTorchTest,
                         ::testing::Values(Param{kernels::DType::f32, {3, 14, 21, 31, 7, 3}},
                                           Param{kernels::DType::f32, {2, 56, 56, 96, 7, 3}},
                                           Param{kernels::DType::f16, {16, 56, 56, 96, 7, 3}},
                                           Param{kernels::DType::bf16, {16, 56, 56, 96, 7, 3}},
                                           Param{kernels::DType::f16, {8, 28, 28, 192, 7, 0}},
                                           Param{kernels::DType::bf16, {8, 7, 7, 768, 7, 0}},
                                           Param{kernels::DType::f16, {4, 96, 96, 192, 12, 6}},
                                           Param{kernels::DType::bf16, {3, 12, 12, 31, 12, 6}}),
                         param_name);

struct PatchParam {
  kernels::DType dtype;
  kernels::PatchShape shape;
};

class PatchMergingTorchTest : public ::testing::TestWithParam<PatchParam> {};

TEST_P(PatchMergingTorchTest, MatchesAutogradOfTheBaseline) {
  FUSEKIT_REQUIRE_GPU();
  const auto [dtype, s] = GetParam();
  const int64_t L = 4 * static_cast<int64_t>(s.channels);
  const at::Tensor x = at::randn({s.batch, s.height, s.width, s.channels}, options(dtype)) * 2 + 0.5;
  const at::Tensor gamma = at::randn({L}, options(dtype)) * 0.2 + 1;
  const at::Tensor beta = at::randn({L}, options(dtype)) * 0.1;
  const at::Tensor dy = at::randn({s.batch, s.height / 2, s.width / 2, L}, options(dtype));

  const auto ref = baselines::patch_merging_forward_backward(x.to(at::kDouble), gamma.to(at::kDouble),
                                                             beta.to(at::kDouble), dy.to(at::kDouble), kEps);
  const auto eager = baselines::patch_merging_forward_backward(x, gamma, beta, dy, kEps);

  at::Tensor y = at::full_like(dy, NAN), dx = at::full_like(x, NAN);
  at::Tensor dgamma = at::full_like(gamma, NAN), dbeta = at::full_like(beta, NAN);
  at::Tensor mean = float_nans(s.merged_tokens()), rstd = float_nans(s.merged_tokens());
  at::Tensor space = workspace(kernels::patch_merging_backward_workspace_bytes(s));
  kernels::patch_merging_forward(dtype, x.data_ptr(), gamma.data_ptr(), beta.data_ptr(), y.data_ptr(),
                                 mean.data_ptr<float>(), rstd.data_ptr<float>(), s, static_cast<float>(kEps), nullptr);
  kernels::patch_merging_backward(dtype, dy.data_ptr(), x.data_ptr(), gamma.data_ptr(), mean.data_ptr<float>(),
                                  rstd.data_ptr<float>(), dx.data_ptr(), dgamma.data_ptr(), dbeta.data_ptr(), s,
                                  space.data_ptr(), nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const double floor = floor_for(dtype);
  expect_within_twice_eager("y", y, eager.y, ref.y, floor);
  expect_within_twice_eager("dx", dx, eager.dx, ref.dx, floor);
  expect_within_twice_eager("dgamma", dgamma, eager.dgamma, ref.dgamma, floor);
  expect_within_twice_eager("dbeta", dbeta, eager.dbeta, ref.dbeta, floor);
}

std::string patch_name(const ::testing::TestParamInfo<PatchParam>& info) {
  const auto& s = info.param.shape;
  return std::string(kernels::dtype_name(info.param.dtype)) + "_" + std::to_string(s.batch) + "x" +
         std::to_string(s.height) + "x" + std::to_string(s.width) + "x" + std::to_string(s.channels);
}

INSTANTIATE_TEST_SUITE_P(Shapes, PatchMergingTorchTest,
                         ::testing::Values(PatchParam{kernels::DType::f32, {3, 6, 10, 31}},
                                           PatchParam{kernels::DType::f32, {4, 56, 56, 96}},
                                           PatchParam{kernels::DType::f16, {16, 56, 56, 96}},
                                           PatchParam{kernels::DType::bf16, {16, 56, 56, 96}},
                                           PatchParam{kernels::DType::f16, {16, 28, 28, 192}},
                                           PatchParam{kernels::DType::bf16, {16, 14, 14, 384}}),
                         patch_name);

}  // namespace
}  // namespace fusekit
