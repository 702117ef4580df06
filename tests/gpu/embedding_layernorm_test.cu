// Embedding + LayerNorm + dropout forward and backward against the float64 reference, with the mask
// regenerated from the same Philox stream, on fresh random inputs and every output poisoned (NaN)
// first: fp32, fp16 and bf16; hidden sizes 1, 31, 768, 1000, 1024 and 12288 (the looping kernels);
// one token; p = 0 (the identity, exactly) and 0.1. Then: thousands of tokens on four word rows (the
// table gradient must be summed in float: a sum in fp16 fails the bound, and the test shows it),
// ids out of range, dropout statistics, and argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "device_buffers.h"
#include "gpu_test_support.h"
#include "kernels/embedding_layernorm.h"
#include "kernels/reference/bias_dropout_residual_layernorm.h"
#include "kernels/reference/embedding_layernorm.h"

namespace fusekit::kernels {
namespace {

constexpr double kEps = 1e-5;

struct Shape {
  int tokens;
  int hidden;
  int vocab;
  int positions = 64;
  int types = 2;
};

// counted: the forward counts the ids in the backward's workspace (training), the backward uses them.
using Param = std::tuple<DType, Shape, float, bool>;

class DeviceIds {
 public:
  explicit DeviceIds(const std::vector<int64_t>& host) {
    EXPECT_EQ(cudaMalloc(&data_, std::max<size_t>(host.size(), 1) * sizeof(int64_t)), cudaSuccess);
    cudaMemcpy(data_, host.data(), host.size() * sizeof(int64_t), cudaMemcpyHostToDevice);
  }
  ~DeviceIds() { cudaFree(data_); }
  const int64_t* get() const { return data_; }

 private:
  int64_t* data_ = nullptr;
};

struct FloatBuffer {  // [count] floats, poisoned
  float* data = nullptr;
  explicit FloatBuffer(size_t n) {
    EXPECT_EQ(cudaMalloc(&data, std::max<size_t>(n, 1) * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemset(data, 0xFF, std::max<size_t>(n, 1) * sizeof(float)), cudaSuccess);
  }
  ~FloatBuffer() { cudaFree(data); }
};

// One problem: inputs as stored (rounded to the dtype), the fused outputs, the float64 reference.
struct Outcome {
  reference::EmbeddingIds ids;
  reference::EmbeddingTables tables;
  std::vector<double> gamma, beta, dy, m;
  std::vector<double> y, mean, rstd, dword, dposition, dtype, dgamma, dbeta;
  reference::EmbeddingLayerNormForward ref;
  reference::EmbeddingLayerNormBackward grad;
};

// backwards: how many times the backward runs (its outputs poisoned before each) on one forward.
Outcome run_problem(DType dtype, Shape shape, float p, reference::EmbeddingIds ids, std::mt19937_64& rng,
                    bool counted = false, int backwards = 1) {
  const int T = shape.tokens, H = shape.hidden;
  std::normal_distribution<double> normal(0.0, 1.0);
  Outcome run;
  run.ids = std::move(ids);
  run.tables = {std::vector<double>(static_cast<size_t>(shape.vocab) * H),
                std::vector<double>(static_cast<size_t>(shape.positions) * H),
                std::vector<double>(static_cast<size_t>(shape.types) * H),
                shape.vocab,
                shape.positions,
                shape.types};
  run.gamma.resize(H);
  run.beta.resize(H);
  run.dy.resize(static_cast<size_t>(T) * H);
  for (auto* v : {&run.tables.word, &run.tables.position, &run.tables.type, &run.dy}) {
    for (double& e : *v) e = normal(rng);
  }
  for (double& g : run.gamma) g = 1.0 + 0.2 * normal(rng);
  for (double& b : run.beta) b = 0.1 * normal(rng);
  const Dropout dropout{p, rng(), rng() >> 16};
  const EmbeddingLayerNormSizes sizes{T, H, shape.vocab, shape.positions, shape.types};

  Buffer word(run.tables.word.size(), dtype), position(run.tables.position.size(), dtype),
      type(run.tables.type.size(), dtype), gamma(H, dtype), beta(H, dtype), dy(run.dy.size(), dtype);
  word.upload(run.tables.word);
  position.upload(run.tables.position);
  type.upload(run.tables.type);
  gamma.upload(run.gamma);
  beta.upload(run.beta);
  dy.upload(run.dy);
  const DeviceIds word_ids(run.ids.word), position_ids(run.ids.position), type_ids(run.ids.type);
  Buffer y(run.dy.size(), dtype), dword(run.tables.word.size(), dtype), dposition(run.tables.position.size(), dtype),
      dtype_(run.tables.type.size(), dtype), dgamma(H, dtype), dbeta(H, dtype);
  FloatBuffer mean(T), rstd(T);
  const size_t workspace_bytes = embedding_layernorm_backward_workspace_bytes(sizes);
  void* workspace = nullptr;
  EXPECT_EQ(cudaMalloc(&workspace, workspace_bytes), cudaSuccess);
  EXPECT_EQ(cudaMemset(workspace, 0xFF, workspace_bytes), cudaSuccess);  // needs no initialization

  EmbeddingLayerNormForwardTensors forward;
  forward.word_ids = word_ids.get();
  forward.position_ids = position_ids.get();
  forward.token_type_ids = type_ids.get();
  forward.word = word.get();
  forward.position = position.get();
  forward.token_type = type.get();
  forward.gamma = gamma.get();
  forward.beta = beta.get();
  forward.y = y.get();
  forward.mean = mean.data;
  forward.rstd = rstd.data;
  if (counted) forward.backward_workspace = workspace;
  embedding_layernorm_forward(dtype, forward, dropout, sizes, static_cast<float>(kEps), nullptr);
  EmbeddingLayerNormBackwardTensors backward;
  backward.dy = dy.get();
  backward.word_ids = word_ids.get();
  backward.position_ids = position_ids.get();
  backward.token_type_ids = type_ids.get();
  backward.word = word.get();
  backward.position = position.get();
  backward.token_type = type.get();
  backward.gamma = gamma.get();
  backward.mean = mean.data;
  backward.rstd = rstd.data;
  backward.dword = dword.get();
  backward.dposition = dposition.get();
  backward.dtoken_type = dtype_.get();
  backward.dgamma = dgamma.get();
  backward.dbeta = dbeta.get();
  backward.ids_counted = counted;
  for (int b = 0; b < backwards; ++b) {
    for (Buffer* out : {&dword, &dposition, &dtype_, &dgamma, &dbeta}) out->poison();
    embedding_layernorm_backward(dtype, backward, dropout, sizes, workspace, nullptr);
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(workspace);

  run.y = y.download();
  run.mean = download_floats(mean.data, T);
  run.rstd = download_floats(rstd.data, T);
  run.dword = dword.download();
  run.dposition = dposition.download();
  run.dtype = dtype_.download();
  run.dgamma = dgamma.download();
  run.dbeta = dbeta.download();
  run.m = reference::dropout_multipliers(T, H, p, dropout.seed, dropout.offset);
  run.ref = reference::embedding_layernorm_forward(run.ids, run.tables, run.gamma, run.beta, run.m, H, kEps);
  run.grad = reference::embedding_layernorm_backward(run.dy, run.ids, run.tables, run.gamma, run.m, H, kEps);
  return run;
}

reference::EmbeddingIds random_ids(Shape shape, std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> word(0, shape.vocab - 1), position(0, shape.positions - 1),
      type(0, shape.types - 1);
  reference::EmbeddingIds ids;
  for (int r = 0; r < shape.tokens; ++r) {
    ids.word.push_back(word(rng));
    ids.position.push_back(position(rng));
    ids.type.push_back(type(rng));
  }
  return ids;
}

double norm(const std::vector<double>& v) {
  double s = 0;
  for (double e : v) s += e * e;
  return std::sqrt(s);
}

// DESIGN.md's bound; outputs whose reference is exactly 0 (hidden size 1: xhat = 0) absolutely.
double bound(DType dtype, const std::vector<double>& reference_values) {
  return norm(reference_values) > 0 ? tolerance(dtype) : 1e-6;
}

void expect_gradients_match(DType dtype, const Outcome& run) {
  EXPECT_LT(relative_error(run.dword, run.grad.dword), bound(dtype, run.grad.dword)) << "dword";
  EXPECT_LT(relative_error(run.dposition, run.grad.dposition), bound(dtype, run.grad.dposition)) << "dposition";
  EXPECT_LT(relative_error(run.dtype, run.grad.dtoken_type), bound(dtype, run.grad.dtoken_type)) << "dtoken_type";
  EXPECT_LT(relative_error(run.dgamma, run.grad.dgamma), bound(dtype, run.grad.dgamma)) << "dgamma";
  EXPECT_LT(relative_error(run.dbeta, run.grad.dbeta), bound(dtype, run.grad.dbeta)) << "dbeta";
}

class EmbeddingLayerNormTest : public ::testing::TestWithParam<Param> {};

TEST_P(EmbeddingLayerNormTest, ForwardAndBackwardMatchFloat64Reference) {
  FUSEKIT_REQUIRE_GPU();
  const auto [dtype, shape, p, counted] = GetParam();
  std::mt19937_64 rng(std::random_device{}());
  const Outcome run = run_problem(dtype, shape, p, random_ids(shape, rng), rng, counted);
  EXPECT_LT(relative_error(run.y, run.ref.y), bound(dtype, run.ref.y)) << "y";
  EXPECT_LT(mean_error(run.mean, run.ref.mean, run.ref.rstd), 1e-5) << "mean";
  EXPECT_LT(relative_error(run.rstd, run.ref.rstd), 1e-5) << "rstd";
  expect_gradients_match(dtype, run);
  // Word rows no token used: exactly zero (the poison must be gone).
  std::vector<bool> used(shape.vocab, false);
  for (int64_t w : run.ids.word) used[w] = true;
  size_t nonzero_unused = 0;
  for (int v = 0; v < shape.vocab; ++v) {
    for (int c = 0; !used[v] && c < shape.hidden; ++c)
      nonzero_unused += run.dword[static_cast<size_t>(v) * shape.hidden + c] != 0;
  }
  EXPECT_EQ(nonzero_unused, 0u) << "unused word rows must have zero gradient";
  // The mask: y is exactly 0 where it drops; p = 0 is the identity (nothing dropped).
  size_t wrong = 0;
  for (size_t i = 0; i < run.m.size(); ++i) wrong += (run.m[i] == 0) != (run.y[i] == 0 && run.ref.y[i] == 0);
  EXPECT_EQ(wrong, 0u) << "y not zero exactly where the mask drops";
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto [dtype, shape, p, counted] = info.param;
  return std::string(dtype_name(dtype)) + "_" + std::to_string(shape.tokens) + "x" + std::to_string(shape.hidden) +
         "_v" + std::to_string(shape.vocab) + "_p" + std::to_string(static_cast<int>(p * 100)) +
         (counted ? "_counted" : "");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, EmbeddingLayerNormTest,
    ::testing::Combine(::testing::Values(DType::f32, DType::f16, DType::bf16),
                       ::testing::Values(Shape{257, 1, 50}, Shape{300, 31, 97}, Shape{77, 1000, 500},
                                         Shape{1000, 768, 4000}, Shape{1, 768, 30522}, Shape{513, 1024, 2000},
                                         Shape{5, 12288, 40}, Shape{33, 1001, 70, 3, 1}, Shape{2000, 384, 5000, 64, 3},
                                         Shape{50, 264, 100}, Shape{64, 2048, 300},
                                         // One position for all tokens, 50 words: the sorted backward's
                                         // longest runs and its atomics on repeated words. 9000
                                         // positions: past the sorted backward's limit.
                                         Shape{3000, 768, 50, 1, 2}, Shape{100, 768, 300, 9000, 2},
                                         // 16-bit types at 768 and 1024 columns take a warp a token:
                                         // 5 token types are summed with atomics, 3 in shared memory.
                                         Shape{700, 768, 900, 40, 5}, Shape{1500, 1024, 600, 512, 3}),
                       ::testing::Values(0.f, 0.1f), ::testing::Bool()),
    param_name);

// 8192 tokens on 4 word rows (about 2048 de rows each) and 2 token types: the table gradients must
// be summed in float. The same sums done in fp16, rounding after every add in token order, miss
// DESIGN.md's bound; the test checks that they do, so it can tell the two apart.
TEST(EmbeddingLayerNormRepeatedIds, WordGradientIsSummedInFloat) {
  FUSEKIT_REQUIRE_GPU();
  std::mt19937_64 rng(std::random_device{}());
  for (const auto& [hidden, counted] : {std::pair{64, false}, {768, false}, {768, true}}) {
    // A warp a row (unsorted backward), the sorted backward (the ids counted by it or by the forward).
    SCOPED_TRACE("hidden " + std::to_string(hidden) + (counted ? ", counted by the forward" : ""));
    const Shape shape{8192, hidden, 4, 128, 2};
    const Outcome run = run_problem(DType::f16, shape, 0.1f, random_ids(shape, rng), rng, counted);
    expect_gradients_match(DType::f16, run);
    auto fp16 = [](double x) { return from_bits(to_bits({x}, DType::f16)[0], DType::f16); };
    std::vector<double> naive(run.grad.dword.size(), 0.0);
    for (int r = 0; r < shape.tokens; ++r) {
      for (int c = 0; c < shape.hidden; ++c) {
        double& sum = naive[run.ids.word[r] * shape.hidden + c];
        sum = fp16(sum + fp16(run.grad.de[static_cast<size_t>(r) * shape.hidden + c]));
      }
    }
    const double naive_error = relative_error(naive, run.grad.dword);
    EXPECT_GT(naive_error, tolerance(DType::f16)) << "an fp16 sum should fail the bound here";
    EXPECT_LT(relative_error(run.dword, run.grad.dword), tolerance(DType::f16) / 2)
        << "fused dword (fp16 sums would give " << naive_error << ")";
  }
}

// Backwards run again on one forward's counts (a gradient check, a second loss): each gives the same
// gradients. With every word repeated, the repeated words' list of the third backward would run far
// past its vocab places if it were not kept to them (memcheck sees such writes).
TEST(EmbeddingLayerNormCounted, BackwardsRepeatedOnOneForward) {
  FUSEKIT_REQUIRE_GPU();
  std::mt19937_64 rng(std::random_device{}());
  for (const auto& [dtype, hidden] : {std::pair{DType::f16, 768}, {DType::f32, 768}, {DType::bf16, 1024}}) {
    // The split row kernel (16-bit types) and the block one (fp32).
    SCOPED_TRACE(std::string(dtype_name(dtype)) + ", hidden " + std::to_string(hidden));
    const Shape shape{3000, hidden, 50, 64, 2};
    const Outcome run = run_problem(dtype, shape, 0.1f, random_ids(shape, rng), rng, true, 3);
    expect_gradients_match(dtype, run);
  }
}

// Tokens with an id out of range read nothing, have NaN y, mean and rstd, and no gradient; the other
// tokens are unaffected.
TEST(EmbeddingLayerNormIdsOutOfRange, GiveNaNRowsAndNoGradient) {
  FUSEKIT_REQUIRE_GPU();
  std::mt19937_64 rng(std::random_device{}());
  for (const auto& [hidden, counted] : {std::pair{768, false}, {12288, false}, {768, true}, {12288, true}}) {
    // The register and the looping kernels; the ids counted by the backward or by the forward.
    SCOPED_TRACE("hidden " + std::to_string(hidden) + (counted ? ", counted by the forward" : ""));
    const Shape shape{40, hidden, 100, 16, 2};
    reference::EmbeddingIds ids = random_ids(shape, rng);
    ids.word[3] = shape.vocab;
    ids.word[7] = -1;
    ids.position[11] = shape.positions;
    ids.type[19] = 1LL << 40;
    const Outcome run = run_problem(DType::bf16, shape, 0.1f, ids, rng, counted);
    std::vector<double> y_ok, ref_ok;
    for (int r = 0; r < shape.tokens; ++r) {
      const bool out = r == 3 || r == 7 || r == 11 || r == 19;
      EXPECT_EQ(std::isnan(run.mean[r]) && std::isnan(run.rstd[r]), out) << "row " << r << ", hidden " << hidden;
      for (int c = 0; c < hidden; ++c) {
        const size_t i = static_cast<size_t>(r) * hidden + c;
        if (out) {
          EXPECT_TRUE(std::isnan(run.y[i])) << "row " << r;
        } else {
          y_ok.push_back(run.y[i]);
          ref_ok.push_back(run.ref.y[i]);
        }
      }
    }
    EXPECT_LT(relative_error(y_ok, ref_ok), tolerance(DType::bf16)) << "y of the other rows";
    expect_gradients_match(DType::bf16, run);
  }
}

// The kept fraction of a large y is 1 - p within a binomial bound (y is exactly 0 only where dropped).
TEST(EmbeddingLayerNormDropout, KeepsOneMinusP) {
  FUSEKIT_REQUIRE_GPU();
  std::mt19937_64 rng(std::random_device{}());
  const Shape shape{2048, 1024, 1000};
  for (float p : {0.1f, 0.5f}) {
    const Outcome run = run_problem(DType::f32, shape, p, random_ids(shape, rng), rng);
    double kept = 0;
    for (double v : run.y) kept += v != 0;
    const double n = static_cast<double>(run.y.size());
    EXPECT_NEAR(kept, n * (1 - p), 6 * std::sqrt(n * p * (1 - p))) << "p = " << p;
  }
}

// The mask at the draw threshold's edges, at 768 columns in 16-bit types (the kernel that compares
// each 16-bit draw inside its Philox word): p = 2^-17 (threshold 1), p = 0.5 (threshold 2^15) and
// p = 1 - 2^-18, which rounds to threshold 2^16 and drops every element.
TEST(EmbeddingLayerNormDropout, MaskAtThresholdEdges) {
  FUSEKIT_REQUIRE_GPU();
  std::mt19937_64 rng(std::random_device{}());
  const Shape shape{300, 768, 1000};
  for (DType dtype : {DType::f16, DType::bf16}) {
    for (float p : {0x1p-17f, 0.5f, 1.f - 0x1p-18f}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + ", p = " + std::to_string(p));
      const Outcome run = run_problem(dtype, shape, p, random_ids(shape, rng), rng);
      size_t wrong = 0, kept = 0;
      for (size_t i = 0; i < run.m.size(); ++i) {
        wrong += (run.m[i] == 0) != (run.y[i] == 0 && run.ref.y[i] == 0);
        kept += run.y[i] != 0;
      }
      EXPECT_EQ(wrong, 0u) << "y not zero exactly where the mask drops";
      if (p > 0.99f) {
        EXPECT_EQ(kept, 0u) << "a threshold of 2^16 drops every element";
      } else {
        EXPECT_LT(relative_error(run.y, run.ref.y), bound(dtype, run.ref.y)) << "y";
      }
    }
  }
}

// Bad arguments are refused before anything runs (no GPU needed).
TEST(EmbeddingLayerNormArguments, AreChecked) {
  int64_t fake_ids = 0;
  int fake = 0;
  EmbeddingLayerNormForwardTensors forward;
  forward.word_ids = forward.position_ids = forward.token_type_ids = &fake_ids;
  forward.word = forward.position = forward.token_type = forward.gamma = forward.beta = &fake;
  forward.y = &fake;
  forward.mean = forward.rstd = reinterpret_cast<float*>(&fake);
  auto run = [&](float p, EmbeddingLayerNormSizes sizes) {
    embedding_layernorm_forward(DType::f16, forward, Dropout{p, 1, 2}, sizes, 1e-5f, nullptr);
  };
  EXPECT_THROW(run(1.f, {0, 8, 10, 4, 2}), std::invalid_argument);
  EXPECT_THROW(run(NAN, {0, 8, 10, 4, 2}), std::invalid_argument);
  EXPECT_THROW(run(0.1f, {-1, 8, 10, 4, 2}), std::invalid_argument);
  EXPECT_THROW(run(0.1f, {0, 0, 10, 4, 2}), std::invalid_argument);
  EXPECT_THROW(run(0.1f, {0, 8, 0, 4, 2}), std::invalid_argument);
  EXPECT_THROW(run(0.1f, {0, 8, 10, 4, 0}), std::invalid_argument);
  EXPECT_NO_THROW(run(0.1f, {0, 8, 10, 4, 2}));  // no tokens: nothing to do
  forward.y = nullptr;
  EXPECT_THROW(run(0.1f, {0, 8, 10, 4, 2}), std::invalid_argument);
  EmbeddingLayerNormBackwardTensors backward;
  EXPECT_THROW(
      embedding_layernorm_backward(DType::f16, backward, Dropout{0.1f, 1, 2}, {4, 8, 10, 4, 2}, &fake, nullptr),
      std::invalid_argument);
}

}  // namespace
}  // namespace fusekit::kernels
