// fusekit::swin_block and its backward: a whole timm SwinTransformerBlock (shifted-window attention
// branch and MLP branch, both pre-LN with a residual add) as one op, over the kernels the per-op path
// runs (python/fusekit/torch/swin.py), so that a patched Swin step pays one op and one autograd node
// per block instead of about thirty (the patched step is host-bound, as BERT's:
// evidence/h100/notes/torch_patch.md).
//
// x [B, H, W, C] channels-last, in the residual stream's dtype S (float32 under autocast, as timm
// leaves it; or float16 / bfloat16); `dtype` D, float16 or bfloat16, the compute dtype of the GEMMs,
// the window attention and bias + GELU. The LayerNorms, the window partition and merge and the
// residual adds run in S, as in timm. params: the block's 13 tensors, any floating dtype:
//   0-1 norm1 weight, bias [C]       2-3 attn.qkv weight [3C, C], bias [3C]
//   4 attn.relative_position_bias_table [(2 window - 1)^2, heads]   5-6 attn.proj weight [C, C], bias [C]
//   7-8 norm2 weight, bias [C]       9-10 mlp.fc1 weight [F, C], bias [F]   11-12 mlp.fc2 [C, F], [C]
// index: the relative position index, int32 [window^2, window^2]; mask: the shift mask, float32
// [windows per image, window^2, window^2], or None. drop1, drop2: stochastic depth (timm's DropPath)
// of the attention and MLP branch, float32 [B] per-sample scales (0 where the sample's branch is
// dropped, 1 / keep where kept), drawn by the caller, or None. No dropout (a block with projection
// dropout keeps the per-op path).
//
//   windows, mean1, rstd1 = LN1 + shift + partition(x)     kernels/swin_window.h            (S)
//   qkv = windows W_qkv^T + b_qkv                           cuBLASLt, bias epilogue          (D)
//   out = window attention(qkv, table, index, mask)         kernels/window_attention.h       (D)
//   proj = (out W_proj^T + b_proj) * drop1[b]               cuBLASLt, bias epilogue          (D)
//   y1 = x + merge + reverse shift(proj)                    kernels/swin_window.h            (S)
//   h = LN2(y1); up = h W1^T; g = gelu(up + b1); m = (g W2^T + b2) * drop2[b]  (LN in S, the rest in D)
//   y = y1 + m                                                                               (S)
// saved (in this order): the four LayerNorm parameters in S, the other nine packed in D (the bias
// table last), windows (in D), mean1, rstd1, qkv, out, bias, lse, y1, mean2, rstd2, h (in D), up, g.
#include <torch/library.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "kernels/bias_gelu.h"
#include "kernels/layernorm.h"
#include "kernels/linear.h"
#include "kernels/swin_window.h"
#include "kernels/window_attention.h"
#include "torch_ops/linear_context.h"
#include "torch_ops/packed_params.h"
#include "torch_ops/tensor_checks.h"

namespace fusekit::torch_ops {
namespace {

constexpr int kParams = 13;
constexpr int kSaved = 15;
// The LayerNorm parameters (kept in the stream's dtype); the others go to the compute dtype.
constexpr bool is_norm(int k) { return k == 0 || k == 1 || k == 7 || k == 8; }

struct Block {
  kernels::DType stream_dtype, compute_dtype;
  at::ScalarType stream_type, compute_type;
  kernels::WindowShape window;
  kernels::WindowAttentionShape attention;
  int tokens, channels, hidden;  // T = B H W, C, F (the MLP's)
  kernels::GeluApproximation approximation;
  const float* mask;
  int64_t offset[kParams];  // in the norms' buffer or the packed one (is_norm)
  int64_t norm_elements, packed_elements;
};

std::vector<std::vector<int64_t>> parameter_shapes(int64_t c, int64_t f, int64_t entries, int64_t heads) {
  return {{c}, {c}, {3 * c, c}, {3 * c}, {entries, heads}, {c, c}, {c}, {c}, {c}, {f, c}, {f}, {c, f}, {c}};
}

Block check(const at::Tensor& x, at::TensorList params, const at::Tensor& index, const std::optional<at::Tensor>& mask,
            at::ScalarType dtype, int64_t window, int64_t shift, int64_t heads, double scale,
            std::string_view approximate, const char* op) {
  check_cuda(x, op, "x");
  Block b;
  b.stream_dtype = dtype_of(x, op, "x");
  b.stream_type = x.scalar_type();
  TORCH_CHECK_TYPE(dtype == at::kHalf || dtype == at::kBFloat16,
                   text("fusekit::", op, ": dtype (the compute dtype) must be float16 or bfloat16, not ", dtype));
  b.compute_type = dtype;
  b.compute_dtype = dtype == at::kHalf ? kernels::DType::f16 : kernels::DType::bf16;
  TORCH_CHECK_VALUE(x.dim() == 4, text("fusekit::", op, ": x must be [B, H, W, C], not ", x.sizes()));
  b.window = {int_size(x.size(0), op, "B"), int_size(x.size(1), op, "H"),   int_size(x.size(2), op, "W"),
              int_size(x.size(3), op, "C"), int_size(window, op, "window"), int_size(shift, op, "shift")};
  try {
    kernels::check_window_shape(op, b.window);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, text("fusekit::", op, ": ", e.what()));
  }
  TORCH_CHECK_VALUE(b.window.tokens() > 0, text("fusekit::", op, ": x is empty (", x.sizes(), ")"));
  const int64_t c = x.size(3);
  TORCH_CHECK_VALUE(heads > 0 && c % heads == 0,
                    text("fusekit::", op, ": channels ", c, " are not a multiple of heads ", heads));
  TORCH_CHECK_VALUE(static_cast<int>(params.size()) == kParams,
                    text("fusekit::", op, ": params must hold the block's 13 tensors, not ", params.size()));
  const int64_t f = params[9].dim() == 2 ? params[9].size(0) : -1;
  const int64_t entries = (2 * window - 1) * (2 * window - 1);
  const std::vector<std::vector<int64_t>> shapes = parameter_shapes(c, f, entries, heads);
  check_params(params, shapes, x, op, [&] { return text("channels ", c, ", MLP ", f, ", heads ", heads); });
  const int64_t n = window * window;
  check_cuda(index, at::kInt, op, "index");
  TORCH_CHECK_VALUE(index.device() == x.device() && index.numel() == n * n,
                    text("fusekit::", op, ": index must be int32 [", n, ", ", n, "] on ", x.device(), ", not ",
                         index.sizes(), " on ", index.device()));
  TORCH_CHECK_VALUE(scale > 0, text("fusekit::", op, ": scale must be positive, not ", scale));
  b.tokens = int_size(b.window.tokens(), op, "tokens");
  b.channels = static_cast<int>(c);
  b.hidden = int_size(f, op, "MLP features");
  const int64_t windows = static_cast<int64_t>(b.window.batch) * (b.window.height / window) * (b.window.width / window);
  b.attention = {int_size(windows, op, "windows"), static_cast<int>(heads), static_cast<int>(n),
                 static_cast<int>(c / heads), 0};
  b.mask = nullptr;
  if (mask.has_value() && mask->defined()) {
    check_cuda(*mask, at::kFloat, op, "mask");
    TORCH_CHECK_VALUE(mask->device() == x.device() && mask->dim() == 3 && mask->size(1) == n && mask->size(2) == n &&
                          mask->size(0) > 0 && windows % mask->size(0) == 0,
                      text("fusekit::", op, ": mask must be [windows per image, ", n, ", ", n, "] on ", x.device(),
                           ", not ", mask->sizes()));
    b.attention.mask_windows = int_size(mask->size(0), op, "mask windows");
    b.mask = mask->data_ptr<float>();
  }
  try {
    kernels::check_window_attention(b.compute_dtype, b.attention);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, text("fusekit::", op, ": ", e.what()));
  }
  b.approximation = gelu_approximation_of(approximate, op);
  // The bias table goes last: its (2 window - 1)^2 x heads elements would leave the weights after
  // it misaligned for cuBLASLt and the vectorized kernels; every other size is a multiple of C.
  constexpr int kOrder[kParams] = {0, 1, 7, 8, 2, 3, 5, 6, 9, 10, 11, 12, 4};
  b.norm_elements = b.packed_elements = 0;
  for (const int k : kOrder) {
    int64_t& at = is_norm(k) ? b.norm_elements : b.packed_elements;
    b.offset[k] = at;
    at += params[k].numel();
  }
  return b;
}

at::Tensor cast(const at::Tensor& t, at::ScalarType type) { return t.scalar_type() == type ? t : t.to(type); }

// A stochastic-depth scale, float32 [B] on x's device, viewed to broadcast over a sample's rows of a
// [B * rows, ...] tensor; undefined where none.
at::Tensor drop_scale(const std::optional<at::Tensor>& scale, const at::Tensor& x, const char* op, const char* name) {
  if (!scale.has_value() || !scale->defined()) return {};
  check_cuda(*scale, at::kFloat, op, name);
  TORCH_CHECK_VALUE(scale->device() == x.device() && scale->numel() == x.size(0),
                    text("fusekit::", op, ": ", name, " must be float32 [", x.size(0), "] on ", x.device(), ", not ",
                         scale->sizes(), " on ", scale->device()));
  return scale->view({x.size(0), 1, 1});
}

// t [B * rows, ...] scaled per sample: t * scale[b] (a new tensor), or t where scale is undefined.
at::Tensor scaled(const at::Tensor& t, const at::Tensor& scale) {
  if (!scale.defined()) return t;
  return (t.view({scale.size(0), -1, t.size(-1)}) * scale).to(t.scalar_type()).view(t.sizes());
}

std::tuple<at::Tensor, std::vector<at::Tensor>> forward(const at::Tensor& x, at::TensorList params,
                                                        const at::Tensor& index, const std::optional<at::Tensor>& mask,
                                                        const std::optional<at::Tensor>& drop1,
                                                        const std::optional<at::Tensor>& drop2, at::ScalarType dtype,
                                                        int64_t window, int64_t shift, int64_t heads, double scale,
                                                        double eps1, double eps2, c10::string_view approximate) {
  constexpr const char* op = "swin_block";
  const Block b = check(x, params, index, mask, dtype, window, shift, heads, scale,
                        std::string_view(approximate.data(), approximate.size()), op);
  const at::Tensor scale1 = drop_scale(drop1, x, op, "drop1"), scale2 = drop_scale(drop2, x, op, "drop2");
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = current_stream(x);
  const int T = b.tokens, C = b.channels, F = b.hidden, W = b.attention.windows, N = b.attention.tokens;
  const auto s_options = x.options(), d_options = x.options().dtype(b.compute_type);
  const auto stats = x.options().dtype(at::kFloat);
  // The parameters, once per call: the LayerNorms' in S, the others in D (copy_ casts).
  at::Tensor norms = at::empty({b.norm_elements}, s_options), packed = at::empty({b.packed_elements}, d_options);
  for (int k = 0; k < kParams; ++k) pack_into(is_norm(k) ? norms : packed, b.offset[k], params[k]);
  auto NP = [&](int k) { return element_at(norms, b.offset[k]); };
  auto P = [&](int k) { return element_at(packed, b.offset[k]); };
  at::Tensor windows = at::empty({W, N, C}, s_options);
  at::Tensor mean1 = at::empty({T}, stats), rstd1 = at::empty({T}, stats);
  kernels::window_partition_forward(b.stream_dtype, x.data_ptr(), NP(0), NP(1), windows.data_ptr(),
                                    mean1.data_ptr<float>(), rstd1.data_ptr<float>(), b.window,
                                    static_cast<float>(eps1), stream);
  const at::Tensor windows_d = cast(windows, b.compute_type);
  at::Tensor qkv = at::empty({W, N, 3, heads, C / heads}, d_options);
  at::Tensor out = at::empty({W, N, C}, d_options), proj = at::empty({W, N, C}, d_options);
  at::Tensor bias = at::empty({heads, N, N}, stats), lse = at::empty({W, heads, N}, stats);
  at::Tensor h = at::empty({T, C}, s_options);
  at::Tensor mean2 = at::empty({T}, stats), rstd2 = at::empty({T}, stats);
  at::Tensor up = at::empty({T, F}, d_options), g = at::empty({T, F}, d_options), m = at::empty({T, C}, d_options);
  at::Tensor y1 = at::empty_like(x), h_d;
  {
    const std::lock_guard<std::mutex> lock(linear_context_mutex());
    kernels::LinearContext& gemm = linear_context_for(x.device().index());
    kernels::linear_forward(gemm, b.compute_dtype, kernels::LinearEpilogue::bias, {T, 3 * C, C, false},
                            windows_d.data_ptr(), P(2), P(3), qkv.data_ptr(), nullptr, stream);
    kernels::window_attention_forward(b.compute_dtype, qkv.data_ptr(), P(4), index.data_ptr<int32_t>(), b.mask,
                                      out.data_ptr(), bias.data_ptr<float>(), lse.data_ptr<float>(), b.attention,
                                      static_cast<float>(scale), stream);
    kernels::linear_forward(gemm, b.compute_dtype, kernels::LinearEpilogue::bias, {T, C, C, false}, out.data_ptr(),
                            P(5), P(6), proj.data_ptr(), nullptr, stream);
    const at::Tensor proj_s = cast(scaled(proj, scale1), b.stream_type);
    kernels::window_merge_forward(b.stream_dtype, proj_s.data_ptr(), x.data_ptr(), y1.data_ptr(), b.window, stream);
    kernels::layernorm_forward(b.stream_dtype, y1.data_ptr(), NP(7), NP(8), h.data_ptr(), mean2.data_ptr<float>(),
                               rstd2.data_ptr<float>(), T, C, static_cast<float>(eps2), stream);
    h_d = cast(h, b.compute_type);
    kernels::linear_forward_no_bias(gemm, b.compute_dtype, {T, F, C, false}, h_d.data_ptr(), P(9), up.data_ptr(),
                                    stream);
    kernels::bias_gelu_forward(b.compute_dtype, b.approximation, up.data_ptr(), P(10), g.data_ptr(), T, F, stream);
    kernels::linear_forward(gemm, b.compute_dtype, kernels::LinearEpilogue::bias, {T, C, F, false}, g.data_ptr(), P(11),
                            P(12), m.data_ptr(), nullptr, stream);
  }
  at::Tensor y = at::add(y1, scaled(m, scale2).view(x.sizes())).to(b.stream_type);
  // Where S is the compute dtype, windows_d and h_d are windows and h themselves.
  return {y, {norms, packed, windows_d, mean1, rstd1, qkv, out, bias, lse, y1, mean2, rstd2, h_d, up, g}};
}

std::tuple<at::Tensor, std::vector<at::Tensor>> backward(const at::Tensor& dy, const at::Tensor& x,
                                                         at::TensorList params, const at::Tensor& index,
                                                         const std::optional<at::Tensor>& mask,
                                                         const std::optional<at::Tensor>& drop1,
                                                         const std::optional<at::Tensor>& drop2, at::TensorList saved,
                                                         int64_t window, int64_t shift, int64_t heads, double scale,
                                                         c10::string_view approximate) {
  constexpr const char* op = "swin_block_backward";
  TORCH_CHECK_VALUE(static_cast<int>(saved.size()) == kSaved,
                    text("fusekit::", op, ": saved must hold the forward's 15 tensors, not ", saved.size()));
  check_cuda(saved[1], op, "saved[1]");
  const Block b = check(x, params, index, mask, saved[1].scalar_type(), window, shift, heads, scale,
                        std::string_view(approximate.data(), approximate.size()), op);
  check_cuda(dy, op, "dy");
  check_same(x, "x", {{&dy, "dy"}}, op);
  TORCH_CHECK_VALUE(dy.sizes() == x.sizes(),
                    text("fusekit::", op, ": dy has shape ", dy.sizes(), " but x has ", x.sizes()));
  const at::Tensor scale1 = drop_scale(drop1, x, op, "drop1"), scale2 = drop_scale(drop2, x, op, "drop2");
  const int T = b.tokens, C = b.channels, F = b.hidden, W = b.attention.windows, N = b.attention.tokens;
  const at::ScalarType S = b.stream_type, D = b.compute_type, f32 = at::kFloat;
  const std::vector<int64_t> expected[kSaved] = {{b.norm_elements},
                                                 {b.packed_elements},
                                                 {W, N, C},
                                                 {T},
                                                 {T},
                                                 {W, N, 3, heads, C / heads},
                                                 {W, N, C},
                                                 {heads, N, N},
                                                 {W, heads, N},
                                                 x.sizes().vec(),
                                                 {T},
                                                 {T},
                                                 {T, C},
                                                 {T, F},
                                                 {T, F}};
  const at::ScalarType types[kSaved] = {S, D, D, f32, f32, D, D, f32, f32, S, f32, f32, D, D, D};
  for (int k = 0; k < kSaved; ++k) {
    const std::string name = "saved[" + std::to_string(k) + "]";
    check_cuda(saved[k], types[k], op, name.c_str());
    TORCH_CHECK_VALUE(saved[k].sizes() == c10::IntArrayRef(expected[k]) && saved[k].device() == x.device(),
                      text("fusekit::", op, ": ", name, " has shape ", saved[k].sizes(), " on ", saved[k].device(),
                           ", expected ", c10::IntArrayRef(expected[k]), " on ", x.device()));
  }
  const at::Tensor &norms = saved[0], &packed = saved[1], &windows_d = saved[2], &mean1 = saved[3], &rstd1 = saved[4],
                   &qkv = saved[5], &out = saved[6], &bias = saved[7], &lse = saved[8], &y1 = saved[9],
                   &mean2 = saved[10], &rstd2 = saved[11], &h_d = saved[12], &up = saved[13], &g = saved[14];
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = current_stream(x);
  auto NP = [&](int k) { return element_at(norms, b.offset[k]); };
  auto P = [&](int k) { return element_at(packed, b.offset[k]); };
  at::Tensor dnorms = at::empty_like(norms), dpacked = at::empty_like(packed);
  auto DN = [&](int k) { return element_at(dnorms, b.offset[k]); };
  auto DP = [&](int k) { return element_at(dpacked, b.offset[k]); };
  const size_t scratch_bytes =
      std::max({kernels::layernorm_backward_workspace_bytes(T, C), kernels::bias_gelu_backward_workspace_bytes(T, F),
                kernels::window_attention_backward_workspace_bytes(b.attention),
                kernels::window_partition_backward_workspace_bytes(b.window)});
  at::Tensor scratch = workspace(scratch_bytes, x);
  const at::Tensor dy_s = dy.contiguous();
  // The MLP branch's gradient: dy through its stochastic-depth scale (never in place: dy is an input).
  const at::Tensor dm = scaled(cast(dy_s, D).view({T, C}), scale2);
  at::Tensor dg = at::empty({T, F}, dm.options()), dup = at::empty({T, F}, dm.options());
  at::Tensor dh = at::empty({T, C}, dm.options()), dy1 = at::empty({T, C}, dy_s.options());
  at::Tensor dproj_s = at::empty({W, N, C}, dy_s.options()), dout = at::empty({W, N, C}, dm.options());
  at::Tensor dqkv = at::empty_like(qkv), dwindows = at::empty({W, N, C}, dm.options());
  at::Tensor dx = at::empty_like(x);
  {
    const std::lock_guard<std::mutex> lock(linear_context_mutex());
    kernels::LinearContext& gemm = linear_context_for(x.device().index());
    // MLP branch: fc2 (d g, d W2, d b2), GELU (d up, d b1), fc1 (d h, d W1).
    kernels::linear_backward(gemm, b.compute_dtype, {T, C, F, false}, dm.data_ptr(), g.data_ptr(), P(11), dg.data_ptr(),
                             DP(11), DP(12), stream);
    kernels::bias_gelu_backward(b.compute_dtype, b.approximation, dg.data_ptr(), up.data_ptr(), P(10), dup.data_ptr(),
                                DP(10), T, F, scratch.data_ptr(), stream);
    kernels::linear_backward(gemm, b.compute_dtype, {T, F, C, false}, dup.data_ptr(), h_d.data_ptr(), P(9),
                             dh.data_ptr(), DP(9), nullptr, stream);
    // LN2 in S, then d y1 = dy + its gradient (the residual).
    const at::Tensor dh_s = cast(dh, S);
    kernels::layernorm_backward(b.stream_dtype, dh_s.data_ptr(), y1.data_ptr(), NP(7), mean2.data_ptr<float>(),
                                rstd2.data_ptr<float>(), dy1.data_ptr(), DN(7), DN(8), T, C, scratch.data_ptr(),
                                stream);
    dy1.add_(dy_s.view({T, C}));
    // Attention branch: merge (d proj), proj (d out, d W, d b), attention (d qkv, d table), qkv (d windows).
    kernels::window_merge_backward(b.stream_dtype, dy1.data_ptr(), dproj_s.data_ptr(), b.window, stream);
    const at::Tensor dproj = scaled(cast(dproj_s, D), scale1);
    kernels::linear_backward(gemm, b.compute_dtype, {T, C, C, false}, dproj.data_ptr(), out.data_ptr(), P(5),
                             dout.data_ptr(), DP(5), DP(6), stream);
    kernels::window_attention_backward(b.compute_dtype, qkv.data_ptr(), bias.data_ptr<float>(), b.mask, out.data_ptr(),
                                       lse.data_ptr<float>(), dout.data_ptr(), index.data_ptr<int32_t>(),
                                       dqkv.data_ptr(), DP(4), scratch.data_ptr(), b.attention,
                                       static_cast<float>(scale), stream);
    kernels::linear_backward(gemm, b.compute_dtype, {T, 3 * C, C, false}, dqkv.data_ptr(), windows_d.data_ptr(), P(2),
                             dwindows.data_ptr(), DP(2), DP(3), stream);
    // LN1 + shift + partition in S; d x = its gradient + d y1 (the residual).
    const at::Tensor dwindows_s = cast(dwindows, S);
    kernels::window_partition_backward(b.stream_dtype, dwindows_s.data_ptr(), x.data_ptr(), NP(0),
                                       mean1.data_ptr<float>(), rstd1.data_ptr<float>(), dx.data_ptr(), DN(0), DN(1),
                                       b.window, scratch.data_ptr(), stream);
  }
  dx.add_(dy1.view(x.sizes()));
  std::vector<at::Tensor> dparams;
  dparams.reserve(kParams);
  for (int k = 0; k < kParams; ++k) dparams.push_back(unpack_as(is_norm(k) ? dnorms : dpacked, b.offset[k], params[k]));
  return {dx, dparams};
}

}  // namespace

TORCH_LIBRARY_IMPL(fusekit, CUDA, m) {
  m.impl("swin_block", &forward);
  m.impl("swin_block_backward", &backward);
}

}  // namespace fusekit::torch_ops
