// --on-miss parsing, and the skip and low-bit rules on routes worked out by hand (miss_policy.h).
#include "model/miss_policy.h"

#include "support/test_util.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace swiftlet {
namespace {

TEST(MissPolicy, ParsesExactAndSkip) {
  EXPECT_FALSE(parse_miss_policy("exact").lossy());
  EXPECT_EQ(parse_miss_policy("exact").name(), "exact");
  EXPECT_EQ(parse_miss_policy("exact").label(), "exact");
  const MissPolicy zero = parse_miss_policy("skip:0");
  EXPECT_FALSE(zero.lossy());  // nothing is below 0: the exact path
  EXPECT_EQ(zero.label(), "exact");
  const MissPolicy p = parse_miss_policy("skip:0.05");
  EXPECT_TRUE(p.lossy());
  EXPECT_FLOAT_EQ(p.below, 0.05f);
  EXPECT_EQ(p.name(), "skip:0.05");
  EXPECT_EQ(p.label(), "lossy (skip:0.05)");
  EXPECT_FLOAT_EQ(parse_miss_policy("skip:.2").below, 0.2f);
}

TEST(MissPolicy, RefusesOtherFormsNamingTheAcceptedOnes) {
  for (const char* bad : {"skip:abc", "skip:1.5", "skip:1", "skip:-0.1", "skip:", "skip:nan", "skip:inf", "skip:0.1x",
                          "bogus", "", "Exact", "skip 0.1", "low-bit:", "low-bit:1.5", "low-bit:-1", "lowbit",
                          "low-bit:0.2x"}) {
    SCOPED_TRACE(bad);
    const std::string msg = testing::error_of([&] { parse_miss_policy(bad); });
    EXPECT_NE(msg.find("'exact'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("skip:W"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'low-bit'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::string("'") + bad + "'"), std::string::npos) << msg;
  }
}

TEST(MissPolicy, ParsesLowBit) {
  const MissPolicy every = parse_miss_policy("low-bit");
  EXPECT_TRUE(every.reads_low_bit());
  EXPECT_FALSE(every.skips());
  EXPECT_EQ(every.name(), "low-bit");
  EXPECT_EQ(every.label(), "lossy (low-bit)");
  const MissPolicy w = parse_miss_policy("low-bit:0.1");
  EXPECT_TRUE(w.reads_low_bit());
  EXPECT_EQ(w.name(), "low-bit:0.1");
  EXPECT_EQ(parse_miss_policy("low-bit:1").name(), "low-bit:1");
  const MissPolicy zero = parse_miss_policy("low-bit:0");
  EXPECT_FALSE(zero.lossy());
  EXPECT_FALSE(zero.reads_low_bit());
  EXPECT_EQ(zero.label(), "exact");
}

// Two tokens, top-4 of 8 experts, weights normalised (norm_topk_prob). Experts 5, 2 and 3 are in
// memory; 7, 1 and 6 are not.
struct Case {
  std::vector<int32_t> experts = {5, 2, 7, 1, /**/ 2, 6, 1, 3};
  std::vector<float> weights = {0.5f, 0.3f, 0.15f, 0.05f, /**/ 0.4f, 0.35f, 0.2f, 0.05f};
  std::set<int32_t> cached = {5, 2, 3};
  std::vector<int32_t> asked;  // in_memory's questions
  int run(float w, bool normalised = true) {
    return skip_missed_experts(MissPolicy::skip(w), 8, 4, normalised, experts, weights, [this](int32_t e) {
      asked.push_back(e);
      return cached.count(e) > 0;
    });
  }
};

TEST(MissPolicy, ThresholdZeroTouchesNothing) {
  Case c;
  const Case before;
  EXPECT_EQ(c.run(0.0f), 0);
  EXPECT_TRUE(c.asked.empty());  // exact: the source is not even asked
  EXPECT_EQ(c.experts, before.experts);
  EXPECT_EQ(c.weights, before.weights);
}

TEST(MissPolicy, AMissBelowWIsLeftOutOnlyWhenNoTokenKeepsIt) {
  // W = 0.1: 7 misses at 0.15 (kept); 1 misses at 0.05 for token 0 but is read for token 1 (0.2),
  // so token 0 uses it too; 3 is below W but a hit (kept). Nothing left out, bits unchanged.
  Case c;
  const Case before;
  EXPECT_EQ(c.run(0.1f), 0);
  EXPECT_EQ(c.experts, before.experts);
  EXPECT_EQ(c.weights, before.weights);
  EXPECT_EQ(std::set<int32_t>(c.asked.begin(), c.asked.end()), (std::set<int32_t>{5, 2, 7, 1, 6, 3}));
  EXPECT_EQ(c.asked.size(), 6u);  // once per expert

  // W = 0.25: 7 (0.15) and 1 (0.05, 0.2) miss below W for every token that chose them: left out.
  // Token 0 keeps 0.5 + 0.3 = 0.8 of 1, token 1 keeps 0.4 + 0.35 + 0.05 = 0.8: both scaled by 1.25.
  Case d;
  EXPECT_EQ(d.run(0.25f), 2);
  EXPECT_EQ(d.experts, (std::vector<int32_t>{5, 2, -1, -1, /**/ 2, 6, -1, 3}));
  const std::vector<float> want = {0.625f, 0.375f, 0, 0, /**/ 0.5f, 0.4375f, 0, 0.0625f};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(d.weights[i], want[i], 1e-7) << i;
  EXPECT_NEAR(d.weights[0] + d.weights[1], 1.0, 1e-7);
  EXPECT_NEAR(d.weights[4] + d.weights[5] + d.weights[7], 1.0, 1e-7);
}

TEST(MissPolicy, TheTopOneIsNeverLeftOut) {
  // Nothing cached and W near 1: every choice but each token's first is left out; the first
  // carries the whole weight.
  Case c;
  c.cached.clear();
  EXPECT_EQ(c.run(0.99f), 4);  // 7, 1, 6, 3; 5 and 2 are a token's top-1 (2 is token 1's)
  EXPECT_EQ(c.experts, (std::vector<int32_t>{5, 2, -1, -1, /**/ 2, -1, -1, -1}));
  EXPECT_NEAR(c.weights[0], 0.5f / 0.8f, 1e-7);  // token 0 keeps 5 and 2 (2 is read for token 1)
  EXPECT_NEAR(c.weights[1], 0.3f / 0.8f, 1e-7);
  EXPECT_NEAR(c.weights[4], 1.0f, 1e-7);
  for (int i : {5, 6, 7}) EXPECT_EQ(c.weights[size_t(i)], 0.0f);
}

TEST(MissPolicy, UnnormalisedWeightsAreComparedNormalisedAndKeepTheirSum) {
  // Softmax probabilities that sum to 0.4 over the top-4: normalised 0.5, 0.25, 0.15, 0.1.
  std::vector<int32_t> experts = {0, 1, 2, 3};
  std::vector<float> weights = {0.2f, 0.1f, 0.06f, 0.04f};
  const int n = skip_missed_experts(MissPolicy::skip(0.2f), 4, 4, /*normalised=*/false, experts, weights,
                                    [](int32_t) { return false; });
  EXPECT_EQ(n, 2);  // 2 and 3 (0.15 and 0.1 normalised); 1 stays (0.25) though its raw 0.1 < 0.2
  EXPECT_EQ(experts, (std::vector<int32_t>{0, 1, -1, -1}));
  EXPECT_NEAR(weights[0], 0.2 * 0.4 / 0.3, 1e-7);
  EXPECT_NEAR(weights[1], 0.1 * 0.4 / 0.3, 1e-7);
  EXPECT_NEAR(weights[0] + weights[1], 0.4, 1e-7);
}

// low-bit:W on the same routes: a missed expert is read from its copy unless some token gives it
// W or more (no exception for a top-1); nothing is changed in the routes.
TEST(MissPolicy, LowBitNamesTheMissedExpertsNoTokenWeighsAtW) {
  Case c;
  const Case before;
  auto low = [&](const char* flag) {
    return low_bit_experts(parse_miss_policy(flag), 8, 4, true, c.experts, c.weights,
                           [&](int32_t e) { return c.cached.count(e) > 0; });
  };
  // Missed: 7 (0.15), 1 (0.05 and 0.2), 6 (0.35).
  EXPECT_EQ(low("low-bit"), (std::vector<int32_t>{1, 6, 7}));
  EXPECT_EQ(low("low-bit:0.3"), (std::vector<int32_t>{1, 7}));  // 6 is kept by token 2's 0.35
  EXPECT_EQ(low("low-bit:0.16"), (std::vector<int32_t>{7}));    // 1 is kept by its 0.2
  EXPECT_EQ(low("low-bit:0.15"), (std::vector<int32_t>{}));     // 7 is kept at exactly W
  EXPECT_TRUE(low("low-bit:0").empty());
  EXPECT_TRUE(low("skip:0.3").empty());
  EXPECT_EQ(c.experts, before.experts);
  EXPECT_EQ(c.weights, before.weights);
  // A missed top-1 is read from its copy too when its weight is below W.
  const std::vector<int32_t> one = {4, 5};
  const std::vector<float> w = {0.6f, 0.4f};
  EXPECT_EQ(low_bit_experts(parse_miss_policy("low-bit:0.7"), 8, 2, true, one, w, [](int32_t) { return false; }),
            (std::vector<int32_t>{4, 5}));
}

}  // namespace
}  // namespace swiftlet
