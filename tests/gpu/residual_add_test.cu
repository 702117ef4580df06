// kernels/residual_add.h against a float64 sum of the stored inputs, on fresh random inputs with the
// output poisoned first; in place (y = a) and out of place; fp32, fp16, bf16; counts that exercise
// the 16-byte body and the element tail, and operands one element off alignment.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "device_buffers.h"
#include "gpu_test_support.h"
#include "kernels/residual_add.h"

namespace fusekit::kernels {
namespace {

class ResidualAddTest : public ::testing::TestWithParam<std::tuple<DType, long long, int, bool>> {};

TEST_P(ResidualAddTest, MatchesTheSum) {
  FUSEKIT_REQUIRE_GPU();
  const auto [dtype, n, offset, in_place] = GetParam();
  std::mt19937_64 rng(21);
  std::normal_distribution<double> normal;
  std::vector<double> a(n + offset), b(n + offset);
  for (double& v : a) v = normal(rng);
  for (double& v : b) v = normal(rng);
  Buffer da(a.size(), dtype), db(b.size(), dtype), dy(a.size(), dtype);
  da.upload(a);
  db.upload(b);
  const size_t bytes = dtype_size(dtype) * offset;
  void* y = in_place ? da.get() : dy.get();
  residual_add(dtype, static_cast<char*>(da.get()) + bytes, static_cast<char*>(db.get()) + bytes,
               static_cast<char*>(y) + bytes, n, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<double> got = (in_place ? da : dy).download();
  std::vector<double> out(got.begin() + offset, got.end()), ref(n);
  for (long long i = 0; i < n; ++i) ref[i] = a[offset + i] + b[offset + i];
  EXPECT_LE(relative_error(out, ref), tolerance(dtype));
}

INSTANTIATE_TEST_SUITE_P(Counts, ResidualAddTest,
                         ::testing::Combine(::testing::Values(DType::f32, DType::f16, DType::bf16),
                                            ::testing::Values(1LL, 7LL, 8LL, 1000003LL, 401408LL * 96),
                                            ::testing::Values(0, 1), ::testing::Bool()));

}  // namespace
}  // namespace fusekit::kernels
