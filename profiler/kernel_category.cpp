#include "profiler/kernel_category.h"

#include <string>

namespace fusekit::profiler {
namespace {

using C = KernelCategory;

enum class Match {
  contains,            // the name holds the fragment (and `also`, where given)
  triton_data_moving,  // a Triton kernel that fuses only copies, casts, fills and views
};

struct Rule {
  Match match;
  std::string_view fragment;
  KernelCategory category;
  std::string_view also = {};
};

// The first matching rule decides. Groups run from the most specific names to the most general.
constexpr Rule kRules[] = {
    // Collectives: NCCL's kernels (ncclDevKernel_AllReduce_Sum_f32_RING_LL, ...); dp/'s selection,
    // encoding and error feedback.
    {Match::contains, "nccl", C::communication},
    {Match::contains, "fusekit::dp::", C::communication},

    // The optimizer step: fusekit's AdamW, PyTorch's fused Adam(W) (FusedAdamMathFunctor) and every
    // foreach kernel (multi_tensor_apply_kernel: AdamW, the GradScaler's unscale and inf check;
    // Inductor's triton_for_* when the step is compiled), the loss scale's update.
    {Match::contains, "adam", C::optimizer},
    {Match::contains, "triton_for_", C::optimizer},
    {Match::contains, "Adam", C::optimizer},
    {Match::contains, "multi_tensor_apply", C::optimizer},
    {Match::contains, "amp_update_scale", C::optimizer},
    {Match::contains, "non_finite_check_and_unscale", C::optimizer},

    // Attention by name: fusekit's BERT and Swin window attention (with the window bias table's
    // kernels), flash / memory-efficient (fmha) / cuDNN SDPA kernels and cuDNN's helpers for their
    // backward and dropout seeds.
    {Match::contains, "attention", C::attention},
    {Match::contains, "Attention", C::attention},
    {Match::contains, "window_bias_", C::attention},
    {Match::contains, "window_table_gradient", C::attention},
    {Match::contains, "fmha", C::attention},
    {Match::contains, "flash", C::attention},
    {Match::contains, "Flash", C::attention},
    {Match::contains, "sdpa", C::attention},
    {Match::contains, "compute_dot_do_o", C::attention},
    {Match::contains, "convert_dq_to", C::attention},
    {Match::contains, "unpack_cudnn", C::attention},

    // Normalization, before the loss and elementwise rules: Triton fuses LayerNorms with dropouts,
    // casts and the loss's gathers. fusekit's embedding + LayerNorm backward sorts tokens first.
    {Match::contains, "layer_norm", C::normalization},
    {Match::contains, "layernorm", C::normalization},
    {Match::contains, "LayerNorm", C::normalization},
    {Match::contains, "GammaBetaBackward", C::normalization},
    {Match::contains, "rms_norm", C::normalization},
    {Match::contains, "rmsnorm", C::normalization},
    {Match::contains, "RMSNorm", C::normalization},
    {Match::contains, "RmsNorm", C::normalization},
    {Match::contains, "batch_norm", C::normalization},
    {Match::contains, "batchnorm", C::normalization},
    {Match::contains, "BatchNorm", C::normalization},
    {Match::contains, "group_norm", C::normalization},
    {Match::contains, "GroupNorm", C::normalization},
    {Match::contains, "order_tokens_kernel", C::normalization},
    {Match::contains, "sorted_gradients_kernel", C::normalization},
    {Match::contains, "count_tokens_kernel", C::normalization},
    {Match::contains, "mark_words_kernel", C::normalization},
    {Match::contains, "word_slots_kernel", C::normalization},
    {Match::contains, "table_gradient_kernel", C::normalization},

    // Inductor names the embedding's gradient after the loss's ignore-index mask it fuses in.
    {Match::contains, "embedding_dense_backward", C::copy},

    // The loss, before softmax: PyTorch's log-softmax is cunn_SoftMaxForward with a
    // LogSoftMaxForwardEpilogue, or softmax_warp_forward<in, out, acc, log2 elements, is_log_softmax,
    // is_masked> with is_log_softmax true.
    {Match::contains, "softmax_warp_", C::loss, ", true, false>("},
    {Match::contains, "softmax_warp_", C::loss, ", true, true>("},
    {Match::contains, "cross_entropy", C::loss},
    {Match::contains, "CrossEntropy", C::loss},
    {Match::contains, "nll_loss", C::loss},
    {Match::contains, "log_softmax", C::loss},
    {Match::contains, "LogSoftMax", C::loss},
    {Match::contains, "LogSoftmax", C::loss},
    {Match::contains, "_loss", C::loss},
    {Match::contains, "mse_", C::loss},
    {Match::contains, "smooth_l1", C::loss},
    {Match::contains, "huber", C::loss},

    // Softmax on its own: attention's (PyTorch's softmax_warp_forward and cunn_SoftMax*, fusekit's
    // masked softmax).
    {Match::contains, "softmax", C::attention},
    {Match::contains, "SoftMax", C::attention},
    {Match::contains, "Softmax", C::attention},

    // GEMMs: cuBLAS / cuBLASLt (nvjet_*, sm90_xmma_gemm_*, cutlass::Kernel2<...gemm...>, the split-K
    // reduction and epilogue kernels), gemv, Inductor's GEMM templates, fusekit's skinny GEMMs.
    {Match::contains, "gemm", C::gemm},
    {Match::contains, "Gemm", C::gemm},
    {Match::contains, "GEMM", C::gemm},
    {Match::contains, "gemv", C::gemm},
    {Match::contains, "nvjet", C::gemm},
    {Match::contains, "cutlass", C::gemm},
    {Match::contains, "cublas", C::gemm},
    {Match::contains, "triton_tem_", C::gemm},
    {Match::contains, "skinny_forward", C::gemm},
    {Match::contains, "skinny_backward", C::gemm},
    // Convolutions (timm's patch embedding under cuDNN): the kernels and the weight gradient's.
    {Match::contains, "cudnn::cnn::", C::gemm},
    {Match::contains, "wgrad_alg", C::gemm},
    {Match::contains, "convolve", C::gemm},

    // Moving data: PyTorch's copies and casts (direct_copy_kernel_cuda and friends are
    // elementwise_kernel instances), fills, concatenation, roll; gathers, scatters and indexing;
    // the embedding's backward (sorts, segment sums); fusekit's row gather, window partition /
    // merge and zero fill.
    {Match::contains, "copy_kernel", C::copy},
    {Match::contains, "CatArrayBatchedCopy", C::copy},
    {Match::contains, "FillFunctor", C::copy},
    {Match::contains, "roll_cuda_kernel", C::copy},
    {Match::contains, "zero_float4s_kernel", C::copy},
    {Match::contains, "gather", C::copy},
    {Match::contains, "scatter", C::copy},
    {Match::contains, "index_elementwise_kernel", C::copy},
    {Match::contains, "indexFunc", C::copy},
    {Match::contains, "indexing_backward", C::copy},
    {Match::contains, "index_put", C::copy},
    {Match::contains, "embedding", C::copy},
    {Match::contains, "compute_grad_weight", C::copy},
    {Match::contains, "partial_segment", C::copy},
    {Match::contains, "krn_partial", C::copy},
    {Match::contains, "RadixSort", C::copy},
    {Match::contains, "radix_sort", C::copy},
    {Match::contains, "UniqueByKey", C::copy},
    {Match::contains, "DeviceSelect", C::copy},
    {Match::contains, "DeviceCompact", C::copy},
    {Match::contains, "DeviceScan", C::copy},
    {Match::contains, "patch_columns", C::copy},  // Swin's patch embedding as a GEMM: its im2col
    {Match::contains, "nchwToNhwc", C::copy},     // cuDNN's layout conversions around a convolution
    {Match::contains, "nhwcToNchw", C::copy},
    {Match::contains, "window_merge", C::copy},
    {Match::contains, "window_partition", C::copy},
    {Match::contains, "swin_window", C::copy},
    {Match::contains, "memcpy", C::copy},
    {Match::contains, "Memcpy", C::copy},
    {Match::contains, "memset", C::copy},
    {Match::contains, "Memset", C::copy},
    {Match::triton_data_moving, "triton_", C::copy},

    // Pointwise kernels and reductions: PyTorch's TensorIterator kernels (elementwise_kernel,
    // vectorized_ / unrolled_elementwise_kernel, reduce_kernel), dropout, activations, random
    // numbers, masks; fusekit's bias + GELU, residual adds, token mean and dropout step counter; the
    // rest of Triton's pointwise (poi), persistent (per) and reduction (red) kernels.
    {Match::contains, "elementwise", C::elementwise},
    {Match::contains, "reduce_kernel", C::elementwise},
    {Match::contains, "DeviceReduce", C::elementwise},
    {Match::contains, "dropout", C::elementwise},
    {Match::contains, "Dropout", C::elementwise},
    {Match::contains, "masked_scale", C::elementwise},
    {Match::contains, "gelu", C::elementwise},
    {Match::contains, "Gelu", C::elementwise},
    {Match::contains, "relu", C::elementwise},
    {Match::contains, "silu", C::elementwise},
    {Match::contains, "triu_tril", C::elementwise},
    {Match::contains, "residual_add", C::elementwise},          // fusekit's Swin residual adds
    {Match::contains, "token_mean", C::elementwise},            // fusekit's Swin average pool
    {Match::contains, "advance_step_counter", C::elementwise},  // fusekit's dropout step
    {Match::contains, "triton_", C::elementwise},
    {Match::contains, "fusekit::suites::", C::elementwise},  // the demo suite's scale and add kernels
};

// A Triton kernel is named triton_<kind>_fused_<the fused operators>_<n>. True if every word of
// the operators is one of a copy, cast, fill or view: such a kernel moves data, it computes nothing.
// The words of GEMM and convolution operators count too: Inductor names the layout copy of a GEMM's
// operand after it. Swin's cyclic shift (roll) and the QKV split (unbind) move data too.
bool triton_moves_data_only(std::string_view name) {
  const size_t fused = name.find("_fused_");
  if (name.rfind("triton_", 0) != 0 || fused == std::string_view::npos) return false;
  std::string_view operators = name.substr(fused + 7);
  const size_t last = operators.find_last_of('_');
  if (last == std::string_view::npos) return false;  // no operators before the number
  operators = operators.substr(0, last);
  static constexpr std::string_view kDataMoving[] = {
      "to",     "copy",  "clone",  "view",   "permute",  "transpose",  "t",      "cat",     "unsqueeze", "squeeze",
      "expand", "slice", "select", "unsafe", "reshape",  "contiguous", "as",     "strided", "new",       "zeros",
      "zero",   "empty", "fill",   "full",   "ones",     "lift",       "fresh",  "alias",   "mm",        "addmm",
      "bmm",    "split", "with",   "sizes",  "constant", "pad",        "unbind", "stack",   "roll",      "convolution"};
  bool any = false;
  size_t begin = 0;
  while (begin <= operators.size()) {
    size_t end = operators.find('_', begin);
    if (end == std::string_view::npos) end = operators.size();
    const std::string_view word = operators.substr(begin, end - begin);
    if (!word.empty()) {
      bool moving = false;
      for (std::string_view w : kDataMoving) moving = moving || w == word;
      if (!moving) return false;
      any = true;
    }
    begin = end + 1;
  }
  return any;
}

}  // namespace

std::string_view category_name(KernelCategory category) {
  switch (category) {
    case C::gemm:
      return "GEMM";
    case C::attention:
      return "attention";
    case C::normalization:
      return "normalization";
    case C::elementwise:
      return "elementwise";
    case C::loss:
      return "loss";
    case C::optimizer:
      return "optimizer";
    case C::copy:
      return "copy/cast";
    case C::communication:
      return "communication";
    case C::other:
      return "other";
  }
  return "other";
}

std::string_view category_key(KernelCategory category) {
  switch (category) {
    case C::gemm:
      return "gemm";
    case C::copy:
      return "copy_cast";
    default:
      return category_name(category);
  }
}

KernelCategory classify_kernel(std::string_view name) {
  for (const Rule& rule : kRules) {
    const bool matches = rule.match == Match::contains
                             ? name.find(rule.fragment) != std::string_view::npos &&
                                   (rule.also.empty() || name.find(rule.also) != std::string_view::npos)
                             : triton_moves_data_only(name);
    if (matches) return rule.category;
  }
  return C::other;
}

}  // namespace fusekit::profiler
