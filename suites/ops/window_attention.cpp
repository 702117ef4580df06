// Attention-suite cases for Swin window attention: forward, and forward + backward, fused and
// (where libtorch is built in) the libtorch baseline of Swin's eager composition, on rotated sets.
//
// Shapes are "WINDOWSxHEADSxNxD[:shift]": WINDOWS = images x windows per image, N = 49 (window 7)
// or 144 (window 12) tokens, D the head dimension (32 or 64). ":shift" adds Swin's shifted-window
// mask with 64 windows per image (stage 1: 56 x 56 tokens in windows of 7 at 224 x 224, or 96 x 96
// in windows of 12 at 384 x 384), so WINDOWS must then be a multiple of 64; without it no mask.
//
// Bytes that must move: the forward reads qkv and writes out and the float log-sum-exp per row; the
// backward reads qkv, out, dout and the log-sum-exp and writes dqkv and the table's gradient. The
// small operands (table, index, gathered float bias, float mask) count once per direction.
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/window_attention.h"
#include "suites/ops/operands.h"
#include "suites/ops/ops_suite.h"

#include "suites/ops/torch_operands.h"

#ifdef FUSEKIT_WITH_TORCH
#include "baselines/window_attention.h"
#endif

namespace fusekit::suites {
namespace {

constexpr int kShiftMaskWindows = 64;  // windows per image of the suite's shifted stages

kernels::WindowAttentionShape parse_window_attention_shape(const std::string& text) {
  const std::string usage = "unsupported shape '" + text +
                            "': expected WINDOWSxHEADSxNxD[:shift] with N 49 or 144 and D 32 or 64, e.g. "
                            "8192x3x49x32:shift";
  const size_t colon = text.find(':');
  const std::vector<long> sizes = parse_sizes(text.substr(0, colon), 4, 1L << 24, usage);
  kernels::WindowAttentionShape s{static_cast<int>(sizes[0]), static_cast<int>(sizes[1]), static_cast<int>(sizes[2]),
                                  static_cast<int>(sizes[3]), 0};
  if (colon != std::string::npos) {
    if (text.substr(colon + 1) != "shift") throw std::invalid_argument(usage);
    s.mask_windows = kShiftMaskWindows;
  }
  try {
    kernels::check_window_attention(kernels::DType::f16, s);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(usage + " (" + e.what() + ")");
  }
  return s;
}

int window_of(int tokens) { return tokens == 49 ? 7 : 12; }
size_t table_entries(int tokens) {
  return static_cast<size_t>(2 * window_of(tokens) - 1) * (2 * window_of(tokens) - 1);
}

double bytes_moved(const kernels::WindowAttentionShape& s, kernels::DType dtype, bool backward) {
  const double size = kernels::dtype_size(dtype);
  const double rows = static_cast<double>(s.windows) * s.tokens;  // token rows
  const double qkv = rows * 3 * s.heads * s.head_dim * size, out = rows * s.heads * s.head_dim * size;
  const double lse = rows * s.heads * 4;
  const double pairs = static_cast<double>(s.tokens) * s.tokens;
  const double table = table_entries(s.tokens) * s.heads * size;
  // index (int32), gathered bias (float), mask (float)
  const double small = pairs * 4 + s.heads * pairs * 4 + static_cast<double>(s.mask_windows) * pairs * 4;
  const double forward = qkv + out + lse + table + small;
  // Reads qkv, dout, lse; writes dqkv. O is not counted: D_i = dO_i . O_i is also rowsum(P * dP),
  // which a fused backward has in registers (the 49-token kernel reads no O).
  const double backward_bytes = qkv + out + lse + qkv + table + small;
  return backward ? forward + backward_bytes : forward;
}

// The operands of one case, allocated by setup and freed by release.
struct WindowAttentionOperands {
  int sets = 0;
  std::vector<DeviceBuffer> qkv, out, lse, dout, dqkv;
  DeviceBuffer table, index, mask, bias, dtable, workspace;

  WindowAttentionOperands(const kernels::WindowAttentionShape& s, kernels::DType dtype, bool backward,
                          cudaStream_t stream) {
    const size_t size = kernels::dtype_size(dtype);
    const size_t rows = static_cast<size_t>(s.windows) * s.tokens;
    const size_t qkv_count = rows * 3 * s.heads * s.head_dim, out_count = rows * s.heads * s.head_dim;
    const size_t lse_bytes = rows * s.heads * sizeof(float);
    const size_t pairs = static_cast<size_t>(s.tokens) * s.tokens;
    sets = rotation_sets((qkv_count + out_count) * size * (backward ? 2 : 1) + lse_bytes);
    for (int set = 0; set < sets; ++set) {
      qkv.emplace_back(qkv_count * size);
      out.emplace_back(out_count * size);
      lse.emplace_back(lse_bytes);
      fill_random(qkv.back().get(), qkv_count, dtype, 1000 + set, 1.0f, 0.0f, stream);
      if (backward) {
        dout.emplace_back(out_count * size);
        dqkv.emplace_back(qkv_count * size);
        fill_random(dout.back().get(), out_count, dtype, 2000 + set, 1.0f, 0.0f, stream);
      }
    }
    const size_t entries = table_entries(s.tokens) * s.heads;
    table = DeviceBuffer(entries * size);
    fill_random(table.get(), entries, dtype, 3, 1.0f, 0.0f, stream);
    const std::vector<int32_t> host = kernels::relative_position_index(window_of(s.tokens));
    index = DeviceBuffer(host.size() * sizeof(int32_t));
    FUSEKIT_CUDA_CHECK(
        cudaMemcpyAsync(index.get(), host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
    if (s.mask_windows > 0) {
      // The mask's values do not change the work; uniform values in [-1, 1) stand in for 0 / -100.
      mask = DeviceBuffer(static_cast<size_t>(s.mask_windows) * pairs * sizeof(float));
      fill_random(mask.get(), s.mask_windows * pairs, kernels::DType::f32, 4, 1.0f, 0.0f, stream);
    }
    bias = DeviceBuffer(s.heads * pairs * sizeof(float));
    if (backward) {
      dtable = DeviceBuffer(entries * size);
      workspace = DeviceBuffer(kernels::window_attention_backward_workspace_bytes(s));
    }
    FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));  // `host` goes out of scope
  }
};

std::vector<Case> window_attention_cases(const std::string& shape_text, kernels::DType dtype, bool backward) {
  const kernels::WindowAttentionShape s = parse_window_attention_shape(shape_text);
  kernels::check_window_attention(dtype, s);  // fp32: one clear error
  store::CaseInfo info =
      make_case_info("window_attention", shape_text, dtype, backward, bytes_moved(s, dtype, backward));
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  auto operands = std::make_shared<std::optional<WindowAttentionOperands>>();
  auto setup = [operands, s, dtype, backward](cudaStream_t stream) { operands->emplace(s, dtype, backward, stream); };
  auto release = [operands] { operands->reset(); };

  std::vector<Case> cases;
  info.variant = "fused";
  cases.push_back(
      {info,
       [operands, s, dtype, backward, scale](cudaStream_t stream, int rep) {
         WindowAttentionOperands& o = **operands;
         const int k = rep % o.sets;
         const float* mask = s.mask_windows > 0 ? o.mask.as<float>() : nullptr;
         kernels::window_attention_forward(dtype, o.qkv[k].get(), o.table.get(), o.index.as<int32_t>(), mask,
                                           o.out[k].get(), o.bias.as<float>(), o.lse[k].as<float>(), s, scale, stream);
         if (backward) {
           kernels::window_attention_backward(dtype, o.qkv[k].get(), o.bias.as<float>(), mask, o.out[k].get(),
                                              o.lse[k].as<float>(), o.dout[k].get(), o.index.as<int32_t>(),
                                              o.dqkv[k].get(), o.dtable.get(), o.workspace.get(), s, scale, stream);
         }
       },
       setup, release});
#ifdef FUSEKIT_WITH_TORCH
  info.variant = "baseline";
  cases.push_back(
      {info,
       [operands, s, dtype, backward, scale](cudaStream_t stream, int rep) {
         WindowAttentionOperands& o = **operands;
         const int k = rep % o.sets;
         TorchStream on_stream(stream);
         const at::ScalarType type = torch_type(dtype);
         const at::Tensor qkv = wrap(o.qkv[k], {s.windows, s.tokens, 3, s.heads, s.head_dim}, type);
         const at::Tensor table = wrap(o.table, {static_cast<int64_t>(table_entries(s.tokens)), s.heads}, type);
         const at::Tensor index = wrap(o.index, {s.tokens, s.tokens}, at::kInt);
         at::Tensor mask;
         if (s.mask_windows > 0) mask = wrap(o.mask, {s.mask_windows, s.tokens, s.tokens}, at::kFloat);
         if (backward) {
           const at::Tensor dout = wrap(o.dout[k], {s.windows, s.tokens, s.heads * s.head_dim}, type);
           baselines::window_attention_forward_backward(qkv, table, index, mask, scale, dout);
         } else {
           baselines::window_attention_forward(qkv, table, index, mask, scale);
         }
       },
       setup, release});
#endif
  return cases;
}

}  // namespace

OpDefinition window_attention_op() {
  OpDefinition op;
  op.name = "window_attention";
  op.suite = "attention";
  op.shape_syntax = "WINDOWSxHEADSxNxD[:shift]";
  // Swin-T at 128 images of 224 x 224: stages 1-3 with the shift mask, stage 4 (one window per
  // image) without; Swin-B's stage 1; Swin-L at 384 x 384 with windows of 12, stage 2 shape.
  op.shapes = {"8192x3x49x32:shift", "2048x6x49x32:shift", "512x12x49x32:shift",
               "128x24x49x32",       "8192x4x49x32:shift", "2048x6x144x32:shift"};
  op.cases = [](const std::string& shape, kernels::DType dtype, bool backward) {
    return window_attention_cases(shape, dtype, backward);
  };
  return op;
}

}  // namespace fusekit::suites
