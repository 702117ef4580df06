#include "baselines/models/bert_baseline.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "models/bert_checkpoint.h"
#include "profiler/range.h"

namespace fusekit::baselines {
namespace detail {

namespace F = torch::nn::functional;

// Set by BaselineBert::set_dropout_masks: each dropout site's mask comes from it instead of torch's
// generator (a site: 0 the embeddings, 1 + 3l layer l's attention probabilities, 2 + 3l its attention
// output, 3 + 3l its FFN output, models/bert_fused.h's numbering).
struct DropoutOverride {
  BaselineBert::DropoutMasks masks;
  double p = 0;
};

// dropout(x) at `site`: torch's where no masks are given (or not training), else x * mask / (1 - p).
at::Tensor site_dropout(const at::Tensor& x, int site, const DropoutOverride& o, torch::nn::Dropout& dropout,
                        bool training) {
  if (!training || !o.masks) return dropout(x);
  return x * o.masks(site, x.sizes()).to(x.scalar_type()) * (1.0 / (1.0 - o.p));
}

torch::nn::LayerNormOptions layer_norm_options(const models::BertConfig& c) {
  return torch::nn::LayerNormOptions(std::vector<int64_t>{c.hidden}).eps(c.layer_norm_eps);
}

// "gelu_pytorch_tanh", Hugging Face's name for this form.
at::Tensor gelu_tanh(const at::Tensor& x) { return F::gelu(x, F::GELUFuncOptions().approximate("tanh")); }

// The modules below are Hugging Face's classes of the same names, registered under the same names, so
// that named_parameters() gives Hugging Face's state-dict names.

class BertEmbeddingsImpl : public torch::nn::Module {
 public:
  BertEmbeddingsImpl(const models::BertConfig& c, std::shared_ptr<const DropoutOverride> masks)
      : masks_(std::move(masks)),
        word_embeddings(register_module(
            "word_embeddings",
            torch::nn::Embedding(torch::nn::EmbeddingOptions(c.vocab, c.hidden).padding_idx(models::kPadToken)))),
        position_embeddings(register_module("position_embeddings", torch::nn::Embedding(c.max_positions, c.hidden))),
        token_type_embeddings(register_module("token_type_embeddings", torch::nn::Embedding(c.token_types, c.hidden))),
        layer_norm(register_module("LayerNorm", torch::nn::LayerNorm(layer_norm_options(c)))),
        dropout(register_module("dropout", torch::nn::Dropout(c.dropout))) {}

  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& token_type_ids, const at::Tensor& position_ids) {
    at::Tensor embeddings = word_embeddings(input_ids) + token_type_embeddings(token_type_ids);
    embeddings += position_embeddings(position_ids);  // [1, seq, hidden], broadcast over the batch
    return site_dropout(layer_norm(embeddings), 0, *masks_, dropout, is_training());
  }

  std::shared_ptr<const DropoutOverride> masks_;
  torch::nn::Embedding word_embeddings, position_embeddings, token_type_embeddings;
  torch::nn::LayerNorm layer_norm;
  torch::nn::Dropout dropout;
};
TORCH_MODULE(BertEmbeddings);

// BertSdpaSelfAttention: the projections, then at::scaled_dot_product_attention with the additive mask
// and dropout on the probabilities while training.
class BertSelfAttentionImpl : public torch::nn::Module {
 public:
  BertSelfAttentionImpl(const models::BertConfig& c, std::shared_ptr<const DropoutOverride> masks, int site)
      : query(register_module("query", torch::nn::Linear(c.hidden, c.hidden))),
        key(register_module("key", torch::nn::Linear(c.hidden, c.hidden))),
        value(register_module("value", torch::nn::Linear(c.hidden, c.hidden))),
        heads_(c.heads),
        head_dim_(c.head_dim()),
        dropout_p_(c.dropout),
        masks_(std::move(masks)),
        site_(site) {}

  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& mask) {
    const int64_t batch = hidden.size(0), seq = hidden.size(1);
    // transpose_for_scores: [batch, seq, hidden] -> [batch, heads, seq, head_dim]
    const auto heads_first = [&](const at::Tensor& x) {
      return x.view({batch, seq, heads_, head_dim_}).permute({0, 2, 1, 3});
    };
    const at::Tensor q = heads_first(query(hidden));
    const at::Tensor k = heads_first(key(hidden));
    const at::Tensor v = heads_first(value(hidden));
    at::Tensor context;
    if (is_training() && masks_->masks) {  // SDPA's math, with the given mask on the probabilities
      const at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(head_dim_))) + mask;
      const at::Tensor probabilities = at::softmax(scores, -1);
      const at::Tensor kept = masks_->masks(site_, probabilities.sizes()).to(probabilities.scalar_type());
      context = at::matmul(probabilities * kept * (1.0 / (1.0 - dropout_p_)), v);
    } else {
      context = at::scaled_dot_product_attention(q, k, v, mask, is_training() ? dropout_p_ : 0.0);
    }
    return context.transpose(1, 2).reshape({batch, seq, heads_ * head_dim_});
  }

  torch::nn::Linear query, key, value;

 private:
  int64_t heads_, head_dim_;
  double dropout_p_;
  std::shared_ptr<const DropoutOverride> masks_;
  int site_;
};
TORCH_MODULE(BertSelfAttention);

// BertSelfOutput and BertOutput: dense, dropout, LayerNorm of the sum with the block's input.
class BertOutputImpl : public torch::nn::Module {
 public:
  BertOutputImpl(int64_t in_features, const models::BertConfig& c, std::shared_ptr<const DropoutOverride> masks,
                 int site)
      : masks_(std::move(masks)),
        site_(site),
        dense(register_module("dense", torch::nn::Linear(in_features, c.hidden))),
        layer_norm(register_module("LayerNorm", torch::nn::LayerNorm(layer_norm_options(c)))),
        dropout(register_module("dropout", torch::nn::Dropout(c.dropout))) {}

  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& input) {
    return layer_norm(site_dropout(dense(hidden), site_, *masks_, dropout, is_training()) + input);
  }

  std::shared_ptr<const DropoutOverride> masks_;
  int site_;
  torch::nn::Linear dense;
  torch::nn::LayerNorm layer_norm;
  torch::nn::Dropout dropout;
};
TORCH_MODULE(BertOutput);

class BertAttentionImpl : public torch::nn::Module {
 public:
  BertAttentionImpl(const models::BertConfig& c, const std::shared_ptr<const DropoutOverride>& masks, int layer)
      : self_attention(register_module("self", BertSelfAttention(c, masks, 1 + 3 * layer))),
        output(register_module("output", BertOutput(c.hidden, c, masks, 2 + 3 * layer))) {}

  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& mask) {
    return output(self_attention(hidden, mask), hidden);
  }

  BertSelfAttention self_attention;
  BertOutput output;
};
TORCH_MODULE(BertAttention);

class BertIntermediateImpl : public torch::nn::Module {
 public:
  explicit BertIntermediateImpl(const models::BertConfig& c)
      : dense(register_module("dense", torch::nn::Linear(c.hidden, c.intermediate))) {}

  at::Tensor forward(const at::Tensor& hidden) { return gelu_tanh(dense(hidden)); }

  torch::nn::Linear dense;
};
TORCH_MODULE(BertIntermediate);

class BertLayerImpl : public torch::nn::Module {
 public:
  BertLayerImpl(const models::BertConfig& c, const std::shared_ptr<const DropoutOverride>& masks, int layer)
      : attention(register_module("attention", BertAttention(c, masks, layer))),
        intermediate(register_module("intermediate", BertIntermediate(c))),
        output(register_module("output", BertOutput(c.intermediate, c, masks, 3 + 3 * layer))) {}

  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& mask) {
    const at::Tensor attention_output = attention(hidden, mask);
    return output(intermediate(attention_output), attention_output);
  }

  BertAttention attention;
  BertIntermediate intermediate;
  BertOutput output;
};
TORCH_MODULE(BertLayer);

class BertEncoderImpl : public torch::nn::Module {
 public:
  BertEncoderImpl(const models::BertConfig& c, const std::shared_ptr<const DropoutOverride>& masks)
      : layer(register_module("layer", torch::nn::ModuleList())) {
    for (int i = 0; i < c.layers; ++i) {
      layers_.push_back(BertLayer(c, masks, i));
      layer->push_back(layers_.back());  // registered as "<i>"
    }
  }

  at::Tensor forward(at::Tensor hidden, const at::Tensor& mask) {
    for (size_t i = 0; i < layers_.size(); ++i) {
      profiler::ScopedRange range("bert.layer." + std::to_string(i));
      hidden = layers_[i](hidden, mask);
    }
    return hidden;
  }

  torch::nn::ModuleList layer;

 private:
  std::vector<BertLayer> layers_;  // the same modules, typed
};
TORCH_MODULE(BertEncoder);

class BertModelImpl : public torch::nn::Module {
 public:
  BertModelImpl(const models::BertConfig& c, const std::shared_ptr<const DropoutOverride>& masks)
      : embeddings(register_module("embeddings", BertEmbeddings(c, masks))),
        encoder(register_module("encoder", BertEncoder(c, masks))) {}

  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& token_type_ids, const at::Tensor& position_ids,
                     const at::Tensor& attention_mask) {
    at::Tensor embedding_output;
    {
      profiler::ScopedRange range("bert.embeddings");
      embedding_output = embeddings(input_ids, token_type_ids, position_ids);
    }
    // The mask for SDPA, as _prepare_4d_attention_mask_for_sdpa builds it: [batch, 1, seq, seq], 0 for
    // valid keys and torch.finfo(dtype).min for padded ones, in the embeddings' dtype, which is fp32 in
    // both precisions (LayerNorm runs in fp32 under autocast).
    TORCH_CHECK(embedding_output.scalar_type() == at::kFloat, "bert baseline: fp32 embeddings expected");
    const int64_t batch = attention_mask.size(0), seq = attention_mask.size(1);
    const at::Tensor expanded =
        attention_mask.view({batch, 1, 1, seq}).expand({batch, 1, seq, seq}).to(embedding_output.scalar_type());
    const at::Tensor inverted = at::rsub(expanded, 1.0);
    const at::Tensor mask = inverted.masked_fill(inverted.to(at::kBool), std::numeric_limits<float>::lowest());
    return encoder(embedding_output, mask);
  }

  BertEmbeddings embeddings;
  BertEncoder encoder;
};
TORCH_MODULE(BertModel);

class BertPredictionHeadTransformImpl : public torch::nn::Module {
 public:
  explicit BertPredictionHeadTransformImpl(const models::BertConfig& c)
      : dense(register_module("dense", torch::nn::Linear(c.hidden, c.hidden))),
        layer_norm(register_module("LayerNorm", torch::nn::LayerNorm(layer_norm_options(c)))) {}

  at::Tensor forward(const at::Tensor& hidden) { return layer_norm(gelu_tanh(dense(hidden))); }

  torch::nn::Linear dense;
  torch::nn::LayerNorm layer_norm;
};
TORCH_MODULE(BertPredictionHeadTransform);

// BertLMPredictionHead: the decoder is tied to the word embeddings, so it takes their weight as an
// argument and owns only its bias.
class BertLMPredictionHeadImpl : public torch::nn::Module {
 public:
  explicit BertLMPredictionHeadImpl(const models::BertConfig& c)
      : transform(register_module("transform", BertPredictionHeadTransform(c))),
        bias(register_parameter("bias", torch::zeros({c.vocab}))) {}

  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& decoder_weight) {
    return F::linear(transform(hidden), decoder_weight, bias);
  }

  BertPredictionHeadTransform transform;
  at::Tensor bias;
};
TORCH_MODULE(BertLMPredictionHead);

class BertOnlyMLMHeadImpl : public torch::nn::Module {
 public:
  explicit BertOnlyMLMHeadImpl(const models::BertConfig& c)
      : predictions(register_module("predictions", BertLMPredictionHead(c))) {}

  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& decoder_weight) {
    return predictions(hidden, decoder_weight);
  }

  BertLMPredictionHead predictions;
};
TORCH_MODULE(BertOnlyMLMHead);

class BertForMaskedLMImpl : public torch::nn::Module {
 public:
  BertForMaskedLMImpl(const models::BertConfig& c, const std::shared_ptr<const DropoutOverride>& masks)
      : bert(register_module("bert", BertModel(c, masks))),
        cls(register_module("cls", BertOnlyMLMHead(c))),
        vocab_(c.vocab) {}

  // The mean masked-LM loss of the batch.
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& token_type_ids, const at::Tensor& position_ids,
                     const at::Tensor& attention_mask, const at::Tensor& labels) {
    const at::Tensor sequence_output = bert(input_ids, token_type_ids, position_ids, attention_mask);
    profiler::ScopedRange range("bert.head");
    const at::Tensor logits = cls(sequence_output, bert->embeddings->word_embeddings->weight);
    return F::cross_entropy(logits.view({-1, vocab_}), labels.view({-1}),
                            F::CrossEntropyFuncOptions().ignore_index(models::kIgnoreLabel));
  }

  BertModel bert;
  BertOnlyMLMHead cls;

 private:
  int64_t vocab_;
};

}  // namespace detail

namespace {

models::BertConfig validated(const models::BertConfig& config) {
  models::validate(config);
  return config;
}

// Hugging Face's _init_weights for BERT: Linear and Embedding weights normal(0, 0.02), biases 0,
// LayerNorm 1 and 0, the padding token's embedding 0.
void init_weights(detail::BertForMaskedLMImpl& model, uint64_t seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    at::Tensor& p = item.value();
    if (item.key().ends_with("LayerNorm.weight")) {
      p.fill_(1.0);
    } else if (p.dim() == 1) {
      p.zero_();
    } else {
      p.normal_(0.0, 0.02, generator);
    }
  }
  model.bert->embeddings->word_embeddings->weight[models::kPadToken].zero_();
}

}  // namespace

BaselineBert::BaselineBert(const models::BertConfig& config, const models::BertTrainOptions& options,
                           BaselinePrecision precision)
    : config_(validated(config)),
      precision_(precision),
      layout_(config_, models::QkvLayout::separate, kernels::DType::f32),
      device_(at::kCUDA, c10::cuda::current_device()),
      masks_(std::make_shared<detail::DropoutOverride>()),
      model_(std::make_shared<detail::BertForMaskedLMImpl>(config_, masks_)),
      runner_(device_, "bert baseline") {
  init_weights(*model_, options.seed);
  model_->to(device_);
  model_->train();

  const auto named = model_->named_parameters();
  if (named.size() != layout_.parameters().size()) {
    throw std::logic_error("bert baseline: the module has " + std::to_string(named.size()) +
                           " parameters, the layout " + std::to_string(layout_.parameters().size()));
  }
  std::vector<bool> decays;
  for (const models::BertParameter& p : layout_.parameters()) {
    const at::Tensor* tensor = named.find(p.name);
    if (!tensor) throw std::logic_error("bert baseline: the module has no parameter '" + p.name + "'");
    parameters_.push_back(*tensor);
    decays.push_back(p.decays);
  }
  const double scale =
      options.effective_loss_scale(precision == BaselinePrecision::fp32 ? kernels::DType::f32 : config_.dtype);
  trainer_ = std::make_unique<AmpAdamW>(
      parameters_, decays,
      AdamWHyperparameters{options.lr, options.beta1, options.beta2, options.eps, options.weight_decay}, scale);
  position_ids_ = at::arange(config_.sequence, at::TensorOptions().dtype(at::kLong).device(device_)).unsqueeze(0);
  torch::cuda::manual_seed(options.seed);
}

BaselineBert::~BaselineBert() = default;  // runner_ waits for the last step first

void BaselineBert::set_dropout_masks(DropoutMasks masks) {
  masks_->masks = std::move(masks);
  masks_->p = config_.dropout;
}

const char* BaselineBert::variant() const {
  return precision_ == BaselinePrecision::amp ? "baseline" : "baseline-fp32";
}

void BaselineBert::load_state_dict(const std::vector<models::TensorView>& tensors) {
  std::vector<std::byte> flat(layout_.flat_bytes());
  models::load_bert_state_dict(tensors, layout_, flat);
  runner_.synchronize();
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const models::BertParameter& p = layout_.parameters()[i];
    parameters_[i].copy_(at::from_blob(flat.data() + p.offset * sizeof(float), p.shape, at::kFloat));
  }
  trainer_->reset_state();
  trainer_->zero_grad();
}

BaselineBert::DeviceBatch BaselineBert::to_device(const models::MlmBatch& batch) const {
  if (batch.batch != config_.batch || batch.sequence != config_.sequence) {
    throw std::invalid_argument("bert baseline: a batch of " + std::to_string(batch.batch) + " x " +
                                std::to_string(batch.sequence) + " tokens, the config's shape is " +
                                std::to_string(config_.batch) + " x " + std::to_string(config_.sequence));
  }
  const size_t tokens = static_cast<size_t>(batch.batch) * batch.sequence;
  if (batch.input_ids.size() != tokens || batch.token_type_ids.size() != tokens || batch.labels.size() != tokens ||
      batch.lengths.size() != static_cast<size_t>(batch.batch)) {
    throw std::invalid_argument("bert baseline: the batch's tensors do not have its shape");
  }
  // The tokenizer's attention_mask: 1 for the first lengths[b] tokens, 0 for the padding.
  std::vector<int64_t> attention_mask(tokens);
  for (int b = 0; b < batch.batch; ++b) {
    for (int s = 0; s < batch.sequence; ++s) attention_mask[b * batch.sequence + s] = s < batch.lengths[b] ? 1 : 0;
  }
  const auto upload = [&](const std::vector<int64_t>& values) {
    return at::from_blob(const_cast<int64_t*>(values.data()), {batch.batch, batch.sequence}, at::kLong).to(device_);
  };
  return {upload(batch.input_ids), upload(batch.token_type_ids), upload(batch.labels), upload(attention_mask)};
}

at::Tensor BaselineBert::forward_backward_scaled(const DeviceBatch& batch) {
  return trainer_->forward_backward("bert", precision_ == BaselinePrecision::amp, autocast_dtype(config_.dtype), [&] {
    return model_->forward(batch.input_ids, batch.token_type_ids, position_ids_, batch.attention_mask, batch.labels);
  });
}

at::Tensor BaselineBert::train_step(const DeviceBatch& batch) {
  return trainer_->train_step("bert", precision_ == BaselinePrecision::amp, autocast_dtype(config_.dtype), [&] {
    return model_->forward(batch.input_ids, batch.token_type_ids, position_ids_, batch.attention_mask, batch.labels);
  });
}

float BaselineBert::forward_backward(const models::MlmBatch& batch) {
  const DeviceBatch device_batch = to_device(batch);
  return runner_.run_now(
      [&] {
        const at::Tensor loss = forward_backward_scaled(device_batch);
        trainer_->unscale();
        return loss;
      },
      false);
}

float BaselineBert::step(const models::MlmBatch& batch) {
  const DeviceBatch device_batch = to_device(batch);
  return runner_.run_now([&] { return train_step(device_batch); }, true);
}

void BaselineBert::prepare_batches(const std::vector<models::MlmBatch>& batches) {
  std::vector<DeviceBatch> prepared;
  for (const models::MlmBatch& batch : batches) prepared.push_back(to_device(batch));
  runner_.synchronize();  // steps may still read the batches replaced here
  batches_ = std::move(prepared);
}

void BaselineBert::enqueue_step(int batch_index, cudaStream_t stream) {
  if (batch_index < 0 || static_cast<size_t>(batch_index) >= batches_.size()) {
    throw std::out_of_range("bert baseline: batch " + std::to_string(batch_index) + " of " +
                            std::to_string(batches_.size()) + " prepared");
  }
  runner_.enqueue(stream, [&] { return train_step(batches_[batch_index]); });
}

float BaselineBert::last_loss() { return runner_.last_loss(); }

std::vector<models::HostTensor> BaselineBert::gradients() {
  return runner_.host_copies(parameters_, layout_.parameters(), true);
}

std::vector<models::HostTensor> BaselineBert::parameters() {
  return runner_.host_copies(parameters_, layout_.parameters(), false);
}

}  // namespace fusekit::baselines
