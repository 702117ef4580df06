// The fused Swin training step: models/swin_fused.h and models/swin_memory_plan.h say what runs where.
#include "models/swin_fused.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/bias_dropout_residual_layernorm.h"
#include "kernels/bias_gelu.h"
#include "kernels/cross_entropy.h"
#include "kernels/cuda_check.h"
#include "kernels/layernorm.h"
#include "kernels/patch_columns.h"
#include "kernels/residual_add.h"
#include "kernels/swin_window.h"
#include "kernels/token_mean.h"
#include "kernels/window_attention.h"
#include "models/host_tensors.h"
#include "models/storage_conversion.h"
#include "models/swin_checkpoint.h"
#include "profiler/range.h"

namespace fusekit::models {
namespace {

using kernels::DType;
using profiler::ScopedRange;

// The geometry of one stage, as the kernels take it.
struct Stage {
  int T, D, R, heads, head_dim, window, tokens, windows, per_image;
  kernels::WindowShape windows_of(int batch, int shift) const { return {batch, R, R, D, window, shift}; }
  kernels::WindowAttentionShape attention(int shift) const {
    return {windows, heads, tokens, head_dim, shift ? per_image : 0};
  }
};

Stage stage_of(const SwinConfig& c, int s) {
  Stage g;
  g.T = static_cast<int>(c.tokens(s));
  g.D = c.stage_dim(s);
  g.R = c.stage_resolution(s);
  g.heads = c.heads[s];
  g.head_dim = c.stage_head_dim(s);
  g.window = std::min(c.window, g.R);
  g.tokens = g.window * g.window;
  g.windows = g.T / g.tokens;
  g.per_image = (g.R / g.window) * (g.R / g.window);
  return g;
}

int shift_of(const SwinConfig& c, int stage, int block) {
  return block % 2 == 1 && c.stage_shifts(stage) ? c.window / 2 : 0;
}

SwinKernelWorkspaces workspace_sizes(const SwinConfig& c) {
  SwinKernelWorkspaces w;
  const auto grow = [](size_t& into, size_t bytes) { into = std::max(into, bytes); };
  grow(w.layernorm, kernels::layernorm_backward_workspace_bytes(static_cast<int>(c.tokens(0)), c.embed_dim));
  grow(w.layernorm,
       kernels::layernorm_backward_workspace_bytes(static_cast<int>(c.tokens(c.stages() - 1)), c.features()));
  for (int s = 0; s < c.stages(); ++s) {
    const Stage g = stage_of(c, s);
    grow(w.layernorm, kernels::layernorm_backward_workspace_bytes(g.T, g.D));
    grow(w.layernorm, kernels::bias_dropout_residual_layernorm_backward_workspace_bytes(g.T, g.D));
    grow(w.bias_gelu, kernels::bias_gelu_backward_workspace_bytes(g.T, c.mlp_ratio * g.D));
    for (int shift : {0, c.stage_shifts(s) ? c.window / 2 : 0}) {
      grow(w.window_partition, kernels::window_partition_backward_workspace_bytes(g.windows_of(c.batch, shift)));
      grow(w.window_attention, kernels::window_attention_backward_workspace_bytes(g.attention(shift)));
    }
    if (s > 0) {
      grow(w.patch_merging, kernels::patch_merging_backward_workspace_bytes({c.batch, 2 * g.R, 2 * g.R, g.D / 2}));
    }
  }
  return w;
}

template <class T>
T* device_alloc(size_t bytes) {
  void* p = nullptr;
  FUSEKIT_CUDA_CHECK(cudaMalloc(&p, bytes));
  return static_cast<T*>(p);
}

std::string stage_name(int s) { return "stage." + std::to_string(s) + "."; }
std::string downsample_name(int s, const char* suffix) {
  return "layers." + std::to_string(s) + ".downsample." + suffix;
}

}  // namespace

FusedSwin::FusedSwin(const SwinConfig& config, const SwinTrainOptions& options, bool master_weights)
    : config_(config),
      options_(options),
      master_weights_(master_weights),
      loss_scale_(options.effective_loss_scale(config.dtype)),
      layout_(config, config.dtype) {
  validate(config_);
  plan_ = std::make_unique<SwinMemoryPlan>(config_, workspace_sizes(config_));
  FUSEKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  linear_ = std::make_unique<kernels::LinearContext>();
  trainer_ = std::make_unique<kernels::AdamWTrainer>(config_.dtype, layout_.parameter_sizes(), master_weights_,
                                                     layout_.decayed_parameters());
  arena_ = device_alloc<char>(plan_->arena_bytes());
  FUSEKIT_CUDA_CHECK(cudaMemset(arena_, 0, plan_->arena_bytes()));
  unused_bias_ = device_alloc<void>(static_cast<size_t>(config_.features()) * dtype_bytes(config_.dtype));
  // The constants: the window's relative position index, each shifting stage's mask, dloss = the
  // loss scale (the cross-entropy backward's seed).
  const std::vector<int32_t> index = kernels::relative_position_index(config_.window);
  FUSEKIT_CUDA_CHECK(
      cudaMemcpy(buffer("window.index"), index.data(), index.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  for (int s = 0; s < config_.stages(); ++s) {
    if (!config_.stage_shifts(s)) continue;
    const std::vector<float> mask = swin_shift_mask(config_.stage_resolution(s), config_.window, config_.window / 2);
    FUSEKIT_CUDA_CHECK(
        cudaMemcpy(buffer(stage_name(s) + "mask"), mask.data(), mask.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  FUSEKIT_CUDA_CHECK(cudaMemcpy(buffer("grad.dloss"), &loss_scale_, sizeof(float), cudaMemcpyHostToDevice));
  // The memset and the copies ran on the default stream, which the non-blocking stream_ does not
  // wait for (and a pageable copy may return before its transfer lands): finish them first.
  FUSEKIT_CUDA_CHECK(cudaDeviceSynchronize());
}

FusedSwin::~FusedSwin() {
  graphs_.clear();
  for (void* p : batches_) cudaFree(p);
  cudaFree(unused_bias_);
  cudaFree(arena_);
  trainer_.reset();
  linear_.reset();
  if (stream_) cudaStreamDestroy(stream_);
}

void* FusedSwin::buffer(const std::string& name) const { return arena_ + plan_->buffer(name).offset; }
void* FusedSwin::parameter(const std::string& name) const { return trainer_->parameter(layout_.index(name)); }
void* FusedSwin::gradient(const std::string& name) const { return trainer_->gradient(layout_.index(name)); }

void FusedSwin::load_state_dict(const std::vector<TensorView>& tensors) {
  graphs_.clear();  // they hold the trainer replaced below
  std::vector<std::byte> flat(layout_.flat_bytes());
  load_swin_state_dict(tensors, layout_, flat);
  trainer_.reset();
  trainer_ = std::make_unique<kernels::AdamWTrainer>(config_.dtype, layout_.parameter_sizes(), master_weights_,
                                                     layout_.decayed_parameters());
  FUSEKIT_CUDA_CHECK(cudaMemcpy(trainer_->parameters(), flat.data(), flat.size(), cudaMemcpyHostToDevice));
  FUSEKIT_CUDA_CHECK(cudaDeviceSynchronize());  // the default stream's copy, before stream_ reads it
  trainer_->load_master_weights(stream_);
  FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void FusedSwin::upload(const SwinBatch& batch, void* images, void* labels, cudaStream_t stream) {
  const size_t pixels =
      static_cast<size_t>(config_.batch) * config_.in_channels * config_.image_size * config_.image_size;
  if (batch.images.size() != pixels || batch.labels.size() != static_cast<size_t>(config_.batch)) {
    throw std::invalid_argument("fused swin: a batch of " + std::to_string(batch.images.size()) + " pixels and " +
                                std::to_string(batch.labels.size()) + " labels for a model planned for " +
                                config_.spec() + " (" + std::to_string(pixels) + " pixels, " +
                                std::to_string(config_.batch) + " labels)");
  }
  std::vector<std::byte> stored(pixels * dtype_bytes(config_.dtype));
  convert_storage(DType::f32, reinterpret_cast<const std::byte*>(batch.images.data()), config_.dtype, stored.data(),
                  pixels);
  FUSEKIT_CUDA_CHECK(cudaMemcpyAsync(images, stored.data(), stored.size(), cudaMemcpyHostToDevice, stream));
  FUSEKIT_CUDA_CHECK(cudaMemcpyAsync(labels, batch.labels.data(), batch.labels.size() * sizeof(int64_t),
                                     cudaMemcpyHostToDevice, stream));
  FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));  // the host copies must outlive the transfers
}

void FusedSwin::forward(const void* images, const int64_t* labels, cudaStream_t stream) {
  ScopedRange range("swin.forward");
  const SwinConfig& c = config_;
  const DType dt = c.dtype;
  const int B = c.batch, C = c.embed_dim, T0 = static_cast<int>(c.tokens(0));
  const int K0 = c.in_channels * c.patch * c.patch;
  const float eps = static_cast<float>(c.layer_norm_eps);
  const auto stats = [&](const std::string& name) { return static_cast<float*>(buffer(name)); };
  {
    ScopedRange r("swin.patch_embed");
    kernels::patch_columns_forward(dt, images, buffer("patch_embed.columns"),
                                   {B, c.in_channels, c.image_size, c.image_size, c.patch}, stream);
    kernels::linear_forward(*linear_, dt, kernels::LinearEpilogue::bias, {T0, C, K0, false},
                            buffer("patch_embed.columns"), parameter("patch_embed.proj.weight"),
                            parameter("patch_embed.proj.bias"), buffer("patch_embed.proj"), nullptr, stream);
    kernels::layernorm_forward(dt, buffer("patch_embed.proj"), parameter("patch_embed.norm.weight"),
                               parameter("patch_embed.norm.bias"), buffer("patch_embed.norm"),
                               stats("patch_embed.norm.mean"), stats("patch_embed.norm.rstd"), T0, C, eps, stream);
  }
  const void* x = buffer("patch_embed.norm");
  const auto* index = static_cast<const int32_t*>(buffer("window.index"));
  for (int s = 0; s < c.stages(); ++s) {
    const Stage g = stage_of(c, s);
    const std::string stage = stage_name(s);
    if (s > 0) {
      ScopedRange r("swin.stage." + std::to_string(s) + ".downsample");
      kernels::patch_merging_forward(dt, x, parameter(downsample_name(s, "norm.weight")),
                                     parameter(downsample_name(s, "norm.bias")), buffer(stage + "downsample.merged"),
                                     stats(stage + "downsample.mean"), stats(stage + "downsample.rstd"),
                                     {B, 2 * g.R, 2 * g.R, g.D / 2}, eps, stream);
      kernels::linear_forward_no_bias(*linear_, dt, {g.T, g.D, 2 * g.D, false}, buffer(stage + "downsample.merged"),
                                      parameter(downsample_name(s, "reduction.weight")),
                                      buffer(stage + "downsample.output"), stream);
      x = buffer(stage + "downsample.output");
    }
    const float scale = 1.f / std::sqrt(static_cast<float>(g.head_dim));
    for (int b = 0; b < c.depths[s]; ++b) {
      ScopedRange r("swin.stage." + std::to_string(s) + ".block." + std::to_string(b));
      const int shift = shift_of(c, s, b);
      const auto B_ = [&](const char* what) { return buffer(SwinMemoryPlan::block_buffer(s, b, what)); };
      const auto P = [&](const char* suffix) { return parameter(swin_block_name(s, b, suffix)); };
      const kernels::WindowShape ws = g.windows_of(B, shift);
      const float* mask = shift ? static_cast<const float*>(buffer(stage + "mask")) : nullptr;
      kernels::window_partition_forward(dt, x, P("norm1.weight"), P("norm1.bias"), B_("windows"),
                                        static_cast<float*>(B_("norm1.mean")), static_cast<float*>(B_("norm1.rstd")),
                                        ws, eps, stream);
      kernels::linear_forward(*linear_, dt, kernels::LinearEpilogue::bias, {g.T, 3 * g.D, g.D, false}, B_("windows"),
                              P("attn.qkv.weight"), P("attn.qkv.bias"), B_("qkv"), nullptr, stream);
      kernels::window_attention_forward(dt, B_("qkv"), P("attn.relative_position_bias_table"), index, mask,
                                        B_("attention.out"), static_cast<float*>(B_("attention.bias")),
                                        static_cast<float*>(B_("attention.lse")), g.attention(shift), scale, stream);
      kernels::linear_forward(*linear_, dt, kernels::LinearEpilogue::bias, {g.T, g.D, g.D, false}, B_("attention.out"),
                              P("attn.proj.weight"), P("attn.proj.bias"), buffer("scratch.branch"), nullptr, stream);
      kernels::window_merge_forward(dt, buffer("scratch.branch"), x, B_("x1"), ws, stream);
      kernels::layernorm_forward(dt, B_("x1"), P("norm2.weight"), P("norm2.bias"), B_("norm2"),
                                 static_cast<float*>(B_("norm2.mean")), static_cast<float*>(B_("norm2.rstd")), g.T, g.D,
                                 eps, stream);
      const int hidden = c.mlp_ratio * g.D;
      kernels::linear_forward_no_bias(*linear_, dt, {g.T, hidden, g.D, false}, B_("norm2"), P("mlp.fc1.weight"),
                                      B_("mlp.up"), stream);
      // timm's Mlp uses nn.GELU(): the exact (erf) form.
      kernels::bias_gelu_forward(dt, kernels::GeluApproximation::none, B_("mlp.up"), P("mlp.fc1.bias"), B_("mlp.gelu"),
                                 g.T, hidden, stream);
      kernels::linear_forward(*linear_, dt, kernels::LinearEpilogue::bias, {g.T, g.D, hidden, false}, B_("mlp.gelu"),
                              P("mlp.fc2.weight"), P("mlp.fc2.bias"), buffer("scratch.branch"), nullptr, stream);
      kernels::residual_add(dt, B_("x1"), buffer("scratch.branch"), B_("output"), static_cast<long long>(g.T) * g.D,
                            stream);
      x = B_("output");
    }
  }
  {
    ScopedRange r("swin.head");
    const int last = c.stages() - 1, TL = static_cast<int>(c.tokens(last)), F = c.features();
    const int per_image = c.stage_resolution(last) * c.stage_resolution(last);
    kernels::layernorm_forward(dt, x, parameter("norm.weight"), parameter("norm.bias"), buffer("norm"),
                               stats("norm.mean"), stats("norm.rstd"), TL, F, eps, stream);
    kernels::token_mean_forward(dt, buffer("norm"), buffer("pooled"), B, per_image, F, stream);
    kernels::linear_forward(*linear_, dt, kernels::LinearEpilogue::bias, {B, c.classes, F, false}, buffer("pooled"),
                            parameter("head.fc.weight"), parameter("head.fc.bias"), buffer("head.logits"), nullptr,
                            stream);
    kernels::cross_entropy_forward(dt, buffer("head.logits"), labels, stats("head.losses"), stats("head.logsumexp"),
                                   stats("head.mean_loss"), static_cast<int*>(buffer("head.valid_rows")), B, c.classes,
                                   kIgnoreLabel, options_.label_smoothing, stream);
  }
}

void FusedSwin::backward(const int64_t* labels, cudaStream_t stream) {
  ScopedRange range("swin.backward");
  const SwinConfig& c = config_;
  const DType dt = c.dtype;
  const int B = c.batch, C = c.embed_dim, T0 = static_cast<int>(c.tokens(0));
  const int K0 = c.in_channels * c.patch * c.patch;
  void* workspace = buffer("workspace.backward");
  const auto stats = [&](const std::string& name) { return static_cast<const float*>(buffer(name)); };
  const auto block_output = [&](int s, int b) { return buffer(SwinMemoryPlan::block_buffer(s, b, "output")); };
  void* g = buffer("grad.stream.1");      // the gradient of the current block's output
  void* other = buffer("grad.stream.0");  // scratch of the same size
  {
    ScopedRange r("swin.head");
    const int last = c.stages() - 1, TL = static_cast<int>(c.tokens(last)), F = c.features();
    const int per_image = c.stage_resolution(last) * c.stage_resolution(last);
    kernels::cross_entropy_backward(
        dt, buffer("head.logits"), labels, stats("head.logsumexp"), static_cast<const int*>(buffer("head.valid_rows")),
        stats("grad.dloss"), buffer("grad.logits"), B, c.classes, kIgnoreLabel, options_.label_smoothing, stream);
    kernels::linear_backward(*linear_, dt, {B, c.classes, F, false}, buffer("grad.logits"), buffer("pooled"),
                             parameter("head.fc.weight"), buffer("grad.pooled"), gradient("head.fc.weight"),
                             gradient("head.fc.bias"), stream);
    kernels::token_mean_backward(dt, buffer("grad.pooled"), other, B, per_image, F, stream);
    kernels::layernorm_backward(dt, other, block_output(last, c.depths[last] - 1), parameter("norm.weight"),
                                stats("norm.mean"), stats("norm.rstd"), g, gradient("norm.weight"),
                                gradient("norm.bias"), TL, F, workspace, stream);
  }
  const auto* index = static_cast<const int32_t*>(buffer("window.index"));
  for (int s = c.stages() - 1; s >= 0; --s) {
    const Stage st = stage_of(c, s);
    const std::string stage = stage_name(s);
    const float scale = 1.f / std::sqrt(static_cast<float>(st.head_dim));
    const int hidden = c.mlp_ratio * st.D;
    const long long elements = static_cast<long long>(st.T) * st.D;
    for (int b = c.depths[s] - 1; b >= 0; --b) {
      ScopedRange r("swin.stage." + std::to_string(s) + ".block." + std::to_string(b));
      const int shift = shift_of(c, s, b);
      const auto B_ = [&](const char* what) { return buffer(SwinMemoryPlan::block_buffer(s, b, what)); };
      const auto P = [&](const char* suffix) { return parameter(swin_block_name(s, b, suffix)); };
      const auto G = [&](const char* suffix) { return gradient(swin_block_name(s, b, suffix)); };
      const kernels::WindowShape ws = st.windows_of(B, shift);
      const float* mask = shift ? static_cast<const float*>(buffer(stage + "mask")) : nullptr;
      const void* x =
          b > 0 ? block_output(s, b - 1) : (s == 0 ? buffer("patch_embed.norm") : buffer(stage + "downsample.output"));
      // MLP: d gelu, then d up (into the spent gelu buffer) and db1, then d norm2.
      kernels::linear_backward(*linear_, dt, {st.T, st.D, hidden, false}, g, B_("mlp.gelu"), P("mlp.fc2.weight"),
                               buffer("grad.hidden"), G("mlp.fc2.weight"), G("mlp.fc2.bias"), stream);
      kernels::bias_gelu_backward(dt, kernels::GeluApproximation::none, buffer("grad.hidden"), B_("mlp.up"),
                                  P("mlp.fc1.bias"), B_("mlp.gelu"), G("mlp.fc1.bias"), st.T, hidden, workspace,
                                  stream);
      kernels::linear_backward(*linear_, dt, {st.T, hidden, st.D, false}, B_("mlp.gelu"), B_("norm2"),
                               P("mlp.fc1.weight"), buffer("grad.branch"), G("mlp.fc1.weight"), nullptr, stream);
      // norm2 and the stream in one kernel: dx1 = LayerNorm backward(d norm2) + g (pre-LN, no dropout).
      kernels::BiasDropoutResidualBackwardTensors t;
      t.dy = buffer("grad.branch");
      t.dh_extra = g;
      t.h = B_("x1");
      t.gamma = P("norm2.weight");
      t.mean = static_cast<const float*>(B_("norm2.mean"));
      t.rstd = static_cast<const float*>(B_("norm2.rstd"));
      t.dx = other;
      t.dresidual = buffer("grad.unused");
      t.dbias = unused_bias_;
      t.dgamma = G("norm2.weight");
      t.dbeta = G("norm2.bias");
      kernels::bias_dropout_residual_layernorm_backward(dt, kernels::ResidualOrder::pre_ln, t, {0.f, 0, 0}, st.T, st.D,
                                                        workspace, stream);
      // Attention: d proj (the window map of dx1), d out, d qkv and the table's gradient, d windows.
      kernels::window_merge_backward(dt, other, buffer("grad.windows"), ws, stream);
      kernels::linear_backward(*linear_, dt, {st.T, st.D, st.D, false}, buffer("grad.windows"), B_("attention.out"),
                               P("attn.proj.weight"), buffer("grad.branch"), G("attn.proj.weight"), G("attn.proj.bias"),
                               stream);
      kernels::window_attention_backward(
          dt, B_("qkv"), static_cast<const float*>(B_("attention.bias")), mask, B_("attention.out"),
          static_cast<const float*>(B_("attention.lse")), buffer("grad.branch"), index, buffer("grad.qkv"),
          G("attn.relative_position_bias_table"), workspace, st.attention(shift), scale, stream);
      kernels::linear_backward(*linear_, dt, {st.T, 3 * st.D, st.D, false}, buffer("grad.qkv"), B_("windows"),
                               P("attn.qkv.weight"), buffer("grad.windows"), G("attn.qkv.weight"), G("attn.qkv.bias"),
                               stream);
      // norm1 through the window map, into g (spent), then the shortcut's share: g = that + dx1.
      kernels::window_partition_backward(
          dt, buffer("grad.windows"), x, P("norm1.weight"), static_cast<const float*>(B_("norm1.mean")),
          static_cast<const float*>(B_("norm1.rstd")), g, G("norm1.weight"), G("norm1.bias"), ws, workspace, stream);
      kernels::residual_add(dt, g, other, g, elements, stream);
    }
    if (s > 0) {
      ScopedRange r("swin.stage." + std::to_string(s) + ".downsample");
      kernels::linear_backward(*linear_, dt, {st.T, st.D, 2 * st.D, false}, g, buffer(stage + "downsample.merged"),
                               parameter(downsample_name(s, "reduction.weight")), buffer("grad.hidden"),
                               gradient(downsample_name(s, "reduction.weight")), nullptr, stream);
      kernels::patch_merging_backward(
          dt, buffer("grad.hidden"), block_output(s - 1, c.depths[s - 1] - 1),
          parameter(downsample_name(s, "norm.weight")), stats(stage + "downsample.mean"),
          stats(stage + "downsample.rstd"), other, gradient(downsample_name(s, "norm.weight")),
          gradient(downsample_name(s, "norm.bias")), {B, 2 * st.R, 2 * st.R, st.D / 2}, workspace, stream);
      std::swap(g, other);
    }
  }
  {
    ScopedRange r("swin.patch_embed");
    kernels::layernorm_backward(dt, g, buffer("patch_embed.proj"), parameter("patch_embed.norm.weight"),
                                stats("patch_embed.norm.mean"), stats("patch_embed.norm.rstd"),
                                buffer("grad.patch_embed"), gradient("patch_embed.norm.weight"),
                                gradient("patch_embed.norm.bias"), T0, C, workspace, stream);
    kernels::linear_backward(*linear_, dt, {T0, C, K0, false}, buffer("grad.patch_embed"),
                             buffer("patch_embed.columns"), parameter("patch_embed.proj.weight"), nullptr,
                             gradient("patch_embed.proj.weight"), gradient("patch_embed.proj.bias"), stream);
  }
}

void FusedSwin::optimizer_step(cudaStream_t stream) {
  ScopedRange range("swin.optimizer");
  kernels::AdamWOptions o;
  o.lr = options_.lr;
  o.beta1 = options_.beta1;
  o.beta2 = options_.beta2;
  o.eps = options_.eps;
  o.weight_decay = options_.weight_decay;
  trainer_->step(o, loss_scale_, stream);
}

float FusedSwin::forward_backward(const SwinBatch& batch) {
  upload(batch, buffer("input.images"), buffer("input.labels"), stream_);
  {
    ScopedRange range("swin.step");
    forward(buffer("input.images"), static_cast<const int64_t*>(buffer("input.labels")), stream_);
    backward(static_cast<const int64_t*>(buffer("input.labels")), stream_);
  }
  last_stream_ = stream_;
  return last_loss();
}

float FusedSwin::step(const SwinBatch& batch) {
  upload(batch, buffer("input.images"), buffer("input.labels"), stream_);
  {
    ScopedRange range("swin.step");
    forward(buffer("input.images"), static_cast<const int64_t*>(buffer("input.labels")), stream_);
    backward(static_cast<const int64_t*>(buffer("input.labels")), stream_);
    optimizer_step(stream_);
  }
  last_stream_ = stream_;
  return last_loss();
}

void FusedSwin::prepare_batches(const std::vector<SwinBatch>& batches) {
  graphs_.clear();  // they read the batches freed here
  for (void* p : batches_) cudaFree(p);
  batches_.clear();
  const size_t pixels =
      static_cast<size_t>(config_.batch) * config_.in_channels * config_.image_size * config_.image_size;
  const size_t image_bytes = (pixels * dtype_bytes(config_.dtype) + 255) / 256 * 256;
  for (const SwinBatch& batch : batches) {
    char* p = device_alloc<char>(image_bytes + static_cast<size_t>(config_.batch) * sizeof(int64_t));
    batches_.push_back(p);
    upload(batch, p, p + image_bytes, stream_);
  }
}

void FusedSwin::enqueue_prepared(int batch_index, cudaStream_t stream, bool update) {
  char* p = static_cast<char*>(batches_.at(static_cast<size_t>(batch_index)));
  const size_t pixels =
      static_cast<size_t>(config_.batch) * config_.in_channels * config_.image_size * config_.image_size;
  const size_t image_bytes = (pixels * dtype_bytes(config_.dtype) + 255) / 256 * 256;
  const auto* labels = reinterpret_cast<const int64_t*>(p + image_bytes);
  forward(p, labels, stream);
  backward(labels, stream);
  if (update) optimizer_step(stream);
}

void FusedSwin::enqueue_step(int batch_index, cudaStream_t stream) {
  if (static_cast<size_t>(batch_index) >= batches_.size() || batch_index < 0)
    throw std::out_of_range("fused swin: no prepared batch " + std::to_string(batch_index));
  ScopedRange range("swin.step");
  if (!graphs_.empty()) {
    graphs_[static_cast<size_t>(batch_index)]->launch(stream);
  } else {
    enqueue_prepared(batch_index, stream, true);
  }
  last_stream_ = stream;
}

void FusedSwin::capture_step_graphs() {
  if (batches_.empty()) throw std::logic_error("fused swin: capture_step_graphs needs prepare_batches first");
  graphs_.clear();
  // Each batch's forward and backward once first, uncaptured: the GEMMs' plans and scratch buffers
  // are made on first use (kernels/linear.h), which a capture cannot record. No update: the
  // parameters and the optimizer's state are those of before the call.
  FUSEKIT_CUDA_CHECK(cudaDeviceSynchronize());  // steps enqueued on other streams: done
  for (size_t i = 0; i < batches_.size(); ++i) enqueue_prepared(static_cast<int>(i), stream_, false);
  FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::vector<std::unique_ptr<StepGraph>> graphs;
  for (size_t i = 0; i < batches_.size(); ++i) {
    graphs.push_back(
        std::make_unique<StepGraph>([&](cudaStream_t stream) { enqueue_prepared(static_cast<int>(i), stream, true); }));
  }
  graphs_ = std::move(graphs);
}

float FusedSwin::last_loss() { return last_stream_ ? read_device_float(buffer("head.mean_loss"), last_stream_) : 0.f; }

std::vector<HostTensor> FusedSwin::host_tensors(const void* flat, float scale) const {
  return models::host_tensors(flat, layout_.flat_bytes(), scale,
                              [&](std::span<const std::byte> host) { return swin_state_dict_views(layout_, host); });
}

std::vector<HostTensor> FusedSwin::gradients() { return host_tensors(trainer_->gradients(), loss_scale_); }
std::vector<HostTensor> FusedSwin::parameters() { return host_tensors(trainer_->parameters(), 1.f); }

}  // namespace fusekit::models
