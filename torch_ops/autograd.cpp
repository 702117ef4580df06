// Autograd for fusekit's torch.ops in C++ (torch::autograd::Function), the alternative to the
// Python formulas that python/fusekit/ops.py registers with torch.library: the same math (each
// forward op's backward is its _backward op, the statistics it saved are not differentiable), with
// none of the Python work per call. Registered at the Autograd dispatch key only when
// fusekit_enable_cpp_autograd() is called (ops.py does, under FUSEKIT_TORCH_AUTOGRAD=cpp, its
// default): an op takes one autograd formula, chosen at load time, so both can be measured. Every
// forward op but linear has one here.
//
// Each formula calls the ops through the dispatcher below autograd, so under torch.compile's fake
// tensors it reaches the fake implementations, as the Python formulas do.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace fusekit::torch_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Tensor3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using Tensor5 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

template <typename Signature>
c10::TypedOperatorHandle<Signature> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

at::Tensor contiguous(const at::Tensor& t) { return t.contiguous(); }

struct LayerNorm : torch::autograd::Function<LayerNorm> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& gamma,
                               const at::Tensor& beta, double eps) {
    static const auto forward_op =
        op<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, double)>("fusekit::layernorm");
    at::AutoDispatchBelowADInplaceOrView below;
    auto [y, mean, rstd] = forward_op.call(x, gamma, beta, eps);
    ctx->save_for_backward({x, gamma, mean, rstd});
    ctx->mark_non_differentiable({mean, rstd});
    return {y, mean, rstd};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto backward_op =
        op<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)>(
            "fusekit::layernorm_backward");
    const variable_list s = ctx->get_saved_variables();
    auto [dx, dgamma, dbeta] = backward_op.call(contiguous(grads[0]), s[0], s[1], s[2], s[3]);
    return {dx, dgamma, dbeta, at::Tensor()};
  }
};

struct BiasGelu : torch::autograd::Function<BiasGelu> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& bias,
                               const std::string& approximate) {
    static const auto forward_op =
        op<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>("fusekit::bias_gelu");
    at::AutoDispatchBelowADInplaceOrView below;
    at::Tensor y = forward_op.call(x, bias, approximate);
    ctx->save_for_backward({x, bias});
    ctx->saved_data["approximate"] = approximate;
    return {y};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto backward_op = op<std::tuple<at::Tensor, at::Tensor>(
        const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::string_view)>("fusekit::bias_gelu_backward");
    const variable_list s = ctx->get_saved_variables();
    auto [dx, dbias] = backward_op.call(contiguous(grads[0]), s[0], s[1], ctx->saved_data["approximate"].toStringRef());
    return {dx, dbias, at::Tensor()};
  }
};

struct BiasDropoutResidualLayerNorm : torch::autograd::Function<BiasDropoutResidualLayerNorm> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& bias,
                               const at::Tensor& residual, const at::Tensor& gamma, const at::Tensor& beta, double p,
                               const at::Tensor& philox, double eps) {
    static const auto forward_op =
        op<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                   double, const at::Tensor&, double)>("fusekit::bias_dropout_residual_layernorm");
    at::AutoDispatchBelowADInplaceOrView below;
    auto [y, mean, rstd] = forward_op.call(x, bias, residual, gamma, beta, p, philox, eps);
    ctx->save_for_backward({x, bias, residual, gamma, mean, rstd, philox});
    ctx->mark_non_differentiable({mean, rstd});
    ctx->saved_data["p"] = p;
    return {y, mean, rstd};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto backward_op =
        op<Tensor5(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                   const at::Tensor&, const at::Tensor&, double, const at::Tensor&)>(
            "fusekit::bias_dropout_residual_layernorm_backward");
    const variable_list s = ctx->get_saved_variables();
    auto [dx, dresidual, dbias, dgamma, dbeta] = backward_op.call(contiguous(grads[0]), s[0], s[1], s[2], s[3], s[4],
                                                                  s[5], ctx->saved_data["p"].toDouble(), s[6]);
    return {dx, dbias, dresidual, dgamma, dbeta, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct EmbeddingLayerNorm : torch::autograd::Function<EmbeddingLayerNorm> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& word_ids, const at::Tensor& position_ids,
                               const at::Tensor& token_type_ids, const at::Tensor& word, const at::Tensor& position,
                               const at::Tensor& token_type, const at::Tensor& gamma, const at::Tensor& beta, double p,
                               const at::Tensor& philox, double eps, int64_t padding_idx) {
    static const auto forward_op =
        op<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                   const at::Tensor&, const at::Tensor&, const at::Tensor&, double, const at::Tensor&, double,
                   int64_t)>("fusekit::embedding_layernorm");
    at::AutoDispatchBelowADInplaceOrView below;
    auto [y, mean, rstd] = forward_op.call(word_ids, position_ids, token_type_ids, word, position, token_type, gamma,
                                           beta, p, philox, eps, padding_idx);
    ctx->save_for_backward(
        {word_ids, position_ids, token_type_ids, word, position, token_type, gamma, mean, rstd, philox});
    ctx->mark_non_differentiable({mean, rstd});
    ctx->saved_data["p"] = p;
    ctx->saved_data["padding_idx"] = padding_idx;
    return {y, mean, rstd};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto backward_op =
        op<Tensor5(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                   const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                   double, const at::Tensor&, int64_t)>("fusekit::embedding_layernorm_backward");
    const variable_list s = ctx->get_saved_variables();
    auto [dword, dposition, dtoken_type, dgamma, dbeta] =
        backward_op.call(contiguous(grads[0]), s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8],
                         ctx->saved_data["p"].toDouble(), s[9], ctx->saved_data["padding_idx"].toInt());
    const at::Tensor none;
    return {none, none, none, dword, dposition, dtoken_type, dgamma, dbeta, none, none, none, none};
  }
};

struct BertAttention : torch::autograd::Function<BertAttention> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& qkv, const at::Tensor& lengths, double scale,
                               double p, const at::Tensor& philox) {
    static const auto forward_op =
        op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, double, double, const at::Tensor&)>(
            "fusekit::bert_attention");
    at::AutoDispatchBelowADInplaceOrView below;
    auto [out, lse] = forward_op.call(qkv, lengths, scale, p, philox);
    ctx->save_for_backward({qkv, lengths, out, lse, philox});
    ctx->mark_non_differentiable({lse});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["p"] = p;
    return {out, lse};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto backward_op =
        op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      double, double, const at::Tensor&)>("fusekit::bert_attention_backward");
    const variable_list s = ctx->get_saved_variables();
    at::Tensor dqkv = backward_op.call(contiguous(grads[0]), s[0], s[1], s[2], s[3],
                                       ctx->saved_data["scale"].toDouble(), ctx->saved_data["p"].toDouble(), s[4]);
    const at::Tensor none;
    return {dqkv, none, none, none, none};
  }
};

struct CrossEntropy : torch::autograd::Function<CrossEntropy> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& labels,
                               int64_t ignore_index, double label_smoothing) {
    static const auto forward_op =
        op<Tensor3(const at::Tensor&, const at::Tensor&, int64_t, double)>("fusekit::cross_entropy");
    at::AutoDispatchBelowADInplaceOrView below;
    auto [loss, lse, valid] = forward_op.call(logits, labels, ignore_index, label_smoothing);
    ctx->save_for_backward({logits, labels, lse, valid});
    ctx->mark_non_differentiable({lse, valid});
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["label_smoothing"] = label_smoothing;
    return {loss, lse, valid};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto backward_op =
        op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      int64_t, double)>("fusekit::cross_entropy_backward");
    const variable_list s = ctx->get_saved_variables();
    const at::Tensor dloss = grads[0].to(at::kFloat).reshape({1}).contiguous();
    at::Tensor dlogits = backward_op.call(dloss, s[0], s[1], s[2], s[3], ctx->saved_data["ignore_index"].toInt(),
                                          ctx->saved_data["label_smoothing"].toDouble());
    const at::Tensor none;
    return {dlogits, none, none, none};
  }
};

struct Softmax : torch::autograd::Function<Softmax> {
  // lengths stays an optional: an undefined tensor among apply()'s arguments fails there ("tensor
  // does not have a device"), an empty optional is skipped.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, double scale, const std::string& mask,
                               const std::optional<at::Tensor>& lengths) {
    static const auto forward_op =
        op<at::Tensor(const at::Tensor&, double, c10::string_view, const std::optional<at::Tensor>&)>(
            "fusekit::softmax");
    at::AutoDispatchBelowADInplaceOrView below;
    at::Tensor y = forward_op.call(x, scale, mask, lengths);
    ctx->save_for_backward({y});
    ctx->saved_data["scale"] = scale;
    return {y};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto backward_op =
        op<at::Tensor(const at::Tensor&, const at::Tensor&, double)>("fusekit::softmax_backward");
    const variable_list s = ctx->get_saved_variables();
    at::Tensor dx = backward_op.call(s[0], contiguous(grads[0]), ctx->saved_data["scale"].toDouble());
    const at::Tensor none;
    return {dx, none, none, none};
  }
};

struct WindowPartition : torch::autograd::Function<WindowPartition> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& gamma,
                               const at::Tensor& beta, int64_t window, int64_t shift, double eps) {
    static const auto forward_op =
        op<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, int64_t, double)>(
            "fusekit::window_partition");
    at::AutoDispatchBelowADInplaceOrView below;
    auto [windows, mean, rstd] = forward_op.call(x, gamma, beta, window, shift, eps);
    ctx->save_for_backward({x, gamma, mean, rstd});
    ctx->mark_non_differentiable({mean, rstd});
    ctx->saved_data["window"] = window;
    ctx->saved_data["shift"] = shift;
    return {windows, mean, rstd};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto backward_op =
        op<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                   int64_t, int64_t)>("fusekit::window_partition_backward");
    const variable_list s = ctx->get_saved_variables();
    auto [dx, dgamma, dbeta] = backward_op.call(contiguous(grads[0]), s[0], s[1], s[2], s[3],
                                                ctx->saved_data["window"].toInt(), ctx->saved_data["shift"].toInt());
    const at::Tensor none;
    return {dx, dgamma, dbeta, none, none, none};
  }
};

struct WindowMerge : torch::autograd::Function<WindowMerge> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& windows, const at::Tensor& shortcut,
                               int64_t window, int64_t shift) {
    static const auto forward_op =
        op<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, int64_t)>("fusekit::window_merge");
    at::AutoDispatchBelowADInplaceOrView below;
    at::Tensor y = forward_op.call(windows, shortcut, window, shift);
    ctx->saved_data["window"] = window;
    ctx->saved_data["shift"] = shift;
    return {y};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto backward_op =
        op<at::Tensor(const at::Tensor&, int64_t, int64_t)>("fusekit::window_merge_backward");
    const at::Tensor dy = contiguous(grads[0]);
    at::Tensor dwindows = backward_op.call(dy, ctx->saved_data["window"].toInt(), ctx->saved_data["shift"].toInt());
    const at::Tensor none;
    return {dwindows, dy, none, none};
  }
};

struct PatchMerging : torch::autograd::Function<PatchMerging> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& gamma,
                               const at::Tensor& beta, double eps) {
    static const auto forward_op =
        op<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, double)>("fusekit::patch_merging");
    at::AutoDispatchBelowADInplaceOrView below;
    auto [y, mean, rstd] = forward_op.call(x, gamma, beta, eps);
    ctx->save_for_backward({x, gamma, mean, rstd});
    ctx->mark_non_differentiable({mean, rstd});
    return {y, mean, rstd};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto backward_op =
        op<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)>(
            "fusekit::patch_merging_backward");
    const variable_list s = ctx->get_saved_variables();
    auto [dx, dgamma, dbeta] = backward_op.call(contiguous(grads[0]), s[0], s[1], s[2], s[3]);
    return {dx, dgamma, dbeta, at::Tensor()};
  }
};

struct WindowAttention : torch::autograd::Function<WindowAttention> {
  // mask: an optional, as Softmax's lengths; saved as a possibly undefined tensor.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& qkv, const at::Tensor& table,
                               const at::Tensor& index, const std::optional<at::Tensor>& mask, double scale) {
    static const auto forward_op =
        op<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, double)>(
            "fusekit::window_attention");
    at::AutoDispatchBelowADInplaceOrView below;
    auto [out, bias, lse] = forward_op.call(qkv, table, index, mask, scale);
    ctx->save_for_backward({qkv, table, index, mask.value_or(at::Tensor()), out, bias, lse});
    ctx->mark_non_differentiable({bias, lse});
    ctx->saved_data["scale"] = scale;
    return {out, bias, lse};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto backward_op = op<std::tuple<at::Tensor, at::Tensor>(
        const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
        const at::Tensor&, const at::Tensor&, const at::Tensor&, double)>("fusekit::window_attention_backward");
    const variable_list s = ctx->get_saved_variables();
    const std::optional<at::Tensor> mask = s[3].defined() ? std::optional<at::Tensor>(s[3]) : std::nullopt;
    auto [dqkv, dtable] = backward_op.call(contiguous(grads[0]), s[0], s[1], s[2], mask, s[4], s[5], s[6],
                                           ctx->saved_data["scale"].toDouble());
    const at::Tensor none;
    return {dqkv, dtable, none, none, none};
  }
};

// ---- layer-level ops (bert_layer, swin_block): one node over a layer's inputs, its parameters
// (a TensorList) and the tensors its forward saved for the backward (outputs, not differentiable).

// Saves `head` (the layer's other tensor inputs), then the parameters, then the saved outputs.
void save_layer(AutogradContext* ctx, variable_list head, at::TensorList params, const variable_list& saved) {
  head.insert(head.end(), params.begin(), params.end());
  head.insert(head.end(), saved.begin(), saved.end());
  ctx->save_for_backward(head);
  ctx->mark_non_differentiable(saved);
  ctx->set_materialize_grads(false);  // no zero-filled gradients for the saved outputs
  ctx->saved_data["params"] = static_cast<int64_t>(params.size());
}

struct LayerSaved {
  variable_list head, params, saved;
};

LayerSaved restore_layer(AutogradContext* ctx, size_t head) {
  const variable_list s = ctx->get_saved_variables();
  const auto n = static_cast<size_t>(ctx->saved_data["params"].toInt());
  return {variable_list(s.begin(), s.begin() + head), variable_list(s.begin() + head, s.begin() + head + n),
          variable_list(s.begin() + head + n, s.end())};
}

// The forward's outputs: y, then the saved tensors.
variable_list layer_outputs(const at::Tensor& y, const variable_list& saved) {
  variable_list out{y};
  out.insert(out.end(), saved.begin(), saved.end());
  return out;
}

// One node for a whole encoder layer: the params' gradients come back in their own dtype (float32
// under autocast), so AccumulateGrad takes them as they are, with no cast node per parameter.
struct BertLayer : torch::autograd::Function<BertLayer> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& lengths,
                               at::TensorList params, int64_t heads, double scale, double p_attention,
                               double p_attention_output, double p_output, const at::Tensor& philox, double eps,
                               const std::string& approximate) {
    static const auto forward_op = op<std::tuple<at::Tensor, std::vector<at::Tensor>>(
        const at::Tensor&, const at::Tensor&, at::TensorList, int64_t, double, double, double, double,
        const at::Tensor&, double, c10::string_view)>("fusekit::bert_layer");
    at::AutoDispatchBelowADInplaceOrView below;
    auto [y, saved] = forward_op.call(x, lengths, params, heads, scale, p_attention, p_attention_output, p_output,
                                      philox, eps, approximate);
    save_layer(ctx, {x, lengths, philox}, params, saved);
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["p_attention"] = p_attention;
    ctx->saved_data["p_attention_output"] = p_attention_output;
    ctx->saved_data["p_output"] = p_output;
    ctx->saved_data["approximate"] = approximate;
    return layer_outputs(y, saved);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto backward_op = op<std::tuple<at::Tensor, std::vector<at::Tensor>>(
        const at::Tensor&, const at::Tensor&, const at::Tensor&, at::TensorList, at::TensorList, int64_t, double,
        double, double, double, const at::Tensor&, c10::string_view)>("fusekit::bert_layer_backward");
    const LayerSaved l = restore_layer(ctx, 3);                              // x, lengths, philox
    if (!grads[0].defined()) return variable_list(2 + l.params.size() + 8);  // no gradient reached y
    auto [dx, dparams] = backward_op.call(
        contiguous(grads[0]), l.head[0], l.head[1], l.params, l.saved, ctx->saved_data["heads"].toInt(),
        ctx->saved_data["scale"].toDouble(), ctx->saved_data["p_attention"].toDouble(),
        ctx->saved_data["p_attention_output"].toDouble(), ctx->saved_data["p_output"].toDouble(), l.head[2],
        ctx->saved_data["approximate"].toStringRef());
    // One gradient per input as apply() flattened them: x, lengths, each param, then the rest.
    variable_list out{dx, at::Tensor()};
    out.insert(out.end(), dparams.begin(), dparams.end());
    out.resize(out.size() + 8);  // heads, scale, the three p, philox, eps, approximate
    return out;
  }
};

// One node for a whole Swin block, as BertLayer; mask stays an optional (Softmax's note).
struct SwinBlock : torch::autograd::Function<SwinBlock> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList params,
                               const at::Tensor& index, const std::optional<at::Tensor>& mask,
                               const std::optional<at::Tensor>& drop1, const std::optional<at::Tensor>& drop2,
                               at::ScalarType dtype, int64_t window, int64_t shift, int64_t heads, double scale,
                               double eps1, double eps2, const std::string& approximate) {
    static const auto forward_op = op<std::tuple<at::Tensor, std::vector<at::Tensor>>(
        const at::Tensor&, at::TensorList, const at::Tensor&, const std::optional<at::Tensor>&,
        const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, at::ScalarType, int64_t, int64_t, int64_t,
        double, double, double, c10::string_view)>("fusekit::swin_block");
    at::AutoDispatchBelowADInplaceOrView below;
    auto [y, saved] = forward_op.call(x, params, index, mask, drop1, drop2, dtype, window, shift, heads, scale, eps1,
                                      eps2, approximate);
    const at::Tensor none;
    save_layer(ctx, {x, index, mask.value_or(none), drop1.value_or(none), drop2.value_or(none)}, params, saved);
    ctx->saved_data["window"] = window;
    ctx->saved_data["shift"] = shift;
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["approximate"] = approximate;
    return layer_outputs(y, saved);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto backward_op = op<std::tuple<at::Tensor, std::vector<at::Tensor>>(
        const at::Tensor&, const at::Tensor&, at::TensorList, const at::Tensor&, const std::optional<at::Tensor>&,
        const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, at::TensorList, int64_t, int64_t, int64_t,
        double, c10::string_view)>("fusekit::swin_block_backward");
    // x, index, then mask, drop1, drop2 (each undefined where none).
    const LayerSaved l = restore_layer(ctx, 5);
    // One gradient per input as apply() flattened them: x, each param, then index, mask, drop1,
    // drop2 (one entry each, given or not) and the 8 other arguments: undefined, trimmed by apply().
    const size_t inputs = 1 + l.params.size() + 4 + 8;
    if (!grads[0].defined()) return variable_list(inputs);
    auto given = [](const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; };
    auto [dx, dparams] = backward_op.call(
        contiguous(grads[0]), l.head[0], l.params, l.head[1], given(l.head[2]), given(l.head[3]), given(l.head[4]),
        l.saved, ctx->saved_data["window"].toInt(), ctx->saved_data["shift"].toInt(), ctx->saved_data["heads"].toInt(),
        ctx->saved_data["scale"].toDouble(), ctx->saved_data["approximate"].toStringRef());
    variable_list out{dx};
    out.insert(out.end(), dparams.begin(), dparams.end());
    out.resize(inputs);
    return out;
  }
};

// ---- the kernels registered at the Autograd key: the schemas' signatures

Tensor3 layernorm(const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta, double eps) {
  const variable_list out = LayerNorm::apply(x, gamma, beta, eps);
  return {out[0], out[1], out[2]};
}

at::Tensor bias_gelu(const at::Tensor& x, const at::Tensor& bias, c10::string_view approximate) {
  return BiasGelu::apply(x, bias, std::string(approximate.data(), approximate.size()))[0];
}

Tensor3 bias_dropout_residual_layernorm(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& residual,
                                        const at::Tensor& gamma, const at::Tensor& beta, double p,
                                        const at::Tensor& philox, double eps) {
  const variable_list out = BiasDropoutResidualLayerNorm::apply(x, bias, residual, gamma, beta, p, philox, eps);
  return {out[0], out[1], out[2]};
}

Tensor3 embedding_layernorm(const at::Tensor& word_ids, const at::Tensor& position_ids,
                            const at::Tensor& token_type_ids, const at::Tensor& word, const at::Tensor& position,
                            const at::Tensor& token_type, const at::Tensor& gamma, const at::Tensor& beta, double p,
                            const at::Tensor& philox, double eps, int64_t padding_idx) {
  const variable_list out = EmbeddingLayerNorm::apply(word_ids, position_ids, token_type_ids, word, position,
                                                      token_type, gamma, beta, p, philox, eps, padding_idx);
  return {out[0], out[1], out[2]};
}

std::tuple<at::Tensor, at::Tensor> bert_attention(const at::Tensor& qkv, const at::Tensor& lengths, double scale,
                                                  double p, const at::Tensor& philox) {
  const variable_list out = BertAttention::apply(qkv, lengths, scale, p, philox);
  return {out[0], out[1]};
}

Tensor3 cross_entropy(const at::Tensor& logits, const at::Tensor& labels, int64_t ignore_index,
                      double label_smoothing) {
  const variable_list out = CrossEntropy::apply(logits, labels, ignore_index, label_smoothing);
  return {out[0], out[1], out[2]};
}

at::Tensor softmax(const at::Tensor& x, double scale, c10::string_view mask, const std::optional<at::Tensor>& lengths) {
  return Softmax::apply(x, scale, std::string(mask.data(), mask.size()), lengths)[0];
}

Tensor3 window_partition(const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta, int64_t window,
                         int64_t shift, double eps) {
  const variable_list out = WindowPartition::apply(x, gamma, beta, window, shift, eps);
  return {out[0], out[1], out[2]};
}

at::Tensor window_merge(const at::Tensor& windows, const at::Tensor& shortcut, int64_t window, int64_t shift) {
  return WindowMerge::apply(windows, shortcut, window, shift)[0];
}

Tensor3 patch_merging(const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta, double eps) {
  const variable_list out = PatchMerging::apply(x, gamma, beta, eps);
  return {out[0], out[1], out[2]};
}

Tensor3 window_attention(const at::Tensor& qkv, const at::Tensor& table, const at::Tensor& index,
                         const std::optional<at::Tensor>& mask, double scale) {
  const variable_list out = WindowAttention::apply(qkv, table, index, mask, scale);
  return {out[0], out[1], out[2]};
}

std::tuple<at::Tensor, std::vector<at::Tensor>> bert_layer(const at::Tensor& x, const at::Tensor& lengths,
                                                           at::TensorList params, int64_t heads, double scale,
                                                           double p_attention, double p_attention_output,
                                                           double p_output, const at::Tensor& philox, double eps,
                                                           c10::string_view approximate) {
  const variable_list out =
      BertLayer::apply(x, lengths, params, heads, scale, p_attention, p_attention_output, p_output, philox, eps,
                       std::string(approximate.data(), approximate.size()));
  return {out[0], std::vector<at::Tensor>(out.begin() + 1, out.end())};
}

std::tuple<at::Tensor, std::vector<at::Tensor>> swin_block(const at::Tensor& x, at::TensorList params,
                                                           const at::Tensor& index,
                                                           const std::optional<at::Tensor>& mask,
                                                           const std::optional<at::Tensor>& drop1,
                                                           const std::optional<at::Tensor>& drop2, at::ScalarType dtype,
                                                           int64_t window, int64_t shift, int64_t heads, double scale,
                                                           double eps1, double eps2, c10::string_view approximate) {
  const variable_list out = SwinBlock::apply(x, params, index, mask, drop1, drop2, dtype, window, shift, heads, scale,
                                             eps1, eps2, std::string(approximate.data(), approximate.size()));
  return {out[0], std::vector<at::Tensor>(out.begin() + 1, out.end())};
}

}  // namespace
}  // namespace fusekit::torch_ops

// 1 the first time (the formulas are now registered), 0 after that.
extern "C" int fusekit_enable_cpp_autograd() {
  using namespace fusekit::torch_ops;
  static std::unique_ptr<torch::Library> library;
  if (library) return 0;
  library =
      std::make_unique<torch::Library>(torch::Library::IMPL, "fusekit", c10::DispatchKey::Autograd, __FILE__, __LINE__);
  library->impl("layernorm", &layernorm);
  library->impl("bias_gelu", &bias_gelu);
  library->impl("bias_dropout_residual_layernorm", &bias_dropout_residual_layernorm);
  library->impl("embedding_layernorm", &embedding_layernorm);
  library->impl("bert_attention", &bert_attention);
  library->impl("cross_entropy", &cross_entropy);
  library->impl("softmax", &softmax);
  library->impl("window_partition", &window_partition);
  library->impl("window_merge", &window_merge);
  library->impl("patch_merging", &patch_merging);
  library->impl("window_attention", &window_attention);
  library->impl("bert_layer", &bert_layer);
  library->impl("swin_block", &swin_block);
  return 1;
}
