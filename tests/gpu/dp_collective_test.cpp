// The sparse collectives across ranks, one process per GPU. Run once per rank:
//   torchrun --no-python --nproc-per-node=N build/tests/gpu/dp_collective_test
//   mpirun -np N -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 build/tests/gpu/dp_collective_test
// or alone (WORLD_SIZE unset: one rank; ctest runs it so). scripts/dp-check.sh runs 2 and 4 ranks.
//
// Each rank draws its own random gradients over a flat buffer of transformer-like layers (uniform,
// or with the large values clustered in three windows of the first eighth of the index space),
// selects per layer with error feedback (dp/error_feedback.h, top-k of dp/topk_selection.h), and
// runs the three collectives. Checked on every rank, against the dense sum of every rank's selected
// entries (an ncclAllGather of the padded selections, summed on the host in float64):
// - the sparse allgather's fp32 sums within the fp32 rounding of P additions;
// - the balanced and the equal reduce-scatter + allgather: exactly the allgather's sums rounded
//   once to the wire type;
// - the dense allreduce of the same entries within the same bound;
// - every result bitwise the same on every rank;
// - the balanced slices' most loaded rank at most 1.2x the mean, clustered or not;
// - over several steps, each rank's sent + residual equal to the sum of its gradients;
// - entries out of order on one rank make every rank throw, and the next collective still works.
// Rank 0 prints, per collective, the bytes each rank sends (the largest over ranks), the median time
// (of the slowest rank) and the owners' max / mean load. FUSEKIT_DP_ELEMENTS sets the buffer's size
// (default 16,777,259), FUSEKIT_DP_REPS the timed repetitions (default 10).
//
// Every rank runs the same collectives in the same order: each test does its collectives first
// and its host-side checks after, and an unexpected exception inside a collective ends the
// process (exit 1, the launcher stops the others) rather than leave the other ranks blocked.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "dp/communicator.h"
#include "dp/error_feedback.h"
#include "dp/gradient_exchanger.h"
#include "dp/nccl_check.h"
#include "dp/slice_plan.h"  // reselect_count
#include "dp/sparse_collective.h"
#include "dp/sparse_encoding.h"  // float_to_wire, wire_to_float
#include "gpu_test_support.h"
#include "kernels/cuda_check.h"

namespace fusekit::dp {
namespace {

// ---- the process's communicator and small device helpers

Communicator& communicator() {
  static Communicator* c = [] {
    try {
      return new Communicator();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dp_collective_test: %s\n", e.what());
      std::fflush(stderr);
      std::_Exit(1);
    }
  }();
  return *c;
}

// Runs f; an exception ends the process (the other ranks would block in their next collective).
template <class F>
auto collectively(const char* what, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dp_collective_test: rank %d: %s failed: %s\n", communicator().rank(), what, e.what());
    std::fflush(stderr);
    std::_Exit(1);
  }
}

uint64_t env_or(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v == nullptr ? fallback : std::strtoull(v, nullptr, 10);
}

// Device memory for the test's own data. Copies wait for the whole device before and after: the
// communicator's stream does not synchronize with the legacy default stream, and a cudaMemcpy from
// pageable memory may return before its data has landed.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) { FUSEKIT_CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T))); }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return p_; }
  size_t size() const { return n_; }
  std::vector<T> download(size_t count) const { return download_from(p_, count); }
  static std::vector<T> download_from(const T* p, size_t count) {
    std::vector<T> out(count);
    FUSEKIT_CUDA_CHECK(cudaDeviceSynchronize());
    if (count > 0) FUSEKIT_CUDA_CHECK(cudaMemcpy(out.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }
  void upload(const std::vector<T>& v) {
    FUSEKIT_CUDA_CHECK(cudaDeviceSynchronize());
    if (!v.empty()) FUSEKIT_CUDA_CHECK(cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    FUSEKIT_CUDA_CHECK(cudaDeviceSynchronize());
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

void barrier(Communicator& c) {
  static DeviceArray<float> token(1);
  FUSEKIT_NCCL_CHECK(ncclAllReduce(token.get(), token.get(), 1, ncclFloat32, ncclSum, c.comm(), c.stream()));
  FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(c.stream()));
}

// The element-wise max over ranks of host values.
std::vector<double> max_over_ranks(Communicator& c, const std::vector<double>& values) {
  DeviceArray<double> buffer(values.size());
  buffer.upload(values);
  FUSEKIT_NCCL_CHECK(
      ncclAllReduce(buffer.get(), buffer.get(), values.size(), ncclFloat64, ncclMax, c.comm(), c.stream()));
  FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(c.stream()));
  return buffer.download(values.size());
}

// Every rank's value of one 64-bit word.
std::vector<uint64_t> gather_words(Communicator& c, uint64_t word) {
  DeviceArray<uint64_t> mine(1), all(c.size());
  mine.upload({word});
  FUSEKIT_NCCL_CHECK(ncclAllGather(mine.get(), all.get(), 1, ncclUint64, c.comm(), c.stream()));
  FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(c.stream()));
  return all.download(c.size());
}

uint64_t fnv1a(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// Median over `reps` of the slowest rank's wall time of f() (ranks lined up by a barrier first,
// the stream drained after), in milliseconds.
template <class F>
double median_ms(Communicator& c, int reps, F&& f) {
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    barrier(c);
    const auto start = std::chrono::steady_clock::now();
    f();
    FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(c.stream()));
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  times = max_over_ranks(c, times);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// ---- the data

// Transformer-like layers (a BERT-base block's weights and biases, repeated) over `elements`.
std::vector<LayerSpan> transformer_layers(uint64_t elements) {
  const int64_t pattern[] = {768 * 2304, 2304, 768 * 768, 768, 768, 768, 768 * 3072, 3072, 3072 * 768, 768, 768, 768};
  std::vector<LayerSpan> layers;
  int64_t offset = 0;
  for (size_t i = 0; offset < static_cast<int64_t>(elements); ++i) {
    const int64_t size = std::min<int64_t>(pattern[i % std::size(pattern)], static_cast<int64_t>(elements) - offset);
    layers.push_back({offset, size});
    offset += size;
  }
  return layers;
}

// Rank `rank`'s gradient of step `step`: N(0, 1), and where `clustered`, N(0, 30^2) inside three
// windows of 1% of the elements each, all in the first eighth (the same windows on every rank).
std::vector<float> make_gradient(uint64_t elements, int rank, int step, bool clustered) {
  std::mt19937_64 rng(1000003ull * static_cast<uint64_t>(rank + 1) + 7919ull * static_cast<uint64_t>(step) +
                      (clustered ? 17 : 0));
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> g(elements);
  for (float& x : g) x = normal(rng);
  if (clustered) {
    const uint64_t window = std::max<uint64_t>(elements / 100, 1);
    for (uint64_t start : {elements / 40, elements / 16, elements / 10}) {
      for (uint64_t i = start; i < std::min(start + window, elements); ++i) g[i] *= 30.f;
    }
  }
  return g;
}

// The float64 sum of every rank's entries (and of their magnitudes), from an ncclAllGather of the
// selections padded to the largest count: a path of its own, not the collectives under test.
struct DenseReference {
  std::vector<double> sum, magnitude;
  uint64_t entries = 0;  // over all ranks
};

DenseReference gather_reference(Communicator& c, const SparseEntries& mine, WireValue wire, uint64_t elements) {
  const std::vector<uint64_t> counts = gather_words(c, mine.count);
  const uint64_t largest = *std::max_element(counts.begin(), counts.end());
  DenseReference ref;
  ref.sum.assign(elements, 0.0);
  ref.magnitude.assign(elements, 0.0);
  if (largest == 0) return ref;
  const int ranks = c.size();
  DeviceArray<uint32_t> send_indices(largest), all_indices(largest * ranks);
  DeviceArray<uint16_t> send_values(largest), all_values(largest * ranks);
  FUSEKIT_CUDA_CHECK(cudaMemsetAsync(send_indices.get(), 0, largest * 4, c.stream()));
  FUSEKIT_CUDA_CHECK(cudaMemsetAsync(send_values.get(), 0, largest * 2, c.stream()));
  if (mine.count > 0) {
    FUSEKIT_CUDA_CHECK(
        cudaMemcpyAsync(send_indices.get(), mine.indices, mine.count * 4, cudaMemcpyDeviceToDevice, c.stream()));
    FUSEKIT_CUDA_CHECK(
        cudaMemcpyAsync(send_values.get(), mine.values, mine.count * 2, cudaMemcpyDeviceToDevice, c.stream()));
  }
  FUSEKIT_NCCL_CHECK(ncclAllGather(send_indices.get(), all_indices.get(), largest, ncclUint32, c.comm(), c.stream()));
  FUSEKIT_NCCL_CHECK(ncclAllGather(send_values.get(), all_values.get(), largest, ncclFloat16, c.comm(), c.stream()));
  FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(c.stream()));
  const std::vector<uint32_t> indices = all_indices.download(largest * ranks);
  const std::vector<uint16_t> values = all_values.download(largest * ranks);
  for (int r = 0; r < ranks; ++r) {
    for (uint64_t j = 0; j < counts[r]; ++j) {
      const uint32_t i = indices[r * largest + j];
      if (i >= elements) throw std::runtime_error("reference: index out of range");
      const double v = wire_to_float(values[r * largest + j], wire);
      ref.sum[i] += v;
      ref.magnitude[i] += std::fabs(v);
    }
    ref.entries += counts[r];
  }
  return ref;
}

// fp32 summation of P terms in any order: |computed - exact| <= (P - 1) 2^-24 sum |terms| (first order).
double fp32_sum_bound(double magnitude, int ranks) { return (ranks - 1) * std::ldexp(magnitude, -24) * 1.001; }

std::string mb(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", bytes / 1e6);
  return text;
}

// ---- the tests

struct Case {
  bool clustered;
  WireValue wire;
  double density;
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  std::string d = std::to_string(info.param.density);
  d.erase(d.find_last_not_of('0') + 1);
  for (char& ch : d)
    if (ch == '.') ch = 'p';
  return std::string(info.param.clustered ? "clustered" : "uniform") + "_" +
         (info.param.wire == WireValue::f16 ? "fp16" : "bf16") + "_d" + d;
}

class DpCollectiveTest : public testing::TestWithParam<Case> {};

TEST_P(DpCollectiveTest, SparseSumsEqualTheDenseSumOfTheSelections) {
  FUSEKIT_REQUIRE_GPU();
  const Case cs = GetParam();
  Communicator& c = communicator();
  const int ranks = c.size(), me = c.rank();
  const uint64_t elements = env_or("FUSEKIT_DP_ELEMENTS", 16'777'259);
  const int reps = static_cast<int>(std::max<uint64_t>(env_or("FUSEKIT_DP_REPS", 10), 1));
  const std::vector<LayerSpan> layers = transformer_layers(elements);

  // ---- collectives (every rank alike)
  struct Outcome {
    ExchangeStats allgather, balanced, equal, dense;
    std::vector<float> out_allgather, out_balanced, out_equal, out_dense;
    std::vector<uint64_t> hashes;  // per rank: of the four results
    DenseReference ref;
    std::vector<double> times_ms, bytes;  // per row of the table below
  };
  const Outcome o = collectively("the collectives", [&] {
    Outcome o;
    ErrorFeedback feedback(layers, cs.density, 0.0, cs.wire);
    const std::vector<float> gradient = make_gradient(elements, me, 0, cs.clustered);
    DeviceArray<float> gradient_device(elements);
    gradient_device.upload(gradient);
    feedback.step(gradient_device.get(), kernels::DType::f32, cs.density, c.stream());
    const SparseEntries mine{feedback.indices(), feedback.values(), feedback.count()};
    SparseCollective collective(c, elements, std::min<uint64_t>(feedback.capacity(), elements), cs.wire);
    DeviceArray<float> out(elements);

    o.ref = gather_reference(c, mine, cs.wire, elements);
    o.allgather = collective.allgather(mine, out.get());
    FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(c.stream()));
    o.out_allgather = out.download(elements);
    o.balanced = collective.reduce_scatter_allgather(mine, out.get(), SlicePartition::balanced);
    FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(c.stream()));
    o.out_balanced = out.download(elements);
    o.equal = collective.reduce_scatter_allgather(mine, out.get(), SlicePartition::equal);
    FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(c.stream()));
    o.out_equal = out.download(elements);
    // The dense allreduce of the same entries (the rank's selection as a dense fp32 buffer).
    std::vector<float> own(elements, 0.f);
    {
      const std::vector<uint32_t> indices = DeviceArray<uint32_t>::download_from(mine.indices, mine.count);
      const std::vector<uint16_t> values = DeviceArray<uint16_t>::download_from(mine.values, mine.count);
      for (uint64_t j = 0; j < mine.count; ++j) own[indices[j]] = wire_to_float(values[j], cs.wire);
    }
    out.upload(own);
    o.dense = dense_allreduce(c, out.get(), elements, kernels::DType::f32);
    FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(c.stream()));
    o.out_dense = out.download(elements);
    for (const std::vector<float>* result : {&o.out_allgather, &o.out_balanced, &o.out_equal, &o.out_dense}) {
      const std::vector<uint64_t> h = gather_words(c, fnv1a(result->data(), result->size() * sizeof(float)));
      o.hashes.insert(o.hashes.end(), h.begin(), h.end());
    }

    // Timings: the three collectives; the selection (which replaces the entries, needed no more);
    // the dense baselines on the whole gradient buffer (which they overwrite).
    o.times_ms.push_back(median_ms(c, reps, [&] { collective.allgather(mine, out.get()); }));
    o.times_ms.push_back(
        median_ms(c, reps, [&] { collective.reduce_scatter_allgather(mine, out.get(), SlicePartition::balanced); }));
    o.times_ms.push_back(
        median_ms(c, reps, [&] { collective.reduce_scatter_allgather(mine, out.get(), SlicePartition::equal); }));
    const double selection_ms =
        median_ms(c, reps, [&] { feedback.step(gradient_device.get(), kernels::DType::f32, cs.density, c.stream()); });
    ExchangeStats dense32, dense16;
    o.times_ms.push_back(median_ms(
        c, reps, [&] { dense32 = dense_allreduce(c, gradient_device.get(), elements, kernels::DType::f32); }));
    o.times_ms.push_back(median_ms(
        c, reps, [&] { dense16 = dense_allreduce(c, gradient_device.get(), elements, kernels::DType::f16); }));
    o.times_ms.push_back(selection_ms);
    o.bytes = max_over_ranks(c, {o.allgather.bytes_sent, o.balanced.bytes_sent, o.equal.bytes_sent, dense32.bytes_sent,
                                 dense16.bytes_sent, 0.0});
    return o;
  });

  // ---- checks (host only)
  if (me == 0) {
    const char* rows[] = {"sparse allgather",
                          "reduce-scatter + allgather, balanced slices",
                          "reduce-scatter + allgather, equal slices",
                          "dense allreduce, fp32 gradient",
                          "dense allreduce, fp16 gradient",
                          "top-k selection + pack (error feedback step)"};
    const double loads[] = {1.0, o.balanced.imbalance, o.equal.imbalance, 1.0, 1.0, 1.0};
    std::printf("dp_collective: %d ranks, %llu elements, density %g, wire %s, %s gradients: %llu entries selected\n",
                ranks, static_cast<unsigned long long>(elements), cs.density, wire_value_name(cs.wire),
                cs.clustered ? "clustered" : "uniform", static_cast<unsigned long long>(o.ref.entries));
    std::printf("  %-46s %14s %10s %14s\n", "collective", "sent/rank MB", "median ms", "max/mean load");
    for (int row = 0; row < 6; ++row) {
      std::printf("  %-46s %14s %10.3f %14.3f\n", rows[row], row == 5 ? "-" : mb(o.bytes[row]).c_str(), o.times_ms[row],
                  loads[row]);
    }
    std::printf("  balanced: %d of %d slices gathered dense, %llu nonzero sums\n", o.balanced.dense_slices, ranks,
                static_cast<unsigned long long>(o.balanced.result_entries));
    std::fflush(stdout);
  }

  // Bitwise the same on every rank.
  for (int result = 0; result < 4; ++result) {
    for (int r = 1; r < ranks; ++r)
      EXPECT_EQ(o.hashes[result * ranks + r], o.hashes[result * ranks]) << "result " << result << ", rank " << r;
  }
  // The owners' loads.
  EXPECT_LE(o.balanced.imbalance, 1.2);
  uint64_t total = 0;
  for (uint64_t load : o.balanced.received) total += load;
  EXPECT_EQ(total, o.ref.entries);
  if (ranks == 1) {
    EXPECT_EQ(o.balanced.bytes_sent, 0.0);
    EXPECT_EQ(o.allgather.bytes_sent, 0.0);
  }
  // The sums.
  uint64_t bad_allgather = 0, bad_balanced = 0, bad_equal = 0, bad_dense = 0;
  for (uint64_t i = 0; i < elements; ++i) {
    const double bound = fp32_sum_bound(o.ref.magnitude[i], ranks);
    const float rounded = wire_to_float(float_to_wire(o.out_allgather[i], cs.wire), cs.wire) + 0.f;  // -0 as +0
    if (!(std::fabs(o.out_allgather[i] - o.ref.sum[i]) <= bound) && ++bad_allgather <= 5)
      ADD_FAILURE() << "allgather at " << i << ": " << o.out_allgather[i] << ", expected " << o.ref.sum[i];
    if (std::memcmp(&o.out_balanced[i], &rounded, 4) != 0 && ++bad_balanced <= 5)
      ADD_FAILURE() << "balanced at " << i << ": " << o.out_balanced[i] << ", expected " << rounded;
    if (std::memcmp(&o.out_equal[i], &o.out_balanced[i], 4) != 0 && ++bad_equal <= 5)
      ADD_FAILURE() << "equal at " << i << ": " << o.out_equal[i] << ", balanced " << o.out_balanced[i];
    if (!(std::fabs(o.out_dense[i] - o.ref.sum[i]) <= bound) && ++bad_dense <= 5)
      ADD_FAILURE() << "dense at " << i << ": " << o.out_dense[i] << ", expected " << o.ref.sum[i];
  }
  EXPECT_EQ(bad_allgather + bad_balanced + bad_equal + bad_dense, 0u)
      << bad_allgather << " allgather, " << bad_balanced << " balanced, " << bad_equal << " equal, " << bad_dense
      << " dense elements wrong";
}

// "Millions" in the names: device-check.sh leaves cases of a million elements or more out of its
// sanitizer runs, as these are.
INSTANTIATE_TEST_SUITE_P(MillionsOfElements, DpCollectiveTest,
                         testing::Values(Case{false, WireValue::f16, 0.01}, Case{true, WireValue::f16, 0.01},
                                         Case{true, WireValue::bf16, 0.001}),
                         case_name);

// Several steps of error feedback with the balanced collective: on every rank, sent + residual
// equals the sum of its gradients within one float rounding per step, and each step's result is
// the sum of every rank's sent entries rounded once to the wire type.
TEST(DpCollectiveSteps, ErrorFeedbackLosesNothingOverTwoMillionElements) {
  FUSEKIT_REQUIRE_GPU();
  Communicator& c = communicator();
  const int ranks = c.size(), me = c.rank();
  constexpr int kSteps = 3;
  const uint64_t elements = std::min<uint64_t>(env_or("FUSEKIT_DP_ELEMENTS", 16'777'259), 2'000'003);
  const std::vector<LayerSpan> layers = transformer_layers(elements);
  constexpr double kDensity = 0.01;

  struct Outcome {
    std::vector<double> sent_sum, gradient_sum, bound;
    std::vector<float> residual;
    uint64_t wrong_sums = 0;
    double first_wrong_at = -1;
  };
  const Outcome o = collectively("error feedback steps", [&] {
    Outcome o;
    o.sent_sum.assign(elements, 0.0);
    o.gradient_sum.assign(elements, 0.0);
    o.bound.assign(elements, 0.0);
    std::vector<float> residual(elements, 0.f);
    ErrorFeedback feedback(layers, kDensity, 0.0, WireValue::f16);
    SparseCollective collective(c, elements, std::min<uint64_t>(feedback.capacity(), elements), WireValue::f16);
    DeviceArray<float> gradient_device(elements), out(elements);
    for (int step = 0; step < kSteps; ++step) {
      const std::vector<float> gradient = make_gradient(elements, me, step, step % 2 == 1);
      gradient_device.upload(gradient);
      feedback.step(gradient_device.get(), kernels::DType::f32, kDensity, c.stream());
      const SparseEntries mine{feedback.indices(), feedback.values(), feedback.count()};
      const DenseReference ref = gather_reference(c, mine, WireValue::f16, elements);
      collective.reduce_scatter_allgather(mine, out.get());
      FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(c.stream()));
      const std::vector<float> result = out.download(elements);
      const std::vector<uint32_t> indices = DeviceArray<uint32_t>::download_from(mine.indices, mine.count);
      const std::vector<uint16_t> values = DeviceArray<uint16_t>::download_from(mine.values, mine.count);
      for (uint64_t i = 0; i < elements; ++i) {
        o.bound[i] += std::ldexp(std::fabs(static_cast<double>(residual[i]) + gradient[i]), -24);
        o.gradient_sum[i] += gradient[i];
        // The result: the float64 sum rounded to fp16, within the fp32 sum's rounding before it.
        // fp16 rounds to half an ulp: 2^-11 relative, 2^-25 absolute among subnormals.
        const double slack =
            fp32_sum_bound(ref.magnitude[i], ranks) + std::ldexp(std::fabs(ref.sum[i]), -11) + std::ldexp(1.0, -25);
        if (!(std::fabs(result[i] - ref.sum[i]) <= slack * 1.001) && o.wrong_sums++ == 0) o.first_wrong_at = i;
      }
      for (uint64_t j = 0; j < mine.count; ++j) o.sent_sum[indices[j]] += wire_to_float(values[j], WireValue::f16);
      residual = DeviceArray<float>::download_from(feedback.residual(), elements);
    }
    o.residual = residual;
    return o;
  });
  EXPECT_EQ(o.wrong_sums, 0u) << "first at element " << o.first_wrong_at;
  uint64_t lost = 0;
  for (uint64_t i = 0; i < elements; ++i) {
    const double kept = o.sent_sum[i] + o.residual[i];
    if (!(std::fabs(kept - o.gradient_sum[i]) <= o.bound[i] * 1.0001 + 1e-30) && ++lost <= 5)
      ADD_FAILURE() << "rank " << me << ", element " << i << ": sent + residual " << kept << ", gradients "
                    << o.gradient_sum[i];
  }
  EXPECT_EQ(lost, 0u);
}

// Entries out of order on the last rank: every rank throws the same error from both sparse
// collectives, and the next collective still runs (no rank was left behind).
TEST(DpCollectiveErrors, BadEntriesFailOnEveryRank) {
  FUSEKIT_REQUIRE_GPU();
  Communicator& c = communicator();
  const int ranks = c.size(), me = c.rank();
  const uint64_t elements = 100'003;
  SparseCollective collective(c, elements, 1000, WireValue::f16, 64);
  DeviceArray<uint32_t> indices(1000);
  DeviceArray<uint16_t> values(1000);
  std::vector<uint32_t> host_indices(1000);
  for (uint32_t j = 0; j < 1000; ++j) host_indices[j] = 7 + 97 * j;
  if (me == ranks - 1) std::swap(host_indices[10], host_indices[11]);
  indices.upload(host_indices);
  values.upload(std::vector<uint16_t>(1000, float_to_wire(1.f, WireValue::f16)));
  DeviceArray<float> out(elements);
  const SparseEntries mine{indices.get(), values.get(), 1000};
  std::string allgather_error, reduce_error;
  try {
    collective.allgather(mine, out.get());
  } catch (const std::invalid_argument& e) {
    allgather_error = e.what();
  }
  try {
    collective.reduce_scatter_allgather(mine, out.get());
  } catch (const std::invalid_argument& e) {
    reduce_error = e.what();
  }
  // A good call afterwards: the last rank's entries sorted again, every rank adds 1 at 1000 places.
  std::sort(host_indices.begin(), host_indices.end());
  indices.upload(host_indices);
  collectively("the collective after the errors", [&] {
    collective.reduce_scatter_allgather(mine, out.get());
    return 0;
  });
  FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(c.stream()));
  const std::vector<float> result = out.download(elements);
  EXPECT_EQ(allgather_error, "sparse collective: rank " + std::to_string(ranks - 1) +
                                 " has 1 entries out of order or at or above 100003");
  EXPECT_NE(reduce_error.find("1 entries out of order or at or above 100003"), std::string::npos) << reduce_error;
  double total = 0;
  for (float v : result) total += v;
  EXPECT_EQ(total, 1000.0 * ranks);
  EXPECT_EQ(result[7], static_cast<float>(ranks));
}

// Small and empty: a buffer of fewer elements than bins, one rank with every entry and the others
// with none, then nobody with any.
TEST(DpCollectiveEdges, EmptyAndLopsidedSelections) {
  FUSEKIT_REQUIRE_GPU();
  Communicator& c = communicator();
  const int ranks = c.size(), me = c.rank();
  const uint64_t elements = 1000;
  SparseCollective collective(c, elements, elements, WireValue::bf16);
  DeviceArray<uint32_t> indices(elements);
  DeviceArray<uint16_t> values(elements);
  std::vector<uint32_t> all(elements);
  for (uint32_t i = 0; i < elements; ++i) all[i] = i;
  indices.upload(all);
  values.upload(std::vector<uint16_t>(elements, float_to_wire(0.5f, WireValue::bf16)));
  DeviceArray<float> out(elements);
  struct Outcome {
    std::vector<float> lopsided_allgather, lopsided_balanced, empty_allgather, empty_balanced;
    ExchangeStats lopsided;
  };
  const Outcome o = collectively("edge cases", [&] {
    Outcome o;
    const SparseEntries lopsided{indices.get(), values.get(), me == 0 ? elements : 0};
    collective.allgather(lopsided, out.get());
    FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(c.stream()));
    o.lopsided_allgather = out.download(elements);
    o.lopsided = collective.reduce_scatter_allgather(lopsided, out.get());
    FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(c.stream()));
    o.lopsided_balanced = out.download(elements);
    const SparseEntries empty{nullptr, nullptr, 0};
    collective.allgather(empty, out.get());
    FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(c.stream()));
    o.empty_allgather = out.download(elements);
    collective.reduce_scatter_allgather(empty, out.get());
    FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(c.stream()));
    o.empty_balanced = out.download(elements);
    return o;
  });
  EXPECT_EQ(o.lopsided_allgather, std::vector<float>(elements, 0.5f));
  EXPECT_EQ(o.lopsided_balanced, std::vector<float>(elements, 0.5f));
  EXPECT_EQ(o.lopsided.dense_slices, ranks);  // every slice full: dense
  EXPECT_EQ(o.empty_allgather, std::vector<float>(elements, 0.f));
  EXPECT_EQ(o.empty_balanced, std::vector<float>(elements, 0.f));
}

// Re-selection (keep < 1): each slice's owner keeps its largest sums. Every rank sends random
// entries (the same indices overlap across ranks); against the full exchange (keep 1) of the same
// entries, on every rank: each kept sum equals the full one, each slice keeps at least
// ceil(keep x its nonzero sums) of them, and no dropped sum is larger in magnitude than a kept one.
TEST(DpCollectiveReselect, OwnersKeepTheirLargestSums) {
  FUSEKIT_REQUIRE_GPU();
  Communicator& c = communicator();
  const int ranks = c.size(), me = c.rank();
  const uint64_t elements = 300007;
  const double keep = 0.3;
  std::mt19937_64 random(77 + static_cast<uint64_t>(me));
  std::lognormal_distribution<float> magnitude(0.f, 2.f);
  std::vector<uint32_t> chosen;
  std::vector<uint16_t> words;
  for (uint32_t i = 0; i < elements; ++i) {
    if (random() % 20 != 0) continue;  // about 5% of the indices per rank
    chosen.push_back(i);
    words.push_back(float_to_wire((random() % 2 ? 1.f : -1.f) * magnitude(random), WireValue::bf16));
  }
  SparseCollective collective(c, elements, elements, WireValue::bf16);  // one bound on every rank
  DeviceArray<uint32_t> indices(chosen.size() + 1);
  DeviceArray<uint16_t> values(chosen.size() + 1);
  indices.upload(chosen);
  values.upload(words);
  DeviceArray<float> out(elements);
  const SparseEntries mine{indices.get(), values.get(), chosen.size()};
  struct Outcome {
    std::vector<float> full, kept;
    std::vector<uint64_t> edges;
    ExchangeStats stats;
  };
  const Outcome o = collectively("re-selection", [&] {
    Outcome o;
    collective.reduce_scatter_allgather(mine, out.get(), SlicePartition::balanced);
    FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(c.stream()));
    o.full = out.download(elements);
    o.stats = collective.reduce_scatter_allgather(mine, out.get(), SlicePartition::balanced, keep);
    FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(c.stream()));
    o.kept = out.download(elements);
    o.edges = collective.slice_edges();
    return o;
  });
  ASSERT_EQ(o.edges.size(), static_cast<size_t>(ranks) + 1);
  // Every rank ends with the same result.
  const std::vector<uint64_t> hashes = gather_words(c, fnv1a(o.kept.data(), elements * sizeof(float)));
  for (int r = 1; r < ranks; ++r) EXPECT_EQ(hashes[r], hashes[0]) << "rank " << r;
  size_t changed = 0, kept_total = 0, full_total = 0;
  for (int r = 0; r < ranks; ++r) {
    uint64_t nonzero = 0, kept = 0;
    float smallest_kept = INFINITY, largest_dropped = 0;
    for (uint64_t i = o.edges[r]; i < o.edges[r + 1]; ++i) {
      if (o.full[i] == 0.f) {
        changed += o.kept[i] != 0.f;
        continue;
      }
      ++nonzero;
      if (o.kept[i] != 0.f) {
        ++kept;
        changed += o.kept[i] != o.full[i];
        smallest_kept = std::min(smallest_kept, std::fabs(o.full[i]));
      } else {
        largest_dropped = std::max(largest_dropped, std::fabs(o.full[i]));
      }
    }
    EXPECT_GE(kept, reselect_count(nonzero, keep)) << "slice " << r;
    EXPECT_LE(largest_dropped, smallest_kept) << "slice " << r;
    kept_total += kept;
    full_total += nonzero;
    if (r == me) {
      EXPECT_EQ(o.stats.reselected_from, nonzero);  // bf16 sums of these values never round to 0
    }
  }
  EXPECT_EQ(changed, 0u);
  // An eighth of an octave per bin: the overshoot over keep stays small on spread-out magnitudes.
  EXPECT_LE(kept_total, static_cast<size_t>(1.2 * keep * full_total) + 2 * ranks);
  std::printf("re-selection: kept %zu of %zu sums (keep %.2f), gathered %s per rank\n", kept_total, full_total, keep,
              mb(o.stats.gather_bytes).c_str());
}

// The bucketed index form gives the same sums as plain indices, bit for bit, with and without
// re-selection, on every rank, and sends fewer bytes in both phases. Entries are random (1 / (10 x
// ranks) of the elements per rank, so that the summed slices stay below the gather's dense form
// whatever the rank count) over a buffer long enough for several 2^16-element buckets per slice,
// only in every third bucket of the buffer (so that slices have empty buckets, which share their
// start with the next in the decoder), plus a run of neighbours at the very end (the last bucket of
// the last slice).
TEST(DpCollectiveBucketed, SameSumsFewerBytes) {
  FUSEKIT_REQUIRE_GPU();
  Communicator& c = communicator();
  const int ranks = c.size(), me = c.rank();
  const uint64_t elements = 1000003;
  std::mt19937_64 random(91 + static_cast<uint64_t>(me));
  std::normal_distribution<float> normal;
  std::vector<uint32_t> chosen;
  std::vector<uint16_t> words;
  for (uint32_t i = 0; i < elements; ++i) {
    const bool wanted = (i >> 16) % 3 == 0 && random() % (10 * static_cast<uint64_t>(ranks)) == 0;
    if (!wanted && i + 40 < elements) continue;
    chosen.push_back(i);
    words.push_back(float_to_wire(normal(random), WireValue::bf16));
  }
  SparseCollective plain(c, elements, elements / 2, WireValue::bf16);
  SparseCollective bucketed(c, elements, elements / 2, WireValue::bf16, 4096, IndexForm::bucketed);
  DeviceArray<uint32_t> indices(chosen.size());
  DeviceArray<uint16_t> values(chosen.size());
  indices.upload(chosen);
  values.upload(words);
  DeviceArray<float> out(elements);
  const SparseEntries mine{indices.get(), values.get(), chosen.size()};
  struct Outcome {
    std::vector<float> plain, bucketed, plain_kept, bucketed_kept;
    ExchangeStats plain_stats, bucketed_stats;
  };
  const Outcome o = collectively("bucketed indices", [&] {
    Outcome o;
    const auto run = [&](SparseCollective& collective, double keep, ExchangeStats* stats) {
      const ExchangeStats st = collective.reduce_scatter_allgather(mine, out.get(), SlicePartition::balanced, keep);
      FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(c.stream()));
      if (stats) *stats = st;
      return out.download(elements);
    };
    o.plain = run(plain, 1.0, &o.plain_stats);
    o.bucketed = run(bucketed, 1.0, &o.bucketed_stats);
    o.plain_kept = run(plain, 0.3, nullptr);
    o.bucketed_kept = run(bucketed, 0.3, nullptr);
    return o;
  });
  EXPECT_EQ(std::memcmp(o.plain.data(), o.bucketed.data(), elements * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(o.plain_kept.data(), o.bucketed_kept.data(), elements * sizeof(float)), 0);
  const std::vector<uint64_t> hashes = gather_words(c, fnv1a(o.bucketed.data(), elements * sizeof(float)));
  for (int r = 1; r < ranks; ++r) EXPECT_EQ(hashes[r], hashes[0]) << "rank " << r;
  if (ranks > 1) {
    EXPECT_LT(o.bucketed_stats.reduce_scatter_bytes, 0.75 * o.plain_stats.reduce_scatter_bytes);
    EXPECT_LT(o.bucketed_stats.gather_bytes, o.plain_stats.gather_bytes);
  }
  std::printf("bucketed indices: reduce-scatter %s (plain %s), gather %s (plain %s) per rank\n",
              mb(o.bucketed_stats.reduce_scatter_bytes).c_str(), mb(o.plain_stats.reduce_scatter_bytes).c_str(),
              mb(o.bucketed_stats.gather_bytes).c_str(), mb(o.plain_stats.gather_bytes).c_str());
}

// The gradient exchanger of a model's flat fp16 gradients (three tensors with padding between
// them): dense sums every rank's gradients; sparse at density 1 gives the same sum rounded once;
// N(0, 1) gradients for the tensors of `layout` as fp16 words (padding zero), from `seed`.
std::vector<uint16_t> random_gradients(const models::FlatGradients& layout, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> g(layout.elements, 0);
  for (const auto& t : layout.tensors) {
    for (uint64_t i = t.offset; i < t.offset + t.size; ++i) g[i] = float_to_wire(normal(random), WireValue::f16);
  }
  return g;
}

// Every rank's error-feedback residual summed over the ranks (fp32, layout.elements long: zero past
// the residual's end), through `scratch`.
std::vector<float> residuals_summed(Communicator& c, const GradientExchanger& exchanger,
                                    const models::FlatGradients& layout, DeviceArray<float>& scratch) {
  FUSEKIT_CUDA_CHECK(cudaMemset(scratch.get(), 0, layout.elements * sizeof(float)));
  FUSEKIT_CUDA_CHECK(cudaMemcpy(scratch.get(), exchanger.residual(), exchanger.residual_elements() * sizeof(float),
                                cudaMemcpyDeviceToDevice));
  FUSEKIT_NCCL_CHECK(
      ncclAllReduce(scratch.get(), scratch.get(), layout.elements, ncclFloat, ncclSum, c.comm(), c.stream()));
  FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(c.stream()));
  return scratch.download(layout.elements);
}

// sparse at 5% keeps, element by element, exchanged sum + every rank's residual == the sum of the
// gradients, to the one fp16 rounding of the exchanged value, with and without re-selection. Every rank knows every
// rank's gradients (each is drawn from its rank's seed), so the reference is computed on the host.
TEST(DpGradientExchanger, DenseAndSparseSumTheRanksGradients) {
  FUSEKIT_REQUIRE_GPU();
  Communicator& c = communicator();
  const int ranks = c.size(), me = c.rank();
  models::FlatGradients layout;
  layout.dtype = kernels::DType::f16;
  layout.tensors = {{0, 70001}, {70008, 3}, {70016, 129999}};
  layout.elements = 200016;
  const auto gradients_of = [&](int rank) { return random_gradients(layout, 1000 + static_cast<uint64_t>(rank)); };
  std::vector<double> expected(layout.elements, 0.0), magnitude(layout.elements, 0.0);
  for (int r = 0; r < ranks; ++r) {
    const std::vector<uint16_t> g = gradients_of(r);
    for (uint64_t i = 0; i < layout.elements; ++i) {
      expected[i] += wire_to_float(g[i], WireValue::f16);
      magnitude[i] += std::fabs(wire_to_float(g[i], WireValue::f16));
    }
  }
  const std::vector<uint16_t> mine = gradients_of(me);
  DeviceArray<uint16_t> buffer(layout.elements);
  DeviceArray<float> residuals(layout.elements);
  const auto run = [&](const ExchangerOptions& options, std::vector<float>* residual_sum) {
    return collectively("gradient exchanger", [&] {
      GradientExchanger exchanger(c, layout, options);
      buffer.upload(mine);
      models::FlatGradients g = layout;
      g.data = buffer.get();
      const float divisor = exchanger.exchange(g, c.stream());
      EXPECT_EQ(divisor, static_cast<float>(ranks));
      FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(c.stream()));
      EXPECT_EQ(exchanger.last().nonfinite, 0u);
      if (residual_sum) {
        // The residual ends with the last tensor; the flat buffer's padding after it has none.
        EXPECT_EQ(exchanger.residual_elements(), 200015u);
        *residual_sum = residuals_summed(c, exchanger, layout, residuals);
      }
      std::vector<float> out;
      for (uint16_t bits : buffer.download(layout.elements)) out.push_back(wire_to_float(bits, WireValue::f16));
      return out;
    });
  };
  const auto in_tensor = [&](uint64_t i) {
    for (const auto& t : layout.tensors) {
      if (i >= t.offset && i < t.offset + t.size) return true;
    }
    return false;
  };
  // fp16's rounding of a value of magnitude x: half a unit in the last place, at least the subnormal step.
  const auto half_ulp = [](double x) { return std::max(std::ldexp(std::fabs(x), -11), std::ldexp(1.0, -25)); };

  ExchangerOptions dense;
  dense.mode = ExchangeMode::dense;
  const std::vector<float> summed = run(dense, nullptr);
  ExchangerOptions all;
  all.mode = ExchangeMode::sparse;
  all.density = 1.0;
  // Density 1 selects at least 80% of each tensor (dp/topk_selection.h's tolerance), the rest
  // stays in the residual: what arrives plus the ranks' residuals is the sum.
  std::vector<float> residual_all;
  const std::vector<float> sparse_all = run(all, &residual_all);
  ExchangerOptions some = all;
  some.density = 0.05;
  std::vector<float> residual_sum;
  const std::vector<float> sparse_some = run(some, &residual_sum);
  // Re-selection: half of each slice's sums applied, the other ranks' entries there returned to
  // their residuals, so sum + residuals is still the gradients' sum.
  ExchangerOptions half = some;
  half.reselect = 0.5;
  std::vector<float> residual_half;
  const std::vector<float> sparse_half = run(half, &residual_half);

  size_t dense_bad = 0, all_bad = 0, some_bad = 0, sent = 0, all_sent = 0, half_bad = 0, half_sent = 0;
  for (uint64_t i = 0; i < layout.elements; ++i) {
    if (!in_tensor(i)) {
      all_bad += sparse_all[i] != 0.f;  // padding: nobody sends it
      continue;
    }
    // NCCL adds in fp16 in an order of its own: one rounding per addition, of partial sums no larger
    // than the sum of magnitudes. The sparse sums are fp32 (exact but for 2^-24 relative), rounded once.
    dense_bad += std::fabs(summed[i] - expected[i]) > ranks * half_ulp(magnitude[i]);
    all_bad += std::fabs(sparse_all[i] + residual_all[i] - expected[i]) >
               half_ulp(sparse_all[i]) + 1e-6 * (magnitude[i] + 1.0);
    all_sent += sparse_all[i] != 0.f;
    some_bad += std::fabs(sparse_some[i] + residual_sum[i] - expected[i]) >
                half_ulp(sparse_some[i]) + 1e-6 * (magnitude[i] + 1.0);
    sent += sparse_some[i] != 0.f;
    half_bad += std::fabs(sparse_half[i] + residual_half[i] - expected[i]) >
                half_ulp(sparse_half[i]) + 1e-6 * (magnitude[i] + 1.0);
    half_sent += sparse_half[i] != 0.f;
  }
  EXPECT_EQ(half_bad, 0u);
  // Half of each slice's sums, to within the fine bins' overshoot (crowded sums: top-5% selections).
  EXPECT_GE(half_sent, static_cast<size_t>(0.5 * sent) - ranks);
  EXPECT_LE(half_sent, static_cast<size_t>(0.52 * sent) + 2 * ranks);
  EXPECT_EQ(dense_bad, 0u);
  EXPECT_EQ(all_bad, 0u);
  EXPECT_EQ(some_bad, 0u);
  EXPECT_GE(all_sent, static_cast<size_t>(0.8 * 200003));
  // Each rank sends about 5% of each tensor; the union of the ranks' selections is what arrives.
  EXPECT_GE(sent, static_cast<size_t>(0.8 * 0.05 * 200003));
  EXPECT_LE(sent, static_cast<size_t>(1.25 * 0.05 * 200003 * ranks) + 3 * ranks);
}

// Frozen variance: a dense step first (gradients summed, velocity_factor() 0), then sparse steps
// that exchange each rank's velocity u = 0.8 u + g, never masked: over the sparse steps, what
// arrived plus every rank's residual equals the sum over ranks and steps of the velocities, to one
// fp16 rounding of each arrival; with every sum applied and with re-selection keeping half.
TEST(DpGradientExchanger, ExchangedVelocitiesAddUp) {
  FUSEKIT_REQUIRE_GPU();
  Communicator& c = communicator();
  const int ranks = c.size(), me = c.rank();
  constexpr int kSparseSteps = 3;
  constexpr double kMomentum = 0.8;
  models::FlatGradients layout;
  layout.dtype = kernels::DType::f16;
  layout.tensors = {{0, 50001}, {50008, 7}, {50016, 80000}};
  layout.elements = 130016;
  const auto gradients_of = [&](int rank, int step) {
    return random_gradients(layout, 5000 + 100 * static_cast<uint64_t>(step) + static_cast<uint64_t>(rank));
  };
  // The host's velocities: per rank, from zero at the first sparse step; their sum over ranks and steps.
  std::vector<double> velocity_sum(layout.elements, 0.0), magnitude(layout.elements, 0.0);
  for (int r = 0; r < ranks; ++r) {
    std::vector<double> u(layout.elements, 0.0);
    for (int t = 1; t <= kSparseSteps; ++t) {
      const std::vector<uint16_t> g = gradients_of(r, t);
      for (uint64_t i = 0; i < layout.elements; ++i) {
        u[i] = kMomentum * u[i] + wire_to_float(g[i], WireValue::f16);
        velocity_sum[i] += u[i];
        magnitude[i] += std::fabs(u[i]);
      }
    }
  }
  ExchangerOptions options;
  options.mode = ExchangeMode::sparse;
  options.density = 0.05;
  options.dense_steps = 1;
  options.frozen_variance = true;
  options.momentum = kMomentum;
  DeviceArray<uint16_t> buffer(layout.elements);
  DeviceArray<float> residuals(layout.elements);
  const auto half_ulp = [](double x) { return std::max(std::ldexp(std::fabs(x), -11), std::ldexp(1.0, -25)); };
  // With masking, u cleared where an entry was sent would leave that element's later velocity out
  // of what is sent and of the residual: arrived + residuals would fall short of the velocities.
  const auto check = [&](const ExchangerOptions& o, const char* what) {
    SCOPED_TRACE(what);
    std::vector<double> arrived(layout.elements, 0.0), rounding(layout.elements, 0.0);
    std::vector<float> residual_sum;
    collectively("velocity exchange", [&] {
      GradientExchanger exchanger(c, layout, o);
      for (int t = 0; t <= kSparseSteps; ++t) {
        buffer.upload(gradients_of(me, t));
        models::FlatGradients g = layout;
        g.data = buffer.get();
        EXPECT_EQ(exchanger.exchange(g, c.stream()), static_cast<float>(ranks));
        FUSEKIT_CUDA_CHECK(cudaStreamSynchronize(c.stream()));
        const ExchangeRecord record = exchanger.last();
        EXPECT_EQ(record.sparse, t > 0) << "step " << t;
        EXPECT_EQ(exchanger.velocity_factor(), t > 0 ? kMomentum : 0.0) << "step " << t;
        if (t == 0) continue;
        for (size_t i = 0; const uint16_t bits : buffer.download(layout.elements)) {
          const double x = wire_to_float(bits, WireValue::f16);
          arrived[i] += x;
          rounding[i] += half_ulp(x);
          ++i;
        }
      }
      residual_sum = residuals_summed(c, exchanger, layout, residuals);
      return 0;
    });
    size_t bad = 0, sent = 0;
    for (const auto& t : layout.tensors) {
      for (uint64_t i = t.offset; i < t.offset + t.size; ++i) {
        const double error = std::fabs(arrived[i] + residual_sum[i] - velocity_sum[i]);
        if (error > rounding[i] + 1e-5 * (magnitude[i] + 1.0)) {
          if (bad < 5)
            ADD_FAILURE() << "element " << i << ": arrived " << arrived[i] << " + residuals " << residual_sum[i]
                          << ", velocities summed " << velocity_sum[i];
          ++bad;
        }
        sent += arrived[i] != 0.0;
      }
    }
    EXPECT_EQ(bad, 0u);
    EXPECT_GE(sent, static_cast<size_t>(0.8 * 0.05 * 130008)) << "a sanity bound: one step's selection arrived";
  };
  check(options, "every sum applied");
  // Re-selection: half of each slice's sums applied, the rest back into the senders' residuals, their
  // velocities unmasked too.
  ExchangerOptions half = options;
  half.reselect = 0.5;
  check(half, "half of each slice's sums applied");
  ExchangerOptions no_dense_step = options;
  no_dense_step.dense_steps = 0;
  EXPECT_THROW(GradientExchanger(c, layout, no_dense_step), std::invalid_argument);
}

}  // namespace
}  // namespace fusekit::dp
