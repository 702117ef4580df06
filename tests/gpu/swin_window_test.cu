// Swin's window operations against their float64 references (kernels/reference/swin_window.h), on
// fresh random inputs with every output poisoned (NaN) before the run: fp32, fp16 and bf16; windows
// 7 and 12, shift 0 and ws / 2; one window (H = W = ws) and several, H != W; B = 1, 2, 3; C = 31
// and 999 (the scalar path, lanes and a block per row), 96, 192, 384, 768 (16-byte vectors); a merge
// output larger than L2 (its streaming stores).
// window_partition: windows, mean, rstd (per window token), dx, dgamma, dbeta; window_merge: y (also
// written over its own shortcut), dwindows (a copy: exact); patch_merging: y, mean, rstd, dx,
// dgamma, dbeta. And the shapes the maps do not cover are one std::invalid_argument.
#include <gtest/gtest.h>

#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "device_buffers.h"
#include "gpu_test_support.h"
#include "kernels/reference/swin_window.h"
#include "kernels/swin_window.h"

namespace fusekit::kernels {
namespace {

constexpr double kEps = 1e-5;

std::vector<double> random_vector(size_t n, std::mt19937_64& rng, double scale = 1.0, double offset = 0.0) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> v(n);
  for (double& e : v) e = offset + scale * normal(rng);
  return v;
}

// A float buffer poisoned with NaN, freed at the end of the test.
struct FloatBuffer {
  float* data = nullptr;
  size_t count;
  explicit FloatBuffer(size_t n) : count(n) {
    EXPECT_EQ(cudaMalloc(&data, std::max<size_t>(n, 1) * sizeof(float)), cudaSuccess);
    cudaMemset(data, 0xFF, std::max<size_t>(n, 1) * sizeof(float));
  }
  ~FloatBuffer() { cudaFree(data); }
};

struct WindowParam {
  DType dtype;
  WindowShape shape;
};

reference::SwinWindowShape reference_shape(const WindowShape& s) {
  return {s.batch, s.height, s.width, s.channels, s.window, s.shift};
}

class WindowTest : public ::testing::TestWithParam<WindowParam> {};

TEST_P(WindowTest, PartitionForwardAndBackwardMatchFloat64Reference) {
  FUSEKIT_REQUIRE_GPU();
  const auto [dtype, shape] = GetParam();
  const size_t tokens = shape.tokens(), n = tokens * shape.channels;
  const int C = shape.channels;
  std::mt19937_64 rng(std::random_device{}());
  std::vector<double> x = random_vector(n, rng, 2.0, 0.5), gamma = random_vector(C, rng, 0.2, 1.0),
                      beta = random_vector(C, rng, 0.1), dwindows = random_vector(n, rng);
  Buffer x_d(n, dtype), gamma_d(C, dtype), beta_d(C, dtype), windows_d(n, dtype), dwindows_d(n, dtype), dx_d(n, dtype),
      dgamma_d(C, dtype), dbeta_d(C, dtype);
  x_d.upload(x);
  gamma_d.upload(gamma);
  beta_d.upload(beta);
  dwindows_d.upload(dwindows);
  FloatBuffer mean(tokens), rstd(tokens), workspace(window_partition_backward_workspace_bytes(shape) / sizeof(float));

  window_partition_forward(dtype, x_d.get(), gamma_d.get(), beta_d.get(), windows_d.get(), mean.data, rstd.data, shape,
                           static_cast<float>(kEps), nullptr);
  window_partition_backward(dtype, dwindows_d.get(), x_d.get(), gamma_d.get(), mean.data, rstd.data, dx_d.get(),
                            dgamma_d.get(), dbeta_d.get(), shape, workspace.data, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());

  const auto s = reference_shape(shape);
  const auto ref = reference::window_partition_forward(x, gamma, beta, s, kEps);
  const auto grad = reference::window_partition_backward(dwindows, x, gamma, s, kEps);
  const double tol = tolerance(dtype);
  EXPECT_LT(relative_error(windows_d.download(), ref.windows), tol) << "windows";
  EXPECT_LT(mean_error(download_floats(mean.data, tokens), ref.mean, ref.rstd), 1e-5) << "mean (window order)";
  EXPECT_LT(relative_error(download_floats(rstd.data, tokens), ref.rstd), 1e-5) << "rstd (window order)";
  EXPECT_LT(relative_error(dx_d.download(), grad.dx), tol) << "dx";
  EXPECT_LT(relative_error(dgamma_d.download(), grad.dgamma), tol) << "dgamma";
  EXPECT_LT(relative_error(dbeta_d.download(), grad.dbeta), tol) << "dbeta";
}

TEST_P(WindowTest, MergeForwardAndBackwardMatchFloat64Reference) {
  FUSEKIT_REQUIRE_GPU();
  const auto [dtype, shape] = GetParam();
  const size_t n = shape.tokens() * shape.channels;
  std::mt19937_64 rng(std::random_device{}());
  std::vector<double> windows = random_vector(n, rng), shortcut = random_vector(n, rng), dy = random_vector(n, rng);
  Buffer windows_d(n, dtype), shortcut_d(n, dtype), y_d(n, dtype), dy_d(n, dtype), dwindows_d(n, dtype);
  windows_d.upload(windows);
  shortcut_d.upload(shortcut);
  dy_d.upload(dy);

  window_merge_forward(dtype, windows_d.get(), shortcut_d.get(), y_d.get(), shape, nullptr);
  window_merge_backward(dtype, dy_d.get(), dwindows_d.get(), shape, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());

  const auto s = reference_shape(shape);
  const std::vector<double> y_ref = reference::window_merge_forward(windows, shortcut, s);
  EXPECT_LT(relative_error(y_d.download(), y_ref), tolerance(dtype)) << "y";
  // The backward moves values without arithmetic: every element must be the exact one.
  EXPECT_EQ(relative_error(dwindows_d.download(), reference::window_merge_backward(dy, s).dwindows), 0.0) << "dwindows";

  // y may be the shortcut itself (an in-place residual add).
  window_merge_forward(dtype, windows_d.get(), shortcut_d.get(), shortcut_d.get(), shape, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  EXPECT_LT(relative_error(shortcut_d.download(), y_ref), tolerance(dtype)) << "y written over shortcut";
}

std::string window_name(const ::testing::TestParamInfo<WindowParam>& info) {
  const auto& s = info.param.shape;
  return std::string(dtype_name(info.param.dtype)) + "_" + std::to_string(s.batch) + "x" + std::to_string(s.height) +
         "x" + std::to_string(s.width) + "x" + std::to_string(s.channels) + "_ws" + std::to_string(s.window) +
         "_shift" + std::to_string(s.shift);
}

std::vector<WindowParam> window_params() {
  const std::vector<WindowShape> shapes = {
      {1, 7, 7, 96, 7, 0},       // one window, B = 1
      {1, 7, 7, 96, 7, 3},       // one window, shifted onto itself
      {3, 14, 21, 31, 7, 3},     // odd C (scalar path), H != W, B = 3
      {3, 14, 14, 192, 7, 0},    // several windows, no shift
      {2, 28, 28, 384, 7, 3},    // Swin-T stage 3 channels
      {1, 7, 7, 768, 7, 0},      // Swin-T stage 4
      {8, 56, 56, 96, 7, 3},     // Swin-T stage 1 at batch 8
      {1, 12, 12, 31, 12, 6},    // window 12: one window, odd C
      {3, 24, 36, 192, 12, 6},   // window 12, shifted, H != W
      {2, 24, 24, 96, 12, 0},    // window 12, no shift
      {1, 7, 14, 999, 7, 3},     // odd C, a block per row
      {16, 96, 96, 192, 12, 6},  // merge output past L2 (56 MB in 16 bits): streaming stores
  };
  std::vector<WindowParam> params;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (const WindowShape& shape : shapes) params.push_back({dtype, shape});
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(Shapes, WindowTest, ::testing::ValuesIn(window_params()), window_name);

struct PatchParam {
  DType dtype;
  PatchShape shape;
};

class PatchMergingTest : public ::testing::TestWithParam<PatchParam> {};

TEST_P(PatchMergingTest, ForwardAndBackwardMatchFloat64Reference) {
  FUSEKIT_REQUIRE_GPU();
  const auto [dtype, shape] = GetParam();
  const size_t merged = shape.merged_tokens(), n = merged * 4 * shape.channels;
  const int L = 4 * shape.channels;
  std::mt19937_64 rng(std::random_device{}());
  std::vector<double> x = random_vector(n, rng, 2.0, 0.5), gamma = random_vector(L, rng, 0.2, 1.0),
                      beta = random_vector(L, rng, 0.1), dy = random_vector(n, rng);
  Buffer x_d(n, dtype), gamma_d(L, dtype), beta_d(L, dtype), y_d(n, dtype), dy_d(n, dtype), dx_d(n, dtype),
      dgamma_d(L, dtype), dbeta_d(L, dtype);
  x_d.upload(x);
  gamma_d.upload(gamma);
  beta_d.upload(beta);
  dy_d.upload(dy);
  FloatBuffer mean(merged), rstd(merged), workspace(patch_merging_backward_workspace_bytes(shape) / sizeof(float));

  patch_merging_forward(dtype, x_d.get(), gamma_d.get(), beta_d.get(), y_d.get(), mean.data, rstd.data, shape,
                        static_cast<float>(kEps), nullptr);
  patch_merging_backward(dtype, dy_d.get(), x_d.get(), gamma_d.get(), mean.data, rstd.data, dx_d.get(), dgamma_d.get(),
                         dbeta_d.get(), shape, workspace.data, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());

  const reference::PatchMergingShape s{shape.batch, shape.height, shape.width, shape.channels};
  const auto ref = reference::patch_merging_forward(x, gamma, beta, s, kEps);
  const auto grad = reference::patch_merging_backward(dy, x, gamma, s, kEps);
  const double tol = tolerance(dtype);
  EXPECT_LT(relative_error(y_d.download(), ref.y), tol) << "y";
  EXPECT_LT(mean_error(download_floats(mean.data, merged), ref.mean, ref.rstd), 1e-5) << "mean";
  EXPECT_LT(relative_error(download_floats(rstd.data, merged), ref.rstd), 1e-5) << "rstd";
  EXPECT_LT(relative_error(dx_d.download(), grad.dx), tol) << "dx";
  EXPECT_LT(relative_error(dgamma_d.download(), grad.dgamma), tol) << "dgamma";
  EXPECT_LT(relative_error(dbeta_d.download(), grad.dbeta), tol) << "dbeta";
}

std::string patch_name(const ::testing::TestParamInfo<PatchParam>& info) {
  const auto& s = info.param.shape;
  return std::string(dtype_name(info.param.dtype)) + "_" + std::to_string(s.batch) + "x" + std::to_string(s.height) +
         "x" + std::to_string(s.width) + "x" + std::to_string(s.channels);
}

std::vector<PatchParam> patch_params() {
  const std::vector<PatchShape> shapes = {
      {1, 2, 2, 31},     // one merged token, odd C
      {3, 6, 10, 31},    // odd C, H != W, B = 3
      {3, 14, 14, 96},   // Swin-T stage 3 -> 4 at small size
      {2, 28, 28, 192},  // stage 2 -> 3
      {1, 14, 14, 384},  // 4C = 1536: a block per row
      {4, 56, 56, 96},   // stage 1 -> 2 at batch 4
      {2, 4, 6, 385},    // odd C, a block per row
  };
  std::vector<PatchParam> params;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (const PatchShape& shape : shapes) params.push_back({dtype, shape});
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(Shapes, PatchMergingTest, ::testing::ValuesIn(patch_params()), patch_name);

// One clear std::invalid_argument for each shape the maps do not cover (checked before any launch).
TEST(SwinWindowShapes, UncoveredShapesThrowOneClearMessage) {
  auto message = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message([] {
              check_window_shape("window_partition", {1, 56, 57, 96, 7, 3});
            }).find("window_partition: H and W must be multiples of the window size (got 1x56x57x96, window 7"),
            std::string::npos);
  EXPECT_NE(message([] {
              check_window_shape("window_merge", {1, 12, 12, 96, 12, 12});
            }).find("shift"),
            std::string::npos);
  EXPECT_NE(message([] {
              check_window_shape("window_merge", {1, 14, 14, 96, 7, -1});
            }).find("shift"),
            std::string::npos);
  EXPECT_NE(message([] {
              check_window_shape("window_partition", {0, 7, 7, 96, 7, 0});
            }).find("positive"),
            std::string::npos);
  EXPECT_NE(message([] {
              check_patch_shape({1, 7, 8, 96});
            }).find("patch_merging: H and W must be even"),
            std::string::npos);
  EXPECT_EQ(message([] { check_window_shape("window_partition", {2, 96, 96, 192, 12, 6}); }), "");
  EXPECT_EQ(message([] { check_patch_shape({64, 56, 56, 96}); }), "");
}

}  // namespace
}  // namespace fusekit::kernels
