// Attention-suite cases for BERT's attention core: forward, and forward + backward, fused and (where
// libtorch is built in) two libtorch baselines: "baseline", HuggingFace's eager composition without
// SDPA (additive mask, softmax, dropout, two batched matrix products), and "baseline:sdpa",
// at::scaled_dot_product_attention with a boolean mask and dropout_p. SDPA and eager draw their own
// dropout masks, so only their timings compare with the fused kernels, not their values.
//
// Shapes are "BATCHxHEADSxSEQxD[:pPROB]": D the head dimension (32, 64 or 128), PROB the dropout
// probability on the attention probabilities (default 0). Each sequence's valid length (the
// key-padding mask) is fixed per case, in [ceil(SEQ / 2), SEQ]: valid_length(b) below, a 32-bit
// hash of b, so that the PyTorch peers (scripts/peers/ops/bert_attention.py) draw the same lengths.
//
// Bytes that must move: the forward reads qkv (and the valid lengths) and writes out and the float
// log-sum-exp per row; the backward reads qkv, out, dout and the log-sum-exp and writes dqkv. The
// fused backward's row dots D (a float per row, written and read back) are its own choice and not
// counted.
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/bert_attention.h"
#include "suites/ops/operands.h"
#include "suites/ops/ops_suite.h"

#include "suites/ops/torch_operands.h"

#ifdef FUSEKIT_WITH_TORCH
#include "baselines/bert_attention.h"
#endif

namespace fusekit::suites {
namespace {

constexpr uint64_t kDropoutSeed = 0x5eed;

struct BertAttentionCaseShape {
  kernels::BertAttentionShape sizes;
  float p;
};

BertAttentionCaseShape parse_bert_attention_shape(const std::string& text) {
  const std::string usage = "unsupported shape '" + text +
                            "': expected BATCHxHEADSxSEQxD[:pPROB] with D 32, 64 or 128 and PROB in [0, 1), e.g. "
                            "64x12x128x64:p0.1";
  const size_t colon = text.find(':');
  const std::vector<long> sizes = parse_sizes(text.substr(0, colon), 4, 1L << 24, usage);
  BertAttentionCaseShape s{
      {static_cast<int>(sizes[0]), static_cast<int>(sizes[1]), static_cast<int>(sizes[2]), static_cast<int>(sizes[3])},
      0.f};
  if (colon != std::string::npos) {
    const std::string option = text.substr(colon + 1);
    if (option.size() < 2 || option[0] != 'p') throw std::invalid_argument(usage);
    size_t used = 0;
    try {
      s.p = std::stof(option.substr(1), &used);
    } catch (const std::exception&) {
      throw std::invalid_argument(usage);
    }
    if (used != option.size() - 1) throw std::invalid_argument(usage);
  }
  try {
    kernels::check_bert_attention(kernels::DType::f16, s.sizes, s.p);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(usage + " (" + e.what() + ")");
  }
  return s;
}

// Sequence b's valid length, in [ceil(seq / 2), seq]; the peers compute the same hash.
int valid_length(int b, int seq) {
  uint32_t x = static_cast<uint32_t>(b) * 2654435761u + 12345u;
  x ^= x >> 16;
  x *= 0x45d9f3bu;
  x ^= x >> 16;
  const int low = (seq + 1) / 2;
  return low + static_cast<int>(x % static_cast<uint32_t>(seq - low + 1));
}

double bytes_moved(const kernels::BertAttentionShape& s, kernels::DType dtype, bool backward) {
  const double size = kernels::dtype_size(dtype);
  const double rows = static_cast<double>(s.batch) * s.seq;  // token rows
  const double qkv = rows * 3 * s.heads * s.head_dim * size, out = rows * s.heads * s.head_dim * size;
  const double lse = rows * s.heads * 4, lengths = static_cast<double>(s.batch) * 4;
  const double forward = qkv + lengths + out + lse;
  const double backward_bytes = qkv + lengths + out + out + lse + qkv;  // reads qkv, out, dout, lse; writes dqkv
  return backward ? forward + backward_bytes : forward;
}

// The operands of one case, allocated by setup and freed by release.
struct BertAttentionOperands {
  int sets = 0;
  std::vector<DeviceBuffer> qkv, out, lse, dout, dqkv;
  DeviceBuffer valid_lengths, workspace;

  BertAttentionOperands(const kernels::BertAttentionShape& s, kernels::DType dtype, bool backward,
                        cudaStream_t stream) {
    const size_t size = kernels::dtype_size(dtype);
    const size_t rows = static_cast<size_t>(s.batch) * s.seq;
    const size_t qkv_count = rows * 3 * s.heads * s.head_dim, out_count = rows * s.heads * s.head_dim;
    const size_t lse_bytes = rows * s.heads * sizeof(float);
    sets = rotation_sets((qkv_count + out_count) * size * (backward ? 2 : 1) + lse_bytes);
    for (int set = 0; set < sets; ++set) {
      qkv.emplace_back(qkv_count * size);
      out.emplace_back(out_count * size);
      lse.emplace_back(lse_bytes);
      fill_random(qkv.back().get(), qkv_count, dtype, 1000 + set, 1.0f, 0.0f, stream);
      if (backward) {
        dout.emplace_back(out_count * size);
        dqkv.emplace_back(qkv_count * size);
        fill_random(dout.back().get(), out_count, dtype, 2000 + set, 1.0f, 0.0f, stream);
      }
    }
    std::vector<int32_t> host(s.batch);
    for (int b = 0; b < s.batch; ++b) host[b] = valid_length(b, s.seq);
    valid_lengths = DeviceBuffer(host.size() * sizeof(int32_t));
    FUSEKIT_CUDA_CHECK(cudaMemcpyAsync(valid_lengths.get(), host.data(), host.size() * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, stream));
    if (backward) workspace = DeviceBuffer(kernels::bert_attention_backward_workspace_bytes(s));
    FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(stream));  // `host` goes out of scope
  }
};

std::vector<Case> bert_attention_cases(const std::string& shape_text, kernels::DType dtype, bool backward) {
  const BertAttentionCaseShape parsed = parse_bert_attention_shape(shape_text);
  const kernels::BertAttentionShape s = parsed.sizes;
  const float p = parsed.p;
  kernels::check_bert_attention(dtype, s, p);  // fp32: one clear error
  store::CaseInfo info = make_case_info("bert_attention", shape_text, dtype, backward, bytes_moved(s, dtype, backward));
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  auto operands = std::make_shared<std::optional<BertAttentionOperands>>();
  auto setup = [operands, s, dtype, backward](cudaStream_t stream) { operands->emplace(s, dtype, backward, stream); };
  auto release = [operands] { operands->reset(); };

  std::vector<Case> cases;
  info.variant = "fused";
  cases.push_back({info,
                   [operands, s, dtype, backward, scale, p](cudaStream_t stream, int rep) {
                     BertAttentionOperands& o = **operands;
                     const int k = rep % o.sets;
                     // A fresh mask per call, the backward regenerating the forward's.
                     const kernels::BertAttentionDropout dropout{p, kDropoutSeed, static_cast<uint64_t>(rep)};
                     const int32_t* lengths = o.valid_lengths.as<int32_t>();
                     kernels::bert_attention_forward(dtype, o.qkv[k].get(), lengths, o.out[k].get(),
                                                     o.lse[k].as<float>(), s, scale, dropout, stream);
                     if (backward) {
                       kernels::bert_attention_backward(dtype, o.qkv[k].get(), lengths, o.out[k].get(),
                                                        o.lse[k].as<float>(), o.dout[k].get(), o.dqkv[k].get(),
                                                        o.workspace.get(), s, scale, dropout, stream);
                     }
                   },
                   setup, release});
#ifdef FUSEKIT_WITH_TORCH
  for (const bool use_sdpa : {false, true}) {
    info.variant = use_sdpa ? "baseline:sdpa" : "baseline";
    // The mask, built once per case on its first call (a warm-up) and reused, as HuggingFace builds it
    // once per model forward for every layer.
    auto mask = std::make_shared<at::Tensor>();
    cases.push_back({info,
                     [operands, s, dtype, backward, scale, p, use_sdpa, mask](cudaStream_t stream, int rep) {
                       BertAttentionOperands& o = **operands;
                       const int k = rep % o.sets;
                       TorchStream on_stream(stream);
                       const at::ScalarType type = torch_type(dtype);
                       if (!mask->defined()) {
                         const at::Tensor lengths = wrap(o.valid_lengths, {s.batch}, at::kInt);
                         *mask = use_sdpa ? baselines::bert_key_mask(lengths, s.seq)
                                          : baselines::bert_additive_mask(lengths, s.seq, type);
                       }
                       const at::Tensor qkv = wrap(o.qkv[k], {s.batch, s.seq, 3, s.heads, s.head_dim}, type);
                       if (backward) {
                         const at::Tensor dout = wrap(o.dout[k], {s.batch, s.seq, s.heads * s.head_dim}, type);
                         if (use_sdpa) {
                           baselines::bert_attention_sdpa_forward_backward(qkv, *mask, scale, p, dout);
                         } else {
                           baselines::bert_attention_forward_backward(qkv, *mask, scale, p, dout);
                         }
                       } else if (use_sdpa) {
                         baselines::bert_attention_sdpa_forward(qkv, *mask, scale, p);
                       } else {
                         baselines::bert_attention_forward(qkv, *mask, scale, p);
                       }
                     },
                     setup,
                     [release, mask] {
                       *mask = at::Tensor();
                       release();
                     }});
  }
#endif
  return cases;
}

}  // namespace

OpDefinition bert_attention_op() {
  OpDefinition op;
  op.name = "bert_attention";
  op.suite = "attention";
  op.shape_syntax = "BATCHxHEADSxSEQxD[:pPROB]";
  // BERT-base (12 heads) and BERT-large (16 heads) at sequence 128 and 512, attention dropout 0.1.
  op.shapes = {"64x12x128x64:p0.1", "32x12x512x64:p0.1", "64x16x128x64:p0.1", "32x16x512x64:p0.1"};
  op.cases = [](const std::string& shape, kernels::DType dtype, bool backward) {
    return bert_attention_cases(shape, dtype, backward);
  };
  return op;
}

}  // namespace fusekit::suites
