#include "kernels/reference/swin_window.h"

#include <cstddef>
#include <utility>

#include "kernels/reference/layernorm.h"

namespace fusekit::reference {
namespace {

size_t token(const SwinWindowShape& s, int b, int h, int w) {
  return (static_cast<size_t>(b) * s.height + h) * s.width + w;
}

// torch.roll along H and W of [B, H, W, C]: out[b, h, w] = in[b, (h - shift) mod H, (w - shift) mod W].
std::vector<double> roll(const std::vector<double>& in, const SwinWindowShape& s, int shift) {
  std::vector<double> out(in.size());
  const int C = s.channels;
  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.height; ++h) {
      for (int w = 0; w < s.width; ++w) {
        const int from_h = ((h - shift) % s.height + s.height) % s.height;
        const int from_w = ((w - shift) % s.width + s.width) % s.width;
        for (int c = 0; c < C; ++c) out[token(s, b, h, w) * C + c] = in[token(s, b, from_h, from_w) * C + c];
      }
    }
  }
  return out;
}

// The window row of (b, h, w) in Swin's window_partition (no shift).
size_t window_row(const SwinWindowShape& s, int b, int h, int w) {
  const int ws = s.window, windows_h = s.height / ws, windows_w = s.width / ws;
  const size_t window = (static_cast<size_t>(b) * windows_h + h / ws) * windows_w + w / ws;
  return window * ws * ws + (h % ws) * ws + (w % ws);
}

}  // namespace

std::vector<double> roll_partition(const std::vector<double>& x, const SwinWindowShape& s) {
  const std::vector<double> rolled = roll(x, s, -s.shift);
  std::vector<double> windows(x.size());
  const int C = s.channels;
  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.height; ++h) {
      for (int w = 0; w < s.width; ++w) {
        for (int c = 0; c < C; ++c) windows[window_row(s, b, h, w) * C + c] = rolled[token(s, b, h, w) * C + c];
      }
    }
  }
  return windows;
}

std::vector<double> reverse_roll(const std::vector<double>& windows, const SwinWindowShape& s) {
  std::vector<double> unrolled(windows.size());
  const int C = s.channels;
  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.height; ++h) {
      for (int w = 0; w < s.width; ++w) {
        for (int c = 0; c < C; ++c) unrolled[token(s, b, h, w) * C + c] = windows[window_row(s, b, h, w) * C + c];
      }
    }
  }
  return roll(unrolled, s, s.shift);
}

WindowPartitionForward window_partition_forward(const std::vector<double>& x, const std::vector<double>& gamma,
                                                const std::vector<double>& beta, const SwinWindowShape& s, double eps) {
  const int rows = s.batch * s.height * s.width;
  LayerNormForward f = layernorm_forward(roll_partition(x, s), gamma, beta, rows, s.channels, eps);
  return {std::move(f.y), std::move(f.mean), std::move(f.rstd)};
}

WindowPartitionBackward window_partition_backward(const std::vector<double>& dwindows, const std::vector<double>& x,
                                                  const std::vector<double>& gamma, const SwinWindowShape& s,
                                                  double eps) {
  const int rows = s.batch * s.height * s.width;
  LayerNormBackward g = layernorm_backward(dwindows, roll_partition(x, s), gamma, rows, s.channels, eps);
  // The partition is a permutation: its adjoint is its inverse.
  return {reverse_roll(g.dx, s), std::move(g.dgamma), std::move(g.dbeta)};
}

std::vector<double> window_merge_forward(const std::vector<double>& windows, const std::vector<double>& shortcut,
                                         const SwinWindowShape& s) {
  std::vector<double> y = reverse_roll(windows, s);
  for (size_t i = 0; i < y.size(); ++i) y[i] += shortcut[i];
  return y;
}

WindowMergeBackward window_merge_backward(const std::vector<double>& dy, const SwinWindowShape& s) {
  return {roll_partition(dy, s), dy};
}

std::vector<double> patch_gather(const std::vector<double>& x, const PatchMergingShape& s) {
  const int C = s.channels, half_h = s.height / 2, half_w = s.width / 2;
  std::vector<double> y(x.size());
  const int dh[4] = {0, 1, 0, 1}, dw[4] = {0, 0, 1, 1};  // x0, x1, x2, x3
  for (int b = 0; b < s.batch; ++b) {
    for (int i = 0; i < half_h; ++i) {
      for (int j = 0; j < half_w; ++j) {
        const size_t out = ((static_cast<size_t>(b) * half_h + i) * half_w + j) * 4 * C;
        for (int k = 0; k < 4; ++k) {
          const size_t in = ((static_cast<size_t>(b) * s.height + 2 * i + dh[k]) * s.width + 2 * j + dw[k]) * C;
          for (int c = 0; c < C; ++c) y[out + k * C + c] = x[in + c];
        }
      }
    }
  }
  return y;
}

PatchMergingForward patch_merging_forward(const std::vector<double>& x, const std::vector<double>& gamma,
                                          const std::vector<double>& beta, const PatchMergingShape& s, double eps) {
  const int rows = s.batch * (s.height / 2) * (s.width / 2);
  LayerNormForward f = layernorm_forward(patch_gather(x, s), gamma, beta, rows, 4 * s.channels, eps);
  return {std::move(f.y), std::move(f.mean), std::move(f.rstd)};
}

PatchMergingBackward patch_merging_backward(const std::vector<double>& dy, const std::vector<double>& x,
                                            const std::vector<double>& gamma, const PatchMergingShape& s, double eps) {
  const int rows = s.batch * (s.height / 2) * (s.width / 2);
  LayerNormBackward g = layernorm_backward(dy, patch_gather(x, s), gamma, rows, 4 * s.channels, eps);
  // The gather is a permutation (H and W even): scatter each gathered element back where it came from.
  std::vector<double> index(x.size());
  for (size_t i = 0; i < index.size(); ++i) index[i] = static_cast<double>(i);
  const std::vector<double> source = patch_gather(index, s);
  std::vector<double> dx(x.size());
  for (size_t i = 0; i < source.size(); ++i) dx[static_cast<size_t>(source[i])] = g.dx[i];
  return {std::move(dx), std::move(g.dgamma), std::move(g.dbeta)};
}

}  // namespace fusekit::reference
