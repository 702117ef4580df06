#include "baselines/models/swin_baseline.h"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "baselines/swin_window.h"     // window_partition, window_reverse (timm's)
#include "kernels/window_attention.h"  // relative_position_index
#include "models/mlm_data.h"           // kIgnoreLabel
#include "models/swin_checkpoint.h"
#include "profiler/range.h"

namespace fusekit::baselines {
namespace detail {

namespace F = torch::nn::functional;

torch::nn::LayerNorm layer_norm(int64_t features, const models::SwinConfig& c) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions(std::vector<int64_t>{features}).eps(c.layer_norm_eps));
}

// The modules below are timm's classes of the same names, registered under the same names, so that
// named_parameters() gives timm's state-dict names.

class PatchEmbedImpl : public torch::nn::Module {
 public:
  explicit PatchEmbedImpl(const models::SwinConfig& c)
      : proj(register_module(
            "proj", torch::nn::Conv2d(torch::nn::Conv2dOptions(c.in_channels, c.embed_dim, c.patch).stride(c.patch)))),
        norm(register_module("norm", layer_norm(c.embed_dim, c))) {}

  at::Tensor forward(const at::Tensor& images) { return norm(proj(images).permute({0, 2, 3, 1})); }  // NHWC

  torch::nn::Conv2d proj;
  torch::nn::LayerNorm norm;
};
TORCH_MODULE(PatchEmbed);

class WindowAttentionImpl : public torch::nn::Module {
 public:
  WindowAttentionImpl(int64_t dim, int64_t heads, int64_t window)
      : relative_position_bias_table(register_parameter("relative_position_bias_table",
                                                        torch::zeros({(2 * window - 1) * (2 * window - 1), heads}))),
        qkv(register_module("qkv", torch::nn::Linear(dim, 3 * dim))),
        proj(register_module("proj", torch::nn::Linear(dim, dim))),
        heads_(heads),
        scale_(1.0 / std::sqrt(static_cast<double>(dim / heads))) {
    const std::vector<int32_t> index = kernels::relative_position_index(static_cast<int>(window));
    relative_position_index = register_buffer(
        "relative_position_index",
        at::tensor(std::vector<int64_t>(index.begin(), index.end()), at::TensorOptions().dtype(at::kLong)));
  }

  // x [B * nW, N, C]; mask [nW, N, N] (0 / -100) or undefined.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& mask) {
    const int64_t windows = x.size(0), N = x.size(1);
    const std::vector<at::Tensor> qkv_parts =
        qkv(x).reshape({windows, N, 3, heads_, -1}).permute({2, 0, 3, 1, 4}).unbind(0);
    const at::Tensor q = qkv_parts[0] * scale_;
    at::Tensor attn = q.matmul(qkv_parts[1].transpose(-2, -1));
    const at::Tensor bias =
        relative_position_bias_table.index_select(0, relative_position_index).view({N, N, -1}).permute({2, 0, 1});
    attn = attn + bias.contiguous().unsqueeze(0);
    if (mask.defined()) {
      const int64_t mask_windows = mask.size(0);
      attn = (attn.view({-1, mask_windows, heads_, N, N}) + mask.unsqueeze(1).unsqueeze(0)).view({-1, heads_, N, N});
    }
    attn = attn.softmax(-1);
    return proj(attn.matmul(qkv_parts[2]).transpose(1, 2).reshape({windows, N, -1}));
  }

  at::Tensor relative_position_bias_table, relative_position_index;
  torch::nn::Linear qkv, proj;

 private:
  int64_t heads_;
  double scale_;
};
TORCH_MODULE(WindowAttention);

class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(int64_t dim, int64_t hidden)
      : fc1(register_module("fc1", torch::nn::Linear(dim, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, dim))) {}

  at::Tensor forward(const at::Tensor& x) { return fc2(F::gelu(fc1(x))); }  // nn.GELU(): the exact form

  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Mlp);

class SwinTransformerBlockImpl : public torch::nn::Module {
 public:
  SwinTransformerBlockImpl(const models::SwinConfig& c, int stage, int block)
      : norm1(register_module("norm1", layer_norm(c.stage_dim(stage), c))),
        attn(register_module("attn", WindowAttention(c.stage_dim(stage), c.heads[stage],
                                                     std::min(c.window, c.stage_resolution(stage))))),
        norm2(register_module("norm2", layer_norm(c.stage_dim(stage), c))),
        mlp(register_module("mlp", Mlp(c.stage_dim(stage), static_cast<int64_t>(c.mlp_ratio) * c.stage_dim(stage)))),
        window_(std::min(c.window, c.stage_resolution(stage))),
        shift_(block % 2 == 1 && c.stage_shifts(stage) ? c.window / 2 : 0) {
    if (shift_ > 0) {
      const int resolution = c.stage_resolution(stage);
      const std::vector<float> mask =
          models::swin_shift_mask(resolution, static_cast<int>(window_), static_cast<int>(shift_));
      const int64_t windows = (resolution / window_) * (resolution / window_);
      attn_mask = register_buffer("attn_mask", at::tensor(mask).view({windows, window_ * window_, window_ * window_}));
    }
  }

  // x [B, H, W, C] -> the same.
  at::Tensor forward(const at::Tensor& x) {
    const int64_t B = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
    at::Tensor h = norm1(x);
    if (shift_ > 0) h = at::roll(h, {-shift_, -shift_}, {1, 2});
    h = window_reverse(attn(window_partition(h, window_), attn_mask), window_, B, H, W);
    if (shift_ > 0) h = at::roll(h, {shift_, shift_}, {1, 2});
    at::Tensor y = (x + h).reshape({B, -1, C});
    y = y + mlp(norm2(y));
    return y.reshape({B, H, W, C});
  }

  torch::nn::LayerNorm norm1;
  WindowAttention attn;
  torch::nn::LayerNorm norm2;
  Mlp mlp;
  at::Tensor attn_mask;  // undefined where the block does not shift

 private:
  int64_t window_, shift_;
};
TORCH_MODULE(SwinTransformerBlock);

// timm 1.x's PatchMerging at the start of stages 1 and later: [B, H, W, C] -> [B, H/2, W/2, 2C].
class PatchMergingImpl : public torch::nn::Module {
 public:
  PatchMergingImpl(int64_t dim, const models::SwinConfig& c)
      : norm(register_module("norm", layer_norm(4 * dim, c))),
        reduction(
            register_module("reduction", torch::nn::Linear(torch::nn::LinearOptions(4 * dim, 2 * dim).bias(false)))) {}

  at::Tensor forward(const at::Tensor& x) {
    const int64_t B = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
    return reduction(norm(x.reshape({B, H / 2, 2, W / 2, 2, C}).permute({0, 1, 3, 4, 2, 5}).flatten(3)));
  }

  torch::nn::LayerNorm norm;
  torch::nn::Linear reduction;
};
TORCH_MODULE(PatchMerging);

class SwinTransformerStageImpl : public torch::nn::Module {
 public:
  SwinTransformerStageImpl(const models::SwinConfig& c, int stage)
      : blocks(register_module("blocks", torch::nn::ModuleList())), stage_(stage) {
    if (stage > 0) downsample = register_module("downsample", PatchMerging(c.stage_dim(stage - 1), c));
    for (int b = 0; b < c.depths[stage]; ++b) {
      blocks_.push_back(SwinTransformerBlock(c, stage, b));
      blocks->push_back(blocks_.back());  // registered as "<b>"
    }
  }

  at::Tensor forward(at::Tensor x) {
    const std::string prefix = "swin.stage." + std::to_string(stage_);
    if (downsample) {
      profiler::ScopedRange range(prefix + ".downsample");
      x = downsample(x);
    }
    for (size_t b = 0; b < blocks_.size(); ++b) {
      profiler::ScopedRange range(prefix + ".block." + std::to_string(b));
      x = blocks_[b](x);
    }
    return x;
  }

  PatchMerging downsample{nullptr};  // stage 0 has none (timm: nn.Identity)
  torch::nn::ModuleList blocks;

 private:
  int stage_;
  std::vector<SwinTransformerBlock> blocks_;  // the same modules, typed
};
TORCH_MODULE(SwinTransformerStage);

class ClassifierHeadImpl : public torch::nn::Module {
 public:
  explicit ClassifierHeadImpl(const models::SwinConfig& c)
      : fc(register_module("fc", torch::nn::Linear(c.features(), c.classes))) {}

  at::Tensor forward(const at::Tensor& x) { return fc(x.mean({1, 2})); }  // average pooling of NHWC

  torch::nn::Linear fc;
};
TORCH_MODULE(ClassifierHead);

class SwinTransformerImpl : public torch::nn::Module {
 public:
  explicit SwinTransformerImpl(const models::SwinConfig& c)
      : patch_embed(register_module("patch_embed", PatchEmbed(c))),
        layers(register_module("layers", torch::nn::ModuleList())),
        norm(register_module("norm", layer_norm(c.features(), c))),
        head(register_module("head", ClassifierHead(c))) {
    for (int s = 0; s < c.stages(); ++s) {
      stages_.push_back(SwinTransformerStage(c, s));
      layers->push_back(stages_.back());
    }
  }

  // The mean label-smoothed cross-entropy of the batch.
  at::Tensor forward(const at::Tensor& images, const at::Tensor& labels, double label_smoothing) {
    at::Tensor x;
    {
      profiler::ScopedRange range("swin.patch_embed");
      x = patch_embed(images);
    }
    for (SwinTransformerStage& stage : stages_) x = stage(x);
    profiler::ScopedRange range("swin.head");
    const at::Tensor logits = head(norm(x));
    return F::cross_entropy(
        logits, labels,
        F::CrossEntropyFuncOptions().ignore_index(models::kIgnoreLabel).label_smoothing(label_smoothing));
  }

  PatchEmbed patch_embed;
  torch::nn::ModuleList layers;
  torch::nn::LayerNorm norm;
  ClassifierHead head;

 private:
  std::vector<SwinTransformerStage> stages_;
};

}  // namespace detail

namespace {

models::SwinConfig validated(const models::SwinConfig& config) {
  models::validate(config);
  return config;
}

}  // namespace

BaselineSwin::BaselineSwin(const models::SwinConfig& config, const models::SwinTrainOptions& options,
                           BaselinePrecision precision)
    : config_(validated(config)),
      options_(options),
      precision_(precision),
      layout_(config_, kernels::DType::f32),
      device_(at::kCUDA, c10::cuda::current_device()),
      model_(std::make_shared<detail::SwinTransformerImpl>(config_)),
      runner_(device_, "swin baseline") {
  model_->to(device_);
  model_->train();
  const auto named = model_->named_parameters();
  if (named.size() != layout_.parameters().size()) {
    throw std::logic_error("swin baseline: the module has " + std::to_string(named.size()) +
                           " parameters, the layout " + std::to_string(layout_.parameters().size()));
  }
  std::vector<bool> decays;
  for (const models::SwinParameter& p : layout_.parameters()) {
    const at::Tensor* tensor = named.find(p.name);
    if (!tensor) throw std::logic_error("swin baseline: the module has no parameter '" + p.name + "'");
    if (tensor->sizes() != at::IntArrayRef(p.shape))
      throw std::logic_error("swin baseline: parameter '" + p.name + "' has another shape than the layout's");
    parameters_.push_back(*tensor);
    decays.push_back(p.decays);
  }
  const double scale =
      options.effective_loss_scale(precision == BaselinePrecision::fp32 ? kernels::DType::f32 : config_.dtype);
  trainer_ = std::make_unique<AmpAdamW>(
      parameters_, decays,
      AdamWHyperparameters{options.lr, options.beta1, options.beta2, options.eps, options.weight_decay}, scale);
}

BaselineSwin::~BaselineSwin() = default;  // runner_ waits for the last step first

const char* BaselineSwin::variant() const {
  return precision_ == BaselinePrecision::amp ? "baseline" : "baseline-fp32";
}

void BaselineSwin::load_state_dict(const std::vector<models::TensorView>& tensors) {
  std::vector<std::byte> flat(layout_.flat_bytes());
  models::load_swin_state_dict(tensors, layout_, flat);
  runner_.synchronize();
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const models::SwinParameter& p = layout_.parameters()[i];
    parameters_[i].copy_(at::from_blob(flat.data() + p.offset * sizeof(float), p.shape, at::kFloat));
  }
  trainer_->reset_state();
  trainer_->zero_grad();
}

BaselineSwin::DeviceBatch BaselineSwin::to_device(const models::SwinBatch& batch) const {
  const int64_t images = config_.batch, side = config_.image_size;
  if (batch.images.size() != static_cast<size_t>(images * config_.in_channels * side * side) ||
      batch.labels.size() != static_cast<size_t>(images)) {
    throw std::invalid_argument("swin baseline: a batch of " + std::to_string(batch.labels.size()) + " labels and " +
                                std::to_string(batch.images.size()) + " pixel values; the config " + "takes " +
                                std::to_string(images) + " images of " + std::to_string(config_.in_channels) + " x " +
                                std::to_string(side) + " x " + std::to_string(side));
  }
  const at::Tensor pixels =
      at::from_blob(const_cast<float*>(batch.images.data()), {images, config_.in_channels, side, side}, at::kFloat);
  const at::Tensor labels = at::from_blob(const_cast<int64_t*>(batch.labels.data()), {images}, at::kLong);
  return {pixels.to(device_), labels.to(device_)};
}

at::Tensor BaselineSwin::forward_backward_scaled(const DeviceBatch& batch) {
  return trainer_->forward_backward("swin", precision_ == BaselinePrecision::amp, autocast_dtype(config_.dtype), [&] {
    return model_->forward(batch.images, batch.labels, options_.label_smoothing);
  });
}

at::Tensor BaselineSwin::train_step(const DeviceBatch& batch) {
  return trainer_->train_step("swin", precision_ == BaselinePrecision::amp, autocast_dtype(config_.dtype),
                              [&] { return model_->forward(batch.images, batch.labels, options_.label_smoothing); });
}

float BaselineSwin::forward_backward(const models::SwinBatch& batch) {
  const DeviceBatch device_batch = to_device(batch);
  return runner_.run_now(
      [&] {
        const at::Tensor loss = forward_backward_scaled(device_batch);
        trainer_->unscale();
        return loss;
      },
      false);
}

float BaselineSwin::step(const models::SwinBatch& batch) {
  const DeviceBatch device_batch = to_device(batch);
  return runner_.run_now([&] { return train_step(device_batch); }, true);
}

void BaselineSwin::prepare_batches(const std::vector<models::SwinBatch>& batches) {
  std::vector<DeviceBatch> prepared;
  for (const models::SwinBatch& batch : batches) prepared.push_back(to_device(batch));
  runner_.synchronize();  // steps may still read the batches replaced here
  batches_ = std::move(prepared);
}

void BaselineSwin::enqueue_step(int batch_index, cudaStream_t stream) {
  if (batch_index < 0 || static_cast<size_t>(batch_index) >= batches_.size()) {
    throw std::out_of_range("swin baseline: batch " + std::to_string(batch_index) + " of " +
                            std::to_string(batches_.size()) + " prepared");
  }
  runner_.enqueue(stream, [&] { return train_step(batches_[batch_index]); });
}

float BaselineSwin::last_loss() { return runner_.last_loss(); }

std::vector<models::HostTensor> BaselineSwin::gradients() {
  return runner_.host_copies(parameters_, layout_.parameters(), true);
}

std::vector<models::HostTensor> BaselineSwin::parameters() {
  return runner_.host_copies(parameters_, layout_.parameters(), false);
}

}  // namespace fusekit::baselines
