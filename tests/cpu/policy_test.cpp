// The exchange policy on the measured figures of 2x H100 (NVLink and the socket transport):
// dense allreduce of 110M fp16 gradients 0.82 ms / 111.7 ms; all_gather of k fp16 values + k int32
// indices at 0.1% density 0.23 ms / 0.63 ms.
#include "dp/policy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

namespace fusekit::dp {
namespace {

using kernels::DType;

constexpr uint64_t kElements = 110'000'000;
constexpr double kDenseBytes = kElements * 2.0;

// Latency: the 0.1% all_gather is two calls (values, indices) of 0.44 and 0.88 MB gathered, mostly
// latency on NVLink: about 0.1 ms a call; over sockets 0.63 ms less its transfer at 2 GB/s (0.33
// ms), 0.15 ms a call. Bus bandwidth: the dense allreduce's time less that latency (at P = 2,
// busbw = algbw), so the model reproduces the measured allreduce.
const Link kNvlink{kDenseBytes / (0.82e-3 - 0.1e-3), 0.1e-3};
const Link kSockets{kDenseBytes / (111.7e-3 - 0.15e-3), 0.15e-3};
// Selection at torch.topk's rate (2.5 ms for 110M floats), and 20 us of launches per layer.
const SelectionCost kSelection{2.5e-3 / (kElements * 4.0), 20e-6};

TEST(Policy, ReproducesTheMeasuredAllreduce) {
  EXPECT_NEAR(choose_exchange(kNvlink, 2, kElements, DType::f16, 0.01, kSelection).dense_seconds, 0.82e-3, 1e-9);
  EXPECT_NEAR(choose_exchange(kSockets, 2, kElements, DType::f16, 0.01, kSelection).dense_seconds, 111.7e-3, 1e-9);
}

TEST(Policy, NvlinkFullModelIsDense) {
  for (double density : {0.1, 0.01, 0.001, 0.0001}) {
    const ExchangeDecision d = choose_exchange(kNvlink, 2, kElements, DType::f16, density, kSelection);
    EXPECT_FALSE(d.sparse) << d.reason;
    EXPECT_GT(d.sparse_seconds, d.dense_seconds);
    EXPECT_EQ(d.reason.rfind("dense allreduce", 0), 0u) << d.reason;
  }
}

TEST(Policy, SocketsAtOnePercentAreSparse) {
  const ExchangeDecision d = choose_exchange(kSockets, 2, kElements, DType::f16, 0.01, kSelection);
  EXPECT_TRUE(d.sparse) << d.reason;
  EXPECT_EQ(d.k, 1'100'000u);
  EXPECT_EQ(d.encoding, Encoding::delta_varint);
  EXPECT_LT(d.sparse_seconds, 0.1 * d.dense_seconds) << d.reason;
  EXPECT_NEAR(d.sparse_seconds, d.selection_seconds + d.reduce_scatter_seconds + d.allgather_seconds, 1e-12);
  EXPECT_LT(d.sparse_bytes_per_rank, d.dense_bytes_per_rank / 10);
  EXPECT_NE(d.reason.find("sparse delta_varint"), std::string::npos) << d.reason;
  // More ranks: dense costs 2(P-1)/P of the gradient bytes per rank, the sparse exchange grows
  // with the union of the selections; at 1% and 8 ranks it still wins.
  EXPECT_TRUE(choose_exchange(kSockets, 8, kElements, DType::f16, 0.01, kSelection).sparse);
  // Selecting every element is never worth it.
  EXPECT_FALSE(choose_exchange(kSockets, 2, kElements, DType::f16, 1.0, kSelection).sparse);
}

TEST(Policy, TinyLayersAreDenseByLatency) {
  for (const Link& link : {kNvlink, kSockets}) {
    for (uint64_t n : {1ull, 768ull, 3072ull}) {
      const ExchangeDecision d = choose_exchange(link, 2, n, DType::f16, 0.01, kSelection);
      EXPECT_FALSE(d.sparse) << d.reason;
      EXPECT_NE(d.reason.find("latency-bound"), std::string::npos) << d.reason;
    }
  }
}

TEST(Policy, OneRankAndBadInput) {
  const ExchangeDecision d = choose_exchange(kSockets, 1, kElements, DType::f32, 0.01, kSelection);
  EXPECT_FALSE(d.sparse);
  EXPECT_EQ(d.dense_seconds, 0.0);
  EXPECT_EQ(d.reason.rfind("dense: nothing to exchange", 0), 0u);
  EXPECT_THROW(choose_exchange(kSockets, 2, 10, DType::f16, 0.0, kSelection), std::invalid_argument);
  EXPECT_THROW(choose_exchange(Link{0, 0}, 2, 10, DType::f16, 0.1, kSelection), std::invalid_argument);
}

TEST(Policy, DensityWarmup) {
  EXPECT_DOUBLE_EQ(warmup_density(0, 4, 0.25, 0.001), 0.25);
  EXPECT_NEAR(warmup_density(2, 4, 0.25, 0.001), std::sqrt(0.25 * 0.001), 1e-15);
  EXPECT_DOUBLE_EQ(warmup_density(4, 4, 0.25, 0.001), 0.001);
  EXPECT_DOUBLE_EQ(warmup_density(100, 0, 0.25, 0.001), 0.001);
}

}  // namespace
}  // namespace fusekit::dp
