// What kind of work a kernel does, from its name: one ordered table of name fragments.
//
// The first rule whose fragment the demangled name holds decides, so specific fragments come
// before general ones: PyTorch's casts and its fused AdamW are elementwise_kernel and
// multi_tensor_apply_kernel instances told apart by their functors, a log-softmax (the loss's) is
// matched before the softmax of attention, and a Triton kernel (torch.compile) that fuses a
// LayerNorm with a dropout counts as normalization. Copies and memsets recorded as such (not as
// kernels) are copy/cast.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

namespace fusekit::profiler {

enum class KernelCategory {
  gemm,           // cuBLAS / cuBLASLt (nvjet, xmma, CUTLASS, split-K reductions, epilogues), fusekit's skinny GEMMs
  attention,      // fused attention (fusekit's, cuDNN / flash / memory-efficient SDPA) and softmax
  normalization,  // LayerNorm, RMSNorm and friends, fusekit's fused residual / embedding LayerNorms
  elementwise,    // pointwise kernels and reductions: activations, dropout, adds, sums (PyTorch's, Triton's)
  loss,           // cross-entropy, log-softmax, NLL
  optimizer,      // AdamW and PyTorch's multi-tensor (foreach) kernels, loss-scale updates
  copy,           // copies, casts, fills, concatenation, gathers, scatters, indexing, sorts; memcpy, memset
  communication,  // NCCL, fusekit's sparse gradient exchange (dp/)
  other,
};

inline constexpr std::array<KernelCategory, 9> kKernelCategories = {
    KernelCategory::gemm,        KernelCategory::attention,     KernelCategory::normalization,
    KernelCategory::elementwise, KernelCategory::loss,          KernelCategory::optimizer,
    KernelCategory::copy,        KernelCategory::communication, KernelCategory::other};

// "GEMM", "attention", "normalization", "elementwise", "loss", "optimizer", "copy/cast",
// "communication", "other".
std::string_view category_name(KernelCategory category);
// The same as an identifier, for CSV columns: "gemm", ..., "copy_cast", ...
std::string_view category_key(KernelCategory category);

// The category of a kernel by its demangled name (or its short name, where the functors and
// template arguments that some rules read are gone).
KernelCategory classify_kernel(std::string_view name);

}  // namespace fusekit::profiler
