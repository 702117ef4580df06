// Error feedback on one GPU against its float64 reference, over several steps on fresh random
// gradients: layers of odd sizes (one of a single element), gaps between layers, scales from 1e-4
// to 1e2, gradients in fp32, fp16 and bf16, wire values in fp16 and bf16, with and without
// momentum correction. Per step: the packed indices increase and lie in their layers, the counts
// are the selection's; with residual accumulation, wire value + residual equals the accumulated
// value exactly and unsent elements keep it exactly; over the steps, sent + residual equals the
// sum of the gradients within one float rounding per step; with momentum, residual, velocity and
// sent values match the reference (DESIGN.md's fp32 bound) and sent + residual equals the sum of
// the velocities. An fp16 value beyond 65504 leaves as 65504 with the rest kept.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "device_buffers.h"
#include "dp/error_feedback.h"
#include "dp/error_feedback_reference.h"
#include "gpu_test_support.h"

namespace fusekit::dp {
namespace {

using kernels::Buffer;
using kernels::DType;

DType wire_dtype(WireValue wire) { return wire == WireValue::f16 ? DType::f16 : DType::bf16; }

float wire_to_float_host(uint16_t bits, WireValue wire) {
  return static_cast<float>(kernels::from_bits(bits, wire_dtype(wire)));
}

// The wire bits of x, rounded to nearest even on the host.
uint16_t float_to_wire_host(float x, WireValue wire) { return kernels::to_bits({x}, wire_dtype(wire))[0]; }

struct Case {
  DType dtype;
  WireValue wire;
  double momentum;
  double density;
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string d = std::to_string(c.density);
  d.erase(d.find_last_not_of('0') + 1);
  for (char& ch : d)
    if (ch == '.') ch = 'p';
  return std::string(kernels::dtype_name(c.dtype)) + "_wire_" + (c.wire == WireValue::f16 ? "fp16" : "bf16") +
         (c.momentum > 0 ? "_momentum" : "_residual") + "_d" + d;
}

class ErrorFeedbackTest : public testing::TestWithParam<Case> {};

TEST_P(ErrorFeedbackTest, MatchesReferenceOverSteps) {
  FUSEKIT_REQUIRE_GPU();
  const Case c = GetParam();
  constexpr int kSteps = 5;
  const std::vector<int64_t> sizes = {1, 7, 1000, 4097, 65537, 300001, 33};
  const std::vector<double> scales = {1e-3, 1.0, 1e-4, 1e2, 0.1, 1e-2, 5.0};
  std::vector<LayerSpan> layers;
  int64_t elements = 0;
  for (size_t l = 0; l < sizes.size(); ++l) {
    elements += static_cast<int64_t>(l % 3);  // gaps of 0, 1 and 2 elements before the layers
    layers.push_back({elements, sizes[l]});
    elements += sizes[l];
  }
  ErrorFeedback feedback(layers, c.density, c.momentum, c.wire);
  ASSERT_EQ(feedback.elements(), static_cast<uint64_t>(elements));
  std::mt19937 rng(static_cast<unsigned>(1000 * c.density) + 17 * static_cast<unsigned>(c.dtype) +
                   3 * static_cast<unsigned>(c.wire) + (c.momentum > 0 ? 101 : 0));

  ErrorFeedbackState reference(elements);
  std::vector<float> residual(elements, 0.f);         // the GPU's v after the last step
  std::vector<double> sent_sum(elements, 0.0);        // sum over steps of the wire values sent
  std::vector<double> added_sum(elements, 0.0);       // sum of g (or of u before its clearing)
  std::vector<double> rounding_bound(elements, 0.0);  // sum over steps of 2^-24 |v + g|
  for (int step = 0; step < kSteps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    std::vector<double> gradient(elements, 0.0);
    for (size_t l = 0; l < layers.size(); ++l) {
      std::normal_distribution<double> normal(0.0, scales[l]);
      for (int64_t i = 0; i < layers[l].size; ++i) gradient[layers[l].offset + i] = normal(rng);
    }
    Buffer gradient_device(elements, c.dtype);
    gradient_device.upload(gradient);  // gradient now holds the stored values
    const uint64_t count = feedback.step(gradient_device.get(), c.dtype, c.density, nullptr);
    CHECK_CUDA(cudaDeviceSynchronize());

    // Counts: the selection's per layer, each within its tolerance.
    uint64_t expected_count = 0;
    for (size_t l = 0; l < layers.size(); ++l) {
      const LayerSelectionResult& r = feedback.layer_results()[l];
      EXPECT_GE(r.count, selection_low(r.k)) << "layer " << l;
      EXPECT_LE(r.count, selection_cap(r.k)) << "layer " << l;
      expected_count += static_cast<uint64_t>(r.count);
    }
    ASSERT_EQ(count, expected_count);
    ASSERT_EQ(feedback.count(), count);

    std::vector<uint32_t> indices(count);
    std::vector<uint16_t> values(count);
    std::vector<float> new_residual(elements), velocity;
    CHECK_CUDA(cudaMemcpy(indices.data(), feedback.indices(), count * 4, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(values.data(), feedback.values(), count * 2, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(new_residual.data(), feedback.residual(), elements * 4, cudaMemcpyDeviceToHost));
    if (c.momentum > 0) {
      velocity.resize(elements);
      CHECK_CUDA(cudaMemcpy(velocity.data(), feedback.momentum(), elements * 4, cudaMemcpyDeviceToHost));
    }
    // The packed indices: strictly increasing, each inside a layer.
    size_t layer = 0;
    for (uint64_t e = 0; e < count; ++e) {
      if (e > 0) ASSERT_LT(indices[e - 1], indices[e]) << "entry " << e;
      while (layer < layers.size() && indices[e] >= static_cast<uint64_t>(layers[layer].offset + layers[layer].size))
        ++layer;
      ASSERT_LT(layer, layers.size()) << "entry " << e;
      ASSERT_GE(indices[e], static_cast<uint64_t>(layers[layer].offset)) << "entry " << e << " in a gap";
    }

    for (int64_t i = 0; i < elements; ++i) {
      const double added = c.momentum > 0 ? c.momentum * reference.momentum[i] + gradient[i] : gradient[i];
      added_sum[i] += added;
      rounding_bound[i] += std::ldexp(std::fabs(reference.residual[i] + added), -24);
    }
    // The reference keeps each sent entry's wire-rounding remainder in its residual, as the GPU does.
    std::vector<double> wire_values(count);
    for (uint64_t e = 0; e < count; ++e) wire_values[e] = wire_to_float_host(values[e], c.wire);
    const std::vector<double> sent =
        error_feedback_step_reference(reference, gradient, c.momentum, indices, wire_values);
    std::vector<bool> selected(elements, false);
    for (uint64_t e = 0; e < count; ++e) {
      const uint32_t i = indices[e];
      selected[i] = true;
      sent_sum[i] += wire_to_float_host(values[e], c.wire);
    }

    if (c.momentum == 0) {
      // The GPU's own float step, exactly: acc = v + g (one float addition); sent elements leave
      // as wire value + remainder, unsent ones keep acc.
      for (uint64_t e = 0; e < count; ++e) {
        const uint32_t i = indices[e];
        const float acc = residual[i] + static_cast<float>(gradient[i]);
        const float w = wire_to_float_host(values[e], c.wire);
        ASSERT_EQ(w + new_residual[i], acc) << "element " << i << ": wire " << w << " + " << new_residual[i];
        ASSERT_EQ(values[e], float_to_wire_host(acc, c.wire)) << "element " << i;
      }
      for (int64_t i = 0; i < elements; ++i) {
        if (selected[i]) continue;
        ASSERT_EQ(new_residual[i], residual[i] + static_cast<float>(gradient[i])) << "element " << i;
      }
    } else {
      // Against the float64 reference with the GPU's selections: DESIGN.md's fp32 bound.
      std::vector<double> gpu_v(new_residual.begin(), new_residual.end()), gpu_u(velocity.begin(), velocity.end());
      EXPECT_LT(kernels::relative_error(gpu_v, reference.residual), 1e-5);
      EXPECT_LT(kernels::relative_error(gpu_u, reference.momentum), 1e-5);
      std::vector<double> gpu_sent(count);
      for (uint64_t e = 0; e < count; ++e) {
        gpu_sent[e] = wire_to_float_host(values[e], c.wire) + static_cast<double>(new_residual[indices[e]]);
        ASSERT_EQ(velocity[indices[e]], 0.f) << "element " << indices[e] << ": velocity not cleared";
      }
      // wire value + remainder is the accumulated value the GPU sent.
      EXPECT_LT(kernels::relative_error(gpu_sent, sent), 1e-5);
    }
    residual = new_residual;
  }

  // Nothing lost: sent + residual equals what was added, within the float roundings of v += g.
  std::vector<double> kept(elements);
  for (int64_t i = 0; i < elements; ++i) kept[i] = sent_sum[i] + residual[i];
  if (c.momentum == 0) {
    for (int64_t i = 0; i < elements; ++i) {
      ASSERT_LE(std::fabs(kept[i] - added_sum[i]), rounding_bound[i] * 1.0001 + 1e-30) << "element " << i;
    }
  } else {
    EXPECT_LT(kernels::relative_error(kept, added_sum), 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layers, ErrorFeedbackTest,
    testing::Values(Case{DType::f32, WireValue::f16, 0.0, 0.01}, Case{DType::f32, WireValue::bf16, 0.0, 0.001},
                    Case{DType::f16, WireValue::f16, 0.0, 0.1}, Case{DType::bf16, WireValue::bf16, 0.0, 0.01},
                    Case{DType::f32, WireValue::f16, 0.9, 0.01}, Case{DType::bf16, WireValue::bf16, 0.9, 0.001},
                    Case{DType::f16, WireValue::f16, 0.9, 0.1}),
    case_name);

// An fp16 wire value saturates at 65504; the rest of the value stays in the residual.
TEST(ErrorFeedbackSaturation, LargeValuesKeepTheirExcess) {
  FUSEKIT_REQUIRE_GPU();
  const int64_t n = 100;
  ErrorFeedback feedback({{0, n}}, 0.01, 0.0, WireValue::f16);
  std::vector<double> gradient(n, 1e-3);
  gradient[42] = -1e6;
  Buffer gradient_device(n, DType::f32);
  gradient_device.upload(gradient);
  ASSERT_EQ(feedback.step(gradient_device.get(), DType::f32, 0.01, nullptr), 1u);
  uint32_t index = 0;
  uint16_t value = 0;
  float kept = 0;
  CHECK_CUDA(cudaMemcpy(&index, feedback.indices(), 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(&value, feedback.values(), 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(&kept, feedback.residual() + 42, 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(index, 42u);
  EXPECT_EQ(value, 0xFBFFu);  // -65504 in fp16
  EXPECT_EQ(kept, -1e6f + 65504.f);
}

TEST(ErrorFeedbackLayers, OutOfOrderOrOverlappingLayersAreRefused) {
  FUSEKIT_REQUIRE_GPU();
  EXPECT_THROW(ErrorFeedback({{100, 10}, {0, 10}}, 0.01, 0.0, WireValue::f16), std::invalid_argument);
  EXPECT_THROW(ErrorFeedback({{0, 10}, {5, 10}}, 0.01, 0.0, WireValue::f16), std::invalid_argument);
  EXPECT_THROW(ErrorFeedback({{0, 10}}, 0.01, 1.0, WireValue::f16), std::invalid_argument);
}

}  // namespace
}  // namespace fusekit::dp
