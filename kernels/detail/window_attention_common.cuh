// Swin window attention: what both window sizes share. The log2-domain constants, how the backward
// deals the windows of a shape to its blocks (WindowDeal), and the softmax numerators of a warp's
// score fragments.
#pragma once

#include <algorithm>

#include "kernels/common.cuh"
#include "kernels/window_attention.h"

namespace fusekit::kernels {
// Included by window_attention.cu alone: its kernels keep the anonymous namespace (and so
// their names in traces) of the one translation unit that launches them.
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kMaxHeads = 64;  // the table gradient's warp holds two heads per lane

// How the windows are dealt to blocks: class c = h * mask_windows + m, `parts` blocks per class,
// block (c, part) takes the windows m + mask_windows k for k in [part chunk, (part + 1) chunk).
struct WindowDeal {
  int mask_windows;  // >= 1
  int per_class;     // windows / mask_windows
  int chunk;
  int parts;
  int blocks(int heads) const { return heads * mask_windows * parts; }

  // Block `index`'s head h, mask window m, part of its class and windows' range [first, last) of k.
  struct Block {
    int h, m, part, first, last;
  };
  __device__ Block block(unsigned index) const {  // unsigned: blockIdx.x
    const int cls = index / parts, part = index % parts;
    const int h = cls / mask_windows, m = cls % mask_windows;
    const int first = part * chunk;
    return {h, m, part, first, min(per_class, first + chunk)};
  }
};

WindowDeal deal_windows(const WindowAttentionShape& s, int chunk) {
  WindowDeal d;
  d.mask_windows = std::max(s.mask_windows, 1);
  d.per_class = s.windows / d.mask_windows;
  d.chunk = std::max(1, std::min(chunk, d.per_class));
  d.parts = d.per_class > 0 ? ceil_div(d.per_class, d.chunk) : 0;
  return d;
}

// The softmax numerators of a warp's scores in fragments (log2 domain), rows g (elements 0, 1) and
// g + 8 (2, 3), each spread over the 4 lanes t, given the lanes' own row maxima high0, high1:
// s = exp2(s - shift) with shift the row maximum (0 for a row with no key: every term is then 0),
// and the row sums of the results.
template <int TILES>
__device__ __forceinline__ void exponentiate_rows(float (&s)[TILES][4], float high0, float high1, float& shift0,
                                                  float& shift1, float& sum0, float& sum1) {
  high0 = lane_group_max<4>(high0);
  high1 = lane_group_max<4>(high1);
  shift0 = high0 == -INFINITY ? 0.f : high0;
  shift1 = high1 == -INFINITY ? 0.f : high1;
  sum0 = 0.f;
  sum1 = 0.f;
#pragma unroll
  for (int j = 0; j < TILES; ++j) {
    s[j][0] = exp2f(s[j][0] - shift0);
    s[j][1] = exp2f(s[j][1] - shift0);
    s[j][2] = exp2f(s[j][2] - shift1);
    s[j][3] = exp2f(s[j][3] - shift1);
    sum0 += s[j][0] + s[j][1];
    sum1 += s[j][2] + s[j][3];
  }
  sum0 = lane_group_sum<4>(sum0);
  sum1 = lane_group_sum<4>(sum1);
}

}  // namespace
}  // namespace fusekit::kernels
