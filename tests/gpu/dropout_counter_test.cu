// The dropout stream's device counter (kernels/detail/philox.cuh, kernels/step_counter.h): a kernel
// given offset o and a counter holding c draws exactly the mask of offset o + c, and a counter
// advanced by one draws another. Checked on every kernel with dropout, forward and backward (the
// bias + dropout + residual + LayerNorm pair, the embedding forward and backward, the attention
// forward and backward), on fresh random inputs, bit for bit: the counter decides the offset and
// nothing else (outputs that are sums of float atomics within DESIGN.md's bound).
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "device_buffers.h"
#include "gpu_test_support.h"
#include "kernels/bert_attention.h"
#include "kernels/bias_dropout_residual_layernorm.h"
#include "kernels/embedding_layernorm.h"
#include "kernels/step_counter.h"

namespace fusekit::kernels {
namespace {

constexpr float kP = 0.1f;
constexpr uint64_t kSeed = 0x5EEDF00Dull;

std::vector<double> random_values(size_t n, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = normal(rng);
  return v;
}

// A device counter set to `value` through the kernel that advances it: value launches from zero.
class Counter {
 public:
  explicit Counter(uint64_t value) {
    EXPECT_EQ(cudaMalloc(&word_, sizeof(uint64_t)), cudaSuccess);
    EXPECT_EQ(cudaMemset(word_, 0, sizeof(uint64_t)), cudaSuccess);
    for (uint64_t i = 0; i < value; ++i) advance_step_counter(word_, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  ~Counter() { cudaFree(word_); }
  const uint64_t* get() const { return word_; }
  uint64_t* word() { return word_; }

 private:
  uint64_t* word_ = nullptr;
};

// What a run wrote: the forward's outputs, compared bit for bit, and the backward's gradients,
// compared within DESIGN.md's bound (the table and parameter gradients sum with float atomics,
// whose order varies from run to run; a mask drawn from another offset changes a tenth of the
// terms, far beyond the bound).
struct Written {
  std::vector<double> exact, summed;
};

void append(std::vector<double>& to, const Buffer& buffer) {
  const std::vector<double> v = buffer.download();
  to.insert(to.end(), v.begin(), v.end());
}

// run(offset, counter); the three runs: offset 7 alone, offset 3 + counter 4, offset 3 + counter 5.
void expect_counter_decides_the_offset(DType dtype, const std::function<Written(uint64_t, const uint64_t*)>& run) {
  const Written plain = run(7, nullptr);
  const Counter four(4), five(5);
  const Written counted = run(3, four.get());
  const Written next = run(3, five.get());
  ASSERT_EQ(plain.exact.size(), counted.exact.size());
  size_t differing = 0, finite = 0;
  for (size_t i = 0; i < plain.exact.size(); ++i) {
    finite += std::isfinite(plain.exact[i]);
    differing += plain.exact[i] != counted.exact[i];
  }
  EXPECT_EQ(finite, plain.exact.size()) << "an output was not written";
  EXPECT_EQ(differing, 0u) << "offset 3 + counter 4 is not offset 7";
  EXPECT_LE(relative_error(counted.summed, plain.summed), tolerance(dtype)) << "the gradients differ";
  size_t moved = 0;
  for (size_t i = 0; i < plain.exact.size(); ++i) moved += plain.exact[i] != next.exact[i];
  EXPECT_GT(moved, plain.exact.size() / 100) << "counter 5 drew the same mask as counter 4";
  if (!plain.summed.empty()) {
    EXPECT_GT(relative_error(next.summed, plain.summed), 10 * tolerance(dtype)) << "counter 5: the same gradients";
  }
}

class DropoutCounterTest : public ::testing::TestWithParam<DType> {};

TEST_P(DropoutCounterTest, BiasDropoutResidualLayerNorm) {
  FUSEKIT_REQUIRE_GPU();
  const DType dt = GetParam();
  const int rows = 37, C = 768;
  std::mt19937_64 rng(std::random_device{}());
  std::vector<double> x = random_values(size_t(rows) * C, rng), bias = random_values(C, rng),
                      residual = random_values(size_t(rows) * C, rng), gamma = random_values(C, rng),
                      beta = random_values(C, rng), dy = random_values(size_t(rows) * C, rng);
  Buffer bx(x.size(), dt), bb(C, dt), br(residual.size(), dt), bg(C, dt), bbeta(C, dt), bdy(dy.size(), dt);
  bx.upload(x), bb.upload(bias), br.upload(residual), bg.upload(gamma), bbeta.upload(beta), bdy.upload(dy);
  expect_counter_decides_the_offset(dt, [&](uint64_t offset, const uint64_t* counter) {
    const Dropout d{kP, kSeed, offset, counter};
    Buffer y(x.size(), dt), dx(x.size(), dt), dres(x.size(), dt), dbias(C, dt), dgamma(C, dt), dbeta(C, dt);
    float *mean = nullptr, *rstd = nullptr;
    cudaMalloc(&mean, rows * 4);
    cudaMalloc(&rstd, rows * 4);
    BiasDropoutResidualForwardTensors f;
    f.x = bx.get(), f.bias = bb.get(), f.residual = br.get(), f.gamma = bg.get(), f.beta = bbeta.get();
    f.y = y.get(), f.mean = mean, f.rstd = rstd;
    bias_dropout_residual_layernorm_forward(dt, ResidualOrder::post_ln, f, d, rows, C, 1e-5f, nullptr);
    BiasDropoutResidualBackwardTensors b;
    b.dy = bdy.get(), b.x = bx.get(), b.bias = bb.get(), b.residual = br.get(), b.gamma = bg.get();
    b.mean = mean, b.rstd = rstd, b.dx = dx.get(), b.dresidual = dres.get(), b.dbias = dbias.get();
    b.dgamma = dgamma.get(), b.dbeta = dbeta.get();
    void* workspace = nullptr;
    cudaMalloc(&workspace, bias_dropout_residual_layernorm_backward_workspace_bytes(rows, C));
    bias_dropout_residual_layernorm_backward(dt, ResidualOrder::post_ln, b, d, rows, C, workspace, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    Written out;
    for (const Buffer* exact : {&y, &dx, &dres}) append(out.exact, *exact);
    for (const Buffer* summed : {&dbias, &dgamma, &dbeta}) append(out.summed, *summed);
    cudaFree(workspace), cudaFree(mean), cudaFree(rstd);
    return out;
  });
}

TEST_P(DropoutCounterTest, EmbeddingLayerNorm) {
  FUSEKIT_REQUIRE_GPU();
  const DType dt = GetParam();
  const EmbeddingLayerNormSizes sizes{3 * 61, 768, 1000, 64, 2};
  std::mt19937_64 rng(std::random_device{}());
  std::vector<int64_t> words(sizes.tokens), positions(sizes.tokens), types(sizes.tokens);
  std::uniform_int_distribution<int64_t> word(0, sizes.vocab - 1);
  for (int t = 0; t < sizes.tokens; ++t) words[t] = word(rng), positions[t] = t % 61, types[t] = t % 2;
  int64_t* ids = nullptr;
  ASSERT_EQ(cudaMalloc(&ids, 3 * sizes.tokens * sizeof(int64_t)), cudaSuccess);
  cudaMemcpy(ids, words.data(), sizes.tokens * 8, cudaMemcpyHostToDevice);
  cudaMemcpy(ids + sizes.tokens, positions.data(), sizes.tokens * 8, cudaMemcpyHostToDevice);
  cudaMemcpy(ids + 2 * sizes.tokens, types.data(), sizes.tokens * 8, cudaMemcpyHostToDevice);
  const size_t H = sizes.hidden;
  std::vector<double> w = random_values(sizes.vocab * H, rng), p = random_values(sizes.max_positions * H, rng),
                      ty = random_values(sizes.token_types * H, rng), gamma = random_values(H, rng),
                      beta = random_values(H, rng), dy = random_values(sizes.tokens * H, rng);
  Buffer bw(w.size(), dt), bp(p.size(), dt), bt(ty.size(), dt), bg(H, dt), bbeta(H, dt), bdy(dy.size(), dt);
  bw.upload(w), bp.upload(p), bt.upload(ty), bg.upload(gamma), bbeta.upload(beta), bdy.upload(dy);
  expect_counter_decides_the_offset(dt, [&](uint64_t offset, const uint64_t* counter) {
    const Dropout d{kP, kSeed, offset, counter};
    Buffer y(dy.size(), dt), dword(w.size(), dt), dpos(p.size(), dt), dtype(ty.size(), dt), dgamma(H, dt), dbeta(H, dt);
    float *mean = nullptr, *rstd = nullptr;
    cudaMalloc(&mean, sizes.tokens * 4);
    cudaMalloc(&rstd, sizes.tokens * 4);
    void* workspace = nullptr;
    cudaMalloc(&workspace, embedding_layernorm_backward_workspace_bytes(sizes));
    EmbeddingLayerNormForwardTensors f;  // the training forward: it counts the ids for the backward
    f.word_ids = ids, f.position_ids = ids + sizes.tokens, f.token_type_ids = ids + 2 * sizes.tokens;
    f.word = bw.get(), f.position = bp.get(), f.token_type = bt.get(), f.gamma = bg.get(), f.beta = bbeta.get();
    f.y = y.get(), f.mean = mean, f.rstd = rstd;
    f.backward_workspace = workspace;
    embedding_layernorm_forward(dt, f, d, sizes, 1e-12f, nullptr);
    EmbeddingLayerNormBackwardTensors b;
    b.dy = bdy.get(), b.word_ids = f.word_ids, b.position_ids = f.position_ids, b.token_type_ids = f.token_type_ids;
    b.word = f.word, b.position = f.position, b.token_type = f.token_type, b.gamma = f.gamma;
    b.mean = mean, b.rstd = rstd, b.dword = dword.get(), b.dposition = dpos.get(), b.dtoken_type = dtype.get();
    b.dgamma = dgamma.get(), b.dbeta = dbeta.get();
    b.ids_counted = true;
    embedding_layernorm_backward(dt, b, d, sizes, workspace, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    Written out;
    append(out.exact, y);
    for (const Buffer* summed : {&dword, &dpos, &dtype, &dgamma, &dbeta}) append(out.summed, *summed);
    cudaFree(workspace), cudaFree(mean), cudaFree(rstd);
    return out;
  });
  cudaFree(ids);
}

// The counter advanced on the stream right before the launch, no synchronization between: the
// kernel reads the advanced value (as a captured BERT step runs: the advance, then the embeddings).
TEST_P(DropoutCounterTest, ReadsTheCounterTheStreamJustAdvanced) {
  FUSEKIT_REQUIRE_GPU();
  const DType dt = GetParam();
  const int rows = 64, C = 1024;
  std::mt19937_64 rng(std::random_device{}());
  std::vector<double> x = random_values(size_t(rows) * C, rng), bias = random_values(C, rng),
                      residual = random_values(size_t(rows) * C, rng), gamma = random_values(C, rng),
                      beta = random_values(C, rng);
  Buffer bx(x.size(), dt), bb(C, dt), br(residual.size(), dt), bg(C, dt), bbeta(C, dt);
  bx.upload(x), bb.upload(bias), br.upload(residual), bg.upload(gamma), bbeta.upload(beta);
  float *mean = nullptr, *rstd = nullptr;
  ASSERT_EQ(cudaMalloc(&mean, rows * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&rstd, rows * 4), cudaSuccess);
  auto forward = [&](const Dropout& d) {
    Buffer y(x.size(), dt);
    BiasDropoutResidualForwardTensors f;
    f.x = bx.get(), f.bias = bb.get(), f.residual = br.get(), f.gamma = bg.get(), f.beta = bbeta.get();
    f.y = y.get(), f.mean = mean, f.rstd = rstd;
    bias_dropout_residual_layernorm_forward(dt, ResidualOrder::post_ln, f, d, rows, C, 1e-5f, nullptr);
    return y.download();  // synchronizes
  };
  const std::vector<double> plain = forward({kP, kSeed, 7});
  Counter counter(3);
  advance_step_counter(counter.word(), nullptr);  // 4, in stream order: no host wait before the launch
  const std::vector<double> counted = forward({kP, kSeed, 3, counter.get()});
  size_t differing = 0;
  for (size_t i = 0; i < plain.size(); ++i) differing += plain[i] != counted[i];
  EXPECT_EQ(differing, 0u) << "the kernel read the counter before the advance landed";
  cudaFree(mean), cudaFree(rstd);
}

// Both backward paths: one kernel (seq <= 128) and two (seq 200).
class DropoutCounterAttentionTest : public ::testing::TestWithParam<std::tuple<DType, int>> {};

TEST_P(DropoutCounterAttentionTest, BertAttention) {
  FUSEKIT_REQUIRE_GPU();
  const DType dt = std::get<0>(GetParam());
  const BertAttentionShape s{3, 2, std::get<1>(GetParam()), 64};
  std::mt19937_64 rng(std::random_device{}());
  const size_t tokens = size_t(s.batch) * s.seq, width = size_t(s.heads) * s.head_dim;
  std::vector<double> qkv = random_values(tokens * 3 * width, rng), dout = random_values(tokens * width, rng);
  Buffer bqkv(qkv.size(), dt), bdout(dout.size(), dt);
  bqkv.upload(qkv), bdout.upload(dout);
  const std::vector<int32_t> lengths = {s.seq, s.seq - 5, 1};
  int32_t* valid = nullptr;
  ASSERT_EQ(cudaMalloc(&valid, lengths.size() * 4), cudaSuccess);
  cudaMemcpy(valid, lengths.data(), lengths.size() * 4, cudaMemcpyHostToDevice);
  const size_t rows = size_t(s.batch) * s.heads * s.seq;
  expect_counter_decides_the_offset(dt, [&](uint64_t offset, const uint64_t* counter) {
    const BertAttentionDropout d{kP, kSeed, offset, counter};
    Buffer out(dout.size(), dt), dqkv(qkv.size(), dt);
    float *lse = nullptr, *workspace = nullptr;
    cudaMalloc(&lse, rows * 4);
    cudaMalloc(&workspace, bert_attention_backward_workspace_bytes(s) + 4);
    const float scale = 0.125f;
    bert_attention_forward(dt, bqkv.get(), valid, out.get(), lse, s, scale, d, nullptr);
    bert_attention_backward(dt, bqkv.get(), valid, out.get(), lse, bdout.get(), dqkv.get(), workspace, s, scale, d,
                            nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    Written all;  // no atomics: dQ, dK and dV are sums in a fixed order
    append(all.exact, out);
    append(all.exact, dqkv);
    cudaFree(lse), cudaFree(workspace);
    return all;
  });
  cudaFree(valid);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DropoutCounterTest, ::testing::Values(DType::f16, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });
INSTANTIATE_TEST_SUITE_P(Shapes, DropoutCounterAttentionTest,
                         ::testing::Combine(::testing::Values(DType::f16, DType::bf16), ::testing::Values(128, 200)),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_seq" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace fusekit::kernels
