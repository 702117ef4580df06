// The Mann-Whitney U test against hand-derived and exactly counted p-values, and the regression gate on
// seeded synthetic samples: a clear regression, an improvement, identical distributions, noise, a shift
// below the threshold, one-sided cases and too few samples.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>
#include <stdexcept>

#include "profiler/attribution.h"
#include "profiler/gpu_conditions.h"
#include "profiler/summary.h"
#include "reports/gate.h"
#include "reports/markdown.h"
#include "reports/terminal.h"

namespace fusekit::reports {
namespace {

CaseResult make_case(const std::string& name, const std::string& variant, std::vector<double> samples_ns) {
  CaseResult c;
  c.info.name = name;
  c.info.variant = variant;
  c.median_ns = profiler::median(samples_ns);
  c.samples_ns = std::move(samples_ns);
  return c;
}

// A hand-made trace of one case's traced repetitions, as the runner records them: a range "<case> [<variant>]"
// on thread 1 holding `kernels_per_rep.size()` ranges "rep", each launching the given kernels (name,
// duration) from thread 1; a name starting with '@' is launched from thread 2, which holds no range (as
// autograd's thread does); "a/b|name" launches the kernel inside ranges "a" and, nested in it, "b".
class TraceBuilder {
 public:
  void add_case(const std::string& name, const std::string& variant,
                const std::vector<std::vector<std::pair<std::string, uint64_t>>>& kernels_per_rep,
                bool mark_reps = true) {
    const uint64_t case_start = t_;
    t_ += 10;
    for (const auto& rep_kernels : kernels_per_rep) {
      const uint64_t rep_start = t_;
      t_ += 10;
      for (const auto& [spec, duration] : rep_kernels) {
        const size_t bar = spec.find('|');
        const std::string kernel = bar == std::string::npos ? spec : spec.substr(bar + 1);
        std::vector<std::string> path;
        for (size_t at = 0; bar != std::string::npos && at < bar;) {
          const size_t slash = std::min(spec.find('/', at), bar);
          path.push_back(spec.substr(at, slash - at));
          at = slash + 1;
        }
        const bool other_thread = kernel[0] == '@';
        profiler::ApiRecord call;
        call.start = t_;
        call.end = t_ + 5;
        call.process_id = 7;
        call.thread_id = other_thread ? 2 : 1;
        call.correlation_id = ++correlation_;
        call.name = "cudaLaunchKernel";
        trace.api_calls.push_back(call);
        profiler::KernelRecord k;
        k.start = t_ + 5;
        k.end = t_ + 5 + duration;
        k.correlation_id = correlation_;
        k.process_id = 7;
        k.name = other_thread ? kernel.substr(1) : kernel;
        trace.kernels.push_back(k);
        // Nested ranges around the launch, innermost last: each spans the launch call.
        for (size_t depth = 0; depth < path.size(); ++depth) {
          trace.ranges.push_back(range(path[depth], call.start - 2 + depth, call.end + 2 - depth));
        }
        t_ += duration + 10;
      }
      if (mark_reps) trace.ranges.push_back(range("rep", rep_start, t_));
      t_ += 10;
    }
    trace.ranges.push_back(range(name + " [" + variant + "]", case_start, t_));
    t_ += 100;
  }
  profiler::Trace trace;

 private:
  static profiler::RangeRecord range(const std::string& text, uint64_t start, uint64_t end) {
    profiler::RangeRecord r;
    r.start = start;
    r.end = end;
    r.process_id = 7;
    r.thread_id = r.end_thread_id = 1;
    r.text = text;
    return r;
  }
  uint64_t t_ = 1000;
  uint32_t correlation_ = 0;
};

std::map<CaseKey, RepetitionKernels> repetition_kernels(const TraceBuilder& b, const std::set<CaseKey>& cases) {
  return case_repetition_kernels(b.trace, profiler::attribute(b.trace), cases);
}

// `count` samples of median_ns * (1 + relative_noise * N(0, 1)).
std::vector<double> noisy_samples(std::mt19937& rng, double median_ns, double relative_noise, size_t count) {
  std::normal_distribution<double> noise(0.0, relative_noise);
  std::vector<double> samples;
  for (size_t i = 0; i < count; ++i) samples.push_back(median_ns * (1 + noise(rng)));
  return samples;
}

// ---- Mann-Whitney U

// With no ties and sizes m, n every one of the C(m+n, m) orderings is equally likely under the null
// hypothesis; two-sided p = 2 P(U <= min(U, mn - U)).
TEST(MannWhitney, SeparatedSamplesTakeTheSmallestExactP) {
  // Only one of the C(6, 3) = 20 orderings gives U = 0: p = 2 / 20.
  const MannWhitneyResult r = mann_whitney_u({1, 2, 3}, {4, 5, 6});
  EXPECT_EQ(r.u, 0);
  EXPECT_NEAR(r.p_value, 0.1, 1e-15);
}

TEST(MannWhitney, InterleavedSamplesExact) {
  // U = 3 pairs with a > b (3 > 2, 5 > 2, 5 > 4). The counts of U = 0..9 for sizes 3, 3 are
  // 1 1 2 3 3 3 3 2 1 1, so P(U <= 3) = 7 / 20 and p = 0.7.
  const MannWhitneyResult r = mann_whitney_u({1, 3, 5}, {2, 4, 6});
  EXPECT_EQ(r.u, 3);
  EXPECT_NEAR(r.p_value, 0.7, 1e-15);
}

TEST(MannWhitney, ScipyDocumentationExample) {
  // scipy.stats.mannwhitneyu's documented example: U = 17, exact p = 14 / 126.
  const MannWhitneyResult r = mann_whitney_u({19, 22, 16, 29, 24}, {20, 11, 17, 12});
  EXPECT_EQ(r.u, 17);
  EXPECT_NEAR(r.p_value, 1.0 / 9, 1e-15);
}

TEST(MannWhitney, ArgumentOrderMirrorsU) {
  const std::vector<double> a = {3.1, 0.5, 7.2, 4.4, 9.0, 1.2}, b = {2.0, 8.8, 6.1, 5.5};
  const MannWhitneyResult ab = mann_whitney_u(a, b), ba = mann_whitney_u(b, a);
  EXPECT_EQ(ab.u + ba.u, 24);
  EXPECT_DOUBLE_EQ(ab.p_value, ba.p_value);
}

TEST(MannWhitney, ExactAtTheLargestExactSizes) {
  std::vector<double> a, b, shifted;
  for (int i = 0; i < 50; ++i) {
    a.push_back(i);
    b.push_back(i + 100);
    shifted.push_back(i + 20.5);
  }
  // Full separation: p = 2 / C(100, 50), C(100, 50) = 100891344545564193334812497256.
  const MannWhitneyResult separated = mann_whitney_u(a, b);
  EXPECT_EQ(separated.u, 0);
  EXPECT_NEAR(separated.p_value / (2 / 100891344545564193334812497256.0), 1, 1e-12);
  // a_i > shifted_j iff i >= j + 21: U = 29 + 28 + ... + 1 = 435. Reference p from an independent count in
  // Python big integers (the recurrence c(m, n, u) = c(m-1, n, u-n) + c(m, n-1, u)).
  const MannWhitneyResult partial = mann_whitney_u(a, shifted);
  EXPECT_EQ(partial.u, 435);
  EXPECT_NEAR(partial.p_value / 3.3553375012889068e-09, 1, 1e-10);
}

TEST(MannWhitney, NormalApproximationWithTies) {
  // Pooled and sorted: 1(a) | 2 2 2 (a a b) ranks 2-4, average 3 | 3 3 3 (a b b) ranks 5-7, average 6 | 4(a) 8 |
  // 5(b) 9 | 6 6 (b b) 10.5. R_a = 1 + 3 + 3 + 6 + 8 = 21, U = 21 - 15 = 6, mean 15.
  // Ties: sum t^3 - t = 24 + 24 + 6 = 54; sigma^2 = 30 / 12 * (12 - 54 / 110) = 28.7727...
  // z = (24 - 15 - 0.5) / sigma = 1.58463...; p = erfc(z / sqrt 2).
  const MannWhitneyResult r = mann_whitney_u({1, 2, 2, 3, 4}, {2, 3, 3, 5, 6, 6});
  EXPECT_EQ(r.u, 6);
  EXPECT_NEAR(r.p_value, 0.11304997885632297, 1e-12);
}

TEST(MannWhitney, NormalApproximationAboveTheExactSizes) {
  // 60 against 60 without ties: a_i > b_j iff i >= j + 31, so U = 435; mean 1800, sigma = sqrt(3600 * 121 / 12),
  // z = (3165 - 1800 - 0.5) / sigma = 7.1618.
  std::vector<double> a, b;
  for (int i = 0; i < 60; ++i) {
    a.push_back(i);
    b.push_back(i + 30.5);
  }
  const MannWhitneyResult r = mann_whitney_u(a, b);
  EXPECT_EQ(r.u, 435);
  EXPECT_NEAR(r.p_value / 7.964332670470494e-13, 1, 1e-9);
}

TEST(MannWhitney, IdenticalValuesGiveOne) {
  const MannWhitneyResult r = mann_whitney_u({5, 5, 5, 5}, {5, 5, 5});
  EXPECT_EQ(r.u, 6);
  EXPECT_EQ(r.p_value, 1);
}

TEST(MannWhitney, RejectsEmptySamplesAndNaN) {
  EXPECT_THROW(mann_whitney_u({}, {1, 2}), std::invalid_argument);
  EXPECT_THROW(mann_whitney_u({1, 2}, {}), std::invalid_argument);
  EXPECT_THROW(mann_whitney_u({1, std::nan("")}, {1, 2}), std::invalid_argument);
}

// ---- the gate

TEST(Gate, ClearRegression) {
  std::mt19937 rng(1234);
  const auto baseline = noisy_samples(rng, 100e3, 0.01, 20);
  const auto candidate = noisy_samples(rng, 120e3, 0.01, 20);
  const GateResult g = run_gate({make_case("ln/8192x768", "fused", baseline)},
                                {make_case("ln/8192x768", "fused", candidate)}, GateOptions{});
  ASSERT_EQ(g.rows.size(), 1u);
  const GateRow& row = g.rows[0];
  EXPECT_EQ(row.verdict, Verdict::regressed);
  EXPECT_TRUE(g.any_regression());
  EXPECT_EQ(row.baseline_n, 20u);
  EXPECT_EQ(row.candidate_n, 20u);
  EXPECT_NEAR(row.change, 0.2, 0.02);
  // Full separation of 20 against 20 would give 2 / C(40, 20) = 1.45e-11; anything near it is far below alpha.
  EXPECT_LT(row.p_value, 1e-8);
  EXPECT_DOUBLE_EQ(row.baseline_median_ns, profiler::median(baseline));
}

TEST(Gate, ImprovementIsNotARegression) {
  std::mt19937 rng(99);
  const GateResult g = run_gate({make_case("gelu", "fused", noisy_samples(rng, 50e3, 0.01, 20))},
                                {make_case("gelu", "fused", noisy_samples(rng, 40e3, 0.01, 20))}, GateOptions{});
  ASSERT_EQ(g.rows.size(), 1u);
  EXPECT_EQ(g.rows[0].verdict, Verdict::improved);
  EXPECT_NEAR(g.rows[0].change, -0.2, 0.02);
  EXPECT_FALSE(g.any_regression());
}

TEST(Gate, IdenticalDistributionsNeverRegress) {
  // 200 independent pairs drawn from one distribution: the test alone rejects about alpha = 1% of them, but a
  // 5% median shift with 2% noise and 20 samples lies about 8 standard errors out, so the gate flags none.
  std::mt19937 rng(7);
  size_t significant = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const GateResult g = run_gate({make_case("softmax", "fused", noisy_samples(rng, 80e3, 0.02, 20))},
                                  {make_case("softmax", "fused", noisy_samples(rng, 80e3, 0.02, 20))}, GateOptions{});
    ASSERT_EQ(g.rows.size(), 1u);
    EXPECT_NE(g.rows[0].verdict, Verdict::regressed) << "trial " << trial;
    EXPECT_FALSE(g.any_regression());
    significant += g.rows[0].p_value < 0.01;
  }
  // Binomial(200, 0.01): mean 2, P(more than 8) < 1e-3.
  EXPECT_LE(significant, 8u);
}

TEST(Gate, LargeNoiseHidesATinyShift) {
  std::mt19937 rng(42);
  const GateResult g = run_gate({make_case("attn", "fused", noisy_samples(rng, 200e3, 0.3, 20))},
                                {make_case("attn", "fused", noisy_samples(rng, 204e3, 0.3, 20))}, GateOptions{});
  ASSERT_EQ(g.rows.size(), 1u);
  EXPECT_EQ(g.rows[0].verdict, Verdict::unchanged);
  EXPECT_GT(g.rows[0].p_value, 0.01);
}

TEST(Gate, SignificantShiftBelowThresholdIsUnchanged) {
  std::mt19937 rng(5);
  const GateResult g = run_gate({make_case("adamw", "fused", noisy_samples(rng, 100e3, 0.001, 20))},
                                {make_case("adamw", "fused", noisy_samples(rng, 102e3, 0.001, 20))}, GateOptions{});
  ASSERT_EQ(g.rows.size(), 1u);
  EXPECT_LT(g.rows[0].p_value, 1e-8);
  EXPECT_NEAR(g.rows[0].change, 0.02, 0.002);
  EXPECT_EQ(g.rows[0].verdict, Verdict::unchanged);

  GateOptions strict;
  strict.threshold = 0.01;
  EXPECT_EQ(run_gate({make_case("adamw", "fused", noisy_samples(rng, 100e3, 0.001, 20))},
                     {make_case("adamw", "fused", noisy_samples(rng, 102e3, 0.001, 20))}, strict)
                .rows[0]
                .verdict,
            Verdict::regressed);
}

TEST(Gate, OneSidedCasesAreListedNotCompared) {
  std::mt19937 rng(11);
  const std::vector<CaseResult> baseline = {make_case("ln", "fused", noisy_samples(rng, 1e5, 0.01, 10)),
                                            make_case("old", "fused", noisy_samples(rng, 1e5, 0.01, 10))};
  const std::vector<CaseResult> candidate = {make_case("new", "fused", noisy_samples(rng, 9e5, 0.01, 10)),
                                             make_case("ln", "fused", noisy_samples(rng, 1e5, 0.01, 10)),
                                             make_case("ln", "baseline", noisy_samples(rng, 1e5, 0.01, 10))};
  const GateResult g = run_gate(baseline, candidate, GateOptions{});
  ASSERT_EQ(g.rows.size(), 1u);
  EXPECT_EQ(g.rows[0].name, "ln");
  EXPECT_EQ(g.rows[0].variant, "fused");
  EXPECT_EQ(g.only_in_baseline, std::vector<std::string>{"old [fused]"});
  EXPECT_EQ(g.only_in_candidate, (std::vector<std::string>{"new [fused]", "ln [baseline]"}));
  EXPECT_FALSE(g.any_regression());
  const std::string text = gate_table_text(g);
  EXPECT_NE(text.find("only in baseline:  old [fused]\n"), std::string::npos) << text;
  EXPECT_NE(text.find("only in candidate: ln [baseline]\n"), std::string::npos) << text;
  const std::string markdown = gate_table_markdown(g);
  EXPECT_NE(markdown.find("**Only in candidate:**\n\n- `new [fused]`\n- `ln [baseline]`\n"), std::string::npos)
      << markdown;
}

// The libtorch baseline and the peers time code that a change to fusekit does not touch: their verdicts
// are shown but fail nothing, unless every variant is gated.
TEST(Gate, OnlyFusedVariantsFailByDefault) {
  std::mt19937 rng(12);
  const std::vector<CaseResult> baseline = {make_case("emb", "fused", noisy_samples(rng, 1e5, 0.01, 30)),
                                            make_case("emb", "fused:graph", noisy_samples(rng, 1e5, 0.01, 30)),
                                            make_case("emb", "baseline", noisy_samples(rng, 9e5, 0.01, 30)),
                                            make_case("emb", "peer:eager", noisy_samples(rng, 9e5, 0.01, 30))};
  std::vector<CaseResult> candidate = {make_case("emb", "fused", noisy_samples(rng, 1e5, 0.01, 30)),
                                       make_case("emb", "fused:graph", noisy_samples(rng, 1e5, 0.01, 30)),
                                       make_case("emb", "baseline", noisy_samples(rng, 1.2e6, 0.01, 30)),
                                       make_case("emb", "peer:eager", noisy_samples(rng, 1.2e6, 0.01, 30))};
  GateResult g = run_gate(baseline, candidate, GateOptions{});
  ASSERT_EQ(g.rows.size(), 4u);
  EXPECT_TRUE(g.rows[0].gated);
  EXPECT_TRUE(g.rows[1].gated);
  EXPECT_FALSE(g.rows[2].gated);
  EXPECT_FALSE(g.rows[3].gated);
  EXPECT_EQ(g.rows[2].verdict, Verdict::regressed);  // the verdict is still worked out and shown
  EXPECT_FALSE(g.rows[2].fails());
  EXPECT_FALSE(g.any_regression());
  const std::string text = gate_table_text(g);
  EXPECT_NE(text.find("regressed (not gated)"), std::string::npos) << text;
  EXPECT_NE(text.find("0 regressed, 0 improved, 2 unchanged, 0 too few samples; not gated"), std::string::npos) << text;
  EXPECT_NE(text.find("shown, fail nothing): 2 regressed"), std::string::npos) << text;
  const std::string markdown = gate_table_markdown(g);
  EXPECT_EQ(markdown.find("**regressed**"), std::string::npos) << markdown;

  GateOptions every;
  every.gate_every_variant = true;
  g = run_gate(baseline, candidate, every);
  EXPECT_TRUE(g.rows[2].fails());
  EXPECT_TRUE(g.any_regression());
  EXPECT_EQ(gate_table_text(g).find("not gated"), std::string::npos);

  // A slower fused variant fails by default, whatever the references do.
  candidate[1] = make_case("emb", "fused:graph", noisy_samples(rng, 1.3e5, 0.01, 30));
  g = run_gate(baseline, candidate, GateOptions{});
  EXPECT_TRUE(g.rows[1].fails());
  EXPECT_TRUE(g.any_regression());
  EXPECT_NE(gate_table_markdown(g).find("| **regressed** |"), std::string::npos);
  EXPECT_TRUE(is_fusekit_variant("fused"));
  EXPECT_TRUE(is_fusekit_variant("fused:no-master"));
  EXPECT_FALSE(is_fusekit_variant("fusedx"));
  EXPECT_FALSE(is_fusekit_variant("baseline:sdpa"));
  EXPECT_FALSE(is_fusekit_variant("peer:compile"));
}

// A candidate that timed some operators (`bench --ops`): the baseline's other operators are counted in
// one line, while a missing case of a timed operator is still listed.
TEST(Gate, OperatorsTheCandidateDidNotTimeAreCountedNotListed) {
  std::mt19937 rng(13);
  const auto with_op = [](CaseResult c, const std::string& op) {
    c.info.op = op;
    return c;
  };
  const std::vector<CaseResult> baseline = {
      with_op(make_case("emb/1", "fused", noisy_samples(rng, 1e5, 0.01, 10)), "emb"),
      with_op(make_case("emb/2", "fused", noisy_samples(rng, 1e5, 0.01, 10)), "emb"),
      with_op(make_case("ln/1", "fused", noisy_samples(rng, 1e5, 0.01, 10)), "ln"),
      with_op(make_case("ln/1", "baseline", noisy_samples(rng, 1e5, 0.01, 10)), "ln"),
      with_op(make_case("gelu/1", "fused", noisy_samples(rng, 1e5, 0.01, 10)), "gelu"),
      with_op(make_case("emb/1", "peer:eager", noisy_samples(rng, 1e5, 0.01, 10)), "emb"),
      with_op(make_case("emb/1", "fused:graph", noisy_samples(rng, 1e5, 0.01, 10)), "emb")};
  const std::vector<CaseResult> candidate = {
      with_op(make_case("emb/1", "fused", noisy_samples(rng, 1e5, 0.01, 10)), "emb")};
  const GateResult g = run_gate(baseline, candidate, GateOptions{});
  // A fused variant the candidate no longer has is listed: it may be a variant a change dropped.
  EXPECT_EQ(g.only_in_baseline, (std::vector<std::string>{"emb/2 [fused]", "emb/1 [fused:graph]"}));
  EXPECT_EQ(g.unmeasured_operators, (std::map<std::string, size_t>{{"gelu", 1}, {"ln", 2}}));
  EXPECT_EQ(g.unmeasured_variants, (std::map<std::string, size_t>{{"peer:eager", 1}}));
  const std::string text = gate_table_text(g);
  EXPECT_NE(text.find("not timed by the candidate: 3 case(s) of the baseline in 2 other operator(s) (gelu, ln)\n"),
            std::string::npos)
      << text;
  EXPECT_NE(
      text.find("not timed by the candidate: 1 case(s) of the baseline in 1 variant(s) it ran nowhere (peer:eager)\n"),
      std::string::npos)
      << text;
  EXPECT_EQ(text.find("ln/1"), std::string::npos) << text;
}

TEST(Gate, TooFewSamplesIsVisibleButNotARegression) {
  const GateResult g = run_gate({make_case("ln", "fused", {100, 101, 102, 103})},
                                {make_case("ln", "fused", {150, 151, 152, 153, 154, 155})}, GateOptions{});
  ASSERT_EQ(g.rows.size(), 1u);
  EXPECT_EQ(g.rows[0].verdict, Verdict::too_few_samples);
  EXPECT_TRUE(std::isnan(g.rows[0].p_value));
  EXPECT_NEAR(g.rows[0].change, 152.5 / 101.5 - 1, 1e-12);
  EXPECT_FALSE(g.any_regression());
  EXPECT_NE(gate_table_text(g).find("too few samples"), std::string::npos);
}

TEST(Gate, MediansComeFromSamples) {
  CaseResult base = make_case("ln", "fused", {10, 11, 12, 13, 14});
  CaseResult cand = make_case("ln", "fused", {10, 11, 12, 13, 14});
  base.median_ns = 1;  // stale: the gate must not read it
  const GateResult g = run_gate({base}, {cand}, GateOptions{});
  EXPECT_EQ(g.rows[0].baseline_median_ns, 12);
  EXPECT_EQ(g.rows[0].change, 0);
  EXPECT_EQ(g.rows[0].verdict, Verdict::unchanged);
}

TEST(Gate, RejectsDuplicateCasesAndBadOptions) {
  const CaseResult c = make_case("ln", "fused", {1, 2, 3, 4, 5});
  EXPECT_THROW(run_gate({c, c}, {c}, GateOptions{}), std::invalid_argument);
  GateOptions bad_alpha;
  bad_alpha.alpha = 0;
  EXPECT_THROW(run_gate({c}, {c}, bad_alpha), std::invalid_argument);
  GateOptions bad_threshold;
  bad_threshold.threshold = -0.1;
  EXPECT_THROW(run_gate({c}, {c}, bad_threshold), std::invalid_argument);
}

TEST(Gate, TablesShowEveryRow) {
  const GateResult g = run_gate({make_case("a|b", "fused", {1000, 1001, 1002, 1003, 1004}),
                                 make_case("c", "fused", {1000, 1001, 1002, 1003, 1004})},
                                {make_case("a|b", "fused", {1500, 1501, 1502, 1503, 1504}),
                                 make_case("c", "fused", {1000, 1001, 1002, 1003, 1004})},
                                GateOptions{});
  // 5 against 5 fully separated: exact p = 2 / C(10, 5) = 0.0079 < 0.01.
  ASSERT_EQ(g.rows[0].verdict, Verdict::regressed);
  EXPECT_NEAR(g.rows[0].p_value, 2.0 / 252, 1e-15);
  const std::string text = gate_table_text(g);
  EXPECT_NE(text.find("\n        1.002           1.502       +49.9    0.008      5/5  regressed  fused    a|b\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("1 regressed, 0 improved, 1 unchanged, 0 too few samples\n"), std::string::npos) << text;
  const std::string markdown = gate_table_markdown(g);
  EXPECT_EQ(markdown.rfind("| Baseline (us) | Candidate (us) |", 0), 0u) << markdown;
  EXPECT_NE(markdown.find("| ---: | ---: | ---: | ---: | ---: | --- | --- | --- |\n"), std::string::npos) << markdown;
  EXPECT_NE(markdown.find("| **regressed** | `fused` | `a\\|b` |\n"), std::string::npos) << markdown;
  EXPECT_EQ(verdict_name(Verdict::too_few_samples), "too few samples");
}

// ---- per kernel

TEST(GateKernels, SamplesArePerRepetitionSumsOfEachKernel) {
  TraceBuilder b;
  b.add_case("ln", "fused", {{{"a", 100}, {"a", 50}, {"@bwd", 30}}, {{"a", 110}}, {{"b", 7}}});
  b.add_case("other", "fused", {{{"a", 999}}});
  const auto got = repetition_kernels(b, {{"ln", "fused"}, {"other", "fused"}});
  const RepetitionKernels& ln = got.at({"ln", "fused"});
  EXPECT_EQ(ln.repetitions, 3u);
  // Two instances of "a" in the first repetition add up; a kernel missing from a repetition counts 0 there; the
  // kernel launched from the rangeless thread lands in the repetition open when it was launched.
  EXPECT_EQ(ln.samples_ns.at("a"), (std::vector<double>{150, 110, 0}));
  EXPECT_EQ(ln.samples_ns.at("b"), (std::vector<double>{0, 0, 7}));
  EXPECT_EQ(ln.samples_ns.at("bwd"), (std::vector<double>{30, 0, 0}));
  EXPECT_EQ(got.at({"other", "fused"}).samples_ns.at("a"), std::vector<double>{999});
}

// Five repetitions of a case running "slow" and "same"; `slow_ns` per repetition, plus rep * 3 ns of jitter.
TraceBuilder five_reps(uint64_t slow_ns, size_t reps = 5, const std::string& extra = "") {
  TraceBuilder b;
  std::vector<std::vector<std::pair<std::string, uint64_t>>> kernels;
  for (uint64_t r = 0; r < reps; ++r) {
    kernels.push_back({{"slow", slow_ns + 3 * r}, {"same", 2000 + 5 * ((r * 7) % 5)}});
    if (!extra.empty()) kernels.back().push_back({extra, 500 + r});
  }
  b.add_case("ln", "fused", kernels);
  return b;
}

GateResult case_gate(double baseline_ns, double candidate_ns) {
  return run_gate(
      {make_case("ln", "fused", {baseline_ns, baseline_ns + 1, baseline_ns + 2, baseline_ns + 3, baseline_ns + 4})},
      {make_case("ln", "fused",
                 {candidate_ns, candidate_ns + 1, candidate_ns + 2, candidate_ns + 3, candidate_ns + 4})},
      GateOptions{});
}

TEST(GateKernels, RegressedKernelAndUnchangedOne) {
  GateResult g = case_gate(4000, 6000);
  ASSERT_EQ(g.rows[0].verdict, Verdict::regressed);
  const std::set<CaseKey> keys = {{"ln", "fused"}};
  g.kernels = gate_kernels(g, repetition_kernels(five_reps(1000), keys),
                           repetition_kernels(five_reps(3000, 5, "extra"), keys), GateOptions{});
  ASSERT_EQ(g.kernels.size(), 1u);
  const CaseKernelGate& k = g.kernels[0];
  EXPECT_EQ(k.baseline_repetitions, 5u);
  EXPECT_EQ(k.candidate_repetitions, 5u);
  ASSERT_EQ(k.rows.size(), 3u);
  // By how far the time per repetition moved: slow +2000 ns, the new kernel +502, same 0.
  EXPECT_EQ(k.rows[0].kernel, "slow");
  EXPECT_EQ(k.rows[0].verdict, Verdict::regressed);
  EXPECT_NEAR(k.rows[0].p_value, 2.0 / 252, 1e-15);
  EXPECT_DOUBLE_EQ(k.rows[0].moved_ns(), 2000);
  EXPECT_NEAR(k.rows[0].change, 1.988, 0.001);
  EXPECT_EQ(k.rows[1].kernel, "extra");
  EXPECT_EQ(k.rows[1].verdict, Verdict::regressed);  // new in the candidate: 0 ns per repetition before
  EXPECT_TRUE(std::isinf(k.rows[1].change));
  EXPECT_EQ(k.rows[2].kernel, "same");
  EXPECT_EQ(k.rows[2].verdict, Verdict::unchanged);
  EXPECT_DOUBLE_EQ(k.rows[2].moved_ns(), 0);

  // The Markdown lists the regressed case's kernels that moved most even without kernel rows requested.
  const std::string markdown = gate_table_markdown(g);
  EXPECT_NE(markdown.find("**Kernels that moved most in `ln [fused]`** (time per traced repetition):"),
            std::string::npos)
      << markdown;
  EXPECT_NE(markdown.find("| 1.006 | 3.006 | +2.000 | +198.8 | 0.008 | 5/5 | **regressed** | `slow` |"),
            std::string::npos)
      << markdown;
  EXPECT_NE(markdown.find("| new |"), std::string::npos) << markdown;
  EXPECT_EQ(markdown.find("<details>"), std::string::npos) << markdown;
  EXPECT_EQ(gate_table_text(g).find("repetitions:"), std::string::npos);
  EXPECT_TRUE(g.any_regression());

  g.kernel_rows_requested = true;
  EXPECT_NE(gate_table_markdown(g).find("<details>"), std::string::npos);
  const std::string text = gate_table_text(g);
  EXPECT_NE(text.find("ln [fused], 5/5 repetitions:\n"), std::string::npos) << text;
  EXPECT_NE(text.find("unchanged  same\n"), std::string::npos) << text;
}

TEST(GateKernels, TopThreeOnlyAndNothingForUnregressedCases) {
  TraceBuilder base, cand;
  std::vector<std::vector<std::pair<std::string, uint64_t>>> b_reps, c_reps;
  for (uint64_t r = 0; r < 5; ++r) {
    b_reps.push_back({{"k1", 100 + r}, {"k2", 100 + r}, {"k3", 100 + r}, {"k4", 100 + r}});
    c_reps.push_back({{"k1", 500 + r}, {"k2", 400 + r}, {"k3", 300 + r}, {"k4", 200 + r}});
  }
  base.add_case("ln", "fused", b_reps);
  cand.add_case("ln", "fused", c_reps);
  const std::set<CaseKey> keys = {{"ln", "fused"}};
  GateResult g = case_gate(4000, 6000);
  g.kernels = gate_kernels(g, repetition_kernels(base, keys), repetition_kernels(cand, keys), GateOptions{});
  std::string markdown = gate_table_markdown(g);
  EXPECT_NE(markdown.find("`k3`"), std::string::npos) << markdown;
  EXPECT_EQ(markdown.find("`k4`"), std::string::npos) << markdown;

  GateResult same = case_gate(4000, 4000);
  same.kernels = gate_kernels(same, repetition_kernels(base, keys), repetition_kernels(cand, keys), GateOptions{});
  EXPECT_EQ(gate_table_markdown(same).find("moved most"), std::string::npos);
}

TEST(GateKernels, TooFewRepetitionsAreNotAPass) {
  GateResult g = case_gate(4000, 6000);
  const std::set<CaseKey> keys = {{"ln", "fused"}};
  g.kernels = gate_kernels(g, repetition_kernels(five_reps(1000, 3), keys),
                           repetition_kernels(five_reps(3000, 3), keys), GateOptions{});
  ASSERT_EQ(g.kernels[0].rows.size(), 2u);
  for (const KernelGateRow& row : g.kernels[0].rows) {
    EXPECT_EQ(row.verdict, Verdict::too_few_samples) << row.kernel;
    EXPECT_TRUE(std::isnan(row.p_value));
    EXPECT_EQ(row.baseline_n, 3u);
  }
  g.kernel_rows_requested = true;
  EXPECT_NE(gate_table_text(g).find("too few samples  slow\n"), std::string::npos) << gate_table_text(g);
}

TEST(GateKernels, CaseWithoutRepRangesSaysSo) {
  TraceBuilder unmarked;
  unmarked.add_case("ln", "fused", {{{"slow", 100}}, {{"slow", 100}}}, false);
  const std::set<CaseKey> keys = {{"ln", "fused"}};
  GateResult g = case_gate(4000, 6000);
  g.kernels =
      gate_kernels(g, repetition_kernels(unmarked, keys), repetition_kernels(five_reps(3000), keys), GateOptions{});
  EXPECT_EQ(g.kernels[0].baseline_repetitions, 0u);
  EXPECT_TRUE(g.kernels[0].rows.empty());
  EXPECT_NE(gate_table_markdown(g).find("no rep ranges in the baseline\n"), std::string::npos);
}

// ---- Baselines beyond one run

TEST(GateHistory, PoolingJoinsEachCasesSamplesAcrossRuns) {
  CaseResult old_ln = make_case("ln", "fused", {10, 11, 12});
  old_ln.info.bytes = 1;
  CaseResult new_ln = make_case("ln", "fused", {20, 21});
  new_ln.info.bytes = 2;
  new_ln.bandwidth_bytes_per_s = 1.0 / 20.5;  // bytes / median of this run alone
  const std::vector<CaseResult> pooled =
      pool_case_results({{old_ln, make_case("old only", "fused", {5, 5, 5})}, {new_ln}});
  ASSERT_EQ(pooled.size(), 2u);
  EXPECT_EQ(pooled[0].info.name, "ln");
  EXPECT_EQ(pooled[0].info.bytes, 2u);  // the newest run's info
  EXPECT_EQ(pooled[0].samples_ns, (std::vector<double>{10, 11, 12, 20, 21}));
  EXPECT_DOUBLE_EQ(pooled[0].median_ns, 12);
  EXPECT_DOUBLE_EQ(pooled[0].min_ns, 10);
  EXPECT_DOUBLE_EQ(pooled[0].max_ns, 21);
  EXPECT_DOUBLE_EQ(*pooled[0].bandwidth_bytes_per_s, 1.0 / 12);  // rescaled to the pooled median
  EXPECT_EQ(pooled[1].samples_ns.size(), 3u);
}

TEST(GateHistory, APooledBaselineAbsorbsOneQuickRun) {
  // One run at 100 us (a quick machine) and four at 106 us: a candidate at 106 us regresses against
  // the quick run alone, and not against the pooled history, whose median is the usual 106 us.
  std::mt19937 rng(11);
  std::vector<std::vector<CaseResult>> runs;
  for (double median : {100e3, 106e3, 106e3, 106e3, 106e3}) {
    runs.push_back({make_case("gelu", "fused", noisy_samples(rng, median, 0.005, 20))});
  }
  const CaseResult candidate = make_case("gelu", "fused", noisy_samples(rng, 106e3, 0.005, 20));
  EXPECT_EQ(run_gate(runs[0], {candidate}, GateOptions{}).rows[0].verdict, Verdict::regressed);
  EXPECT_EQ(run_gate(pool_case_results(runs), {candidate}, GateOptions{}).rows[0].verdict, Verdict::unchanged);
  EXPECT_EQ(pool_case_results(runs)[0].samples_ns.size(), 100u);
}

std::vector<store::RunInfo> history() {
  std::vector<store::RunInfo> runs;
  const auto add = [&](const char* gpu, const char* status, const char* commit) {
    store::RunInfo r;
    r.id = static_cast<int64_t>(runs.size()) + 1;
    r.gpu_name = gpu;
    r.status = status;
    r.git_commit = commit;
    runs.push_back(r);
  };
  add("H100", "ok", "aaaaaaa1111");     // 1
  add("A100", "ok", "bbbbbbb2222");     // 2
  add("H100", "failed", "ccccccc333");  // 3
  add("H100", "ok", "ddddddd4444");     // 4
  add("H100", "ok", "aaaaaaa5555");     // 5
  add("H100", "ok", "eeeeeee6666");     // 6: the candidate, say
  return runs;
}

TEST(GateHistory, HistoryRunsAreTheNewestFinishedOnesOfTheGpu) {
  EXPECT_EQ(history_runs(history(), "H100", 3, 6), (std::vector<int64_t>{1, 4, 5}));
  EXPECT_EQ(history_runs(history(), "H100", 2, 0), (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(history_runs(history(), "H100", 10, 6), (std::vector<int64_t>{1, 4, 5}));
  EXPECT_EQ(history_runs(history(), "A100", 10, 0), (std::vector<int64_t>{2}));
  EXPECT_TRUE(history_runs(history(), "L4", 10, 0).empty());
}

TEST(GateHistory, RunOfCommitTakesTheNewestFinishedMatch) {
  EXPECT_EQ(run_of_commit(history(), "aaaaaaa"), 5);
  EXPECT_EQ(run_of_commit(history(), "aaaaaaa1"), 1);
  EXPECT_EQ(run_of_commit(history(), "ccccccc"), 0);  // that run failed
  EXPECT_EQ(run_of_commit(history(), "fffffff"), 0);
  EXPECT_THROW(run_of_commit(history(), "aaaa"), std::invalid_argument);
  EXPECT_THROW(run_of_commit(history(), "main~1x"), std::invalid_argument);
}

// ---- Per NVTX range

TEST(GateRanges, EachRangesTimePerRepetition) {
  TraceBuilder b;
  std::vector<std::vector<std::pair<std::string, uint64_t>>> reps;
  for (int r = 0; r < 6; ++r) {
    reps.push_back({{"fwd/layer.0|gemm", 100},
                    {"fwd/layer.0|ln", 10},
                    {"fwd/layer.1|gemm", 100 + 50 * (r % 2)},
                    {"bwd|gemm", 300},
                    {"adam", 20}});
  }
  b.add_case("step", "fused", reps);
  const auto got = case_repetition_ranges(b.trace, profiler::attribute(b.trace), {{"step", "fused"}}, 2);
  const RepetitionKernels& r = got.at({"step", "fused"});
  EXPECT_EQ(r.repetitions, 6u);
  EXPECT_EQ(r.samples_ns.at("fwd / layer.0"), std::vector<double>(6, 110));
  EXPECT_EQ(r.samples_ns.at("fwd / layer.1"), (std::vector<double>{100, 150, 100, 150, 100, 150}));
  EXPECT_EQ(r.samples_ns.at("bwd"), std::vector<double>(6, 300));
  EXPECT_EQ(r.samples_ns.at("(rep)"), std::vector<double>(6, 20));
  const auto outer = case_repetition_ranges(b.trace, profiler::attribute(b.trace), {{"step", "fused"}}, 1);
  EXPECT_EQ(outer.at({"step", "fused"}).samples_ns.at("fwd")[1], 260);  // 100 + 10 + 150
}

TEST(GateRanges, ASlowerRangeIsFlaggedAndWritten) {
  const auto reps_of = [](uint64_t layer1_ns) {
    TraceBuilder b;
    std::vector<std::vector<std::pair<std::string, uint64_t>>> reps(
        6, {{"fwd/layer.0|gemm", 1000}, {"fwd/layer.1|gemm", layer1_ns}});
    b.add_case("step", "fused", reps);
    return b;
  };
  const TraceBuilder base = reps_of(1000), cand = reps_of(1500);
  GateResult g = case_gate(4000, 6000);
  g.rows[0].name = "step";
  const std::set<CaseKey> keys = {{"step", "fused"}};
  g.ranges = gate_kernels(g, case_repetition_ranges(base.trace, profiler::attribute(base.trace), keys, 2),
                          case_repetition_ranges(cand.trace, profiler::attribute(cand.trace), keys, 2), GateOptions{});
  ASSERT_EQ(g.ranges[0].rows.size(), 2u);
  EXPECT_EQ(g.ranges[0].rows[0].kernel, "fwd / layer.1");  // moved most
  EXPECT_EQ(g.ranges[0].rows[0].verdict, Verdict::regressed);
  EXPECT_EQ(g.ranges[0].rows[1].verdict, Verdict::unchanged);
  EXPECT_NE(gate_table_text(g).find("NVTX ranges, 6/6 repetitions"), std::string::npos) << gate_table_text(g);
  EXPECT_NE(gate_table_markdown(g).find("| Range |"), std::string::npos);
}

// ---- GPU conditions

CaseResult with_conditions(CaseResult c, double sm_clock, double temperature, double reasons, double others) {
  for (const char* point : {"start", "end"}) {
    const std::string p = point;
    c.metrics.push_back({"gpu.sm_clock_mhz." + p, sm_clock});
    c.metrics.push_back({"gpu.memory_clock_mhz." + p, 2619});
    c.metrics.push_back({"gpu.temperature_c." + p, temperature});
    c.metrics.push_back({"gpu.clocks_event_reasons." + p, reasons});
    c.metrics.push_back({"gpu.other_processes." + p, others});
  }
  return c;
}

TEST(GateConditions, SameConditionsWarnOfNothing) {
  std::mt19937 rng(5);
  const GateResult g = run_gate(
      {with_conditions(make_case("ln", "fused", noisy_samples(rng, 1e5, 0.01, 10)), 1980, 40, 0, 0)},
      {with_conditions(make_case("ln", "fused", noisy_samples(rng, 1e5, 0.01, 10)), 1965, 48, 0, 0)}, GateOptions{});
  EXPECT_TRUE(g.condition_warnings.empty());
  EXPECT_TRUE(g.throttled_cases.empty());
  EXPECT_EQ(gate_table_text(g).find("warning"), std::string::npos);
}

TEST(GateConditions, DifferentClocksTemperatureAndOtherProcessesAreWarned) {
  std::mt19937 rng(6);
  const GateResult g = run_gate(
      {with_conditions(make_case("ln", "fused", noisy_samples(rng, 1e5, 0.01, 10)), 1980, 40, 0, 0)},
      {with_conditions(make_case("ln", "fused", noisy_samples(rng, 1e5, 0.01, 10)), 1755, 71, 0, 2)}, GateOptions{});
  ASSERT_EQ(g.condition_warnings.size(), 3u) << gate_table_text(g);
  EXPECT_NE(g.condition_warnings[0].find("SM clock: baseline 1980 MHz, candidate 1755 MHz"), std::string::npos);
  EXPECT_NE(g.condition_warnings[1].find("temperature: baseline 40 C, candidate 71 C"), std::string::npos);
  EXPECT_NE(g.condition_warnings[2].find("other processes on the GPU during the candidate's timing: up to 2"),
            std::string::npos);
  EXPECT_NE(gate_table_text(g).find("warning: SM clock"), std::string::npos);
  EXPECT_NE(gate_table_markdown(g).find("> **Warning:** temperature"), std::string::npos);
}

TEST(GateConditions, ThrottledCasesAreMarked) {
  std::mt19937 rng(7);
  const double power_cap = static_cast<double>(profiler::clocks_event::sw_power_cap);
  const double idle = static_cast<double>(profiler::clocks_event::gpu_idle);
  const GateResult g =
      run_gate({with_conditions(make_case("ln", "fused", noisy_samples(rng, 1e5, 0.01, 10)), 1980, 40, idle, 0),
                with_conditions(make_case("gelu", "fused", noisy_samples(rng, 1e5, 0.01, 10)), 1980, 40, 0, 0)},
               {with_conditions(make_case("ln", "fused", noisy_samples(rng, 1e5, 0.01, 10)), 1980, 40, power_cap, 0),
                with_conditions(make_case("gelu", "fused", noisy_samples(rng, 1e5, 0.01, 10)), 1980, 40, idle, 0)},
               GateOptions{});
  ASSERT_EQ(g.throttled_cases.size(), 1u);  // idle is no throttling
  EXPECT_EQ(g.throttled_cases[0], "ln [fused]: candidate (sw power cap)");
  EXPECT_NE(gate_table_text(g).find("throttled: ln [fused]: candidate (sw power cap)"), std::string::npos);
  EXPECT_NE(gate_table_markdown(g).find("Timed while the GPU throttled"), std::string::npos);
}

TEST(GateConditions, ConditionsOfOneSideOnlyCannotBeCompared) {
  std::mt19937 rng(8);
  const GateResult g = run_gate(
      {make_case("ln", "fused", noisy_samples(rng, 1e5, 0.01, 10))},
      {with_conditions(make_case("ln", "fused", noisy_samples(rng, 1e5, 0.01, 10)), 1980, 40, 0, 0)}, GateOptions{});
  ASSERT_EQ(g.condition_warnings.size(), 1u);
  EXPECT_NE(g.condition_warnings[0].find("recorded for the candidate only"), std::string::npos);
}

}  // namespace
}  // namespace fusekit::reports
