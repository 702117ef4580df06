// The models suite's Swin cases: one whole image-classification training step (forward, backward,
// AdamW) of timm's Swin Transformer per repetition. Timed by the peers alone for now
// (scripts/peers/ops/swin_step.py: timm's model under AMP, eager and torch.compile, and the same
// model patched by fusekit.torch, eager and compiled); the fused and libtorch variants follow the
// BERT step's (models/) when the fused Swin model exists. Direction "fwd" only, as bert_step.
//
// Shapes are models/swin_config.h's specs without the dtype: "swin-t:b128". The case's flops are
// the step's matrix products (the forward's x 3), window attention's included.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "models/swin_config.h"
#include "suites/ops/ops_suite.h"

namespace fusekit::suites {
namespace {

// 2 (multiply-add) x 3 (forward, and the backward's two products) x the forward's products.
double step_flops(const models::SwinConfig& c) {
  double forward = 0;
  const double patches = static_cast<double>(c.batch) * (c.image_size / c.patch) * (c.image_size / c.patch);
  forward += patches * c.in_channels * c.patch * c.patch * c.embed_dim;  // the patch embedding
  for (int s = 0; s < c.stages(); ++s) {
    const double tokens = static_cast<double>(c.tokens(s)), dim = c.stage_dim(s);
    const double window_tokens = std::min(c.window_tokens(), c.stage_resolution(s) * c.stage_resolution(s));
    const double per_block = tokens * dim * (3 * dim + dim + 2 * c.mlp_ratio * dim)  // qkv, proj, MLP
                             + 2 * tokens * window_tokens * dim;                     // q k^T and p v
    forward += c.depths[s] * per_block;
    if (s + 1 < c.stages()) forward += (tokens / 4) * (4 * dim) * (2 * dim);  // patch merging's reduction
  }
  forward += static_cast<double>(c.batch) * c.features() * c.classes;  // the head
  return 2 * 3 * forward;
}

}  // namespace

OpDefinition swin_step_op() {
  OpDefinition op;
  op.name = "swin_step";
  op.suite = "models";
  op.shape_syntax = "<swin-t|swin-b>[:b<batch>]";
  op.shapes = {"swin-t:b128", "swin-b:b64"};
  op.has_backward = false;
  op.peer_case = [](const std::string& shape, kernels::DType dtype) {
    if (dtype == kernels::DType::f32) throw std::invalid_argument("swin_step: fp16 or bf16 (AMP)");
    const models::SwinConfig config = models::parse_swin_config(shape + ":" + models::dtype_spec_name(dtype));
    store::CaseInfo info = make_case_info("swin_step", shape, dtype, false, 0);
    info.flops = step_flops(config);
    return info;
  };
  return op;
}

}  // namespace fusekit::suites
