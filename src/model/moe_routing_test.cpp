// The routing helpers the MoE block runs on: top-k order and ties, the grouping of (token,
// choice) pairs by expert, and MoeRouter's choice, override, observer and guesses, worked out by
// hand.
#include "model/moe_routing.h"

#include "core/error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
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

// A source that records what it is asked to read ahead.
struct GuessedSource : ExpertSource {
  std::vector<std::pair<int, std::vector<int32_t>>> predicted;
  int max_batch() const override { return 4; }
  bool wants_predictions() const override { return true; }
  void predict(int layer, std::span<const int32_t> experts) override {
    predicted.emplace_back(layer, std::vector<int32_t>(experts.begin(), experts.end()));
  }
  void acquire(int, std::span<const int32_t>, std::span<ExpertWeights>) override {}
  void release(int) override {}
};

struct Recorder : RoutingObserver {
  std::vector<int32_t> ids, guessed;
  std::vector<float> w;
  int64_t pos0 = -1;
  void routed(int, int64_t p, std::span<const int32_t>, std::span<const int32_t> e,
              std::span<const float> wt) override {
    pos0 = p;
    ids.assign(e.begin(), e.end());
    w.assign(wt.begin(), wt.end());
  }
  void predicted(int, int64_t, std::span<const int32_t> e) override { guessed.assign(e.begin(), e.end()); }
};

// Chooses by position: experts {pos % 4, (pos + 1) % 4}, or a given (bad) pair.
struct ByPosition : RouteOverride {
  std::vector<int32_t> fixed;
  void route(int, int64_t pos, std::span<int32_t> e) override {
    if (!fixed.empty()) return std::copy(fixed.begin(), fixed.end(), e.begin()), void();
    e[0] = int32_t(pos % 4);
    e[1] = int32_t((pos + 1) % 4);
  }
};

TEST(MoeRouter, ChoosesTheTopKWithRenormalisedWeights) {
  // Logits ln 1, ln 2, ln 3, ln 4: probabilities 0.1 .. 0.4; top-2 = {3, 2}, renormalised 4/7, 3/7.
  for (const bool norm : {true, false}) {
    MoeRouter r(2, 4, 2, norm, nullptr);
    std::vector<float> logits = {std::log(1.f), std::log(2.f), std::log(3.f), std::log(4.f)};
    int32_t ids[2];
    float w[2];
    const int64_t pos = 0;
    r.choose(0, &pos, 1, logits.data(), ids, w);
    EXPECT_EQ(ids[0], 3);
    EXPECT_EQ(ids[1], 2);
    EXPECT_NEAR(w[0], norm ? 4.0 / 7 : 0.4, 1e-6);
    EXPECT_NEAR(w[1], norm ? 3.0 / 7 : 0.3, 1e-6);
    EXPECT_NEAR(logits[0], 0.1, 1e-6);  // softmaxed in place
  }
}

TEST(MoeRouter, AnOverrideChoosesEachTokenAtItsPositionAndTheRouterWeighs) {
  MoeRouter r(2, 4, 2, true, nullptr);
  ByPosition o;
  Recorder seen;
  r.set_hooks({.observer = &seen, .route_override = &o});
  EXPECT_TRUE(r.overridden());
  std::vector<float> logits = {std::log(1.f), std::log(2.f), std::log(3.f), std::log(4.f),
                               std::log(1.f), std::log(2.f), std::log(3.f), std::log(4.f)};
  const int64_t pos[] = {5, 2};
  int32_t ids[4];
  float w[4];
  r.choose(1, pos, 2, logits.data(), ids, w);
  // Position 5: experts 1, 2 (probabilities 0.2, 0.3); position 2: experts 2, 3 (0.3, 0.4).
  EXPECT_EQ(std::vector<int32_t>(ids, ids + 4), (std::vector<int32_t>{1, 2, 2, 3}));
  EXPECT_NEAR(w[0], 0.4, 1e-6);
  EXPECT_NEAR(w[1], 0.6, 1e-6);
  EXPECT_NEAR(w[2], 3.0 / 7, 1e-6);
  EXPECT_NEAR(w[3], 4.0 / 7, 1e-6);
  const int32_t tokens[] = {7, 8};
  r.observe(1, 5, tokens, std::span<const int32_t>(ids, 4), std::span<const float>(w, 4));
  EXPECT_EQ(seen.pos0, 5);
  EXPECT_EQ(seen.ids, std::vector<int32_t>(ids, ids + 4));

  for (const std::vector<int32_t>& bad : {std::vector<int32_t>{4, 0}, {1, 1}, {-1, 2}}) {
    o.fixed = bad;
    try {
      r.choose(1, pos, 1, logits.data(), ids, w);
      ADD_FAILURE() << "an override's expert " << bad[0] << ", " << bad[1] << " was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("out of range or repeated"), std::string::npos) << e.what();
    }
  }
}

TEST(MoeRouter, GuessesTheNextLayersAndScoresTheGuess) {
  GuessedSource src;
  Recorder seen;
  MoeRouter r(3, 4, 2, true, &src);
  EXPECT_FALSE(r.predicts());  // no guesses asked for
  r.set_hooks({.observer = &seen, .predict_next = 2});
  ASSERT_TRUE(r.predicts());
  // Layer l's router, applied early, favours experts l and l + 1.
  auto logits = [](int layer, float* out) {
    for (int e = 0; e < 4; ++e) out[e] = (e == layer || e == (layer + 1) % 4) ? 1.0f : 0.0f;
  };
  const int32_t actual0[] = {0, 1};
  r.predict(0, 9, actual0, logits);  // guesses layers 1 and 2
  ASSERT_EQ(src.predicted.size(), 2u);
  EXPECT_EQ(src.predicted[0], (std::make_pair(1, std::vector<int32_t>{1, 2})));
  EXPECT_EQ(src.predicted[1], (std::make_pair(2, std::vector<int32_t>{2, 3})));
  EXPECT_EQ(seen.guessed, (std::vector<int32_t>{1, 2}));  // the next layer's guess only
  EXPECT_EQ(r.prediction_stats().total, 0u);              // nothing guessed for layer 0
  const int32_t actual1[] = {2, 3};                       // one of the two guessed
  r.predict(1, 9, actual1, logits);                       // guesses layer 2 only: the last
  EXPECT_EQ(r.prediction_stats().hits, 1u);
  EXPECT_EQ(r.prediction_stats().total, 2u);
  EXPECT_EQ(src.predicted.size(), 3u);
}

}  // namespace
}  // namespace swiftlet
