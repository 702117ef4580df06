// The models suite's BERT cases: one whole masked-LM training step (forward, backward, AdamW) per
// repetition, of models/bert_model.h's function, for each config. Direction "fwd" only: a step is
// one case per shape and dtype (as an optimizer step is).
//
//   fused      models/bert_fused.h: fusekit's kernels, memory planned once, fp32 master weights
//   baseline   baselines/models/bert_baseline.h: libtorch modules, autocast, autograd, AdamW fused
//              (where libtorch is built in)
// Peers (scripts/peers/ops/bert_step.py): Hugging Face's BertForMaskedLM under AMP, eager and
// torch.compile, on the same weights' distribution and the same batches.
//
// Shapes are models/bert_config.h's specs without the dtype: "bert-base:b64:s128". Every variant
// starts from the same random weights (models/bert_init.h, seed 1) and rotates through four batches
// of the synthetic MLM data (models/mlm_data.h, seed 0). The case's flops are the step's matrix
// products (forward x 3: the backward's two products per forward one), attention's included, the
// head's on the masked rows that the fused step computes (the others compute all rows: more work,
// not counted). Bytes: 0 (a step is not a copy).
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/bert_fused.h"
#include "models/bert_init.h"
#include "models/memory_plan.h"
#include "suites/ops/ops_suite.h"

#ifdef FUSEKIT_WITH_TORCH
#include "baselines/models/bert_baseline.h"
#include "suites/ops/torch_operands.h"
#endif

namespace fusekit::suites {
namespace {

constexpr int kBatches = 4;

double step_flops(const models::BertConfig& c) {
  const double N = static_cast<double>(c.tokens()), H = c.hidden, I = c.intermediate, S = c.sequence;
  const double M = models::MemoryPlan(c).masked_rows();
  const double per_layer = 2 * N * (4 * H * H + 2 * H * I) + 4 * c.batch * S * S * H;
  const double head = 2 * M * (H * H + H * c.vocab);
  return 3 * (c.layers * per_layer + head);
}

struct StepOperands {
  std::unique_ptr<models::BertMlmModel> model;
};

std::vector<Case> bert_step_cases(const std::string& shape, kernels::DType dtype) {
  const models::BertConfig config = models::parse_bert_config(shape + ":" + models::dtype_spec_name(dtype));
  store::CaseInfo info = make_case_info("bert_step", shape, dtype, false, 0);
  info.flops = step_flops(config);
  auto operands = std::make_shared<std::optional<StepOperands>>();
  auto release = [operands] { operands->reset(); };
  auto prepare = [config](models::BertMlmModel& model) {
    const models::BertInitialWeights weights(config, 1, config.dtype);
    model.load_state_dict(weights.tensors());
    models::MlmDataOptions data;
    data.batch = config.batch;
    data.sequence = config.sequence;
    data.vocab = config.vocab;
    std::vector<models::MlmBatch> batches;
    for (int i = 0; i < kBatches; ++i) batches.push_back(models::make_mlm_batch(data, static_cast<uint64_t>(i)));
    model.prepare_batches(batches);
  };
  auto run = [operands](cudaStream_t stream, int rep) { (*operands)->model->enqueue_step(rep % kBatches, stream); };

  std::vector<Case> cases;
  info.variant = "fused";
  cases.push_back({info, run,
                   [operands, config, prepare](cudaStream_t) {
                     operands->emplace();
                     (*operands)->model = std::make_unique<models::FusedBert>(config, models::BertTrainOptions{});
                     prepare(*(*operands)->model);
                   },
                   release});
#ifdef FUSEKIT_WITH_TORCH
  info.variant = "baseline";
  cases.push_back({info,
                   [operands](cudaStream_t stream, int rep) {
                     TorchStream on_stream(stream);
                     (*operands)->model->enqueue_step(rep % kBatches, stream);
                   },
                   [operands, config, prepare](cudaStream_t stream) {
                     TorchStream on_stream(stream);
                     operands->emplace();
                     (*operands)->model = std::make_unique<baselines::BaselineBert>(config, models::BertTrainOptions{},
                                                                                    baselines::BaselinePrecision::amp);
                     prepare(*(*operands)->model);
                   },
                   release});
#endif
  return cases;
}

}  // namespace

OpDefinition bert_step_op() {
  OpDefinition op;
  op.name = "bert_step";
  op.suite = "models";
  op.shape_syntax = "<bert-base|bert-large|bert-tiny>[:b<batch>][:s<sequence>]";
  op.shapes = {"bert-base:b64:s128", "bert-base:b16:s512", "bert-large:b32:s128", "bert-large:b8:s512"};
  op.has_backward = false;
  op.cases = [](const std::string& shape, kernels::DType dtype, bool) {
    if (dtype == kernels::DType::f32)
      throw std::invalid_argument("bert_step: fp16 or bf16 (the attention kernel is 16-bit)");
    return bert_step_cases(shape, dtype);
  };
  return op;
}

}  // namespace fusekit::suites
