// The top-k selection's host references: the threshold's set and the exact top k by sorting, on
// known answers, ties and the empty and full selections.
#include "dp/topk_selection_reference.h"
#include "dp/topk_selection.h"

#include <gtest/gtest.h>

#include <vector>

namespace fusekit::dp {
namespace {

TEST(TopkSelectionReference, KnownAnswers) {
  const std::vector<float> v = {0.5f, -3.f, 2.f, -0.f, 3.f, -1.f, 0.25f};
  EXPECT_EQ(select_at_threshold(v.data(), v.size(), 2.f), (std::vector<uint32_t>{1, 2, 4}));
  EXPECT_EQ(select_at_threshold(v.data(), v.size(), 0.f).size(), v.size());
  EXPECT_TRUE(select_at_threshold(v.data(), v.size(), INFINITY).empty());
  EXPECT_EQ(exact_topk(v.data(), v.size(), 3), (std::vector<uint32_t>{1, 2, 4}));
  EXPECT_EQ(exact_topk(v.data(), v.size(), 1), (std::vector<uint32_t>{1}));  // |-3| ties |3|: the lower index
  EXPECT_TRUE(exact_topk(v.data(), v.size(), 0).empty());
  EXPECT_EQ(exact_topk(v.data(), v.size(), 100).size(), v.size());
}

TEST(TopkSelectionReference, TargetAndTolerance) {
  EXPECT_EQ(selected_entries(0, 0.01), 0u);
  EXPECT_EQ(selected_entries(1, 0.0001), 1u);  // no layer starved
  EXPECT_EQ(selected_entries(1000, 0.01), 10u);
  EXPECT_EQ(selected_entries(1001, 0.01), 11u);
  EXPECT_EQ(selected_entries(10, 1.0), 10u);
  EXPECT_EQ(selection_low(1), 1);
  EXPECT_EQ(selection_cap(1), 1);
  EXPECT_EQ(selection_low(10), 8);
  EXPECT_EQ(selection_cap(10), 12);
  EXPECT_EQ(selection_low(1100000), 880000);
  EXPECT_EQ(selection_cap(1100000), 1375000);
}

}  // namespace
}  // namespace fusekit::dp
