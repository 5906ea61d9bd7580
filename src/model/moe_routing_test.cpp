// The routing helpers the MoE block runs on: top-k order and ties, and the grouping of (token,
// choice) pairs by expert, worked out by hand.
#include "model/moe_routing.h"

#include "core/error.h"

#include <gtest/gtest.h>

#include <vector>

namespace swiftlet {
namespace {

TEST(MoeRouting, TopKIsHighestFirstWithTiesToTheLowerId) {
  const float p[] = {0.1f, 0.4f, 0.2f, 0.4f, -1.0f, 0.2f};
  std::vector<int32_t> order(6, 99);
  top_k_experts(p, 4, order);
  EXPECT_EQ(std::vector<int32_t>(order.begin(), order.begin() + 4), (std::vector<int32_t>{1, 3, 2, 5}));
  top_k_experts(p, 6, order);
  EXPECT_EQ(order, (std::vector<int32_t>{1, 3, 2, 5, 0, 4}));
}

TEST(MoeRouting, PairsAreGroupedByExpertInPairOrder) {
  // Three tokens, two choices each: pairs 0..5. Expert 4 twice, expert 1 twice, expert 0 once,
  // one pair left out (-1); experts 2, 3 and 5 unchosen.
  const std::vector<int32_t> ids = {4, 1, -1, 4, 1, 0};
  ExpertGroups g;
  g.build(ids, 6);
  ASSERT_EQ(g.groups, 3);
  EXPECT_EQ(std::vector<int32_t>(g.chosen().begin(), g.chosen().end()), (std::vector<int32_t>{0, 1, 4}));
  EXPECT_EQ(std::vector<int32_t>(g.start.begin(), g.start.begin() + 4), (std::vector<int32_t>{0, 1, 3, 5}));
  EXPECT_EQ(std::vector<int32_t>(g.pairs.begin(), g.pairs.begin() + 5), (std::vector<int32_t>{5, 1, 4, 0, 3}));
  EXPECT_EQ(g.group_of, (std::vector<int32_t>{0, 1, -1, -1, 2, -1}));
  EXPECT_EQ(g.size(2), 2);

  g.build(std::vector<int32_t>{-1, -1}, 6);  // everything left out: no group
  EXPECT_EQ(g.groups, 0);
  EXPECT_EQ(g.start[0], 0);
  EXPECT_EQ(g.group_of, std::vector<int32_t>(6, -1));
}

TEST(MoeRouting, AnExpertOutsideTheModelIsRefused) {
  ExpertGroups g;
  EXPECT_THROW(g.build(std::vector<int32_t>{0, 6}, 6), Error);
}

}  // namespace
}  // namespace swiftlet
