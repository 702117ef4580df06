// Operator-suite cases for scale + mask + softmax of attention scores: forward, and forward +
// backward, fused and (where libtorch is built in) the libtorch baseline, on rotated input sets.
//
// Shapes are "BxHxSQxSK:MASK" with MASK one of
//   none, causal;
//   padding  key padding: valid key counts in [1, SK] per sequence (padding_lengths below);
//   bias     Swin: a relative position bias [H, SQ, SK] plus, for a batch of 128 images x W windows
//            with W > 1, the shifted-window mask [W, SQ, SK] (W = B / 128; the last stage, one window
//            per image, has none); "biasW" names the window count W instead (bias0: no window mask).
//
// Bytes that must move: the forward reads x's kept scores (a removed key is never read: the fused
// forward skips it, though the eager one reads it), the lengths, bias and window mask, and writes y;
// the backward reads y and dy and writes dx.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/softmax.h"
#include "suites/ops/operands.h"
#include "suites/ops/ops_suite.h"

#include "suites/ops/torch_operands.h"

#ifdef FUSEKIT_WITH_TORCH
#include "baselines/softmax.h"
#endif

namespace fusekit::suites {
namespace {

constexpr float kScale = 0.125f;  // 1 / sqrt(head dimension 64)
constexpr int kSwinImages = 128;  // the batch of images behind the suite's Swin shapes

struct SoftmaxCaseShape {
  kernels::SoftmaxShape shape;
  kernels::SoftmaxMask mask;
  int windows;  // bias: the window mask's count, 0 for none
};

SoftmaxCaseShape parse_softmax_shape(const std::string& text) {
  const std::string usage =
      "unsupported shape '" + text +
      "': expected BxHxSQxSK:MASK with MASK none|padding|causal|bias[W], e.g. 64x12x128x128:padding";
  const size_t colon = text.find(':');
  if (colon == std::string::npos) throw std::invalid_argument(usage);
  const std::vector<long> sizes = parse_sizes(text.substr(0, colon), 4, 1L << 30, usage);
  SoftmaxCaseShape out{
      {static_cast<int>(sizes[0]), static_cast<int>(sizes[1]), static_cast<int>(sizes[2]), static_cast<int>(sizes[3])},
      kernels::SoftmaxMask::none,
      0};
  const std::string mask = text.substr(colon + 1);
  if (mask == "none") return out;
  if (mask == "padding" || mask == "causal") {
    out.mask = mask == "padding" ? kernels::SoftmaxMask::padding : kernels::SoftmaxMask::causal;
    return out;
  }
  if (mask.rfind("bias", 0) != 0) throw std::invalid_argument(usage);
  out.mask = kernels::SoftmaxMask::bias;
  const std::string windows = mask.substr(4);
  if (windows.empty()) {
    if (out.shape.batch % kSwinImages != 0) {
      throw std::invalid_argument("unsupported shape '" + text + "': 'bias' takes the batch as " +
                                  std::to_string(kSwinImages) +
                                  " images x windows; name the window count (biasW) for other batches");
    }
    const int w = out.shape.batch / kSwinImages;
    out.windows = w > 1 ? w : 0;
    return out;
  }
  size_t used = 0;
  long w = -1;
  try {
    w = std::stol(windows, &used);
  } catch (const std::exception&) {
  }
  if (used != windows.size() || w < 0 || (w > 0 && out.shape.batch % w != 0)) {
    throw std::invalid_argument(usage + " (biasW: W >= 0 dividing B)");
  }
  out.windows = static_cast<int>(w);
  return out;
}

uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The valid key counts of operand set `set`: sequence b keeps 1 + splitmix64(b') % keys keys with
// b' = (b + set) % batch. Every set holds the same counts in another order, so every set moves the
// same bytes; the peer (scripts/peers/ops/softmax.py) draws the same counts with the same formula.
std::vector<int32_t> padding_lengths(int batch, int keys, int set) {
  std::vector<int32_t> lengths(batch);
  for (int b = 0; b < batch; ++b) {
    lengths[b] = static_cast<int32_t>(1 + splitmix64(static_cast<uint64_t>((b + set) % batch)) % keys);
  }
  return lengths;
}

// Scores the forward keeps (and reads).
double kept_scores(const SoftmaxCaseShape& c) {
  const kernels::SoftmaxShape& s = c.shape;
  if (c.mask == kernels::SoftmaxMask::padding) {
    double kept = 0;
    for (int32_t length : padding_lengths(s.batch, s.keys, 0)) kept += length;
    return kept * s.heads * s.queries;
  }
  if (c.mask == kernels::SoftmaxMask::causal) {
    double kept = 0;
    for (int q = 0; q < s.queries; ++q) kept += std::min(std::max(q + 1 + s.keys - s.queries, 0), s.keys);
    return kept * s.batch * s.heads;
  }
  return static_cast<double>(s.batch) * s.heads * s.queries * s.keys;
}

double bytes_moved(const SoftmaxCaseShape& c, kernels::DType dtype, bool backward) {
  const kernels::SoftmaxShape& s = c.shape;
  const double n = static_cast<double>(s.batch) * s.heads * s.queries * s.keys, size = kernels::dtype_size(dtype);
  double forward = kept_scores(c) * size + n * size;
  if (c.mask == kernels::SoftmaxMask::padding) forward += 4.0 * s.batch;
  if (c.mask == kernels::SoftmaxMask::bias) {
    forward += (static_cast<double>(s.heads) + c.windows) * s.queries * s.keys * size;
  }
  return backward ? forward + 3 * n * size : forward;
}

// The operands of one case, allocated by setup and freed by release.
struct SoftmaxOperands {
  int sets = 0;
  std::vector<DeviceBuffer> x, y, dy, dx, lengths;
  DeviceBuffer bias, window_mask;

  SoftmaxOperands(const SoftmaxCaseShape& c, kernels::DType dtype, bool backward, cudaStream_t stream) {
    const kernels::SoftmaxShape& s = c.shape;
    const size_t n = static_cast<size_t>(s.batch) * s.heads * s.queries * s.keys;
    const size_t bytes = n * kernels::dtype_size(dtype);
    sets = rotation_sets(bytes * (backward ? 4 : 2));
    for (int set = 0; set < sets; ++set) {
      x.emplace_back(bytes);
      y.emplace_back(bytes);
      fill_random(x.back().get(), n, dtype, 1000 + set, 8.0f, 0.0f, stream);  // scores of 64-dim dot products
      if (backward) {
        dy.emplace_back(bytes);
        dx.emplace_back(bytes);
        fill_random(dy.back().get(), n, dtype, 2000 + set, 1.0f, 0.0f, stream);
      }
      if (c.mask == kernels::SoftmaxMask::padding) {
        const std::vector<int32_t> host = padding_lengths(s.batch, s.keys, set);
        lengths.emplace_back(host.size() * sizeof(int32_t));
        FUSEKIT_CUDA_CHECK(cudaMemcpyAsync(lengths.back().get(), host.data(), host.size() * sizeof(int32_t),
                                           cudaMemcpyHostToDevice, stream));
        FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));  // `host` goes out of scope
      }
    }
    if (c.mask == kernels::SoftmaxMask::bias) {
      // The bias and window mask values do not change the work; uniform values stand in for them.
      const size_t bias_count = static_cast<size_t>(s.heads) * s.queries * s.keys;
      bias = DeviceBuffer(bias_count * kernels::dtype_size(dtype));
      fill_random(bias.get(), bias_count, dtype, 3, 2.0f, 0.0f, stream);
      if (c.windows > 0) {
        const size_t mask_count = static_cast<size_t>(c.windows) * s.queries * s.keys;
        window_mask = DeviceBuffer(mask_count * kernels::dtype_size(dtype));
        fill_random(window_mask.get(), mask_count, dtype, 4, 1.0f, 0.0f, stream);
      }
    }
    FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

  kernels::SoftmaxMasking masking(const SoftmaxCaseShape& c, int set) const {
    kernels::SoftmaxMasking m;
    m.kind = c.mask;
    if (c.mask == kernels::SoftmaxMask::padding) m.lengths = lengths[set].as<int32_t>();
    if (c.mask == kernels::SoftmaxMask::bias) {
      m.bias = bias.get();
      m.window_mask = c.windows > 0 ? window_mask.get() : nullptr;
      m.windows = c.windows;
    }
    return m;
  }
};

std::vector<Case> softmax_cases(const std::string& shape_text, kernels::DType dtype, bool backward) {
  const SoftmaxCaseShape c = parse_softmax_shape(shape_text);
  store::CaseInfo info = make_case_info("softmax", shape_text, dtype, backward, bytes_moved(c, dtype, backward));
  auto operands = std::make_shared<std::optional<SoftmaxOperands>>();
  auto setup = [operands, c, dtype, backward](cudaStream_t stream) { operands->emplace(c, dtype, backward, stream); };
  auto release = [operands] { operands->reset(); };

  std::vector<Case> cases;
  info.variant = "fused";
  cases.push_back(
      {info,
       [operands, c, dtype, backward](cudaStream_t stream, int rep) {
         SoftmaxOperands& o = **operands;
         const int s = rep % o.sets;
         kernels::softmax_forward(dtype, o.x[s].get(), o.y[s].get(), c.shape, kScale, o.masking(c, s), stream);
         if (backward) {
           kernels::softmax_backward(dtype, o.y[s].get(), o.dy[s].get(), o.dx[s].get(), c.shape, kScale, stream);
         }
       },
       setup, release});
#ifdef FUSEKIT_WITH_TORCH
  info.variant = "baseline";
  cases.push_back({info,
                   [operands, c, dtype, backward](cudaStream_t stream, int rep) {
                     SoftmaxOperands& o = **operands;
                     const int s = rep % o.sets;
                     TorchStream on_stream(stream);
                     const at::ScalarType type = torch_type(dtype);
                     const kernels::SoftmaxShape& sh = c.shape;
                     const std::vector<int64_t> sizes = {sh.batch, sh.heads, sh.queries, sh.keys};
                     baselines::SoftmaxMaskTensors mask;
                     mask.kind = static_cast<baselines::SoftmaxMaskKind>(static_cast<int>(c.mask));
                     if (c.mask == kernels::SoftmaxMask::padding)
                       mask.lengths = wrap(o.lengths[s], {sh.batch}, at::kInt);
                     if (c.mask == kernels::SoftmaxMask::bias) {
                       mask.bias = wrap(o.bias, {sh.heads, sh.queries, sh.keys}, type);
                       if (c.windows > 0)
                         mask.window_mask = wrap(o.window_mask, {c.windows, sh.queries, sh.keys}, type);
                     }
                     const at::Tensor x = wrap(o.x[s], sizes, type);
                     if (backward) {
                       baselines::softmax_forward_backward(x, kScale, mask, wrap(o.dy[s], sizes, type));
                     } else {
                       baselines::softmax_forward(x, kScale, mask);
                     }
                   },
                   setup, release});
#endif
  return cases;
}

}  // namespace

OpDefinition softmax_op() {
  OpDefinition op;
  op.name = "softmax";
  op.shape_syntax = "BxHxSQxSK:MASK";
  // BERT-base at batch 64 x seq 128 and BERT-large at 32 x 512 with key padding; a causal decoder at
  // 16 x 1024; Swin-T's window attention at 128 images of 224 x 224 (7 x 7 windows): stage 1 (64
  // windows, 3 heads) and stage 2 (16 windows, 6 heads) with the shift mask, and the stage-4 shape
  // (one window, 24 heads).
  op.shapes = {"64x12x128x128:padding", "32x16x512x512:padding", "16x12x1024x1024:causal",
               "8192x3x49x49:bias",     "2048x6x49x49:bias",     "128x24x49x49:bias"};
  op.cases = [](const std::string& shape, kernels::DType dtype, bool backward) {
    return softmax_cases(shape, dtype, backward);
  };
  return op;
}

}  // namespace fusekit::suites
