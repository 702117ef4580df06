// Comparisons of two runs, of two variants within a run, and of two kernel tables, with their tables.
#include <gtest/gtest.h>

#include <stdexcept>

#include "profiler/summary.h"
#include "reports/compare.h"
#include "reports/markdown.h"

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

profiler::KernelStats kernel(const std::string& name, uint64_t total_ns, uint64_t instances) {
  profiler::KernelStats k;
  k.name = name;
  k.total_ns = total_ns;
  k.instances = instances;
  k.avg_ns = static_cast<double>(total_ns) / static_cast<double>(instances);
  return k;
}

TEST(CompareRuns, MatchesNameAndVariant) {
  const std::vector<CaseResult> a = {make_case("ln", "fused", {100e3, 101e3, 99e3}), make_case("gelu", "fused", {10e3}),
                                     make_case("only_a", "fused", {1e3}), make_case("ln", "baseline", {300e3})};
  const std::vector<CaseResult> b = {make_case("gelu", "fused", {20e3}), make_case("ln", "fused", {50e3, 49e3, 51e3}),
                                     make_case("only_b", "fused", {1e3}), make_case("ln", "peer:eager", {1e3})};
  const auto c = compare_runs(a, b);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].name, "ln");
  EXPECT_EQ(c[0].variant_a, "fused");
  EXPECT_EQ(c[0].variant_b, "fused");
  EXPECT_EQ(c[0].median_a_ns, 100e3);
  EXPECT_EQ(c[0].median_b_ns, 50e3);
  EXPECT_DOUBLE_EQ(c[0].speedup, 2.0);
  EXPECT_EQ(c[1].name, "gelu");
  EXPECT_DOUBLE_EQ(c[1].speedup, 0.5);
}

TEST(CompareRuns, MediansComeFromSamples) {
  CaseResult a = make_case("ln", "fused", {1, 2, 3, 100});
  a.median_ns = 1000;  // stale
  const auto c = compare_runs({a}, {make_case("ln", "fused", {5})});
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].median_a_ns, 2.5);
  EXPECT_DOUBLE_EQ(c[0].speedup, 0.5);
}

TEST(CompareRuns, RejectsDuplicates) {
  const CaseResult c = make_case("ln", "fused", {1});
  EXPECT_THROW(compare_runs({c}, {c, c}), std::invalid_argument);
}

TEST(CompareVariants, OneRowPerNameWithBothVariants) {
  const std::vector<CaseResult> cases = {make_case("ln", "baseline", {300, 310, 290}),
                                         make_case("ln", "fused", {100, 90, 110}),
                                         make_case("gelu", "fused", {40}),
                                         make_case("softmax", "baseline", {80}),
                                         make_case("gelu", "baseline", {60}),
                                         make_case("attn", "baseline", {500}),
                                         make_case("attn", "peer:compile", {250})};
  const auto c = compare_variants(cases, "baseline", "fused");
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].name, "ln");
  EXPECT_EQ(c[0].variant_a, "baseline");
  EXPECT_EQ(c[0].variant_b, "fused");
  EXPECT_DOUBLE_EQ(c[0].speedup, 3.0);
  EXPECT_EQ(c[1].name, "gelu");
  EXPECT_DOUBLE_EQ(c[1].speedup, 1.5);
  EXPECT_THROW(compare_variants(cases, "fused", "fused"), std::invalid_argument);

  const std::string text = comparison_table_text(c);
  EXPECT_NE(text.find("\n        0.300          0.100    3.00x  baseline -> fused  ln\n"), std::string::npos) << text;
  const std::string markdown = comparison_table_markdown(c);
  EXPECT_NE(markdown.find("| 0.060 | 0.040 | 1.50x | `baseline -> fused` | `gelu` |\n"), std::string::npos) << markdown;
}

TEST(DiffKernels, OuterJoinSortedByAbsoluteChange) {
  const std::vector<profiler::KernelStats> a = {kernel("gemm", 1000, 10), kernel("softmax", 500, 5),
                                                kernel("old_kernel", 300, 3), kernel("same", 70, 7)};
  const std::vector<profiler::KernelStats> b = {kernel("gemm", 1200, 10), kernel("new_kernel", 50, 1),
                                                kernel("softmax", 100, 5), kernel("same", 70, 7)};
  const auto d = diff_kernels(a, b);
  ASSERT_EQ(d.size(), 5u);
  const std::vector<std::string> order = {d[0].name, d[1].name, d[2].name, d[3].name, d[4].name};
  EXPECT_EQ(order, (std::vector<std::string>{"softmax", "old_kernel", "gemm", "new_kernel", "same"}));
  EXPECT_EQ(d[0].total_a_ns, 500u);
  EXPECT_EQ(d[0].total_b_ns, 100u);
  EXPECT_EQ(d[0].avg_a_ns, 100);
  EXPECT_EQ(d[0].avg_b_ns, 20);
  // One side only: zeros on the other.
  EXPECT_EQ(d[1].total_b_ns, 0u);
  EXPECT_EQ(d[1].instances_b, 0u);
  EXPECT_EQ(d[1].avg_b_ns, 0);
  EXPECT_EQ(d[1].instances_a, 3u);
  EXPECT_EQ(d[3].total_a_ns, 0u);
  EXPECT_EQ(d[3].instances_a, 0u);
  EXPECT_EQ(d[3].total_b_ns, 50u);
  EXPECT_EQ(d[3].instances_b, 1u);
}

TEST(DiffKernels, EqualChangesOrderedByName) {
  const auto d = diff_kernels({kernel("b", 100, 1), kernel("a", 300, 1)}, {kernel("b", 200, 1), kernel("a", 200, 1)});
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].name, "a");
  EXPECT_EQ(d[1].name, "b");
  EXPECT_THROW(diff_kernels({kernel("x", 1, 1), kernel("x", 2, 1)}, {}), std::invalid_argument);
}

TEST(DiffKernels, Tables) {
  const auto d = diff_kernels({kernel("softmax", 500000, 5), kernel("gemm<float, 4>", 2000, 1)},
                              {kernel("softmax", 100000, 5), kernel("new|kernel", 50, 1)});
  const std::string text = kernel_diff_table_text(d);
  EXPECT_NE(text.find("\n      500.00        100.00     -400.00      -80.0            5            5      100.00"
                      "       20.00  softmax\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\n       0.000         0.050      +0.050          -            0            1       0.000"
                      "       0.050  new|kernel\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(kernel_diff_table_text(d, 1).substr(kernel_diff_table_text(d, 1).size() - 17), "(2 more kernels)\n");
  const std::string markdown = kernel_diff_table_markdown(d);
  EXPECT_NE(markdown.find("| -100.0 | 1 | 0 | 2.000 | 0.000 | `gemm<float, 4>` |\n"), std::string::npos) << markdown;
  EXPECT_NE(markdown.find("`new\\|kernel`"), std::string::npos) << markdown;
}

TEST(Formatting, MicrosecondsAndCodeSpans) {
  EXPECT_EQ(format_microseconds(1234), "1.234");
  EXPECT_EQ(format_microseconds(123456), "123.46");
  EXPECT_EQ(format_microseconds(12345678), "12345.7");
  EXPECT_EQ(markdown_code("a|b"), "`a\\|b`");
  EXPECT_EQ(markdown_code("`anonymous namespace'::k"), "`` `anonymous namespace'::k ``");
  EXPECT_EQ(markdown_table({{"n", "name"}, {"1", "x"}}, 1), "| n | name |\n| ---: | --- |\n| 1 | x |\n");
}

}  // namespace
}  // namespace fusekit::reports
