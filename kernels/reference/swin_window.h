// Float64 references of Swin's window operations (the maps and the math are in
// kernels/swin_window.h): window_partition, window_merge and patch_merging, forward and backward.
// Each is written as the composition Swin's code runs (roll, partition, LayerNorm, ...) on plain
// arrays, so the references share nothing with the GPU kernels' index maps.
#pragma once

#include <vector>

namespace fusekit::reference {

struct SwinWindowShape {
  int batch, height, width, channels, window, shift;
};

// torch.roll(x, (-shift, -shift), (1, 2)) then Swin's window_partition: [B, H, W, C] -> [B * nW, ws * ws, C].
std::vector<double> roll_partition(const std::vector<double>& x, const SwinWindowShape& s);

// Swin's window_reverse then torch.roll(., (shift, shift), (1, 2)): [B * nW, ws * ws, C] -> [B, H, W, C].
std::vector<double> reverse_roll(const std::vector<double>& windows, const SwinWindowShape& s);

struct WindowPartitionForward {
  std::vector<double> windows, mean, rstd;  // mean, rstd per window token
};
WindowPartitionForward window_partition_forward(const std::vector<double>& x, const std::vector<double>& gamma,
                                                const std::vector<double>& beta, const SwinWindowShape& s, double eps);

struct WindowPartitionBackward {
  std::vector<double> dx, dgamma, dbeta;
};
WindowPartitionBackward window_partition_backward(const std::vector<double>& dwindows, const std::vector<double>& x,
                                                  const std::vector<double>& gamma, const SwinWindowShape& s,
                                                  double eps);

// y = shortcut + reverse_roll(windows).
std::vector<double> window_merge_forward(const std::vector<double>& windows, const std::vector<double>& shortcut,
                                         const SwinWindowShape& s);

struct WindowMergeBackward {
  std::vector<double> dwindows, dshortcut;
};
WindowMergeBackward window_merge_backward(const std::vector<double>& dy, const SwinWindowShape& s);

struct PatchMergingShape {
  int batch, height, width, channels;
};

// cat(x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2], -1): [B, H/2, W/2, 4C].
std::vector<double> patch_gather(const std::vector<double>& x, const PatchMergingShape& s);

struct PatchMergingForward {
  std::vector<double> y, mean, rstd;  // mean, rstd per merged token
};
PatchMergingForward patch_merging_forward(const std::vector<double>& x, const std::vector<double>& gamma,
                                          const std::vector<double>& beta, const PatchMergingShape& s, double eps);

struct PatchMergingBackward {
  std::vector<double> dx, dgamma, dbeta;
};
PatchMergingBackward patch_merging_backward(const std::vector<double>& dy, const std::vector<double>& x,
                                            const std::vector<double>& gamma, const PatchMergingShape& s, double eps);

}  // namespace fusekit::reference
