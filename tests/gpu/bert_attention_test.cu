// BERT attention forward and backward against the float64 reference, on fresh random inputs with
// every output (out, lse, dqkv and the backward's workspace) poisoned (NaN) before the run: fp16 and
// bf16; head dims 32, 64 and 128; sequences of 1, 50, 64, 65, 77, 100, 128, 130, 333 and 512 tokens
// (tail tiles, several key and query tiles, both backward paths); per-sequence valid lengths with
// one sequence fully valid, one with no valid key at all, lengths at the tiles' edges and lengths
// the kernels clamp (past seq, negative); dropout p = 0, 0.1 and 0.9, the reference applying the
// same Philox mask, regenerated on the host from kernels/detail/philox.cuh; scores at 4x the usual scale.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "device_buffers.h"
#include "gpu_test_support.h"
#include "kernels/bert_attention.h"
#include "kernels/reference/bert_attention.h"

namespace fusekit::kernels {
namespace {

// A float device buffer poisoned with NaN.
class FloatBuffer {
 public:
  explicit FloatBuffer(size_t count) : count_(count) {
    EXPECT_EQ(cudaMalloc(&data_, std::max<size_t>(1, count * sizeof(float))), cudaSuccess);
    cudaMemset(data_, 0xFF, count * sizeof(float));
  }
  ~FloatBuffer() { cudaFree(data_); }
  float* get() const { return data_; }
  std::vector<double> download() const { return download_floats(data_, count_); }

 private:
  float* data_ = nullptr;
  size_t count_;
};

struct Case {
  int batch;
  int heads;
  int seq;
  int head_dim;
  float p;
  double scale_factor = 1.0;  // scale = scale_factor / sqrt(head_dim)
};

// The rows of part `part` (0 q, 1 k, 2 v) of a packed [rows, 3, heads * head_dim] tensor.
std::vector<double> part_of(const std::vector<double>& packed, size_t rows, size_t per_row, int part) {
  std::vector<double> out;
  for (size_t r = 0; r < rows; ++r) {
    for (size_t e = 0; e < per_row; ++e) out.push_back(packed[(r * 3 + part) * per_row + e]);
  }
  return out;
}

// The bound on dqkv (or a part of it) against the float64 reference `want`. The fused backward takes
// D_i = dO_i . O_i from O as stored, rounded to the dtype (FlashAttention's identity: exact for the
// exact O, dropout included, tests/cpu), and dS = P (dP - D) inherits that rounding, which no kernel
// reading the stored O avoids. It is small next to dS, except where dS itself is 0 or nearly: with
// one key, P = 1 and dS, dQ and dK are exactly 0 in the reference, and all that remains of dQ and dK
// is that rounding. So the bound is the dtype's, or twice the error of `with_stored_o`, the
// reference that takes D from the stored O, where that is larger (as storage_tolerance allows twice
// the rounding of the output itself).
double gradient_bound(const std::vector<double>& want, const std::vector<double>& with_stored_o, DType dtype) {
  return std::max(storage_tolerance(want, dtype), 2 * relative_error(with_stored_o, want));
}

class BertAttentionTest : public ::testing::TestWithParam<std::tuple<DType, Case>> {};

TEST_P(BertAttentionTest, ForwardAndBackwardMatchFloat64Reference) {
  FUSEKIT_REQUIRE_GPU();
  const auto [dtype, c] = GetParam();
  const BertAttentionShape shape{c.batch, c.heads, c.seq, c.head_dim};
  const reference::BertAttentionSizes sizes{c.batch, c.heads, c.seq, c.head_dim};
  const size_t rows = static_cast<size_t>(c.batch) * c.seq, per_row = static_cast<size_t>(c.heads) * c.head_dim;
  const size_t qkv_count = rows * 3 * per_row, out_count = rows * per_row;
  const double scale = c.scale_factor / std::sqrt(static_cast<double>(c.head_dim));
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("inputs from seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  const BertAttentionDropout dropout{c.p, rng(), rng() % 1000};

  // Sequence 0 fully valid, sequence 1 (where there is one) with no valid key, sequence 2 random;
  // from sequence 3 on, as far as the batch reaches, lengths at the edges of the 16-key steps and
  // the 64-row tiles (1, 16, 64, 65, seq - 1) and two that the kernels clamp (seq + 7 to seq, -3 to
  // 0), then random ones. The reference clamps as the kernels do; `valid` holds the clamped values.
  std::vector<int> given(c.batch), valid(c.batch);
  std::uniform_int_distribution<int> length(1, c.seq);
  const int edges[] = {1, 16, 64, 65, c.seq - 1, c.seq + 7, -3};
  for (int b = 0; b < c.batch; ++b) {
    given[b] = b == 0 ? c.seq : b == 1 ? 0 : b >= 3 && b - 3 < 7 ? edges[b - 3] : length(rng);
    valid[b] = std::clamp(given[b], 0, c.seq);
  }
  const std::vector<int32_t> valid32(given.begin(), given.end());

  std::vector<double> qkv(qkv_count), dout(out_count);
  for (auto& v : qkv) v = normal(rng);
  for (auto& v : dout) v = normal(rng);
  Buffer qkv_buffer(qkv_count, dtype), dout_buffer(out_count, dtype);
  Buffer out_buffer(out_count, dtype), dqkv_buffer(qkv_count, dtype);
  qkv_buffer.upload(qkv);  // qkv and dout now hold the values stored in the dtype
  dout_buffer.upload(dout);
  FloatBuffer lse_buffer(rows * c.heads), workspace(bert_attention_backward_workspace_bytes(shape) / sizeof(float));
  int32_t* lengths = nullptr;
  CHECK_CUDA(cudaMalloc(&lengths, c.batch * sizeof(int32_t)));
  CHECK_CUDA(cudaMemcpy(lengths, valid32.data(), c.batch * sizeof(int32_t), cudaMemcpyHostToDevice));

  bert_attention_forward(dtype, qkv_buffer.get(), lengths, out_buffer.get(), lse_buffer.get(), shape,
                         static_cast<float>(scale), dropout, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<double> out = out_buffer.download(), lse = lse_buffer.download();
  // The backward reads the forward's out as stored (D = rowsum(dO * O)).
  bert_attention_backward(dtype, qkv_buffer.get(), lengths, out_buffer.get(), lse_buffer.get(), dout_buffer.get(),
                          dqkv_buffer.get(), workspace.get(), shape, static_cast<float>(scale), dropout, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaFree(lengths);
  const std::vector<double> dqkv = dqkv_buffer.download();

  const std::vector<double> m =
      reference::bert_attention_dropout_multipliers(sizes, dropout.p, dropout.seed, dropout.offset);
  const auto ref = reference::bert_attention_forward(qkv, given, m, sizes, scale);
  const auto dqkv_ref = reference::bert_attention_backward(qkv, given, m, dout, sizes, scale);

  EXPECT_LT(relative_error(out, ref.out), storage_tolerance(ref.out, dtype)) << "out";
  // lse is float, from scores of stored inputs with float accumulation: float's bound.
  EXPECT_LT(relative_error(lse, ref.lse), tolerance(DType::f32)) << "lse";
  // The gradients' bound allows for the rounding of the stored O that D is taken from (see
  // gradient_bound): the reference that takes D from that O measures it.
  const auto dqkv_stored_o = reference::bert_attention_backward(qkv, given, m, dout, sizes, scale, out);
  EXPECT_LT(relative_error(dqkv, dqkv_ref), gradient_bound(dqkv_ref, dqkv_stored_o, dtype)) << "dqkv";
  // Each part of dqkv on its own, so that a wrong dq, dk or dv shows by name.
  const char* names[3] = {"dq", "dk", "dv"};
  for (int part = 0; part < 3; ++part) {
    const std::vector<double> want = part_of(dqkv_ref, rows, per_row, part);
    EXPECT_LT(relative_error(part_of(dqkv, rows, per_row, part), want),
              gradient_bound(want, part_of(dqkv_stored_o, rows, per_row, part), dtype))
        << names[part];
  }

  // Exact zeros: the sequence without valid keys (out, lse, every gradient) and the masked keys'
  // dK and dV.
  size_t nonzero = 0;
  for (int b = 0; b < c.batch; ++b) {
    for (int i = 0; i < c.seq; ++i) {
      const size_t row = static_cast<size_t>(b) * c.seq + i;
      for (size_t e = 0; e < per_row; ++e) {
        if (valid[b] == 0) nonzero += out[row * per_row + e] != 0.0 || dqkv[(row * 3) * per_row + e] != 0.0;
        if (i >= valid[b]) {
          nonzero += dqkv[(row * 3 + 1) * per_row + e] != 0.0 || dqkv[(row * 3 + 2) * per_row + e] != 0.0;
        }
      }
      if (valid[b] == 0) {
        for (int h = 0; h < c.heads; ++h) nonzero += lse[(static_cast<size_t>(b) * c.heads + h) * c.seq + i] != 0.0;
      }
    }
  }
  EXPECT_EQ(nonzero, 0u) << "entries that must be exactly 0 (masked keys, the sequence without valid keys)";

  // The test can see the mask: with p > 0 the reference without dropout is far off.
  if (c.p > 0.f && valid[0] > 1) {
    const auto undropped = reference::bert_attention_forward(qkv, given, {}, sizes, scale);
    EXPECT_GT(relative_error(undropped.out, ref.out), 10 * storage_tolerance(ref.out, dtype));
  }
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<DType, Case>>& info) {
  const auto [dtype, c] = info.param;
  return std::string(dtype_name(dtype)) + "_" + std::to_string(c.batch) + "x" + std::to_string(c.heads) + "x" +
         std::to_string(c.seq) + "x" + std::to_string(c.head_dim) + (c.p > 0.f ? "_dropout" : "") +
         (c.p >= 0.5f ? "_high" : "") + (c.scale_factor != 1.0 ? "_peaked" : "");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, BertAttentionTest,
    ::testing::Combine(::testing::Values(DType::f16, DType::bf16),
                       ::testing::Values(Case{2, 2, 1, 64, 0.f}, Case{2, 2, 1, 32, 0.1f}, Case{3, 2, 77, 32, 0.f},
                                         Case{3, 2, 77, 64, 0.1f}, Case{3, 1, 77, 128, 0.1f}, Case{4, 3, 130, 64, 0.1f},
                                         // The block-per-head backward (seq <= 128, head_dim <= 64):
                                         // its 4-warp (seq <= 64) and 8-warp blocks, full and partial.
                                         Case{3, 2, 128, 64, 0.1f}, Case{3, 2, 100, 32, 0.1f}, Case{3, 2, 64, 64, 0.f},
                                         Case{4, 2, 50, 32, 0.1f}, Case{3, 2, 128, 32, 0.f}, Case{2, 3, 65, 64, 0.1f},
                                         Case{3, 2, 50, 64, 0.1f}, Case{3, 2, 50, 32, 0.f},
                                         // Every edge length (see the test), on both backward paths.
                                         Case{10, 2, 100, 32, 0.1f}, Case{10, 1, 128, 64, 0.f},
                                         Case{10, 1, 333, 64, 0.1f}, Case{3, 2, 333, 64, 0.f},
                                         Case{3, 1, 333, 128, 0.1f}, Case{2, 1, 333, 32, 0.1f},
                                         Case{2, 1, 512, 64, 0.1f}, Case{2, 1, 512, 32, 0.f}, Case{2, 1, 512, 128, 0.f},
                                         // Most elements dropped (1 / (1 - p) = 10), and
                                         // scores 4x the usual scale (a peaked softmax).
                                         Case{2, 2, 77, 64, 0.9f}, Case{3, 2, 130, 64, 0.1f, 4.0},
                                         Case{4, 2, 128, 64, 0.1f, 4.0})),
    case_name);

TEST(BertAttentionErrors, UnsupportedShapesDtypesAndProbabilitiesAreOneClearError) {
  const BertAttentionShape good{8, 12, 128, 64};
  EXPECT_NO_THROW(check_bert_attention(DType::f16, good, 0.f));
  EXPECT_NO_THROW(check_bert_attention(DType::bf16, good, 0.1f));
  EXPECT_NO_THROW(check_bert_attention(DType::f16, {1, 1, 1, 128}, 0.f));
  auto message = [](DType dtype, BertAttentionShape s, float p) {
    try {
      check_bert_attention(dtype, s, p);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(DType::f32, good, 0.f).find("dtype fp32"), std::string::npos);
  EXPECT_NE(message(DType::f16, {8, 12, 128, 48}, 0.f).find("head_dim"), std::string::npos);
  EXPECT_NE(message(DType::f16, {8, 12, 128, 256}, 0.f).find("head_dim"), std::string::npos);
  EXPECT_NE(message(DType::f16, {8, 0, 128, 64}, 0.f).find("heads"), std::string::npos);
  EXPECT_NE(message(DType::f16, {8, 12, 0, 64}, 0.f).find("seq"), std::string::npos);
  EXPECT_NE(message(DType::f16, {-1, 12, 128, 64}, 0.f).find("batch"), std::string::npos);
  EXPECT_NE(message(DType::f16, good, 1.f).find("dropout p"), std::string::npos);
  EXPECT_NE(message(DType::f16, good, -0.1f).find("dropout p"), std::string::npos);
  EXPECT_NE(message(DType::f16, good, NAN).find("dropout p"), std::string::npos);
  // Checked before any launch (so no GPU is needed here): 16-byte alignment.
  char* aligned = reinterpret_cast<char*>(uintptr_t{1} << 20);
  EXPECT_THROW(bert_attention_forward(DType::f16, aligned + 2, nullptr, aligned, nullptr, good, 0.125f, {}, nullptr),
               std::invalid_argument);
  EXPECT_THROW(bert_attention_backward(DType::bf16, aligned, nullptr, aligned, nullptr, aligned + 8, aligned, nullptr,
                                       good, 0.125f, {}, nullptr),
               std::invalid_argument);
  EXPECT_THROW(
      bert_attention_forward(DType::f16, aligned, nullptr, aligned, nullptr, good, 0.125f, {1.5f, 0, 0}, nullptr),
      std::invalid_argument);
  // The scale must be a positive, normal, finite float (the forward takes the running max of the raw
  // scores and scales it).
  for (float scale : {0.f, -0.125f, 1e-40f, NAN, INFINITY}) {
    std::string what = "no error";
    try {
      bert_attention_forward(DType::f16, aligned, nullptr, aligned, nullptr, good, scale, {}, nullptr);
    } catch (const std::invalid_argument& e) {
      what = e.what();
    }
    EXPECT_NE(what.find("scale must be a positive normal finite float"), std::string::npos) << scale << ": " << what;
    EXPECT_THROW(bert_attention_backward(DType::f16, aligned, nullptr, aligned, nullptr, aligned, aligned, nullptr,
                                         good, scale, {}, nullptr),
                 std::invalid_argument);
  }
}

}  // namespace
}  // namespace fusekit::kernels
