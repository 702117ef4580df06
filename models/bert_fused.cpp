// The fused BERT MLM step: models/bert_fused.h says what runs where.
#include "models/bert_fused.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/bert_attention.h"
#include "kernels/bias_dropout_residual_layernorm.h"
#include "kernels/bias_gelu.h"
#include "kernels/cross_entropy.h"
#include "kernels/cuda_check.h"
#include "kernels/embedding_layernorm.h"
#include "kernels/gather_rows.h"
#include "kernels/layernorm.h"
#include "kernels/step_counter.h"
#include "models/bert_checkpoint.h"
#include "models/host_tensors.h"
#include "models/step_graph.h"
#include "models/storage_conversion.h"
#include "profiler/range.h"

namespace fusekit::models {
namespace {

using kernels::DType;
using kernels::LinearShape;
using profiler::ScopedRange;

// SplitMix64's finalizer: the dropout key of (seed, step, site).
uint64_t mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

KernelWorkspaces workspace_sizes(const BertConfig& c, int masked_rows) {
  const int N = static_cast<int>(c.tokens()), H = c.hidden, I = c.intermediate;
  KernelWorkspaces w;
  w.embedding_layernorm =
      kernels::embedding_layernorm_backward_workspace_bytes({N, H, c.vocab, c.max_positions, c.token_types});
  w.layernorm = kernels::layernorm_backward_workspace_bytes(masked_rows, H);
  w.bias_dropout_residual_layernorm = kernels::bias_dropout_residual_layernorm_backward_workspace_bytes(N, H);
  w.bias_gelu = std::max(kernels::bias_gelu_backward_workspace_bytes(N, I),
                         kernels::bias_gelu_backward_workspace_bytes(masked_rows, H));
  return w;
}

template <class T>
T* device_alloc(size_t bytes) {
  void* p = nullptr;
  FUSEKIT_CUDA_CHECK(cudaMalloc(&p, bytes));
  return static_cast<T*>(p);
}

}  // namespace

FusedBert::FusedBert(const BertConfig& config, const BertTrainOptions& options, bool master_weights)
    : config_(config),
      options_(options),
      master_weights_(master_weights),
      loss_scale_(options.effective_loss_scale(config.dtype)),
      layout_(config, QkvLayout::packed, config.dtype) {
  validate(config_);
  const int M = MemoryPlan(config_).masked_rows();
  plan_ = std::make_unique<MemoryPlan>(config_, workspace_sizes(config_, M));
  FUSEKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  linear_ = std::make_unique<kernels::LinearContext>();
  trainer_ = std::make_unique<kernels::AdamWTrainer>(config_.dtype, layout_.parameter_sizes(), master_weights_,
                                                     layout_.decayed_parameters());
  arena_ = device_alloc<char>(plan_->arena_bytes());
  FUSEKIT_CUDA_CHECK(cudaMemset(arena_, 0, plan_->arena_bytes()));
  const size_t zero_bytes =
      static_cast<size_t>(std::max(config_.hidden, config_.intermediate)) * dtype_bytes(config_.dtype);
  zeros_ = device_alloc<void>(zero_bytes);
  FUSEKIT_CUDA_CHECK(cudaMemset(zeros_, 0, zero_bytes));
  step_counter_ = device_alloc<uint64_t>(sizeof(uint64_t));
  FUSEKIT_CUDA_CHECK(cudaMemset(step_counter_, 0, sizeof(uint64_t)));
  // Positions 0 .. S-1 in every sequence; dloss = the loss scale (the cross-entropy backward's seed).
  std::vector<int64_t> positions(static_cast<size_t>(config_.tokens()));
  for (size_t i = 0; i < positions.size(); ++i) positions[i] = static_cast<int64_t>(i % config_.sequence);
  FUSEKIT_CUDA_CHECK(cudaMemcpy(buffer("batch.position_ids"), positions.data(), positions.size() * sizeof(int64_t),
                                cudaMemcpyHostToDevice));
  FUSEKIT_CUDA_CHECK(cudaMemcpy(buffer("grad.dloss"), &loss_scale_, sizeof(float), cudaMemcpyHostToDevice));
}

FusedBert::~FusedBert() {
  graphs_.clear();
  for (void* p : batches_) cudaFree(p);
  cudaFree(step_counter_);
  cudaFree(zeros_);
  cudaFree(arena_);
  trainer_.reset();
  linear_.reset();
  if (stream_) cudaStreamDestroy(stream_);
}

void* FusedBert::buffer(const char* name) const { return arena_ + plan_->buffer(name).offset; }
void* FusedBert::parameter(const std::string& name) const { return trainer_->parameter(layout_.index(name)); }
void* FusedBert::gradient(const std::string& name) const { return trainer_->gradient(layout_.index(name)); }

// A site's Philox key is a function of the seed and the site; the step enters as the counter offset,
// read on the device (kernels/step_counter.h), so that a captured step replays with fresh masks.
uint64_t FusedBert::dropout_key(uint64_t seed, int site) { return mix(mix(seed) + static_cast<uint64_t>(site)); }

kernels::Dropout FusedBert::dropout(float p, int site) const {
  const float kept = dropout_site_kinds_ >> dropout_site_kind(site) & 1u ? p : 0.f;
  return {kept, dropout_key(options_.seed, site), 0, step_counter_};
}

kernels::BertAttentionDropout FusedBert::attention_dropout(float p, int site) const {
  const float kept = dropout_site_kinds_ >> dropout_site_kind(site) & 1u ? p : 0.f;
  return {kept, dropout_key(options_.seed, site), 0, step_counter_};
}

void FusedBert::set_dropout_site_kinds(uint32_t kinds) {
  if (graphed() && kinds != dropout_site_kinds_)
    throw std::logic_error("fused bert: other dropout sites for captured steps (their p is fixed)");
  dropout_site_kinds_ = kinds;
}

void FusedBert::set_dropout_step(uint64_t step) {
  FUSEKIT_CUDA_CHECK(cudaDeviceSynchronize());
  FUSEKIT_CUDA_CHECK(cudaMemcpy(step_counter_, &step, sizeof step, cudaMemcpyHostToDevice));
  FUSEKIT_CUDA_CHECK(cudaDeviceSynchronize());
}

void FusedBert::load_state_dict(const std::vector<TensorView>& tensors) {
  graphs_.clear();  // they hold the trainer replaced below
  std::vector<std::byte> flat(layout_.flat_bytes());
  load_bert_state_dict(tensors, layout_, flat);
  // A fresh trainer: zero moments and step count, as a new optimizer.
  trainer_.reset();
  trainer_ = std::make_unique<kernels::AdamWTrainer>(config_.dtype, layout_.parameter_sizes(), master_weights_,
                                                     layout_.decayed_parameters());
  FUSEKIT_CUDA_CHECK(cudaMemcpy(trainer_->parameters(), flat.data(), flat.size(), cudaMemcpyHostToDevice));
  trainer_->load_master_weights(stream_);
  FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

FusedBert::DeviceBatch FusedBert::arena_batch() const {
  return {static_cast<const int64_t*>(buffer("batch.input_ids")),
          static_cast<const int64_t*>(buffer("batch.token_type_ids")),
          static_cast<const int32_t*>(buffer("batch.lengths")),
          static_cast<const int32_t*>(buffer("batch.masked_positions")),
          static_cast<const int64_t*>(buffer("batch.masked_labels"))};
}

void FusedBert::upload(const MlmBatch& batch, const DeviceBatch& into, cudaStream_t stream) {
  if (batch.batch != config_.batch || batch.sequence != config_.sequence) {
    throw std::invalid_argument("fused bert: a batch of " + std::to_string(batch.batch) + " x " +
                                std::to_string(batch.sequence) + " for a model planned for " + config_.spec());
  }
  const GatheredRows rows = gathered_rows(batch, plan_->masked_rows());
  auto copy = [&](const void* to, const void* from, size_t bytes) {
    FUSEKIT_CUDA_CHECK(cudaMemcpyAsync(const_cast<void*>(to), from, bytes, cudaMemcpyHostToDevice, stream));
  };
  copy(into.input_ids, batch.input_ids.data(), batch.input_ids.size() * sizeof(int64_t));
  copy(into.token_type_ids, batch.token_type_ids.data(), batch.token_type_ids.size() * sizeof(int64_t));
  copy(into.lengths, batch.lengths.data(), batch.lengths.size() * sizeof(int32_t));
  copy(into.masked_positions, rows.positions.data(), rows.positions.size() * sizeof(int32_t));
  copy(into.masked_labels, rows.labels.data(), rows.labels.size() * sizeof(int64_t));
  // The host vectors must outlive the copies: pageable copies return once the data is staged.
  FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void FusedBert::forward(const DeviceBatch& batch, cudaStream_t stream) {
  ScopedRange range("bert.forward");
  const BertConfig& c = config_;
  const DType dt = c.dtype;
  const int B = c.batch, S = c.sequence, N = static_cast<int>(c.tokens()), H = c.hidden, I = c.intermediate;
  const int M = plan_->masked_rows(), V = c.vocab;
  const float eps = static_cast<float>(c.layer_norm_eps), p = c.dropout;
  kernels::advance_step_counter(step_counter_, stream);  // this step's dropout masks
  {
    ScopedRange r("bert.embeddings");
    kernels::EmbeddingLayerNormForwardTensors t;
    t.word_ids = batch.input_ids;
    t.position_ids = static_cast<const int64_t*>(buffer("batch.position_ids"));
    t.token_type_ids = batch.token_type_ids;
    t.word = parameter("bert.embeddings.word_embeddings.weight");
    t.position = parameter("bert.embeddings.position_embeddings.weight");
    t.token_type = parameter("bert.embeddings.token_type_embeddings.weight");
    t.gamma = parameter("bert.embeddings.LayerNorm.weight");
    t.beta = parameter("bert.embeddings.LayerNorm.bias");
    t.y = buffer("embeddings.layernorm");
    t.mean = static_cast<float*>(buffer("embeddings.layernorm.mean"));
    t.rstd = static_cast<float*>(buffer("embeddings.layernorm.rstd"));
    t.backward_workspace = buffer("workspace.embedding_backward");
    kernels::embedding_layernorm_forward(dt, t, dropout(p, 0), {N, H, V, c.max_positions, c.token_types}, eps, stream);
  }
  const kernels::BertAttentionShape attention{B, c.heads, S, c.head_dim()};
  const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim()));
  const void* x = buffer("embeddings.layernorm");
  for (int l = 0; l < c.layers; ++l) {
    ScopedRange r("bert.layer." + std::to_string(l));
    const std::string b = "layer." + std::to_string(l) + ".";
    auto P = [&](const char* suffix) { return parameter(bert_layer_name(l, suffix)); };
    kernels::linear_forward(*linear_, dt, kernels::LinearEpilogue::bias, {N, 3 * H, H, false}, x,
                            P("attention.self.qkv.weight"), P("attention.self.qkv.bias"), buffer(b + "qkv"), nullptr,
                            stream);
    kernels::bert_attention_forward(dt, buffer(b + "qkv"), batch.lengths, buffer(b + "attention.context"),
                                    static_cast<float*>(buffer(b + "attention.lse")), attention, scale,
                                    attention_dropout(p, 1 + 3 * l), stream);
    kernels::linear_forward_no_bias(*linear_, dt, {N, H, H, false}, buffer(b + "attention.context"),
                                    P("attention.output.dense.weight"), buffer(b + "attention.dense"), stream);
    kernels::BiasDropoutResidualForwardTensors a;
    a.x = buffer(b + "attention.dense");
    a.bias = P("attention.output.dense.bias");
    a.residual = x;
    a.gamma = P("attention.output.LayerNorm.weight");
    a.beta = P("attention.output.LayerNorm.bias");
    a.y = buffer(b + "attention.layernorm");
    a.mean = static_cast<float*>(buffer(b + "attention.layernorm.mean"));
    a.rstd = static_cast<float*>(buffer(b + "attention.layernorm.rstd"));
    kernels::bias_dropout_residual_layernorm_forward(dt, kernels::ResidualOrder::post_ln, a, dropout(p, 2 + 3 * l), N,
                                                     H, eps, stream);
    kernels::linear_forward(*linear_, dt, kernels::LinearEpilogue::bias_gelu, {N, I, H, false},
                            buffer(b + "attention.layernorm"), P("intermediate.dense.weight"),
                            P("intermediate.dense.bias"), buffer(b + "ffn.gelu"), buffer(b + "ffn.up"), stream);
    kernels::linear_forward_no_bias(*linear_, dt, {N, H, I, false}, buffer(b + "ffn.gelu"), P("output.dense.weight"),
                                    buffer(b + "ffn.down"), stream);
    kernels::BiasDropoutResidualForwardTensors o;
    o.x = buffer(b + "ffn.down");
    o.bias = P("output.dense.bias");
    o.residual = buffer(b + "attention.layernorm");
    o.gamma = P("output.LayerNorm.weight");
    o.beta = P("output.LayerNorm.bias");
    o.y = buffer(b + "output.layernorm");
    o.mean = static_cast<float*>(buffer(b + "output.layernorm.mean"));
    o.rstd = static_cast<float*>(buffer(b + "output.layernorm.rstd"));
    kernels::bias_dropout_residual_layernorm_forward(dt, kernels::ResidualOrder::post_ln, o, dropout(p, 3 + 3 * l), N,
                                                     H, eps, stream);
    x = buffer(b + "output.layernorm");
  }
  {
    ScopedRange r("bert.head");
    kernels::gather_rows_forward(dt, x, batch.masked_positions, buffer("head.gathered"), N, M, H, stream);
    kernels::linear_forward(*linear_, dt, kernels::LinearEpilogue::bias_gelu, {M, H, H, false}, buffer("head.gathered"),
                            parameter("cls.predictions.transform.dense.weight"),
                            parameter("cls.predictions.transform.dense.bias"), buffer("head.gelu"),
                            buffer("head.dense"), stream);
    kernels::layernorm_forward(dt, buffer("head.gelu"), parameter("cls.predictions.transform.LayerNorm.weight"),
                               parameter("cls.predictions.transform.LayerNorm.bias"), buffer("head.layernorm"),
                               static_cast<float*>(buffer("head.layernorm.mean")),
                               static_cast<float*>(buffer("head.layernorm.rstd")), M, H, eps, stream);
    kernels::linear_forward(*linear_, dt, kernels::LinearEpilogue::bias, {M, V, H, false}, buffer("head.layernorm"),
                            parameter("bert.embeddings.word_embeddings.weight"), parameter("cls.predictions.bias"),
                            buffer("head.logits"), nullptr, stream);
    kernels::cross_entropy_forward(
        dt, buffer("head.logits"), batch.masked_labels, static_cast<float*>(buffer("head.losses")),
        static_cast<float*>(buffer("head.logsumexp")), static_cast<float*>(buffer("head.mean_loss")),
        static_cast<int*>(buffer("head.valid_rows")), M, V, kIgnoreLabel, 0.f, stream);
  }
}

void FusedBert::backward(const DeviceBatch& batch, cudaStream_t stream) {
  ScopedRange range("bert.backward");
  const BertConfig& c = config_;
  const DType dt = c.dtype;
  const int B = c.batch, S = c.sequence, N = static_cast<int>(c.tokens()), H = c.hidden, I = c.intermediate;
  const int M = plan_->masked_rows(), V = c.vocab;
  const float p = c.dropout;
  void* workspace = buffer("workspace.backward");
  void* word_gradient = gradient("bert.embeddings.word_embeddings.weight");
  void* h[4] = {buffer("grad.hidden.0"), buffer("grad.hidden.1"), buffer("grad.hidden.2"), buffer("grad.hidden.3")};
  {
    ScopedRange r("bert.head");
    kernels::cross_entropy_backward(
        dt, buffer("head.logits"), batch.masked_labels, static_cast<const float*>(buffer("head.logsumexp")),
        static_cast<const int*>(buffer("head.valid_rows")), static_cast<const float*>(buffer("grad.dloss")),
        buffer("grad.logits"), M, V, kIgnoreLabel, 0.f, stream);
    // The decoder's input gradient now; its weight gradient after the embeddings' (below).
    kernels::linear_input_gradient(*linear_, dt, {M, V, H, false}, buffer("grad.logits"),
                                   parameter("bert.embeddings.word_embeddings.weight"), buffer("grad.head.0"), false,
                                   stream);
    kernels::layernorm_backward(dt, buffer("grad.head.0"), buffer("head.gelu"),
                                parameter("cls.predictions.transform.LayerNorm.weight"),
                                static_cast<const float*>(buffer("head.layernorm.mean")),
                                static_cast<const float*>(buffer("head.layernorm.rstd")), buffer("grad.head.1"),
                                gradient("cls.predictions.transform.LayerNorm.weight"),
                                gradient("cls.predictions.transform.LayerNorm.bias"), M, H, workspace, stream);
    // head.dense holds the pre-activation with its bias: GELU's backward on it with a zero bias.
    kernels::bias_gelu_backward(dt, kernels::GeluApproximation::tanh, buffer("grad.head.1"), buffer("head.dense"),
                                zeros_, buffer("grad.head.0"), gradient("cls.predictions.transform.dense.bias"), M, H,
                                workspace, stream);
    kernels::linear_backward(*linear_, dt, {M, H, H, false}, buffer("grad.head.0"), buffer("head.gathered"),
                             parameter("cls.predictions.transform.dense.weight"), buffer("grad.head.1"),
                             gradient("cls.predictions.transform.dense.weight"), nullptr, stream);
    kernels::gather_rows_backward(dt, buffer("grad.head.1"), batch.masked_positions, h[0], N, M, H, stream);
  }
  const kernels::BertAttentionShape attention{B, c.heads, S, c.head_dim()};
  const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim()));
  for (int l = c.layers - 1; l >= 0; --l) {
    ScopedRange r("bert.layer." + std::to_string(l));
    const std::string b = "layer." + std::to_string(l) + ".";
    auto P = [&](const char* suffix) { return parameter(bert_layer_name(l, suffix)); };
    auto G = [&](const char* suffix) { return gradient(bert_layer_name(l, suffix)); };
    const void* x =
        l == 0 ? buffer("embeddings.layernorm") : buffer("layer." + std::to_string(l - 1) + ".output.layernorm");
    // h[0]: the gradient of the layer's output. Output LayerNorm: h[1] = d down, h[2] = d a (residual).
    kernels::BiasDropoutResidualBackwardTensors o;
    o.dy = h[0];
    o.x = buffer(b + "ffn.down");
    o.bias = P("output.dense.bias");
    o.residual = buffer(b + "attention.layernorm");
    o.gamma = P("output.LayerNorm.weight");
    o.mean = static_cast<const float*>(buffer(b + "output.layernorm.mean"));
    o.rstd = static_cast<const float*>(buffer(b + "output.layernorm.rstd"));
    o.dx = h[1];
    o.dresidual = h[2];
    o.dbias = G("output.dense.bias");
    o.dgamma = G("output.LayerNorm.weight");
    o.dbeta = G("output.LayerNorm.bias");
    kernels::bias_dropout_residual_layernorm_backward(dt, kernels::ResidualOrder::post_ln, o, dropout(p, 3 + 3 * l), N,
                                                      H, workspace, stream);
    // FFN: d pre = gelu'(pre) * (d down W2), d b1; then d W2, d W1, and d a += d pre W1.
    kernels::linear_gelu_backward_input(*linear_, dt, {N, H, I, false}, h[1], P("output.dense.weight"),
                                        buffer(b + "ffn.up"), buffer("grad.intermediate"), G("intermediate.dense.bias"),
                                        stream);
    kernels::linear_backward(*linear_, dt, {N, H, I, false}, h[1], buffer(b + "ffn.gelu"), P("output.dense.weight"),
                             nullptr, G("output.dense.weight"), nullptr, stream);
    kernels::linear_backward(*linear_, dt, {N, I, H, false}, buffer("grad.intermediate"),
                             buffer(b + "attention.layernorm"), P("intermediate.dense.weight"), nullptr,
                             G("intermediate.dense.weight"), nullptr, stream);
    kernels::linear_input_gradient(*linear_, dt, {N, I, H, false}, buffer("grad.intermediate"),
                                   P("intermediate.dense.weight"), h[2], true, stream);
    // Attention LayerNorm: h[1] = d dense, h[3] = d x (residual).
    kernels::BiasDropoutResidualBackwardTensors a;
    a.dy = h[2];
    a.x = buffer(b + "attention.dense");
    a.bias = P("attention.output.dense.bias");
    a.residual = x;
    a.gamma = P("attention.output.LayerNorm.weight");
    a.mean = static_cast<const float*>(buffer(b + "attention.layernorm.mean"));
    a.rstd = static_cast<const float*>(buffer(b + "attention.layernorm.rstd"));
    a.dx = h[1];
    a.dresidual = h[3];
    a.dbias = G("attention.output.dense.bias");
    a.dgamma = G("attention.output.LayerNorm.weight");
    a.dbeta = G("attention.output.LayerNorm.bias");
    kernels::bias_dropout_residual_layernorm_backward(dt, kernels::ResidualOrder::post_ln, a, dropout(p, 2 + 3 * l), N,
                                                      H, workspace, stream);
    // Output projection: h[0] = d context (the layer's output gradient is no longer needed).
    kernels::linear_backward(*linear_, dt, {N, H, H, false}, h[1], buffer(b + "attention.context"),
                             P("attention.output.dense.weight"), h[0], G("attention.output.dense.weight"), nullptr,
                             stream);
    kernels::bert_attention_backward(dt, buffer(b + "qkv"), batch.lengths, buffer(b + "attention.context"),
                                     static_cast<const float*>(buffer(b + "attention.lse")), h[0], buffer("grad.qkv"),
                                     workspace, attention, scale, attention_dropout(p, 1 + 3 * l), stream);
    // QKV projection: d Wqkv, d bqkv, and d x += d qkv Wqkv.
    kernels::linear_backward(*linear_, dt, {N, 3 * H, H, false}, buffer("grad.qkv"), x, P("attention.self.qkv.weight"),
                             nullptr, G("attention.self.qkv.weight"), G("attention.self.qkv.bias"), stream);
    kernels::linear_input_gradient(*linear_, dt, {N, 3 * H, H, false}, buffer("grad.qkv"),
                                   P("attention.self.qkv.weight"), h[3], true, stream);
    std::swap(h[0], h[3]);  // the next layer down takes d x as its output gradient
  }
  {
    ScopedRange r("bert.embeddings");
    kernels::EmbeddingLayerNormBackwardTensors t;
    t.dy = h[0];
    t.word_ids = batch.input_ids;
    t.position_ids = static_cast<const int64_t*>(buffer("batch.position_ids"));
    t.token_type_ids = batch.token_type_ids;
    t.word = parameter("bert.embeddings.word_embeddings.weight");
    t.position = parameter("bert.embeddings.position_embeddings.weight");
    t.token_type = parameter("bert.embeddings.token_type_embeddings.weight");
    t.gamma = parameter("bert.embeddings.LayerNorm.weight");
    t.mean = static_cast<const float*>(buffer("embeddings.layernorm.mean"));
    t.rstd = static_cast<const float*>(buffer("embeddings.layernorm.rstd"));
    t.dword = word_gradient;
    t.dposition = gradient("bert.embeddings.position_embeddings.weight");
    t.dtoken_type = gradient("bert.embeddings.token_type_embeddings.weight");
    t.dgamma = gradient("bert.embeddings.LayerNorm.weight");
    t.dbeta = gradient("bert.embeddings.LayerNorm.bias");
    t.ids_counted = true;
    kernels::embedding_layernorm_backward(dt, t, dropout(p, 0), {N, H, V, c.max_positions, c.token_types},
                                          buffer("workspace.embedding_backward"), stream);
  }
  {
    ScopedRange r("bert.head");
    // The tied decoder's weight gradient, added into the word embedding's; its bias's, written.
    kernels::linear_weight_gradient(*linear_, dt, {M, V, H, false}, buffer("grad.logits"), buffer("head.layernorm"),
                                    word_gradient, gradient("cls.predictions.bias"), true, stream);
  }
}

FlatGradients FusedBert::flat_gradients() const {
  FlatGradients g;
  g.data = trainer_->gradients();
  g.dtype = config_.dtype;
  g.elements = trainer_->flat_elements();
  for (size_t t = 0; t < trainer_->tensors(); ++t) g.tensors.push_back({trainer_->offset(t), trainer_->size(t)});
  g.second_moment = trainer_->exp_avg_sq();
  g.eps = options_.eps;
  g.beta2 = options_.beta2;
  return g;
}

void FusedBert::exchange_gradients(cudaStream_t stream) {
  gradient_divisor_ = 1.f;
  if (!exchange_) return;
  ScopedRange range("bert.exchange");
  gradient_divisor_ = exchange_->exchange(flat_gradients(), stream);
}

void FusedBert::optimizer_step(cudaStream_t stream) {
  ScopedRange range("bert.optimizer");
  kernels::AdamWOptions o;
  o.lr = options_.lr;
  o.beta1 = options_.beta1;
  o.beta2 = options_.beta2;
  o.eps = options_.eps;
  o.weight_decay = options_.weight_decay;
  const double velocity = exchange_ ? exchange_->velocity_factor() : 0;
  if (velocity > 0) {
    trainer_->step_frozen_variance(o, velocity, loss_scale_ * gradient_divisor_, stream, exchange_->frozen_max_step());
  } else {
    trainer_->step(o, loss_scale_ * gradient_divisor_, stream);
  }
}

float FusedBert::forward_backward(const MlmBatch& batch) {
  const DeviceBatch device = arena_batch();
  upload(batch, device, stream_);
  {
    ScopedRange range("bert.step");
    forward(device, stream_);
    backward(device, stream_);
  }
  last_stream_ = stream_;
  return last_loss();
}

float FusedBert::step(const MlmBatch& batch) {
  const DeviceBatch device = arena_batch();
  upload(batch, device, stream_);
  {
    ScopedRange range("bert.step");
    forward(device, stream_);
    backward(device, stream_);
    exchange_gradients(stream_);
    optimizer_step(stream_);
  }
  last_stream_ = stream_;
  return last_loss();
}

void FusedBert::prepare_batches(const std::vector<MlmBatch>& batches) {
  graphs_.clear();  // they read the batches freed here
  for (void* p : batches_) cudaFree(p);
  batches_.clear();
  device_batches_.clear();
  const size_t N = static_cast<size_t>(config_.tokens()), M = static_cast<size_t>(plan_->masked_rows());
  const size_t bytes = 2 * N * sizeof(int64_t) + M * sizeof(int64_t) +
                       static_cast<size_t>(config_.batch) * sizeof(int32_t) + M * sizeof(int32_t) + 64;
  for (const MlmBatch& batch : batches) {
    char* p = device_alloc<char>(bytes);
    batches_.push_back(p);
    DeviceBatch d;
    d.input_ids = reinterpret_cast<const int64_t*>(p);
    d.token_type_ids = d.input_ids + N;
    d.masked_labels = d.token_type_ids + N;
    d.lengths = reinterpret_cast<const int32_t*>(d.masked_labels + M);
    d.masked_positions = d.lengths + config_.batch;
    upload(batch, d, stream_);
    device_batches_.push_back(d);
  }
}

void FusedBert::enqueue_step(int batch_index, cudaStream_t stream) {
  const DeviceBatch& device = device_batches_.at(static_cast<size_t>(batch_index));
  ScopedRange range("bert.step");
  if (!graphs_.empty()) {
    graphs_[static_cast<size_t>(batch_index)]->launch(stream);
  } else {
    forward(device, stream);
    backward(device, stream);
    exchange_gradients(stream);
    optimizer_step(stream);
  }
  last_stream_ = stream;
}

uint64_t FusedBert::dropout_step() const {
  uint64_t counter = 0;
  FUSEKIT_CUDA_CHECK(cudaMemcpy(&counter, step_counter_, sizeof counter, cudaMemcpyDeviceToHost));
  return counter;
}

void FusedBert::set_gradient_exchange(GradientExchange* exchange) {
  if (exchange && graphed())
    throw std::logic_error("fused bert: a gradient exchange for captured steps (they would skip it)");
  exchange_ = exchange;
}

void FusedBert::set_learning_rate(double lr) {
  if (graphed() && lr != options_.lr)
    throw std::logic_error("fused bert: a new learning rate for captured steps (their AdamW step holds the old one)");
  options_.lr = lr;
}

void FusedBert::capture_step_graphs() {
  if (exchange_)
    throw std::logic_error("fused bert: a step with a gradient exchange is not captured (it waits on the host)");
  if (device_batches_.empty()) throw std::logic_error("fused bert: capture_step_graphs needs prepare_batches first");
  graphs_.clear();
  // Each batch's forward and backward once first, uncaptured: the GEMMs' plans and scratch buffers
  // are made on first use (kernels/linear.h), which a capture cannot record. No update, and the
  // dropout step counter is put back: the next step draws the masks it would have drawn.
  FUSEKIT_CUDA_CHECK(cudaDeviceSynchronize());  // steps enqueued on other streams: done
  const uint64_t counter = dropout_step();
  auto restore = [&] {
    FUSEKIT_CUDA_CHECK(cudaMemcpy(step_counter_, &counter, sizeof counter, cudaMemcpyHostToDevice));
    FUSEKIT_CUDA_CHECK(cudaDeviceSynchronize());  // a pageable copy may return before it lands
  };
  try {
    for (const DeviceBatch& batch : device_batches_) {
      forward(batch, stream_);
      backward(batch, stream_);
    }
    FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  } catch (...) {
    cudaStreamSynchronize(stream_);
    restore();
    throw;
  }
  restore();
  gradient_divisor_ = 1.f;  // no exchange: the captured AdamW step takes the loss scale alone
  std::vector<std::unique_ptr<StepGraph>> graphs;
  for (size_t i = 0; i < device_batches_.size(); ++i) {
    graphs.push_back(std::make_unique<StepGraph>([&](cudaStream_t stream) {
      forward(device_batches_[i], stream);
      backward(device_batches_[i], stream);
      optimizer_step(stream);
    }));
  }
  graphs_ = std::move(graphs);
}

float FusedBert::last_loss() { return last_stream_ ? read_device_float(buffer("head.mean_loss"), last_stream_) : 0.f; }

std::vector<HostTensor> FusedBert::host_tensors(const void* flat, float scale) const {
  std::vector<std::byte> scratch;  // the views of the packed QKV's split tensors point into it
  return models::host_tensors(flat, layout_.flat_bytes(), scale, [&](std::span<const std::byte> host) {
    return bert_state_dict_views(layout_, host, scratch);
  });
}

std::vector<HostTensor> FusedBert::gradients() { return host_tensors(trainer_->gradients(), loss_scale_); }
std::vector<HostTensor> FusedBert::parameters() { return host_tensors(trainer_->parameters(), 1.f); }

}  // namespace fusekit::models
