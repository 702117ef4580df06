#include "models/swin_config.h"

#include <charconv>
#include <climits>
#include <stdexcept>

namespace fusekit::models {
namespace {

[[noreturn]] void fail(const std::string& message) { throw std::invalid_argument("swin config: " + message); }

int parse_positive(std::string_view field, std::string_view digits, std::string_view spec) {
  int value = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || error != std::errc() || end != digits.data() + digits.size() || value < 1) {
    fail("'" + std::string(field) + "' in '" + std::string(spec) + "' needs a positive integer after its letter");
  }
  return value;
}

std::string join(const std::vector<int>& values) {
  std::string s;
  for (size_t i = 0; i < values.size(); ++i) s += (i ? "-" : "") + std::to_string(values[i]);
  return s;
}

}  // namespace

int SwinConfig::blocks() const {
  int n = 0;
  for (int d : depths) n += d;
  return n;
}

int SwinConfig::stage_dim(int stage) const { return embed_dim << stage; }

int SwinConfig::stage_resolution(int stage) const { return patch > 0 ? (image_size / patch) >> stage : 0; }

int SwinConfig::stage_head_dim(int stage) const {
  if (stage < 0 || stage >= static_cast<int>(heads.size()) || heads[stage] < 1) return 0;
  return stage_dim(stage) / heads[stage];
}

long long SwinConfig::tokens(int stage) const {
  const long long side = stage_resolution(stage);
  return static_cast<long long>(batch) * side * side;
}

std::string SwinConfig::spec() const { return name + ":b" + std::to_string(batch) + ":" + dtype_spec_name(dtype); }

std::vector<std::string> swin_preset_names() { return {"swin-t", "swin-b", "swin-test"}; }

SwinConfig swin_preset(std::string_view name) {
  SwinConfig c;
  c.name = std::string(name);
  if (name == "swin-t") {
    c.embed_dim = 96, c.depths = {2, 2, 6, 2}, c.heads = {3, 6, 12, 24};
  } else if (name == "swin-b") {
    c.embed_dim = 128, c.depths = {2, 2, 18, 2}, c.heads = {4, 8, 16, 32};
  } else if (name == "swin-test") {
    c.image_size = 56, c.embed_dim = 32, c.depths = {2, 2}, c.heads = {1, 2}, c.classes = 10;
  } else {
    fail("unknown model '" + std::string(name) + "' (known: swin-t, swin-b, swin-test)");
  }
  return c;
}

SwinConfig parse_swin_config(std::string_view spec) {
  const size_t colon = spec.find(':');
  SwinConfig config = swin_preset(spec.substr(0, colon));
  bool have_batch = false, have_dtype = false;
  std::string_view rest = colon == std::string_view::npos ? std::string_view() : spec.substr(colon + 1);
  if (colon != std::string_view::npos && rest.empty()) fail("empty field at the end of '" + std::string(spec) + "'");
  while (!rest.empty()) {
    const size_t next = rest.find(':');
    const std::string_view field = rest.substr(0, next);
    rest = next == std::string_view::npos ? std::string_view() : rest.substr(next + 1);
    if (next != std::string_view::npos && rest.empty()) fail("empty field at the end of '" + std::string(spec) + "'");
    auto once = [&](bool& seen) {
      if (seen) fail("'" + std::string(field) + "': that field is given twice in '" + std::string(spec) + "'");
      seen = true;
    };
    if (field == "fp16" || field == "bf16" || field == "fp32") {
      once(have_dtype);
      config.dtype = field == "fp16"   ? kernels::DType::f16
                     : field == "bf16" ? kernels::DType::bf16
                                       : kernels::DType::f32;
    } else if (!field.empty() && field[0] == 'b') {
      once(have_batch);
      config.batch = parse_positive(field, field.substr(1), spec);
    } else {
      fail("unknown field '" + std::string(field) + "' in '" + std::string(spec) +
           "' (expected b<batch>, fp16 or bf16)");
    }
  }
  validate(config);
  return config;
}

void validate(const SwinConfig& c) {
  const auto positive = [](const std::string& what, long long value) {
    if (value < 1) fail(what + " must be >= 1 (got " + std::to_string(value) + ")");
  };
  positive("image_size", c.image_size);
  positive("in_channels", c.in_channels);
  positive("patch", c.patch);
  positive("window", c.window);
  positive("embed_dim", c.embed_dim);
  positive("mlp_ratio", c.mlp_ratio);
  positive("classes", c.classes);
  positive("batch", c.batch);
  if (c.depths.empty()) fail("depths is empty: a model needs at least one stage");
  if (c.heads.size() != c.depths.size()) {
    fail("heads " + join(c.heads) + " does not give one count per stage of depths " + join(c.depths));
  }
  for (int s = 0; s < c.stages(); ++s) {
    positive("depths[" + std::to_string(s) + "]", c.depths[s]);
    positive("heads[" + std::to_string(s) + "]", c.heads[s]);
  }
  if (c.stages() > 8) fail(std::to_string(c.stages()) + " stages: at most 8 (the width doubles each stage)");
  if (c.embed_dim > (1 << 16)) fail("embed_dim " + std::to_string(c.embed_dim) + " > 65536");
  if (c.image_size % c.patch != 0) {
    fail("image_size " + std::to_string(c.image_size) + " is not a multiple of patch " + std::to_string(c.patch));
  }
  const int grid = c.image_size / c.patch;
  if (grid % (1 << (c.stages() - 1)) != 0) {
    fail("the patch grid " + std::to_string(grid) + " (image_size / patch) does not halve " +
         std::to_string(c.stages() - 1) + " times (the patch mergings of " + std::to_string(c.stages()) + " stages)");
  }
  if (c.window != 7 && c.window != 12) {
    fail("window " + std::to_string(c.window) + " is not one the window attention kernel has (7, 12)");
  }
  for (int s = 0; s < c.stages(); ++s) {
    const std::string stage = "stage " + std::to_string(s);
    if (c.stage_resolution(s) % c.window != 0) {
      fail(stage + ": grid " + std::to_string(c.stage_resolution(s)) + " (image_size / patch / 2^" + std::to_string(s) +
           ") is not a multiple of window " + std::to_string(c.window));
    }
    if (c.stage_dim(s) % c.heads[s] != 0) {
      fail(stage + ": width " + std::to_string(c.stage_dim(s)) + " is not a multiple of heads " +
           std::to_string(c.heads[s]));
    }
    const int head_dim = c.stage_head_dim(s);
    if (head_dim != 32 && head_dim != 64) {
      fail(stage + ": head_dim " + std::to_string(head_dim) + " (width " + std::to_string(c.stage_dim(s)) +
           " / heads " + std::to_string(c.heads[s]) + ") is not one the window attention kernel has (32, 64)");
    }
    if (c.heads[s] > 64) {
      fail(stage + ": heads " + std::to_string(c.heads[s]) + " > 64, the window attention kernel's limit");
    }
    if (static_cast<long long>(c.stage_dim(s)) * c.mlp_ratio % 8 != 0) {
      fail(stage + ": MLP width " + std::to_string(static_cast<long long>(c.stage_dim(s)) * c.mlp_ratio) +
           " is not a multiple of 8 (the linear layer's GELU epilogue)");
    }
  }
  if (!(c.layer_norm_eps > 0)) fail("layer_norm_eps must be > 0");
  if (c.dtype == kernels::DType::f32) fail("fp32 is not supported (the window attention kernel is fp16 or bf16)");
  // Every [tokens, width] activation is indexed by int rows; the widest is stage 0's MLP.
  if (c.tokens(0) > INT_MAX || c.tokens(0) * c.embed_dim * c.mlp_ratio > (1LL << 40)) {
    fail("batch " + std::to_string(c.batch) + " x " + std::to_string(c.stage_resolution(0)) +
         "^2 = " + std::to_string(c.tokens(0)) + " tokens is too large");
  }
}

std::vector<float> swin_shift_mask(int resolution, int window, int shift) {
  if (resolution < 1 || window < 1 || resolution % window != 0 || shift < 0 || shift >= window) {
    throw std::invalid_argument("swin_shift_mask: resolution " + std::to_string(resolution) + ", window " +
                                std::to_string(window) + ", shift " + std::to_string(shift) +
                                ": the resolution must be a multiple of the window and 0 <= shift < window");
  }
  // timm labels the shifted image's regions by row band and column band: [0, R - window),
  // [R - window, R - shift), [R - shift, R), each band a count 0..2, the region 3 x row + column.
  const auto band = [&](int coordinate) {
    return coordinate < resolution - window ? 0 : coordinate < resolution - shift ? 1 : 2;
  };
  const int per_side = resolution / window, windows = per_side * per_side, n = window * window;
  std::vector<float> mask(static_cast<size_t>(windows) * n * n);
  std::vector<int> region(n);
  for (int w = 0; w < windows; ++w) {
    const int wh = w / per_side, ww = w % per_side;
    for (int t = 0; t < n; ++t) region[t] = 3 * band(wh * window + t / window) + band(ww * window + t % window);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) {
        mask[(static_cast<size_t>(w) * n + i) * n + j] = region[i] == region[j] ? 0.f : -100.f;
      }
    }
  }
  return mask;
}

}  // namespace fusekit::models
