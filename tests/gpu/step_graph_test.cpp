// The fused models' CUDA graph option (capture_step_graphs, models/step_graph.h): replayed graphs
// train as the enqueued steps do (losses step by step and the parameters after, fp16 and bf16, BERT
// with dropout and Swin); with lr 0 a replay draws exactly the enqueued step's dropout masks (the
// losses agree to GEMM rounding) and the dropout step counter (kernels/step_counter.h) reads the
// steps taken, capture's warm-up not counted; each replay draws fresh masks; capturing before
// prepare_batches or with a gradient exchange set, an exchange or a new learning rate after
// capture, are refused, and load_state_dict drops the graphs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gpu_test_support.h"
#include "models/bert_config.h"
#include "models/bert_fused.h"
#include "models/bert_init.h"
#include "models/gradient_exchange.h"
#include "models/mlm_data.h"
#include "models/swin_config.h"
#include "models/swin_fused.h"
#include "models/swin_init.h"
#include "swin_test_support.h"
#include "test_stream.h"

namespace fusekit::models {
namespace {

using kernels::DType;

BertConfig bert_config(DType dtype) {
  BertConfig config = bert_preset("bert-tiny");
  config.batch = 4;
  config.sequence = 32;
  config.dropout = 0.1f;
  config.dtype = dtype;
  return config;
}

std::vector<MlmBatch> bert_batches(const BertConfig& config) {
  MlmDataOptions options;
  options.batch = config.batch;
  options.sequence = config.sequence;
  options.vocab = config.vocab;
  options.seed = 11;
  return {make_mlm_batch(options, 0), make_mlm_batch(options, 1)};
}

// Largest ||a - b|| / ||a|| over the tensors, with the tensor's name. BERT's attention key bias is
// left out: its gradient is zero in exact arithmetic (the softmax cancels q.b_k), so AdamW, which
// divides a gradient by its own running size, moves it by up to lr per step in a direction set by
// rounding noise, which differs between any two runs whose GEMMs differ.
std::pair<double, std::string> largest_distance(const std::vector<HostTensor>& a, const std::vector<HostTensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  std::pair<double, std::string> worst{0.0, ""};
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (a[i].name.find("attention.self.key.bias") != std::string::npos) continue;
    const double scale = std::max(swin_test::norm(a[i].values), 1e-6);
    const double d = swin_test::distance(a[i].values, b[i].values) / scale;
    if (!(d <= worst.first)) worst = {d, a[i].name};  // a NaN distance is the worst
  }
  return worst;
}

// Largest root-mean-square difference of a and b over the BERT tensors, with the tensor's name,
// against the most AdamW can move an element in `steps` steps of `lr` (steps x lr): the measure for
// tensors that start at zero (LayerNorm and linear biases), whose own norm after a few steps is
// mostly AdamW's normalized noise on their smallest gradients. The attention key bias is left out
// (above).
std::pair<double, std::string> largest_rms_difference(const std::vector<HostTensor>& a,
                                                      const std::vector<HostTensor>& b, double steps_times_lr) {
  EXPECT_EQ(a.size(), b.size());
  std::pair<double, std::string> worst{0.0, ""};
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].values.size(), b[i].values.size()) << a[i].name;
    if (a[i].name.find("attention.self.key.bias") != std::string::npos) continue;
    const double n = std::max<double>(static_cast<double>(a[i].values.size()), 1);
    const double d = swin_test::distance(a[i].values, b[i].values) / std::sqrt(n) / steps_times_lr;
    if (!(d <= worst.first)) worst = {d, a[i].name};  // a NaN distance is the worst
  }
  return worst;
}

// `steps` steps of each model, batches 0, 1, 0, ...: the replayed losses within `tolerance`
// (relative) of the enqueued ones.
template <class Model>
void expect_same_losses(Model& enqueued, Model& graphed, int steps, double tolerance, cudaStream_t stream) {
  for (int i = 0; i < steps; ++i) {
    enqueued.enqueue_step(i % 2, stream);
    const float expected = enqueued.last_loss();
    graphed.enqueue_step(i % 2, stream);
    const float loss = graphed.last_loss();
    ASSERT_TRUE(std::isfinite(loss)) << "step " << i;
    EXPECT_NEAR(loss, expected, tolerance * std::fabs(expected)) << "step " << i;
  }
}

// A FusedBert whose weights never move (lr 0, no weight decay): a step's loss depends on its batch
// and its dropout masks alone.
std::unique_ptr<FusedBert> still_bert(const BertConfig& config, uint64_t seed) {
  const BertInitialWeights weights(config, seed, config.dtype, 0.02f);
  BertTrainOptions options;
  options.lr = 0;
  options.weight_decay = 0;
  auto model = std::make_unique<FusedBert>(config, options);
  model->load_state_dict(weights.tensors());
  return model;
}

class StepGraphTest : public ::testing::TestWithParam<DType> {};

TEST_P(StepGraphTest, BertGraphsTrainAsEnqueuedSteps) {
  FUSEKIT_REQUIRE_GPU();
  // Both models take the heuristic's first GEMM algorithm (kernels/linear.h): with each context
  // timing its candidates, the two picked different algorithms in bf16 on the H100, and AdamW, which
  // normalizes each gradient by its running size, turned that rounding into 21% of a step's movement
  // in the embeddings' LayerNorm weight (fp16 happened to pick alike and matched bit for bit).
  const test_support::ScopedEnvironment heuristic("FUSEKIT_GEMM_ALGORITHM", "heuristic");
  const BertConfig config = bert_config(GetParam());
  const BertInitialWeights weights(config, 3, config.dtype, 0.02f);
  const std::vector<MlmBatch> batches = bert_batches(config);
  BertTrainOptions options;
  options.lr = 1e-3;
  const test_support::NonBlockingStream stream;  // before the models: it outlives their last steps
  FusedBert enqueued(config, options), graphed(config, options);
  enqueued.load_state_dict(weights.tensors());
  graphed.load_state_dict(weights.tensors());
  enqueued.prepare_batches(batches);
  graphed.prepare_batches(batches);
  graphed.capture_step_graphs();
  ASSERT_TRUE(graphed.graphed());
  EXPECT_THROW(graphed.enqueue_step(2, stream.stream), std::out_of_range);
  expect_same_losses(enqueued, graphed, 5, 1e-6, stream.stream);
  // The same kernels with the same algorithms on the same inputs: the replayed steps compute what
  // the enqueued ones do, so the parameters agree to far below one step's movement (lr per element).
  // A replay with other masks, another batch or a skipped update would differ by much of it.
  const auto [difference, name] = largest_rms_difference(enqueued.parameters(), graphed.parameters(), 5 * options.lr);
  std::printf("largest rms difference: %.3g of steps x lr (%s)\n", difference, name.c_str());
  EXPECT_LE(difference, 1e-3) << name;
}

// With lr 0 the weights stay put, so the same batch's loss changes from replay to replay only by
// its dropout masks: a graph that replayed one step's masks would give one loss five times.
TEST_P(StepGraphTest, EachBertReplayDrawsFreshDropoutMasks) {
  FUSEKIT_REQUIRE_GPU();
  const BertConfig config = bert_config(GetParam());
  const test_support::NonBlockingStream stream;  // before the model: it outlives its last steps
  const std::unique_ptr<FusedBert> still = still_bert(config, 5);
  FusedBert& model = *still;
  model.prepare_batches({bert_batches(config)[0]});
  model.capture_step_graphs();
  std::vector<float> losses;
  for (int i = 0; i < 5; ++i) {
    model.enqueue_step(0, stream.stream);
    losses.push_back(model.last_loss());
  }
  std::sort(losses.begin(), losses.end());
  EXPECT_EQ(std::unique(losses.begin(), losses.end()) - losses.begin(), 5) << "a replay repeated its masks";
}

// With lr 0 the weights never move, so a step's loss depends on its batch and its masks alone. One
// model (so one set of GEMM plans): five enqueued steps, the dropout step wound back to 0, the
// capture (whose warm-up must leave it at 0), five replays: each must repeat its enqueued step's
// loss (a replay drawing other masks, or a counter the warm-up moved, would not), and the counter
// read the steps taken.
TEST_P(StepGraphTest, BertReplaysDrawTheEnqueuedStepsMasks) {
  FUSEKIT_REQUIRE_GPU();
  const BertConfig config = bert_config(GetParam());
  const test_support::NonBlockingStream stream;  // before the model: it outlives its last steps
  const std::unique_ptr<FusedBert> still = still_bert(config, 9);
  FusedBert& model = *still;
  model.prepare_batches(bert_batches(config));
  std::vector<float> enqueued;
  for (int i = 0; i < 5; ++i) {
    model.enqueue_step(i % 2, stream.stream);
    enqueued.push_back(model.last_loss());
  }
  EXPECT_EQ(model.dropout_step(), 5u);
  model.set_dropout_step(0);
  model.capture_step_graphs();
  EXPECT_EQ(model.dropout_step(), 0u) << "the capture's warm-up moved the dropout step";
  for (int i = 0; i < 5; ++i) {
    model.enqueue_step(i % 2, stream.stream);
    EXPECT_NEAR(model.last_loss(), enqueued[i], 1e-6 * std::fabs(enqueued[i])) << "step " << i;
  }
  EXPECT_EQ(model.dropout_step(), 5u);
  EXPECT_THROW(model.set_dropout_site_kinds(1u), std::logic_error);
}

TEST_P(StepGraphTest, SwinGraphsTrainAsEnqueuedSteps) {
  FUSEKIT_REQUIRE_GPU();
  const SwinConfig c = parse_swin_config(std::string("swin-test:b4:") + dtype_spec_name(GetParam()));
  const SwinInitialWeights weights(c, 21, c.dtype);
  const std::vector<SwinBatch> batches = {swin_test::random_batch(c, 22), swin_test::random_batch(c, 23)};
  const test_support::NonBlockingStream stream;
  FusedSwin enqueued(c), graphed(c);
  enqueued.load_state_dict(weights.tensors());
  graphed.load_state_dict(weights.tensors());
  enqueued.prepare_batches(batches);
  graphed.prepare_batches(batches);
  EXPECT_FALSE(graphed.graphed());
  graphed.capture_step_graphs();
  ASSERT_TRUE(graphed.graphed());
  expect_same_losses(enqueued, graphed, 4, 1e-4, stream.stream);
  const auto [distance, name] = largest_distance(enqueued.parameters(), graphed.parameters());
  EXPECT_LE(distance, 1e-3) << name;
  graphed.prepare_batches(batches);  // new batches: the graphs read the old ones, so they go
  EXPECT_FALSE(graphed.graphed());
}

TEST(StepGraph, CaptureNeedsPreparedBatches) {
  FUSEKIT_REQUIRE_GPU();
  FusedBert bert(bert_config(DType::f16), {});
  EXPECT_THROW(bert.capture_step_graphs(), std::logic_error);
  FusedSwin swin(parse_swin_config("swin-test:b2:fp16"));
  EXPECT_THROW(swin.capture_step_graphs(), std::logic_error);
}

// An exchange that leaves the gradients as they are.
class NoExchange final : public GradientExchange {
 public:
  float exchange(const FlatGradients&, cudaStream_t) override { return 1.f; }
};

// What a captured step cannot follow is refused, and new weights drop the graphs (they hold the
// optimizer that load_state_dict replaces).
TEST(StepGraph, CapturedStepsRefuseWhatTheyCannotFollow) {
  FUSEKIT_REQUIRE_GPU();
  const BertConfig config = bert_config(DType::f16);
  const BertInitialWeights weights(config, 4, config.dtype, 0.02f);
  BertTrainOptions options;
  options.lr = 1e-3;
  NoExchange exchange;
  FusedBert bert(config, options);
  bert.load_state_dict(weights.tensors());
  bert.prepare_batches(bert_batches(config));
  bert.set_gradient_exchange(&exchange);
  EXPECT_THROW(bert.capture_step_graphs(), std::logic_error);
  bert.set_gradient_exchange(nullptr);
  bert.capture_step_graphs();
  EXPECT_THROW(bert.set_gradient_exchange(&exchange), std::logic_error);
  EXPECT_THROW(bert.set_learning_rate(2e-3), std::logic_error);
  bert.set_learning_rate(1e-3);  // the same rate: nothing to follow
  bert.load_state_dict(weights.tensors());
  EXPECT_FALSE(bert.graphed());
  bert.set_learning_rate(2e-3);
  const SwinConfig c = parse_swin_config("swin-test:b2:fp16");
  const SwinInitialWeights swin_weights(c, 5, c.dtype);
  FusedSwin swin(c);
  swin.load_state_dict(swin_weights.tensors());
  swin.prepare_batches({swin_test::random_batch(c, 6)});
  swin.capture_step_graphs();
  swin.load_state_dict(swin_weights.tensors());
  EXPECT_FALSE(swin.graphed());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, StepGraphTest, ::testing::Values(DType::f16, DType::bf16),
                         [](const auto& info) { return std::string(kernels::dtype_name(info.param)); });

}  // namespace
}  // namespace fusekit::models
