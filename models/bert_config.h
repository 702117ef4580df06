// BERT masked-LM pre-training: the model's configuration, its named presets and the string form
// the suites and the CLI use ("bert-base:b64:s128:fp16").
//
// What models/ holds. Whole training steps built on fusekit's fused operators: the fused variants
// (layers with their forward and backward written out over kernels/, activations planned once for
// the largest shape, parameters and gradients in one flat buffer that kernels/adamw.h's trainer
// updates) and what every variant shares: configs, the parameter list and its flat layout, loading a
// Hugging Face state dict, the synthetic MLM data, the memory plan. The libtorch variants live in
// baselines/models/, the cases in suites/models/, the tests in tests/cpu/ and tests/gpu/.
//
// The layer rule: a file in models/ includes only models/ and kernels/ headers (and the standard
// library); nothing in kernels/ includes models/. This host part (the fusekit_models_host library)
// is plain C++20: no CUDA, no libtorch, so that everything here is tested on the CPU.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/dtype.h"

namespace fusekit::models {

struct BertConfig {
  std::string name;  // the preset it came from: "bert-base", "bert-large", "bert-tiny"
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  int intermediate = 0;
  int vocab = 30522;
  int max_positions = 512;
  int token_types = 2;
  double layer_norm_eps = 1e-12;
  float dropout = 0.1f;  // BERT's hidden and attention-probability dropout, both
  // The largest step shape: activations are planned for batch x sequence tokens.
  int batch = 1;
  int sequence = 128;
  kernels::DType dtype = kernels::DType::f16;

  int head_dim() const { return heads > 0 ? hidden / heads : 0; }
  long long tokens() const { return static_cast<long long>(batch) * sequence; }
  // "bert-base:b64:s128:fp16": parse_bert_config reads it back to an equal config (for presets).
  std::string spec() const;
};

// kernels/dtype.h's names and sizes, here too: this library does not link the kernels (CUDA).
const char* dtype_spec_name(kernels::DType dtype);  // "fp32", "fp16", "bf16"
size_t dtype_bytes(kernels::DType dtype);

// The presets: "bert-base" (12 x 768, 12 heads, FFN 3072), "bert-large" (24 x 1024, 16 heads, FFN
// 4096) and "bert-tiny" (2 x 128, 2 heads, FFN 512: Google's BERT-Tiny, for tests). Batch 1,
// sequence 128, fp16. Throws std::invalid_argument naming the presets for any other name.
BertConfig bert_preset(std::string_view name);
std::vector<std::string> bert_preset_names();

// "<preset>[:b<batch>][:s<sequence>][:fp16|bf16]", fields after the preset in any order, each at
// most once. The result is validated. Throws std::invalid_argument with one message per mistake.
BertConfig parse_bert_config(std::string_view spec);

// Throws std::invalid_argument with one message for the first thing wrong: sizes < 1, hidden not a
// multiple of heads, a head_dim the attention kernel lacks (kernels/bert_attention.h: 32, 64, 128;
// heads <= 1024), an intermediate size that is not a multiple of 8 (the linear layer's GELU
// epilogue), sequence > max_positions, dropout outside [0, 1), eps <= 0, fp32 (the attention kernel
// is 16-bit only), or more tokens than an int holds (the kernels' row counts are int).
void validate(const BertConfig& config);

}  // namespace fusekit::models
