// Swin window attention, fused forward and backward, against libtorch autograd of the eager
// baseline: out, dqkv (and each of dq, dk, dv) and the bias table's gradient. The fused result may
// be at most twice as far from the baseline's float64 run as PyTorch eager's own result in the same
// dtype (the FlashAttention rule).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "baselines/window_attention.h"
#include "gpu_test_support.h"
#include "kernels/window_attention.h"
#include "torch_test_support.h"

namespace fusekit {
namespace {

struct Param {
  kernels::DType dtype;
  int windows;
  int heads;
  int tokens;
  int head_dim;
  int mask_windows;  // 0: no mask
};

class WindowAttentionTorchTest : public ::testing::TestWithParam<Param> {};

TEST_P(WindowAttentionTorchTest, MatchesAutogradOfTheBaseline) {
  FUSEKIT_REQUIRE_GPU();
  const Param p = GetParam();
  const kernels::WindowAttentionShape shape{p.windows, p.heads, p.tokens, p.head_dim, p.mask_windows};
  const int window = p.tokens == 49 ? 7 : 12;
  const int64_t entries = (2 * window - 1) * (2 * window - 1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(p.head_dim));
  const auto options = at::TensorOptions().dtype(torch_type(p.dtype)).device(at::kCUDA);
  const auto float_options = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);

  const at::Tensor qkv = at::randn({p.windows, p.tokens, 3, p.heads, p.head_dim}, options);
  const at::Tensor table = at::randn({entries, p.heads}, options);
  const at::Tensor dout = at::randn({p.windows, p.tokens, p.heads * p.head_dim}, options);
  const std::vector<int32_t> host_index = kernels::relative_position_index(window);
  // Swin's buffer is int64; the kernels take int32.
  const at::Tensor index32 =
      at::from_blob(const_cast<int32_t*>(host_index.data()), {p.tokens, p.tokens}, at::kInt).to(at::kCUDA);
  const at::Tensor index64 = index32.to(at::kLong);
  at::Tensor mask;
  if (p.mask_windows > 0) {
    mask = at::where(at::rand({p.mask_windows, p.tokens, p.tokens}, float_options) < 0.3, -100.0, 0.0).to(at::kFloat);
  }

  const auto ref = baselines::window_attention_forward_backward(qkv.to(at::kDouble), table.to(at::kDouble), index64,
                                                                mask.defined() ? mask.to(at::kDouble) : mask, scale,
                                                                dout.to(at::kDouble));
  const auto eager = baselines::window_attention_forward_backward(qkv, table, index64, mask, scale, dout);

  at::Tensor out = at::full({p.windows, p.tokens, p.heads * p.head_dim}, NAN, options);
  at::Tensor dqkv = at::full_like(qkv, NAN), dtable = at::full_like(table, NAN);
  at::Tensor bias = at::full({p.heads, p.tokens, p.tokens}, NAN, float_options);
  at::Tensor lse = at::full({p.windows, p.heads, p.tokens}, NAN, float_options);
  at::Tensor workspace = at::full({static_cast<int64_t>(kernels::window_attention_backward_workspace_bytes(shape) / 4)},
                                  NAN, float_options);
  const float* mask_pointer = mask.defined() ? mask.data_ptr<float>() : nullptr;
  cudaStream_t stream = nullptr;  // the legacy default stream, which torch's ops above used too
  kernels::window_attention_forward(p.dtype, qkv.data_ptr(), table.data_ptr(), index32.data_ptr<int32_t>(),
                                    mask_pointer, out.data_ptr(), bias.data_ptr<float>(), lse.data_ptr<float>(), shape,
                                    static_cast<float>(scale), stream);
  kernels::window_attention_backward(p.dtype, qkv.data_ptr(), bias.data_ptr<float>(), mask_pointer, out.data_ptr(),
                                     lse.data_ptr<float>(), dout.data_ptr(), index32.data_ptr<int32_t>(),
                                     dqkv.data_ptr(), dtable.data_ptr(), workspace.data_ptr(), shape,
                                     static_cast<float>(scale), stream);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  expect_within_twice_eager("out", out, eager.out, ref.out, 0.0);
  expect_within_twice_eager("dqkv", dqkv, eager.dqkv, ref.dqkv, 0.0);
  const char* names[3] = {"dq", "dk", "dv"};
  for (int part = 0; part < 3; ++part) {
    expect_within_twice_eager(names[part], dqkv.select(2, part), eager.dqkv.select(2, part), ref.dqkv.select(2, part),
                              0.0);
  }
  expect_within_twice_eager("dtable", dtable, eager.dtable, ref.dtable, 0.0);
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const Param& p = info.param;
  return std::string(kernels::dtype_name(p.dtype)) + "_" + std::to_string(p.windows) + "x" + std::to_string(p.heads) +
         "x" + std::to_string(p.tokens) + "x" + std::to_string(p.head_dim) +
         (p.mask_windows ? "_mask" + std::to_string(p.mask_windows) : "");
}

using kernels::DType;
INSTANTIATE_TEST_SUITE_P(Shapes, WindowAttentionTorchTest,
                         ::testing::Values(Param{DType::f16, 128, 3, 49, 32, 64},
                                           Param{DType::bf16, 128, 3, 49, 32, 64}, Param{DType::f16, 64, 6, 49, 32, 16},
                                           Param{DType::bf16, 32, 24, 49, 32, 0}, Param{DType::f16, 16, 4, 49, 64, 4},
                                           Param{DType::bf16, 1, 2, 49, 64, 0}, Param{DType::f16, 64, 6, 144, 32, 64},
                                           Param{DType::bf16, 8, 3, 144, 64, 4}, Param{DType::f16, 4, 48, 49, 32, 0}),
                         param_name);

}  // namespace
}  // namespace fusekit
