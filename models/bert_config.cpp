#include "models/bert_config.h"

#include <charconv>
#include <climits>
#include <stdexcept>

namespace fusekit::models {
namespace {

[[noreturn]] void fail(const std::string& message) { throw std::invalid_argument("bert config: " + message); }

int parse_positive(std::string_view field, std::string_view digits, std::string_view spec) {
  int value = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || error != std::errc() || end != digits.data() + digits.size() || value < 1) {
    fail("'" + std::string(field) + "' in '" + std::string(spec) + "' needs a positive integer after its letter");
  }
  return value;
}

}  // namespace

std::string BertConfig::spec() const {
  return name + ":b" + std::to_string(batch) + ":s" + std::to_string(sequence) + ":" + dtype_spec_name(dtype);
}

const char* dtype_spec_name(kernels::DType dtype) {
  switch (dtype) {
    case kernels::DType::f32:
      return "fp32";
    case kernels::DType::f16:
      return "fp16";
    case kernels::DType::bf16:
      return "bf16";
  }
  return "?";
}

size_t dtype_bytes(kernels::DType dtype) { return dtype == kernels::DType::f32 ? 4 : 2; }

std::vector<std::string> bert_preset_names() { return {"bert-base", "bert-large", "bert-tiny"}; }

BertConfig bert_preset(std::string_view name) {
  BertConfig c;
  c.name = std::string(name);
  if (name == "bert-base") {
    c.layers = 12, c.hidden = 768, c.heads = 12, c.intermediate = 3072;
  } else if (name == "bert-large") {
    c.layers = 24, c.hidden = 1024, c.heads = 16, c.intermediate = 4096;
  } else if (name == "bert-tiny") {
    c.layers = 2, c.hidden = 128, c.heads = 2, c.intermediate = 512;
  } else {
    fail("unknown model '" + std::string(name) + "' (known: bert-base, bert-large, bert-tiny)");
  }
  return c;
}

BertConfig parse_bert_config(std::string_view spec) {
  const size_t colon = spec.find(':');
  BertConfig config = bert_preset(spec.substr(0, colon));
  bool have_batch = false, have_sequence = false, have_dtype = false;
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
    } else if (!field.empty() && field[0] == 's') {
      once(have_sequence);
      config.sequence = parse_positive(field, field.substr(1), spec);
    } else {
      fail("unknown field '" + std::string(field) + "' in '" + std::string(spec) +
           "' (expected b<batch>, s<sequence>, fp16 or bf16)");
    }
  }
  validate(config);
  return config;
}

void validate(const BertConfig& c) {
  const auto positive = [](const char* what, long long value) {
    if (value < 1) fail(std::string(what) + " must be >= 1 (got " + std::to_string(value) + ")");
  };
  positive("layers", c.layers);
  positive("hidden", c.hidden);
  positive("heads", c.heads);
  positive("intermediate", c.intermediate);
  positive("vocab", c.vocab);
  positive("max_positions", c.max_positions);
  positive("token_types", c.token_types);
  positive("batch", c.batch);
  positive("sequence", c.sequence);
  if (c.hidden % c.heads != 0) {
    fail("hidden " + std::to_string(c.hidden) + " is not a multiple of heads " + std::to_string(c.heads));
  }
  const int head_dim = c.hidden / c.heads;
  if (head_dim != 32 && head_dim != 64 && head_dim != 128) {
    fail("head_dim " + std::to_string(head_dim) +
         " (hidden / heads) is not one the attention kernel has (32, 64, 128)");
  }
  if (c.heads > 1024) fail("heads " + std::to_string(c.heads) + " > 1024, the attention kernel's limit");
  if (c.intermediate % 8 != 0) {
    fail("intermediate " + std::to_string(c.intermediate) +
         " is not a multiple of 8 (the linear layer's GELU epilogue)");
  }
  if (c.sequence > c.max_positions) {
    fail("sequence " + std::to_string(c.sequence) + " > max_positions " + std::to_string(c.max_positions));
  }
  if (!(c.dropout >= 0.f && c.dropout < 1.f)) fail("dropout " + std::to_string(c.dropout) + " is outside [0, 1)");
  if (!(c.layer_norm_eps > 0)) fail("layer_norm_eps must be > 0");
  if (c.dtype == kernels::DType::f32) fail("fp32 is not supported (the attention kernel is fp16 or bf16)");
  // Every [tokens, width] activation is indexed by int rows in the kernels; the widest is the FFN's.
  if (c.tokens() > INT_MAX || c.tokens() * c.intermediate > (1LL << 40)) {
    fail("batch x sequence = " + std::to_string(c.tokens()) + " tokens is too large");
  }
}

}  // namespace fusekit::models
