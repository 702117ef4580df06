// Loading a timm Swin state dict into the flat layout (models/swin_checkpoint.h): a synthetic
// checkpoint of the swin-test preset with timm's buffers, dtype conversion, the older names timm's
// checkpoint_filter_fn renames, missing, wrong-shape and wrong-type tensors; saving the flat buffer
// back; and the random initial weights (models/swin_init.h).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "models/storage_conversion.h"
#include "models/swin_checkpoint.h"
#include "models/swin_init.h"

namespace fusekit::models {
namespace {

using kernels::DType;

// A timm 1.x state dict in fp32: every tensor's values start from minus its index and step by 1/4
// (fp16 holds them exactly; bf16 rounds some, which the checks account for), plus the buffers an
// older timm saves: relative_position_index (I64) in every block, attn_mask in the shifting ones.
struct Checkpoint {
  std::map<std::string, std::vector<float>> values;
  std::map<std::string, std::vector<int64_t>> shapes;
  std::vector<std::string> order;
  std::vector<int64_t> index;  // the relative_position_index buffers' bytes

  void add(const std::string& name, std::vector<int64_t> shape, float base) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = base + static_cast<float>(i % 512) * 0.25f;
    values[name] = std::move(v);
    shapes[name] = std::move(shape);
    order.push_back(name);
  }
  void erase(const std::string& name) {
    values.erase(name);
    shapes.erase(name);
    std::erase(order, name);
  }
  void rename(const std::string& from, const std::string& to) {
    values[to] = values.at(from);
    shapes[to] = shapes.at(from);
    std::replace(order.begin(), order.end(), from, to);
    values.erase(from);
    shapes.erase(from);
  }
  std::vector<TensorView> views() const {
    std::vector<TensorView> out;
    for (const std::string& name : order) {
      if (name.ends_with("relative_position_index")) {
        out.push_back({name, TensorType::i64, shapes.at(name),
                       std::span<const std::byte>(reinterpret_cast<const std::byte*>(index.data()), index.size() * 8)});
        continue;
      }
      const std::vector<float>& v = values.at(name);
      out.push_back({name, TensorType::f32, shapes.at(name),
                     std::span<const std::byte>(reinterpret_cast<const std::byte*>(v.data()), v.size() * 4)});
    }
    return out;
  }
};

const SwinConfig& config() {
  static const SwinConfig c = swin_preset("swin-test");
  return c;
}

// The parameters in timm's order (the layout's is decaying first; the order does not matter to the
// loader), then the buffers.
Checkpoint timm_checkpoint(const SwinConfig& c) {
  const SwinParameterLayout layout(c, DType::f32);
  Checkpoint checkpoint;
  float base = 0;
  for (const SwinParameter& p : layout.parameters()) checkpoint.add(p.name, p.shape, base++ * -1.0f);
  const int64_t n = c.window_tokens();
  checkpoint.index.assign(n * n, 3);
  for (int s = 0; s < c.stages(); ++s) {
    for (int b = 0; b < c.depths[s]; ++b) {
      const std::string name = swin_block_name(s, b, "attn.relative_position_index");
      checkpoint.shapes[name] = {n, n};
      checkpoint.order.push_back(name);
      if (b % 2 == 1 && c.stage_shifts(s)) {
        const int64_t windows = (c.stage_resolution(s) / c.window) * (c.stage_resolution(s) / c.window);
        checkpoint.add(swin_block_name(s, b, "attn_mask"), {windows, n, n}, -100);
      }
    }
  }
  return checkpoint;
}

// The old form of a timm 1.x checkpoint: patch merging one stage earlier, head.weight/.bias.
Checkpoint older_form(Checkpoint checkpoint) {
  const std::vector<std::string> names = checkpoint.order;
  for (const std::string& name : names) {
    if (name.starts_with("layers.1.downsample.")) checkpoint.rename(name, "layers.0." + name.substr(9));
    if (name.starts_with("head.fc.")) checkpoint.rename(name, "head." + name.substr(8));
  }
  return checkpoint;
}

float flat_value(const SwinParameterLayout& layout, const std::vector<std::byte>& flat, size_t element) {
  if (layout.storage() == DType::f32) {
    float v;
    std::memcpy(&v, flat.data() + element * 4, 4);
    return v;
  }
  uint16_t bits;
  std::memcpy(&bits, flat.data() + element * 2, 2);
  return layout.storage() == DType::f16 ? half_to_float(bits) : bfloat16_to_float(bits);
}

float stored(const SwinParameterLayout& layout, float x) {
  if (layout.storage() == DType::f32) return x;
  return layout.storage() == DType::f16 ? half_to_float(float_to_half(x)) : bfloat16_to_float(float_to_bfloat16(x));
}

std::string load_error(const std::vector<TensorView>& views, const SwinParameterLayout& layout) {
  std::vector<std::byte> flat(layout.flat_bytes());
  try {
    load_swin_state_dict(views, layout, flat);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::vector<std::string>& lines, const std::string& text) {
  for (const std::string& line : lines) {
    if (line.find(text) != std::string::npos) return true;
  }
  return false;
}

TEST(SwinCheckpoint, LoadsConvertsAndListsTheBuffers) {
  const SwinConfig& c = config();
  const Checkpoint checkpoint = timm_checkpoint(c);
  for (DType storage : {DType::f32, DType::f16, DType::bf16}) {
    const SwinParameterLayout layout(c, storage);
    std::vector<std::byte> flat(layout.flat_bytes(), std::byte{0x5A});  // the padding must come out zero
    const CheckpointLoadReport report = load_swin_state_dict(checkpoint.views(), layout, flat);
    EXPECT_EQ(report.loaded.size(), layout.parameters().size());
    EXPECT_TRUE(report.notes.empty());
    // The buffers: 4 relative_position_index, one attn_mask (stage 0's block 1; stage 1 does not shift).
    ASSERT_EQ(report.ignored.size(), 5u);
    for (const std::string& line : report.ignored) EXPECT_NE(line.find("(buffer"), std::string::npos) << line;
    EXPECT_TRUE(contains(report.ignored, "layers.0.blocks.1.attn_mask (buffer"));
    EXPECT_TRUE(contains(report.ignored, "layers.1.blocks.1.attn.relative_position_index (buffer"));
    std::vector<bool> covered(layout.flat_elements(), false);
    for (const SwinParameter& p : layout.parameters()) {
      const std::vector<float>& v = checkpoint.values.at(p.name);
      for (size_t i = 0; i < p.elements; ++i) {
        ASSERT_EQ(flat_value(layout, flat, p.offset + i), stored(layout, v[i])) << p.name << " " << i;
        covered[p.offset + i] = true;
      }
    }
    for (size_t i = 0; i < layout.flat_elements(); ++i) {
      if (!covered[i]) {
        ASSERT_EQ(flat_value(layout, flat, i), 0.f) << "padding element " << i;
      }
    }
  }
}

TEST(SwinCheckpoint, ReadsF16AndBf16Tensors) {
  const SwinConfig& c = config();
  const Checkpoint checkpoint = timm_checkpoint(c);
  std::vector<TensorView> views = checkpoint.views();
  // Every parameter in bf16 (its values rounded), read into an f32 and a bf16 layout: exact.
  std::vector<std::vector<std::byte>> narrow;
  narrow.reserve(views.size());
  for (TensorView& v : views) {
    if (v.type != TensorType::f32) continue;
    narrow.emplace_back(v.elements() * 2);
    convert_storage(DType::f32, v.bytes.data(), DType::bf16, narrow.back().data(), v.elements());
    v.type = TensorType::bf16;
    v.bytes = narrow.back();
  }
  const SwinParameterLayout wide(c, DType::f32), same(c, DType::bf16);
  std::vector<std::byte> wide_flat(wide.flat_bytes()), same_flat(same.flat_bytes());
  load_swin_state_dict(views, wide, wide_flat);
  load_swin_state_dict(views, same, same_flat);
  for (const SwinParameter& p : same.parameters()) {
    const SwinParameter& q = *wide.find(p.name);
    const std::vector<float>& v = checkpoint.values.at(p.name);
    for (size_t i = 0; i < p.elements; i += 7) {
      const float expected = bfloat16_to_float(float_to_bfloat16(v[i]));
      ASSERT_EQ(flat_value(same, same_flat, p.offset + i), expected) << p.name;
      ASSERT_EQ(flat_value(wide, wide_flat, q.offset + i), expected) << p.name;
    }
  }
  // An F16 tensor into a bf16 layout: converted through float.
  std::vector<TensorView> f16_views = checkpoint.views();
  std::vector<std::byte> half(c.embed_dim * 2);
  for (TensorView& v : f16_views) {
    if (v.name != "patch_embed.norm.bias") continue;
    convert_storage(DType::f32, v.bytes.data(), DType::f16, half.data(), v.elements());
    v.type = TensorType::f16;
    v.bytes = half;
  }
  EXPECT_EQ(load_error(f16_views, same), "");
}

TEST(SwinCheckpoint, SaveThenLoadIsExact) {
  const SwinConfig& c = config();
  for (DType storage : {DType::f16, DType::bf16, DType::f32}) {
    const SwinParameterLayout layout(c, storage);
    const SwinInitialWeights weights(c, 11, storage == DType::f32 ? DType::bf16 : storage);
    std::vector<std::byte> flat(layout.flat_bytes());
    load_swin_state_dict(weights.tensors(), layout, flat);
    const std::string path =
        (std::filesystem::temp_directory_path() / ("fusekit_swin_" + std::to_string(::getpid()) + ".safetensors"))
            .string();
    save_swin_safetensors(path, layout, flat);
    std::vector<std::byte> again(layout.flat_bytes(), std::byte{0x33});
    const CheckpointLoadReport report = load_swin_safetensors(path, layout, again);
    EXPECT_EQ(again, flat) << dtype_spec_name(storage);
    EXPECT_TRUE(report.ignored.empty());
    EXPECT_TRUE(report.notes.empty());
    // timm 1.x names, the storage type, no buffers.
    const SafetensorsFile file = SafetensorsFile::read(path);
    EXPECT_EQ(file.tensors().size(), layout.parameters().size());
    ASSERT_NE(file.find("head.fc.weight"), nullptr);
    EXPECT_EQ(file.find("head.fc.weight")->shape, (std::vector<int64_t>{c.classes, c.features()}));
    ASSERT_NE(file.find("layers.1.downsample.reduction.weight"), nullptr);
    EXPECT_EQ(file.find("layers.1.downsample.reduction.weight")->type, tensor_type(storage));
    EXPECT_EQ(file.find("layers.0.downsample.norm.weight"), nullptr);
    EXPECT_EQ(file.find("head.weight"), nullptr);
    std::filesystem::remove(path);
  }
}

TEST(SwinCheckpoint, OlderNamesLoadAsTimmRenamesThem) {
  const SwinConfig& c = config();
  const SwinParameterLayout layout(c, DType::f16);
  const Checkpoint current = timm_checkpoint(c);
  std::vector<std::byte> expected(layout.flat_bytes()), flat(layout.flat_bytes());
  load_swin_state_dict(current.views(), layout, expected);
  const Checkpoint old = older_form(current);
  ASSERT_NE(old.values.count("layers.0.downsample.reduction.weight"), 0u);
  ASSERT_NE(old.values.count("head.weight"), 0u);
  const CheckpointLoadReport report = load_swin_state_dict(old.views(), layout, flat);
  EXPECT_EQ(flat, expected);
  EXPECT_EQ(report.ignored.size(), 5u);  // the buffers
  for (const char* alias : {"read layers.0.downsample.norm.weight as layers.1.downsample.norm.weight",
                            "read layers.0.downsample.norm.bias as layers.1.downsample.norm.bias",
                            "read layers.0.downsample.reduction.weight as layers.1.downsample.reduction.weight",
                            "read head.weight as head.fc.weight", "read head.bias as head.fc.bias"}) {
    EXPECT_TRUE(contains(report.notes, alias)) << alias;
  }
  EXPECT_EQ(report.notes.size(), 6u);  // the five aliases and the line saying older names were found
  // An older checkpoint carrying head.fc.bias as well as head.bias: the same parameter twice.
  Checkpoint both = old;
  both.add("head.fc.bias", {c.classes}, 0);
  EXPECT_NE(load_error(both.views(), layout).find("'head.fc.bias' and 'head.bias' are the same parameter"),
            std::string::npos)
      << load_error(both.views(), layout);
}

TEST(SwinCheckpoint, ErrorsNameTheTensors) {
  const SwinConfig& c = config();
  const SwinParameterLayout layout(c, DType::f16);
  Checkpoint missing = timm_checkpoint(c);
  missing.erase("layers.1.blocks.0.attn.relative_position_bias_table");
  missing.erase("layers.1.downsample.reduction.weight");
  missing.erase("head.fc.bias");
  const std::string error = load_error(missing.views(), layout);
  EXPECT_NE(error.find("missing tensors: "), std::string::npos) << error;
  for (const char* name : {"layers.1.blocks.0.attn.relative_position_bias_table",
                           "layers.1.downsample.reduction.weight", "head.fc.bias"}) {
    EXPECT_NE(error.find(name), std::string::npos) << error;
  }
  // Missing head.fc.weight in a timm 1.x checkpoint reports that, not renamed patch mergings.
  Checkpoint no_head = timm_checkpoint(c);
  no_head.erase("head.fc.weight");
  EXPECT_EQ(load_error(no_head.views(), layout), "swin checkpoint: missing tensors: head.fc.weight");

  Checkpoint wrong_shape = timm_checkpoint(c);
  wrong_shape.erase("layers.0.blocks.1.mlp.fc1.bias");
  wrong_shape.add("layers.0.blocks.1.mlp.fc1.bias", {127}, 0);
  EXPECT_NE(load_error(wrong_shape.views(), layout)
                .find("'layers.0.blocks.1.mlp.fc1.bias' has shape [127], the model needs [128]"),
            std::string::npos);
  // Another window's bias table (timm would interpolate it): a shape error too.
  Checkpoint table = timm_checkpoint(c);
  table.erase("layers.0.blocks.0.attn.relative_position_bias_table");
  table.add("layers.0.blocks.0.attn.relative_position_bias_table", {529, 1}, 0);
  EXPECT_NE(load_error(table.views(), layout).find("'layers.0.blocks.0.attn.relative_position_bias_table' has shape"),
            std::string::npos);

  // An older checkpoint with a wrong-shape renamed tensor names it as the checkpoint does.
  Checkpoint old = older_form(timm_checkpoint(c));
  old.erase("head.weight");
  old.add("head.weight", {c.classes + 1, c.features()}, 0);
  EXPECT_NE(load_error(old.views(), layout).find("'head.weight' has shape [11, 64], the model needs [10, 64]"),
            std::string::npos)
      << load_error(old.views(), layout);

  // An integer tensor where a weight belongs; the buffers' I64 is fine.
  const Checkpoint ints = timm_checkpoint(c);
  std::vector<TensorView> views = ints.views();
  std::vector<int32_t> ones(c.embed_dim, 1);
  for (TensorView& v : views) {
    if (v.name == "patch_embed.norm.bias") {
      v.type = TensorType::i32;
      v.bytes = std::span<const std::byte>(reinterpret_cast<const std::byte*>(ones.data()), ones.size() * 4);
    }
  }
  EXPECT_NE(load_error(views, layout).find("tensor 'patch_embed.norm.bias' has dtype I32"), std::string::npos)
      << load_error(views, layout);

  // A wrong buffer size.
  std::vector<std::byte> small(layout.flat_bytes() - 2);
  EXPECT_THROW(load_swin_state_dict(ints.views(), layout, small), std::invalid_argument);
  EXPECT_THROW(swin_state_dict_views(layout, small), std::invalid_argument);

  // Unknown tensors are ignored and listed.
  Checkpoint extra = timm_checkpoint(c);
  extra.add("head.fc.extra", {3}, 0);
  std::vector<std::byte> flat(layout.flat_bytes());
  const CheckpointLoadReport report = load_swin_state_dict(extra.views(), layout, flat);
  EXPECT_TRUE(contains(report.ignored, "head.fc.extra (not a parameter of Swin)"));
}

// The file-level loader names the file.
TEST(SwinCheckpoint, FileErrorsNameTheFile) {
  const SwinConfig& c = config();
  const SwinParameterLayout layout(c, DType::f16);
  Checkpoint missing = timm_checkpoint(c);
  missing.erase("norm.weight");
  std::vector<TensorView> views;
  for (const TensorView& v : missing.views()) {
    if (v.type == TensorType::f32) views.push_back(v);  // the writer takes I64 too; keep it small
  }
  const std::string path =
      (std::filesystem::temp_directory_path() / ("fusekit_swin_missing_" + std::to_string(::getpid()) + ".safetensors"))
          .string();
  write_safetensors(path, views);
  std::vector<std::byte> flat(layout.flat_bytes());
  try {
    load_swin_safetensors(path, layout, flat);
    ADD_FAILURE() << "no error for a missing tensor";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), path + ": swin checkpoint: missing tensors: norm.weight");
  }
  std::filesystem::remove(path);
}

std::vector<float> values(const TensorView& t) {
  std::vector<float> v(t.elements());
  std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  return v;
}

const TensorView& find(const SwinInitialWeights& w, const std::string& name) {
  for (const TensorView& t : w.tensors()) {
    if (t.name == name) return t;
  }
  throw std::runtime_error("missing " + name);
}

double standard_deviation(const std::vector<float>& v, double* mean_out = nullptr) {
  double sum = 0, squares = 0;
  for (float x : v) {
    sum += x;
    squares += static_cast<double>(x) * x;
  }
  const double mean = sum / v.size();
  if (mean_out) *mean_out = mean;
  return std::sqrt(squares / v.size() - mean * mean);
}

TEST(SwinInitialWeights, TimmsInitDeterministicInTheSeed) {
  const SwinConfig& c = config();
  const SwinInitialWeights a(c, 5, DType::f16), b(c, 5, DType::f16), other(c, 6, DType::f16);
  const std::string fc1 = "layers.0.blocks.0.mlp.fc1.weight";
  EXPECT_EQ(values(find(a, fc1)), values(find(b, fc1)));
  EXPECT_NE(values(find(a, fc1)), values(find(other, fc1)));
  double mean = 0;
  // Linear weights and the bias tables: std 0.02, mean 0.
  for (const std::string& name :
       {fc1, std::string("layers.1.blocks.1.attn.qkv.weight"), std::string("layers.1.downsample.reduction.weight")}) {
    EXPECT_NEAR(standard_deviation(values(find(a, name)), &mean), 0.02, 1e-3) << name;
    EXPECT_NEAR(mean, 0.0, 1e-3) << name;
  }
  std::vector<float> tables;
  for (int s = 0; s < c.stages(); ++s) {
    for (int blk = 0; blk < c.depths[s]; ++blk) {
      const std::vector<float> t = values(find(a, swin_block_name(s, blk, "attn.relative_position_bias_table")));
      tables.insert(tables.end(), t.begin(), t.end());
    }
  }
  EXPECT_NEAR(standard_deviation(tables), 0.02, 2e-3);
  // The patch embedding: uniform in +-1/sqrt(fan_in), fan_in 3 x 4 x 4 = 48, weight and bias.
  const float bound = 1.f / std::sqrt(48.f);
  const std::vector<float> conv = values(find(a, "patch_embed.proj.weight"));
  float largest = 0;
  for (float x : conv) largest = std::max(largest, std::fabs(x));
  EXPECT_LE(largest, bound * 1.001f);
  EXPECT_GT(largest, bound * 0.9f);
  EXPECT_NEAR(standard_deviation(conv), bound / std::sqrt(3.f), 0.01);
  bool conv_bias = false;
  for (float x : values(find(a, "patch_embed.proj.bias"))) {
    EXPECT_LE(std::fabs(x), bound * 1.001f);
    conv_bias = conv_bias || x != 0.f;
  }
  EXPECT_TRUE(conv_bias);
  // LayerNorms 1 and 0; the Linear biases zero.
  for (const TensorView& t : a.tensors()) {
    const bool norm = t.name.find("norm") != std::string::npos;
    if (t.name.starts_with("patch_embed.proj.")) continue;
    if (norm && t.name.ends_with(".weight")) {
      for (float x : values(t)) ASSERT_EQ(x, 1.f) << t.name;
    } else if (t.name.ends_with(".bias")) {
      for (float x : values(t)) ASSERT_EQ(x, 0.f) << t.name;
    }
  }
}

TEST(SwinInitialWeights, RepresentableAndLoadable) {
  const SwinConfig& c = config();
  for (DType dtype : {DType::f16, DType::bf16}) {
    const SwinInitialWeights w(c, 1, dtype);
    for (const TensorView& t : w.tensors()) {
      EXPECT_EQ(t.type, TensorType::f32);
      const std::vector<float> v = values(t);
      std::vector<std::byte> narrow(v.size() * 2), wide(v.size() * 4);
      convert_storage(DType::f32, reinterpret_cast<const std::byte*>(v.data()), dtype, narrow.data(), v.size());
      convert_storage(dtype, narrow.data(), DType::f32, wide.data(), v.size());
      ASSERT_EQ(0, std::memcmp(wide.data(), v.data(), wide.size())) << t.name << " in " << dtype_spec_name(dtype);
    }
    const SwinParameterLayout layout(c, dtype);
    std::vector<std::byte> flat(layout.flat_bytes());
    const CheckpointLoadReport report = load_swin_state_dict(w.tensors(), layout, flat);
    const std::set<std::string> loaded(report.loaded.begin(), report.loaded.end());
    EXPECT_EQ(loaded.size(), layout.parameters().size());
    EXPECT_TRUE(report.ignored.empty());
  }
}

}  // namespace
}  // namespace fusekit::models
