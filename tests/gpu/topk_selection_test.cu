// The layer-wise top-k selection against its host references on fresh random inputs, outputs
// poisoned first: layers of odd sizes, of one element, unaligned offsets, scales from 1e-6 to 1e3
// (a global threshold would starve the small ones), and a layer of more than 256 tiles. Per layer:
// the selected set is exactly {|x| >= t} for the threshold the kernel reports and, up to ties at
// t, the exact top count; the count lies in [ceil(0.8 k), floor(1.25 k)]; pairs come in increasing
// index order; and sent + residual == gradient + old residual exactly, over two steps of error
// feedback.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "device_buffers.h"
#include "dp/topk_selection.h"
#include "dp/topk_selection_reference.h"
#include "gpu_test_support.h"

namespace fusekit::dp {
namespace {

using kernels::Buffer;
using kernels::DType;

struct Case {
  DType dtype;
  double density;
  bool aligned_offsets;  // every layer starts on a multiple of 4 elements (the vector path)
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  std::string d = std::to_string(info.param.density);
  d.erase(d.find_last_not_of('0') + 1);
  for (char& c : d)
    if (c == '.') c = 'p';
  return std::string(kernels::dtype_name(info.param.dtype)) + "_d" + d +
         (info.param.aligned_offsets ? "_aligned" : "_packed");
}

class TopkSelectionTest : public testing::TestWithParam<Case> {};

TEST_P(TopkSelectionTest, MatchesReferences) {
  FUSEKIT_REQUIRE_GPU();
  const Case c = GetParam();
  // 2,100,001 elements: 257 tiles, more than one block-wide step of the scan over a layer's tiles.
  const std::vector<int64_t> sizes = {1, 7, 1000, 4097, 65537, 300001, 33, 8192, 8193, 2, 2100001};
  const std::vector<double> scales = {1e-3, 1.0, 1e-6, 1e3, 0.1, 1e-2, 5.0, 1e-4, 1e2, 1.0, 3e-5};
  std::vector<LayerSpan> layers;
  int64_t elements = 0;
  for (int64_t size : sizes) {
    if (c.aligned_offsets) elements = (elements + 3) / 4 * 4;
    layers.push_back({elements, size});
    elements += size;
  }
  TopkSelection selection(layers, c.density);
  std::mt19937 rng(static_cast<unsigned>(1000 * c.density) + static_cast<unsigned>(c.dtype) * 7 + c.aligned_offsets);

  // The old residual starts as random values too (earlier steps' remainders).
  std::vector<float> residual(elements, 0.f);
  for (size_t l = 0; l < layers.size(); ++l) {
    std::normal_distribution<float> normal(0.f, static_cast<float>(0.3 * scales[l]));
    for (int64_t i = 0; i < layers[l].size; ++i) residual[layers[l].offset + i] = normal(rng);
  }
  float* residual_device = nullptr;
  CHECK_CUDA(cudaMalloc(&residual_device, elements * sizeof(float)));
  CHECK_CUDA(cudaMemcpy(residual_device, residual.data(), elements * sizeof(float), cudaMemcpyHostToDevice));

  for (int step = 0; step < 2; ++step) {
    std::vector<double> gradient(elements, 0.0);
    for (size_t l = 0; l < layers.size(); ++l) {
      std::normal_distribution<double> normal(0.0, scales[l]);
      for (int64_t i = 0; i < layers[l].size; ++i) gradient[layers[l].offset + i] = normal(rng);
    }
    Buffer gradient_device(elements, c.dtype);
    gradient_device.upload(gradient);  // gradient now holds the stored values
    CHECK_CUDA(cudaMemset(const_cast<int32_t*>(selection.indices()), 0xFF, selection.output_capacity() * 4));
    CHECK_CUDA(cudaMemset(const_cast<float*>(selection.values()), 0xFF, selection.output_capacity() * 4));

    selection.select(gradient_device.get(), c.dtype, residual_device, c.density, nullptr);
    const std::vector<LayerSelectionResult> results = selection.results(nullptr);
    CHECK_CUDA(cudaGetLastError());

    std::vector<float> accumulated(elements), new_residual(elements);
    for (int64_t i = 0; i < elements; ++i) accumulated[i] = residual[i] + static_cast<float>(gradient[i]);
    CHECK_CUDA(cudaMemcpy(new_residual.data(), residual_device, elements * sizeof(float), cudaMemcpyDeviceToHost));
    std::vector<int32_t> indices(selection.output_capacity());
    std::vector<float> values(selection.output_capacity());
    CHECK_CUDA(cudaMemcpy(indices.data(), selection.indices(), indices.size() * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(values.data(), selection.values(), values.size() * 4, cudaMemcpyDeviceToHost));

    for (size_t l = 0; l < layers.size(); ++l) {
      const LayerSpan& layer = layers[l];
      const LayerSelectionResult& r = results[l];
      SCOPED_TRACE("step " + std::to_string(step) + ", layer " + std::to_string(l) + " of " +
                   std::to_string(layer.size) + ", k " + std::to_string(r.k) + ", count " + std::to_string(r.count) +
                   ", threshold " + std::to_string(r.threshold) + ", passes " + std::to_string(r.passes));
      const int64_t k = static_cast<int64_t>(selected_entries(layer.size, c.density));
      ASSERT_EQ(r.k, k);
      EXPECT_GE(r.passes, 1);
      EXPECT_LE(r.passes, kSelectionPasses);
      // Random continuous data has no ties: the tolerance holds in every layer.
      EXPECT_GE(r.count, selection_low(k));
      EXPECT_LE(r.count, selection_cap(k));
      const float* acc = accumulated.data() + layer.offset;
      const std::vector<uint32_t> expected = select_at_threshold(acc, layer.size, r.threshold);
      ASSERT_EQ(static_cast<int64_t>(expected.size()), r.count);
      // The pairs: exactly the threshold's set, in increasing order, with the accumulated values.
      for (int64_t j = 0; j < r.count; ++j) {
        ASSERT_EQ(indices[r.output_offset + j], static_cast<int32_t>(expected[j])) << "entry " << j;
        ASSERT_EQ(std::memcmp(&values[r.output_offset + j], &acc[expected[j]], 4), 0) << "entry " << j;
      }
      // Up to ties at the threshold, the exact top count.
      EXPECT_EQ(exact_topk(acc, layer.size, static_cast<size_t>(r.count)), expected);
      // Error feedback: sent + residual == gradient + old residual, element by element.
      std::vector<float> sent(layer.size, 0.f);
      for (uint32_t i : expected) sent[i] = acc[i];
      for (int64_t i = 0; i < layer.size; ++i) {
        const float kept = new_residual[layer.offset + i];
        ASSERT_EQ(sent[i] == 0.f ? kept : sent[i] + kept, acc[i]) << "element " << i;
        if (sent[i] != 0.f) ASSERT_EQ(kept, 0.f) << "element " << i;
      }
    }
    residual = new_residual;
  }
  cudaFree(residual_device);
}

INSTANTIATE_TEST_SUITE_P(Layers, TopkSelectionTest,
                         testing::Values(Case{DType::f32, 0.01, true}, Case{DType::f32, 0.001, false},
                                         Case{DType::f16, 0.01, false}, Case{DType::f16, 0.1, true},
                                         Case{DType::bf16, 0.0001, true}, Case{DType::bf16, 0.01, false}),
                         case_name);

// With AdamW's frozen second moment v the selection ranks by the step each entry would take,
// |x| / (sqrt(v) + eps): exactly the host's float score set at the reported threshold (IEEE
// division and square root on both sides), the values still the residual's, and a different set
// from the plain |x| ranking where v varies over orders of magnitude (zeros included).
class TopkSelectionByStep : public testing::TestWithParam<bool> {};  // aligned offsets (the vector path)

TEST_P(TopkSelectionByStep, RanksByTheStepWithAFrozenSecondMoment) {
  FUSEKIT_REQUIRE_GPU();
  const std::vector<int64_t> sizes =
      GetParam() ? std::vector<int64_t>{8, 4096, 65536, 300000} : std::vector<int64_t>{5, 4097, 65537, 300001};
  std::vector<LayerSpan> layers;
  int64_t elements = 0;
  for (int64_t size : sizes) {
    layers.push_back({elements, size});
    elements += size;
  }
  const double density = 0.01;
  const float eps = 1e-6f;
  TopkSelection selection(layers, density);
  std::mt19937 rng(77);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> uniform(0.f, 1.f);
  std::vector<float> gradient(elements), v(elements);
  for (int64_t i = 0; i < elements; ++i) {
    gradient[i] = normal(rng) * 1e-3f;
    v[i] = uniform(rng) < 0.01f ? 0.f : std::exp(3.f * normal(rng)) * 1e-8f;
  }
  Buffer gradient_device(elements, DType::f32);
  std::vector<double> stored(gradient.begin(), gradient.end());
  gradient_device.upload(stored);
  float *residual = nullptr, *v_device = nullptr;
  CHECK_CUDA(cudaMalloc(&residual, elements * sizeof(float)));
  CHECK_CUDA(cudaMemset(residual, 0, elements * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&v_device, elements * sizeof(float)));
  CHECK_CUDA(cudaMemcpy(v_device, v.data(), elements * sizeof(float), cudaMemcpyHostToDevice));
  EXPECT_THROW(selection.select(gradient_device.get(), DType::f32, residual, density, nullptr, v_device, 0.f),
               std::invalid_argument);
  CHECK_CUDA(cudaMemset(const_cast<int32_t*>(selection.indices()), 0xFF, selection.output_capacity() * 4));
  selection.select(gradient_device.get(), DType::f32, residual, density, nullptr, v_device, eps);
  const std::vector<LayerSelectionResult> results = selection.results(nullptr);
  CHECK_CUDA(cudaGetLastError());
  std::vector<int32_t> indices(selection.output_capacity());
  std::vector<float> values(selection.output_capacity()), new_residual(elements);
  CHECK_CUDA(cudaMemcpy(indices.data(), selection.indices(), indices.size() * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(values.data(), selection.values(), values.size() * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(new_residual.data(), residual, elements * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerSpan& layer = layers[l];
    const LayerSelectionResult& r = results[l];
    SCOPED_TRACE("layer " + std::to_string(l) + ", count " + std::to_string(r.count));
    EXPECT_GE(r.count, selection_low(r.k));
    EXPECT_LE(r.count, selection_cap(r.k));
    std::vector<float> score(layer.size);
    for (int64_t i = 0; i < layer.size; ++i) {
      const int64_t f = layer.offset + i;
      score[i] = std::fabs(gradient[f]) / (std::sqrt(v[f]) + eps);
    }
    const std::vector<uint32_t> expected = select_at_threshold(score.data(), layer.size, r.threshold);
    ASSERT_EQ(static_cast<int64_t>(expected.size()), r.count);
    for (int64_t j = 0; j < r.count; ++j) {
      ASSERT_EQ(indices[r.output_offset + j], static_cast<int32_t>(expected[j])) << "entry " << j;
      ASSERT_EQ(values[r.output_offset + j], gradient[layer.offset + expected[j]]) << "entry " << j;
      ASSERT_EQ(new_residual[layer.offset + expected[j]], 0.f) << "entry " << j;
    }
    if (layer.size >= 4097) {
      EXPECT_NE(exact_topk(gradient.data() + layer.offset, layer.size, static_cast<size_t>(r.count)), expected)
          << "the ranking by the step chose what the plain ranking does";
    }
  }
  cudaFree(residual);
  cudaFree(v_device);
}

INSTANTIATE_TEST_SUITE_P(Offsets, TopkSelectionByStep, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& info) { return info.param ? "aligned" : "packed"; });

// Ties: a layer whose magnitudes are all equal cannot be cut inside the tolerance; the count stays
// <= cap (here none is selected) and the set is still exactly {|x| >= t}.
TEST(TopkSelectionTies, AllEqualMagnitudesNeverOverflow) {
  FUSEKIT_REQUIRE_GPU();
  const int64_t n = 50000;
  TopkSelection selection({{0, n}}, 0.01);
  std::vector<double> gradient(n);
  for (int64_t i = 0; i < n; ++i) gradient[i] = i % 2 ? 0.5 : -0.5;
  Buffer gradient_device(n, DType::f32);
  gradient_device.upload(gradient);
  float* residual = nullptr;
  CHECK_CUDA(cudaMalloc(&residual, n * sizeof(float)));
  CHECK_CUDA(cudaMemset(residual, 0, n * sizeof(float)));
  selection.select(gradient_device.get(), DType::f32, residual, 0.01, nullptr);
  const auto results = selection.results(nullptr);
  EXPECT_LE(results[0].count, selection_cap(results[0].k));
  std::vector<float> acc(gradient.begin(), gradient.end());
  EXPECT_EQ(static_cast<int64_t>(select_at_threshold(acc.data(), acc.size(), results[0].threshold).size()),
            results[0].count);
  cudaFree(residual);
}

}  // namespace
}  // namespace fusekit::dp
