// AdamW against the float64 reference over 1, 2 and 10 steps with non-default hyperparameters and
// fresh random gradients every step: the fp32 tensor-list step (sizes 1, 7, 31, 4097, 2^20 + 3,
// some tensors or only their gradients off 16-byte alignment) and the fp16/bf16 trainer with and
// without master weights, loss scales 1024 and 3000, weight decay on all tensors or only on the
// first 0, 2 or 4 of the 5 (the reference: decay off for the tail tensors). The updates are in
// place, so there is nothing to poison: instead every element is checked against the reference, and
// what no tensor owns (the gaps between tensors, the trainer's padding) must be left as it was. A
// gradient with inf or NaN anywhere must skip the trainer's step: every buffer bitwise unchanged and
// the step count too. With zero gradients and fresh moments a step is the weight decay alone, so
// there the decayed prefix must be p x (1 - lr x weight_decay) and the rest unchanged, bit for bit,
// for every boundary between tensors.
//
// The reference's state is rounded to the storage types after every step, as the kernels store
// it, so the two differ only by float arithmetic: per step about an ulp of the stored value plus
// 1e-5 x lr (the fp32 error of the update term, with a wide margin); moments within 8 float
// roundings of their magnitudes. Gradient magnitudes spread over seven decades around eps, so a
// misplaced eps, bias correction or weight decay moves many elements far outside those bounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "device_buffers.h"
#include "gpu_test_support.h"
#include "kernels/adamw.h"
#include "kernels/reference/adamw.h"

namespace fusekit::kernels {
namespace {

const reference::AdamWOptions kReference{/*lr=*/1e-2, /*beta1=*/0.8, /*beta2=*/0.95, /*eps=*/1e-6,
                                         /*weight_decay=*/0.1};

AdamWOptions options() {
  AdamWOptions o;
  o.lr = kReference.lr;
  o.beta1 = kReference.beta1;
  o.beta2 = kReference.beta2;
  o.eps = kReference.eps;
  o.weight_decay = kReference.weight_decay;
  return o;
}

const std::vector<size_t> kSizes = {1, 7, 31, 4097, (size_t{1} << 20) + 3};
constexpr double kUnitRoundoff = 1.0 / (1 << 24);  // float

// A gradient: normal, scaled by 10^U(-7, 0), so that sqrt(v) falls on both sides of eps = 1e-6.
double random_gradient(std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> decades(-7.0, 0.0);
  return normal(rng) * std::pow(10.0, decades(rng));
}

double round_to(double x, DType dtype) {
  const float f = static_cast<float>(x);
  if (dtype == DType::f32) return f;
  if (dtype == DType::f16) return __half2float(__float2half_rn(f));
  return __bfloat162float(__float2bfloat16_rn(f));
}

// The spacing of the storage type's values at |x| (subnormals included).
double ulp(double x, DType dtype) {
  const int mantissa = dtype == DType::f32 ? 23 : dtype == DType::f16 ? 10 : 7;
  const int min_exponent = dtype == DType::f16 ? -14 : -126;
  const int exponent =
      x == 0 ? min_exponent : std::max(static_cast<int>(std::floor(std::log2(std::fabs(x)))), min_exponent);
  return std::ldexp(1.0, exponent - mantissa);
}

// Every element within its tolerance; the first few offenders are reported.
template <class Tolerance>
void expect_close(const std::vector<double>& out, const std::vector<double>& ref, Tolerance tolerance,
                  const std::string& what) {
  ASSERT_EQ(out.size(), ref.size());
  size_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double tol = tolerance(i);
    if (!(std::fabs(out[i] - ref[i]) <= tol)) {  // NaN fails
      if (bad < 5) ADD_FAILURE() << what << "[" << i << "] = " << out[i] << ", reference " << ref[i] << " +- " << tol;
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": elements outside their tolerance, of " << ref.size();
}

std::vector<double> difference(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

// Device memory of `dtype` from doubles (already representable) and back.
void upload(void* device, const std::vector<double>& values, DType dtype) {
  if (dtype == DType::f32) {
    const std::vector<float> f(values.begin(), values.end());
    ASSERT_EQ(cudaMemcpy(device, f.data(), f.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  } else {
    const std::vector<uint16_t> bits = to_bits(values, dtype);
    ASSERT_EQ(cudaMemcpy(device, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  }
}

std::vector<double> download(const void* device, size_t count, DType dtype) {
  std::vector<double> out(count);
  if (dtype == DType::f32) {
    std::vector<float> f(count);
    EXPECT_EQ(cudaMemcpy(f.data(), device, count * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < count; ++i) out[i] = f[i];
  } else {
    std::vector<uint16_t> bits(count);
    EXPECT_EQ(cudaMemcpy(bits.data(), device, count * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < count; ++i) out[i] = from_bits(bits[i], dtype);
  }
  return out;
}

std::vector<uint8_t> raw_bytes(const void* device, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  EXPECT_EQ(cudaMemcpy(out.data(), device, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

// The magnitude that bounds the float error of m = beta1 m + (1 - beta1) g: the same recurrence on |m|, |g|.
void track_magnitude(std::vector<double>& magnitude, const std::vector<double>& grad) {
  for (size_t i = 0; i < grad.size(); ++i)
    magnitude[i] = kReference.beta1 * magnitude[i] + (1 - kReference.beta1) * std::fabs(grad[i]);
}

// ---- The fp32 tensor list

// A tensor's place in four flat buffers: param, exp_avg and exp_avg_sq at `shift` elements past a
// 16-byte boundary, the gradient at `grad_shift`.
struct Placement {
  size_t size;
  size_t shift;
  size_t grad_shift;
};

class AdamWTensorListTest : public ::testing::TestWithParam<int> {};

TEST_P(AdamWTensorListTest, MatchesFloat64Reference) {
  FUSEKIT_REQUIRE_GPU();
  const int steps = GetParam();
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<Placement> placements;
  for (size_t size : kSizes) placements.push_back({size, 0, 0});
  placements.push_back({7, 1, 1});
  placements.push_back({4097, 3, 3});
  placements.push_back({100003, 2, 2});
  placements.push_back({9000, 0, 1});  // only the gradient misaligned

  // Element e of the concatenated tensors sits at state_at[e] in the state buffers and grad_at[e]
  // in the gradient buffer; everything else there is a gap.
  std::vector<size_t> state_at, grad_at, state_offsets, grad_offsets;
  size_t state_elements = 0, grad_elements = 0;
  for (const Placement& t : placements) {
    state_offsets.push_back((state_elements + 3) / 4 * 4 + t.shift);
    grad_offsets.push_back((grad_elements + 3) / 4 * 4 + t.grad_shift);
    state_elements = state_offsets.back() + t.size + 1;  // at least one gap element after each tensor
    grad_elements = grad_offsets.back() + t.size + 1;
    for (size_t i = 0; i < t.size; ++i) {
      state_at.push_back(state_offsets.back() + i);
      grad_at.push_back(grad_offsets.back() + i);
    }
  }
  const size_t n = state_at.size();
  constexpr double kGap = 12345.0;  // what no tensor owns, and must stay

  std::vector<double> p(n), m(n), v(n), magnitude(n);
  for (size_t e = 0; e < n; ++e) {
    p[e] = round_to(0.05 * normal(rng), DType::f32);
    // A resumed state, so that even one step reads m and v; |m| <= sqrt(v) as Adam's moments keep it.
    const double past = random_gradient(rng);
    m[e] = round_to(0.1 * past, DType::f32);
    v[e] = round_to(past * past, DType::f32);
    magnitude[e] = std::fabs(m[e]);
  }
  const std::vector<double> p0 = p;
  auto scatter = [&](const std::vector<double>& compact, const std::vector<size_t>& at, size_t total) {
    std::vector<double> flat(total, kGap);
    for (size_t e = 0; e < compact.size(); ++e) flat[at[e]] = compact[e];
    return flat;
  };
  auto gather = [&](const std::vector<double>& flat, const std::vector<size_t>& at) {
    std::vector<double> compact(at.size());
    for (size_t e = 0; e < at.size(); ++e) compact[e] = flat[at[e]];
    return compact;
  };

  Buffer param(state_elements, DType::f32), exp_avg(state_elements, DType::f32), exp_avg_sq(state_elements, DType::f32),
      grad(grad_elements, DType::f32);
  upload(param.get(), scatter(p, state_at, state_elements), DType::f32);
  upload(exp_avg.get(), scatter(m, state_at, state_elements), DType::f32);
  upload(exp_avg_sq.get(), scatter(v, state_at, state_elements), DType::f32);

  std::vector<AdamWTensor> tensors;
  for (size_t t = 0; t < placements.size(); ++t) {
    auto at = [](const Buffer& b, size_t offset) { return static_cast<float*>(b.get()) + offset; };
    tensors.push_back({at(param, state_offsets[t]), at(grad, grad_offsets[t]), at(exp_avg, state_offsets[t]),
                       at(exp_avg_sq, state_offsets[t]), placements[t].size});
  }
  const AdamWTensorList list(tensors);  // one table for every step
  EXPECT_EQ(list.elements(), n);

  for (int step = 1; step <= steps; ++step) {
    std::vector<double> g(n);
    for (double& x : g) x = round_to(random_gradient(rng), DType::f32);
    upload(grad.get(), scatter(g, grad_at, grad_elements), DType::f32);
    adamw_step(list, options(), step, nullptr);
    reference::adamw_step(p, g, m, v, kReference, step);
    for (size_t e = 0; e < n; ++e) {
      p[e] = round_to(p[e], DType::f32);
      m[e] = round_to(m[e], DType::f32);
      v[e] = round_to(v[e], DType::f32);
    }
    track_magnitude(magnitude, g);
  }
  CHECK_CUDA(cudaDeviceSynchronize());

  const std::vector<double> p_flat = param.download(), m_flat = exp_avg.download(), v_flat = exp_avg_sq.download();
  const std::vector<double> p_out = gather(p_flat, state_at), m_out = gather(m_flat, state_at),
                            v_out = gather(v_flat, state_at);
  const double rounds = steps + 1;
  expect_close(
      p_out, p, [&](size_t e) { return rounds * (ulp(p[e], DType::f32) + 1e-5 * kReference.lr); }, "param");
  expect_close(
      m_out, m, [&](size_t e) { return rounds * 8 * kUnitRoundoff * magnitude[e]; }, "exp_avg");
  expect_close(
      v_out, v, [&](size_t e) { return rounds * 8 * kUnitRoundoff * v[e]; }, "exp_avg_sq");
  EXPECT_LT(relative_error(difference(p_out, p0), difference(p, p0)), tolerance(DType::f32)) << "param change";
  EXPECT_LT(relative_error(m_out, m), tolerance(DType::f32)) << "exp_avg";
  EXPECT_LT(relative_error(v_out, v), tolerance(DType::f32)) << "exp_avg_sq";

  size_t gaps_written = 0;
  std::vector<bool> owned(state_elements, false);
  for (size_t at : state_at) owned[at] = true;
  for (size_t i = 0; i < state_elements; ++i) {
    if (!owned[i]) gaps_written += (p_flat[i] != kGap) + (m_flat[i] != kGap) + (v_flat[i] != kGap);
  }
  EXPECT_EQ(gaps_written, 0u) << "elements between the tensors were written";
}

INSTANTIATE_TEST_SUITE_P(Steps, AdamWTensorListTest, ::testing::Values(1, 2, 10),
                         [](const auto& info) { return std::to_string(info.param) + "_steps"; });

// ---- The trainer

// One reference step on elements [begin, end) of the concatenated tensors.
void reference_step(std::vector<double>& p, const std::vector<double>& g, std::vector<double>& m,
                    std::vector<double>& v, size_t begin, size_t end, const reference::AdamWOptions& options,
                    int64_t step, int64_t v_step) {
  auto slice = [&](const std::vector<double>& x) { return std::vector<double>(x.begin() + begin, x.begin() + end); };
  std::vector<double> ps = slice(p), ms = slice(m), vs = slice(v);
  reference::adamw_step(ps, slice(g), ms, vs, options, step, v_step);
  std::copy(ps.begin(), ps.end(), p.begin() + begin);
  std::copy(ms.begin(), ms.end(), m.begin() + begin);
  std::copy(vs.begin(), vs.end(), v.begin() + begin);
}

// The reference of a trainer: its state per element of the concatenated tensors.
struct TrainerReference {
  DType dtype;
  bool master;
  std::vector<double> p, master_p, m, v, magnitude;
  std::vector<double> peak;  // the largest |p| so far: a one-ulp divergence there lives on as |p| shrinks
  size_t decayed;            // elements of the tensors that take weight decay, the first ones
  // The frozen-variance steps' |change| of each parameter, summed: float's relative error is of the
  // size of the updates, which are up to max_step x lr each (m^ / max(sqrt(v^), |m^| / max_step)).
  std::vector<double> moved = {};

  // An AdamW step; `v_step` (default: `step`) counts the AdamW steps for v's bias correction, `step`
  // all steps for m's (they differ after frozen-variance steps).
  void step(const std::vector<double>& g, int64_t step, int64_t v_step = 0) {
    std::vector<double>& updated = master ? master_p : p;
    reference::AdamWOptions no_decay = kReference;
    no_decay.weight_decay = 0;
    if (v_step == 0) v_step = step;
    reference_step(updated, g, m, v, 0, decayed, kReference, step, v_step);
    reference_step(updated, g, m, v, decayed, p.size(), no_decay, step, v_step);
    for (size_t e = 0; e < p.size(); ++e) {
      if (master) master_p[e] = round_to(master_p[e], DType::f32);
      p[e] = round_to(updated[e], dtype);
      m[e] = round_to(m[e], DType::f32);
      v[e] = round_to(v[e], DType::f32);
      peak[e] = std::max(peak[e], std::fabs(p[e]));
    }
    track_magnitude(magnitude, g);
  }

  // A frozen-variance step (AdamWTrainer::step_frozen_variance) on velocity increments g.
  void frozen_step(const std::vector<double>& g, double velocity, int64_t frozen_steps, int64_t adamw_steps,
                   double max_step = 1.0) {
    std::vector<double>& updated = master ? master_p : p;
    reference::AdamWOptions no_decay = kReference;
    no_decay.weight_decay = 0;
    auto part = [&](size_t begin, size_t end, const reference::AdamWOptions& options) {
      auto slice = [&](const std::vector<double>& x) {
        return std::vector<double>(x.begin() + begin, x.begin() + end);
      };
      std::vector<double> ps = slice(updated), ms = slice(m);
      reference::adamw_frozen_variance_step(ps, slice(g), ms, slice(v), options, velocity, frozen_steps, adamw_steps,
                                            max_step);
      if (moved.empty()) moved.assign(p.size(), 0.0);
      for (size_t e = begin; e < end; ++e) moved[e] += std::fabs(ps[e - begin] - updated[e]);
      std::copy(ps.begin(), ps.end(), updated.begin() + begin);
      std::copy(ms.begin(), ms.end(), m.begin() + begin);
    };
    part(0, decayed, kReference);
    part(decayed, p.size(), no_decay);
    for (size_t e = 0; e < p.size(); ++e) {
      if (master) master_p[e] = round_to(master_p[e], DType::f32);
      p[e] = round_to(updated[e], dtype);
      m[e] = round_to(m[e], DType::f32);
      peak[e] = std::max(peak[e], std::fabs(p[e]));
    }
    track_magnitude(magnitude, g);
  }
};

// The trainer's flat buffers and the concatenated tensors: where each element lives.
std::vector<size_t> element_offsets(const AdamWTrainer& trainer) {
  std::vector<size_t> at;
  for (size_t t = 0; t < trainer.tensors(); ++t) {
    for (size_t i = 0; i < trainer.size(t); ++i) at.push_back(trainer.offset(t) + i);
  }
  return at;
}

// Fresh gradients: true values g (returned), stored as round(g x loss_scale) in the flat buffer.
std::vector<double> upload_gradients(const AdamWTrainer& trainer, const std::vector<size_t>& at, double loss_scale,
                                     std::mt19937_64& rng) {
  std::vector<double> flat(trainer.flat_elements(), 0.0), g(at.size());
  for (size_t e = 0; e < at.size(); ++e) {
    flat[at[e]] = round_to(random_gradient(rng) * loss_scale, trainer.dtype());
    g[e] = flat[at[e]] / loss_scale;
  }
  upload(trainer.gradients(), flat, trainer.dtype());
  return g;
}

// Fills the parameters (padding zero), loads the master weights; the reference starts from the same.
TrainerReference initialize(AdamWTrainer& trainer, const std::vector<size_t>& at, std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  const size_t n = at.size();
  size_t decayed = 0;
  for (size_t t = 0; t < trainer.decayed_tensors(); ++t) decayed += trainer.size(t);
  TrainerReference ref{trainer.dtype(),
                       trainer.master_weights(),
                       std::vector<double>(n),
                       {},
                       std::vector<double>(n),
                       std::vector<double>(n),
                       std::vector<double>(n),
                       {},
                       decayed};
  std::vector<double> flat(trainer.flat_elements(), 0.0);
  for (size_t e = 0; e < n; ++e) flat[at[e]] = ref.p[e] = round_to(0.05 * normal(rng), trainer.dtype());
  ref.master_p = ref.p;
  ref.peak.resize(n);
  for (size_t e = 0; e < n; ++e) ref.peak[e] = std::fabs(ref.p[e]);
  upload(trainer.parameters(), flat, trainer.dtype());
  trainer.load_master_weights(nullptr);
  return ref;
}

struct TrainerOutputs {
  std::vector<double> p, master, m, v;  // flat
};

TrainerOutputs download_all(const AdamWTrainer& trainer) {
  const size_t n = trainer.flat_elements();
  TrainerOutputs out{download(trainer.parameters(), n, trainer.dtype()),
                     {},
                     download(trainer.exp_avg(), n, DType::f32),
                     download(trainer.exp_avg_sq(), n, DType::f32)};
  if (trainer.master_weights()) out.master = download(trainer.master(), n, DType::f32);
  return out;
}

std::vector<double> gather(const std::vector<double>& flat, const std::vector<size_t>& at) {
  std::vector<double> compact(at.size());
  for (size_t e = 0; e < at.size(); ++e) compact[e] = flat[at[e]];
  return compact;
}

void expect_matches(const AdamWTrainer& trainer, const TrainerReference& ref, const std::vector<double>& p0,
                    const std::vector<size_t>& at, int steps) {
  const TrainerOutputs out = download_all(trainer);
  const DType dtype = trainer.dtype();
  const double rounds = steps + 1;
  auto master_tolerance = [&](size_t e) {
    return rounds * (ulp(ref.master_p[e], DType::f32) + 1e-5 * kReference.lr) +
           (ref.moved.empty() ? 0 : 1e-6 * ref.moved[e]);
  };
  const std::vector<double> p = gather(out.p, at);
  if (trainer.master_weights()) {
    const std::vector<double> master = gather(out.master, at);
    expect_close(master, ref.master_p, master_tolerance, "master");
    EXPECT_LT(relative_error(difference(master, p0), difference(ref.master_p, p0)), tolerance(DType::f32))
        << "master change";
    // The parameters are the master weights rounded: one ulp apart where the two masters straddle a rounding point.
    expect_close(
        p, ref.p,
        [&](size_t e) { return ulp(std::max(std::fabs(p[e]), std::fabs(ref.p[e])), dtype) + master_tolerance(e); },
        "param");
  } else {
    // Rounded every step: once the two round apart they stay about an ulp apart (of the largest |p|
    // the element had), rarely two.
    expect_close(
        p, ref.p,
        [&](size_t e) {
          return 3 * ulp(std::max(std::fabs(p[e]), ref.peak[e]), dtype) + rounds * 1e-5 * kReference.lr +
                 (ref.moved.empty() ? 0 : 1e-6 * ref.moved[e]);
        },
        "param");
  }
  EXPECT_LT(relative_error(difference(p, p0), difference(ref.p, p0)), tolerance(dtype)) << "param change";
  const std::vector<double> m = gather(out.m, at), v = gather(out.v, at);
  expect_close(
      m, ref.m, [&](size_t e) { return rounds * 8 * kUnitRoundoff * ref.magnitude[e]; }, "exp_avg");
  expect_close(
      v, ref.v, [&](size_t e) { return rounds * 8 * kUnitRoundoff * ref.v[e]; }, "exp_avg_sq");
  EXPECT_LT(relative_error(m, ref.m), tolerance(DType::f32)) << "exp_avg";
  EXPECT_LT(relative_error(v, ref.v), tolerance(DType::f32)) << "exp_avg_sq";

  // The padding stays zero.
  std::vector<bool> owned(trainer.flat_elements(), false);
  for (size_t i : at) owned[i] = true;
  size_t padding_written = 0;
  for (size_t i = 0; i < owned.size(); ++i) {
    if (owned[i]) continue;
    padding_written += (out.p[i] != 0) + (out.m[i] != 0) + (out.v[i] != 0);
    if (trainer.master_weights()) padding_written += out.master[i] != 0;
  }
  EXPECT_EQ(padding_written, 0u) << "padding was written";
}

void expect_views(const AdamWTrainer& trainer) {
  size_t sum = 0;
  for (size_t t = 0; t < trainer.tensors(); ++t) {
    EXPECT_EQ(trainer.offset(t) * dtype_size(trainer.dtype()) % 16, 0u) << "tensor " << t << " not 16-byte aligned";
    EXPECT_EQ(static_cast<char*>(trainer.parameter(t)),
              static_cast<char*>(trainer.parameters()) + trainer.offset(t) * dtype_size(trainer.dtype()));
    EXPECT_EQ(static_cast<char*>(trainer.gradient(t)),
              static_cast<char*>(trainer.gradients()) + trainer.offset(t) * dtype_size(trainer.dtype()));
    if (t > 0) EXPECT_GE(trainer.offset(t), trainer.offset(t - 1) + trainer.size(t - 1)) << "tensors overlap";
    sum += trainer.size(t);
  }
  EXPECT_GE(trainer.flat_elements(), sum);
}

struct TrainerParam {
  DType dtype;
  bool master;
  int steps;
  size_t decayed;  // tensors that take weight decay (AdamWTrainer::kAllTensors: all)
};

class AdamWTrainerTest : public ::testing::TestWithParam<TrainerParam> {};

TEST_P(AdamWTrainerTest, MatchesFloat64Reference) {
  FUSEKIT_REQUIRE_GPU();
  const TrainerParam param = GetParam();
  // A power of two (unscaling exact) with master weights, not one without.
  const double loss_scale = param.master ? 1024 : 3000;
  std::mt19937_64 rng(std::random_device{}());
  AdamWTrainer trainer(param.dtype, kSizes, param.master, param.decayed);
  expect_views(trainer);
  EXPECT_EQ(trainer.decayed_tensors(), param.decayed == AdamWTrainer::kAllTensors ? kSizes.size() : param.decayed);
  const std::vector<size_t> at = element_offsets(trainer);
  TrainerReference ref = initialize(trainer, at, rng);
  const std::vector<double> p0 = ref.p;
  for (int step = 1; step <= param.steps; ++step) {
    const std::vector<double> g = upload_gradients(trainer, at, loss_scale, rng);
    trainer.step(options(), static_cast<float>(loss_scale), nullptr);
    ref.step(g, step);
  }
  EXPECT_EQ(trainer.step_count(nullptr), param.steps);
  expect_matches(trainer, ref, p0, at, param.steps);
}

std::string trainer_name(const ::testing::TestParamInfo<TrainerParam>& info) {
  const TrainerParam& p = info.param;
  return std::string(dtype_name(p.dtype)) + (p.master ? "_master_" : "_no_master_") + std::to_string(p.steps) +
         "_steps" + (p.decayed == AdamWTrainer::kAllTensors ? "" : "_decay_" + std::to_string(p.decayed));
}

std::vector<TrainerParam> trainer_params() {
  std::vector<TrainerParam> out;
  for (DType dtype : {DType::f16, DType::bf16}) {
    for (bool master : {true, false}) {
      for (int steps : {1, 2, 10}) out.push_back({dtype, master, steps, AdamWTrainer::kAllTensors});
      // Decay on none, on the two smallest (the boundary before the 31), on all but the largest:
      // ten steps, so that decay on the wrong side moves elements past their bounds.
      for (size_t decayed : {0, 2, 4}) out.push_back({dtype, master, 10, decayed});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Trainers, AdamWTrainerTest, ::testing::ValuesIn(trainer_params()), trainer_name);

class AdamWTrainerSkipTest : public ::testing::TestWithParam<std::tuple<DType, bool>> {};

TEST_P(AdamWTrainerSkipTest, NonFiniteGradientSkipsTheStep) {
  FUSEKIT_REQUIRE_GPU();
  const DType dtype = std::get<0>(GetParam());
  const bool master = std::get<1>(GetParam());
  const double loss_scale = 1024;
  std::mt19937_64 rng(std::random_device{}());
  AdamWTrainer trainer(dtype, kSizes, master);
  const std::vector<size_t> at = element_offsets(trainer);
  TrainerReference ref = initialize(trainer, at, rng);
  const std::vector<double> p0 = ref.p;
  ref.step(upload_gradients(trainer, at, loss_scale, rng), 1);
  trainer.step(options(), static_cast<float>(loss_scale), nullptr);

  const size_t n = trainer.flat_elements(), bytes = n * dtype_size(dtype);
  auto snapshot = [&] {
    std::vector<std::vector<uint8_t>> s = {raw_bytes(trainer.parameters(), bytes), raw_bytes(trainer.exp_avg(), n * 4),
                                           raw_bytes(trainer.exp_avg_sq(), n * 4)};
    if (master) s.push_back(raw_bytes(trainer.master(), n * 4));
    return s;
  };
  const auto before = snapshot();
  // One bad element at a time: +inf in the middle of the largest tensor, NaN as the only element
  // of the first, -inf as the last element of the flat buffer's last tensor.
  struct Poison {
    size_t element;
    double value;
    const char* name;
  };
  const Poison poisons[] = {{trainer.offset(4) + trainer.size(4) / 2, INFINITY, "+inf"},
                            {trainer.offset(0), NAN, "NaN"},
                            {trainer.offset(4) + trainer.size(4) - 1, -INFINITY, "-inf"}};
  for (const Poison& poison : poisons) {
    upload_gradients(trainer, at, loss_scale, rng);
    std::vector<double> one = {poison.value};
    upload(static_cast<char*>(trainer.gradients()) + poison.element * dtype_size(dtype), one, dtype);
    trainer.step(options(), static_cast<float>(loss_scale), nullptr);
    EXPECT_EQ(trainer.step_count(nullptr), 1) << poison.name << ": the step count advanced";
    EXPECT_TRUE(snapshot() == before) << poison.name << ": a buffer changed";
  }
  // The next finite step is step 2 of the reference (its bias corrections say so).
  ref.step(upload_gradients(trainer, at, loss_scale, rng), 2);
  trainer.step(options(), static_cast<float>(loss_scale), nullptr);
  EXPECT_EQ(trainer.step_count(nullptr), 2);
  expect_matches(trainer, ref, p0, at, 2);
}

INSTANTIATE_TEST_SUITE_P(Trainers, AdamWTrainerSkipTest,
                         ::testing::Combine(::testing::Values(DType::f16, DType::bf16), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_master" : "_no_master");
                         });

// The frozen-variance step: three AdamW steps, four frozen ones with a non-finite one among them
// (skipped: nothing changes), an AdamW step again (m's bias correction counts every step, 8; v's the
// AdamW steps, 4), then a second freeze (from 4 AdamW steps) whose steps may reach 8 lr (max_step).
// v keeps its bits while frozen.
class AdamWTrainerFrozenVarianceTest : public ::testing::TestWithParam<std::tuple<DType, bool>> {};

TEST_P(AdamWTrainerFrozenVarianceTest, MatchesFloat64Reference) {
  FUSEKIT_REQUIRE_GPU();
  const DType dtype = std::get<0>(GetParam());
  const bool master = std::get<1>(GetParam());
  const double loss_scale = master ? 1024 : 3000;
  const double velocity = 0.85;
  std::mt19937_64 rng(std::random_device{}());
  AdamWTrainer trainer(dtype, kSizes, master, 2);
  const std::vector<size_t> at = element_offsets(trainer);
  TrainerReference ref = initialize(trainer, at, rng);
  const std::vector<double> p0 = ref.p;
  const auto scale = static_cast<float>(loss_scale);
  EXPECT_THROW(trainer.step_frozen_variance(options(), velocity, scale, nullptr), std::logic_error);
  for (int step = 1; step <= 3; ++step) {
    ref.step(upload_gradients(trainer, at, loss_scale, rng), step);
    trainer.step(options(), scale, nullptr);
  }
  const size_t n = trainer.flat_elements(), bytes = n * dtype_size(dtype);
  const std::vector<uint8_t> v_before = raw_bytes(trainer.exp_avg_sq(), n * 4);
  for (int frozen = 1; frozen <= 4; ++frozen) {
    if (frozen == 3) {  // a non-finite gradient: the step is skipped and s does not advance
      const std::vector<uint8_t> p_before = raw_bytes(trainer.parameters(), bytes);
      upload_gradients(trainer, at, loss_scale, rng);
      std::vector<double> bad = {INFINITY};
      upload(static_cast<char*>(trainer.gradients()) + trainer.offset(4) * dtype_size(dtype), bad, dtype);
      trainer.step_frozen_variance(options(), velocity, scale, nullptr);
      EXPECT_EQ(trainer.step_count(nullptr), 5);
      EXPECT_TRUE(raw_bytes(trainer.parameters(), bytes) == p_before) << "a skipped frozen step moved parameters";
    }
    ref.frozen_step(upload_gradients(trainer, at, loss_scale, rng), velocity, frozen, 3);
    trainer.step_frozen_variance(options(), velocity, scale, nullptr);
  }
  EXPECT_TRUE(raw_bytes(trainer.exp_avg_sq(), n * 4) == v_before) << "a frozen step wrote the second moment";
  EXPECT_EQ(trainer.step_count(nullptr), 7);
  expect_matches(trainer, ref, p0, at, 7);
  ref.step(upload_gradients(trainer, at, loss_scale, rng), 8, 4);
  trainer.step(options(), scale, nullptr);
  for (int frozen = 1; frozen <= 2; ++frozen) {
    ref.frozen_step(upload_gradients(trainer, at, loss_scale, rng), velocity, frozen, 4, 8.0);
    trainer.step_frozen_variance(options(), velocity, scale, nullptr, 8.0);
  }
  EXPECT_EQ(trainer.step_count(nullptr), 10);
  expect_matches(trainer, ref, p0, at, 10);
  EXPECT_THROW(trainer.step_frozen_variance(options(), 1.0, scale, nullptr), std::invalid_argument);
  EXPECT_THROW(trainer.step_frozen_variance(options(), velocity, scale, nullptr, 0.5), std::invalid_argument);
}

// Every AdamW step skipped (non-finite gradients): v is still zero, so a frozen step is skipped too
// (it would divide by zero), instead of writing NaN into every parameter.
TEST(AdamWTrainerFrozenVariance, IsSkippedWhileTheSecondMomentIsEmpty) {
  FUSEKIT_REQUIRE_GPU();
  std::mt19937_64 rng(std::random_device{}());
  AdamWTrainer trainer(DType::f16, kSizes, true);
  const std::vector<size_t> at = element_offsets(trainer);
  initialize(trainer, at, rng);
  const size_t n = trainer.flat_elements(), bytes = n * dtype_size(DType::f16);
  const std::vector<uint8_t> before = raw_bytes(trainer.parameters(), bytes),
                             master_before = raw_bytes(trainer.master(), n * 4),
                             m_before = raw_bytes(trainer.exp_avg(), n * 4);
  upload_gradients(trainer, at, 1024, rng);
  std::vector<double> bad = {NAN};
  upload(trainer.gradients(), bad, DType::f16);
  trainer.step(options(), 1024.f, nullptr);  // skipped: no AdamW step taken
  upload_gradients(trainer, at, 1024, rng);
  trainer.step_frozen_variance(options(), 0.9, 1024.f, nullptr);
  EXPECT_EQ(trainer.step_count(nullptr), 0);
  EXPECT_TRUE(raw_bytes(trainer.parameters(), bytes) == before) << "a frozen step ran without a second moment";
  EXPECT_TRUE(raw_bytes(trainer.master(), n * 4) == master_before) << "the master weights moved";
  EXPECT_TRUE(raw_bytes(trainer.exp_avg(), n * 4) == m_before) << "exp_avg was written";
}

INSTANTIATE_TEST_SUITE_P(Trainers, AdamWTrainerFrozenVarianceTest,
                         ::testing::Combine(::testing::Values(DType::f16, DType::bf16), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_master" : "_no_master");
                         });

// Zero gradients on fresh moments: m and v stay 0, the update term is 0 / (0 + eps) = 0, and a step
// is the weight decay alone. So with lr x weight_decay = 0.1 every parameter of the first
// `decayed` tensors becomes p x 0.9 (in float, then rounded to the storage type) and every other
// one keeps its bits, for each boundary 0 .. 5; the step count advances.
class AdamWTrainerDecayTest : public ::testing::TestWithParam<std::tuple<DType, bool>> {};

TEST_P(AdamWTrainerDecayTest, DecaysExactlyTheFirstTensors) {
  FUSEKIT_REQUIRE_GPU();
  const DType dtype = std::get<0>(GetParam());
  const bool master = std::get<1>(GetParam());
  AdamWOptions decay_only = options();
  decay_only.lr = 0.1;
  decay_only.weight_decay = 1.0;
  const float factor = static_cast<float>(1.0 - decay_only.lr * decay_only.weight_decay);  // as the kernel rounds it
  std::mt19937_64 rng(std::random_device{}());
  for (size_t decayed = 0; decayed <= kSizes.size(); ++decayed) {
    SCOPED_TRACE(std::to_string(decayed) + " tensors decayed");
    AdamWTrainer trainer(dtype, kSizes, master, decayed);
    const std::vector<size_t> at = element_offsets(trainer);
    const TrainerReference start = initialize(trainer, at, rng);  // the gradients are zero (allocated so)
    EXPECT_EQ(trainer.decay_end(), decayed < kSizes.size() ? trainer.offset(decayed) : trainer.flat_elements());
    trainer.step(decay_only, 1024.f, nullptr);
    EXPECT_EQ(trainer.step_count(nullptr), 1);
    const std::vector<double> p = gather(download(trainer.parameters(), trainer.flat_elements(), dtype), at);
    std::vector<double> expected = start.p;
    for (size_t e = 0; e < start.decayed; ++e) expected[e] = round_to(static_cast<float>(start.p[e]) * factor, dtype);
    size_t bad = 0;
    for (size_t e = 0; e < expected.size(); ++e) {
      if (p[e] != expected[e]) {
        if (bad < 5) ADD_FAILURE() << "param[" << e << "] = " << p[e] << ", expected " << expected[e];
        ++bad;
      }
    }
    EXPECT_EQ(bad, 0u) << "parameters not decayed exactly as their tensor says";
    if (master) {
      const std::vector<double> m = gather(download(trainer.master(), trainer.flat_elements(), DType::f32), at);
      for (size_t e = 0; e < expected.size(); ++e) {
        const double want = e < start.decayed ? static_cast<float>(start.p[e]) * factor : start.p[e];
        if (m[e] != want) {
          ADD_FAILURE() << "master[" << e << "] = " << m[e] << ", expected " << want;
          break;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Trainers, AdamWTrainerDecayTest,
                         ::testing::Combine(::testing::Values(DType::f16, DType::bf16), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_master" : "_no_master");
                         });

TEST(AdamWArguments, AreChecked) {
  FUSEKIT_REQUIRE_GPU();
  EXPECT_THROW(AdamWTrainer(DType::f32, {8}, true), std::invalid_argument);
  EXPECT_THROW(AdamWTrainer(DType::f16, {8, 8}, true, 3), std::invalid_argument);  // more decayed tensors than tensors
  EXPECT_EQ(AdamWTrainer(DType::f16, {8, 8}, false, 2).decay_end(), 16u);
  EXPECT_EQ(AdamWTrainer(DType::f16, {3, 8}, false, 1).decay_end(), 8u);  // tensor 1 starts at the next 16 bytes
  const AdamWTensorList empty({});
  EXPECT_EQ(empty.chunks(), 0);
  EXPECT_THROW(adamw_step(empty, options(), 0, nullptr), std::invalid_argument);
  AdamWOptions bad = options();
  bad.beta1 = 1.0;
  EXPECT_THROW(adamw_step(empty, bad, 1, nullptr), std::invalid_argument);
  bad = options();
  bad.eps = NAN;
  EXPECT_THROW(adamw_step(empty, bad, 1, nullptr), std::invalid_argument);
  EXPECT_THROW(AdamWTensorList({{nullptr, nullptr, nullptr, nullptr, 5}}), std::invalid_argument);
  AdamWTrainer trainer(DType::f16, {3}, false);
  EXPECT_THROW(trainer.step(options(), 0.0f, nullptr), std::invalid_argument);
  EXPECT_THROW(trainer.step(options(), INFINITY, nullptr), std::invalid_argument);
  EXPECT_EQ(trainer.step_count(nullptr), 0);
}

}  // namespace
}  // namespace fusekit::kernels
