// The cache simulator on hand-worked traces: every expected count below was worked out by hand
// (the steps are in the comments), not taken from the code.
#include "experts/cache_sim.h"

#include "core/error.h"

#include <gtest/gtest.h>

namespace swiftlet {
namespace {

// A trace of top-1 routing: tokens[i][l] is token i's expert at layer l.
RoutingTrace top1_trace(int layers, int experts, const std::vector<std::vector<uint16_t>>& tokens) {
  RoutingTrace t;
  t.layers = layers;
  t.experts = experts;
  t.top_k = 1;
  for (size_t i = 0; i < tokens.size(); ++i) t.append(int32_t(i), 0, tokens[i]);
  return t;
}

// One layer, 4 experts, a cache of 2; the sequence 0 1 0 2 1 0 3 0 1 2 1 at times t0..t10.
RoutingTrace one_layer() { return top1_trace(1, 4, {{0}, {1}, {0}, {2}, {1}, {0}, {3}, {0}, {1}, {2}, {1}}); }

TEST(CacheSim, LruByHand) {
  // Most recent first:
  // t0 0 miss [0]; t1 1 miss [1 0]; t2 0 hit [0 1]; t3 2 miss, evicts 1 [2 0];
  // t4 1 miss, evicts 0 [1 2]; t5 0 miss, evicts 2 [0 1]; t6 3 miss, evicts 1 [3 0];
  // t7 0 hit [0 3]; t8 1 miss, evicts 3 [1 0]; t9 2 miss, evicts 0 [2 1]; t10 1 hit.
  const CacheSimResult r = simulate_cache(one_layer(), CachePolicy::Lru, 2);
  ASSERT_TRUE(r.feasible);
  EXPECT_EQ(r.hits, 3u);
  EXPECT_EQ(r.misses, 8u);
}

TEST(CacheSim, EnginePolicyByHand) {
  // Evict the lowest (uses, last use); use counts survive eviction (u = uses after the step):
  // t0 0 miss u0=1; t1 1 miss u1=1; t2 0 hit u0=2; t3 2 miss: 1 (u1) below 0 (u2), evicts 1, u2=1;
  // t4 1 miss: 2 (u1) below 0 (u2), evicts 2, u1=2; t5 0 hit u0=3;
  // t6 3 miss: 1 (u2) below 0 (u3), evicts 1, u3=1; t7 0 hit u0=4;
  // t8 1 miss: evicts 3 (u1), u1=3; t9 2 miss: 1 (u3) below 0 (u4), evicts 1, u2=2;
  // t10 1 miss: evicts 2 (u2), u1=4.
  const CacheSimResult r = simulate_cache(one_layer(), CachePolicy::Engine, 2);
  ASSERT_TRUE(r.feasible);
  EXPECT_EQ(r.hits, 3u);  // t2, t5, t7
  EXPECT_EQ(r.misses, 8u);
}

TEST(CacheSim, BeladyByHand) {
  // Evict the expert needed furthest ahead:
  // t0 0 miss; t1 1 miss; t2 0 hit; t3 2 miss: next 0 at t5, 1 at t4, evicts 0 {1 2};
  // t4 1 hit; t5 0 miss: next 1 at t8, 2 at t9, evicts 2 {1 0}; t6 3 miss: 1 at t8, 0 at t7,
  // evicts 1 {0 3}; t7 0 hit; t8 1 miss: 0 and 3 never again, evicts one {1 x};
  // t9 2 miss: 1 at t10, x never, evicts x {1 2}; t10 1 hit.
  const CacheSimResult r = simulate_cache(one_layer(), CachePolicy::Belady, 2);
  ASSERT_TRUE(r.feasible);
  EXPECT_EQ(r.hits, 4u);
  EXPECT_EQ(r.misses, 7u);
}

TEST(CacheSim, PerLayerPoolsByHand) {
  // Two layers; layer 0 always expert 0 (A), layer 1 alternates experts 0 (B) and 1 (C):
  // accesses A B A C A B A C. A global cache of 3 holds all three: 3 misses, 5 hits.
  // Per-layer pools of 3 slots: layer 0 gets 2, layer 1 gets 1; layer 1 alternates B C B C in
  // one slot: 4 misses; layer 0: 1 miss, 3 hits. Total 3 hits, 5 misses.
  const RoutingTrace t = top1_trace(2, 2, {{0, 0}, {0, 1}, {0, 0}, {0, 1}});
  const CacheSimResult global = simulate_cache(t, CachePolicy::Engine, 3);
  EXPECT_EQ(global.hits, 5u);
  EXPECT_EQ(global.misses, 3u);
  const CacheSimResult pools = simulate_cache(t, CachePolicy::PerLayer, 3);
  ASSERT_TRUE(pools.feasible);
  EXPECT_EQ(pools.hits, 3u);
  EXPECT_EQ(pools.misses, 5u);
  // A global cache of 2 under the engine's policy: A B miss; A hit (uA=2); C miss evicts B (uB=1);
  // A hit (uA=3); B miss evicts C (uC=1), uB=2; A hit; C miss evicts B (uB=2 < uA=4). 3 hits.
  const CacheSimResult two = simulate_cache(t, CachePolicy::Engine, 2);
  EXPECT_EQ(two.hits, 3u);
  EXPECT_EQ(two.misses, 5u);
  // Pools of 1 slot in a cache of 1 expert per layer... a cache of 1 has no slot for layer 1.
  EXPECT_FALSE(simulate_cache(t, CachePolicy::PerLayer, 1).feasible);
}

TEST(CacheSim, StepsNeedTheirTopKAtOnce) {
  // Top-2, one layer, experts {0,1} then {2,3} then {0,1}: a cache of 1 cannot hold a step.
  RoutingTrace t;
  t.layers = 1;
  t.experts = 4;
  t.top_k = 2;
  const std::vector<std::vector<uint16_t>> steps = {{0, 1}, {2, 3}, {0, 1}, {1, 0}};
  for (const auto& s : steps) t.append(0, 0, s);
  for (CachePolicy p : {CachePolicy::Engine, CachePolicy::Lru, CachePolicy::Belady})
    EXPECT_FALSE(simulate_cache(t, p, 1).feasible) << cache_policy_name(p);
  // A cache of 2: {0,1} miss miss; {2,3} evicts both; {0,1} evicts both; {1,0} hits both.
  for (CachePolicy p : {CachePolicy::Engine, CachePolicy::Lru, CachePolicy::Belady}) {
    const CacheSimResult r = simulate_cache(t, p, 2);
    ASSERT_TRUE(r.feasible) << cache_policy_name(p);
    EXPECT_EQ(r.hits, 2u) << cache_policy_name(p);
    EXPECT_EQ(r.misses, 6u) << cache_policy_name(p);
  }
  // A cache of 3, Belady: {0,1} miss miss; {2,3}: 2 miss fills the cache, 3 miss evicts whichever
  // of 0, 1 is needed later (both at the next step: one of them), so the next {0,1} has one hit;
  // {1,0} two hits. 3 hits, 5 misses. LRU: 3 evicts 0 (older than 1); {0,1}: 1 hit, 0 misses
  // and evicts 2; {1,0} two hits: also 3 hits.
  EXPECT_EQ(simulate_cache(t, CachePolicy::Belady, 3).hits, 3u);
  EXPECT_EQ(simulate_cache(t, CachePolicy::Lru, 3).hits, 3u);
}

TEST(CacheSim, EngineKeepsAStepsCachedExperts) {
  // Top-2, one layer, a cache of 2; steps {0,1} {0,2} {1,0}. Uses u, ticks in use order.
  // {0,1}: 0 miss (u0=1), 1 miss (u1=1, later). {0,2}: 0 is cached; reading 2 needs a victim and
  // 0 ranks lowest (u1, older), but 0 is needed by this step: 1 goes. 0 hit (u0=2), 2 miss (u2=1).
  // {1,0}: 0 hit (u0=3); 1 evicts 2 (not needed by the step), miss. 2 hits, 4 misses.
  // (Evicting 0 for 2 would read 0 again at once: 1 hit, 5 misses.)
  RoutingTrace t;
  t.layers = 1;
  t.experts = 4;
  t.top_k = 2;
  const std::vector<std::vector<uint16_t>> steps = {{0, 1}, {0, 2}, {1, 0}};
  for (const auto& s : steps) t.append(0, 0, s);
  const CacheSimResult r = simulate_cache(t, CachePolicy::Engine, 2);
  ASSERT_TRUE(r.feasible);
  EXPECT_EQ(r.hits, 2u);
  EXPECT_EQ(r.misses, 4u);
}

TEST(CacheSim, LocalityByHand) {
  // Layer 0 repeats its expert (3 of 3 reused), layer 1 alternates (0 of 3): 3 / 6.
  RoutingTrace t = top1_trace(2, 2, {});
  t.has_predictions = true;
  const uint16_t none = kNoPrediction;
  t.append(0, 0, std::vector<uint16_t>{0, 0});
  t.append(1, 0, std::vector<uint16_t>{0, 1}, {}, std::vector<uint16_t>{none, 0});  // guessed 0, was 1
  t.append(2, 0, std::vector<uint16_t>{0, 0}, {}, std::vector<uint16_t>{none, 0});  // guessed 0, was 0
  t.append(3, 0, std::vector<uint16_t>{0, 1});
  const TraceLocality loc = trace_locality(t);
  EXPECT_DOUBLE_EQ(loc.reuse_next_token, 0.5);
  EXPECT_EQ(loc.predicted_steps, 2u);
  EXPECT_DOUBLE_EQ(loc.prediction_accuracy, 0.5);
}

TEST(CacheSim, PredictionPrecisionAndRecallByHand) {
  // Top-2, two layers; guesses for layer 1 only.
  // t0: L0 {0,1} L1 {2,3}, no guess.
  // t1: L0 {0,4} L1 {2,5}, guessed {5,6}: 5 right. New to layer 1 (t0 lacks): 5, guessed;
  //     guesses t0 lacks: 5, 6.
  // t2: L0 {0,1} L1 {3,5}, guessed {2,3}: 3 right. New: 3, guessed; guesses t1 lacks: 3.
  // Recall 2 of 4 routed, precision 2 of 4 guesses; new experts: recall 2 of 2, precision 2 of 3.
  // Reuse: t1 keeps 0 and 2, t2 keeps 0 and 5: 4 of 8.
  RoutingTrace t;
  t.layers = 2;
  t.experts = 8;
  t.top_k = 2;
  t.has_predictions = true;
  const uint16_t x = kNoPrediction;
  t.append(0, 0, std::vector<uint16_t>{0, 1, 2, 3}, {}, std::vector<uint16_t>{x, x, x, x});
  t.append(1, 0, std::vector<uint16_t>{0, 4, 2, 5}, {}, std::vector<uint16_t>{x, x, 5, 6});
  t.append(2, 0, std::vector<uint16_t>{0, 1, 3, 5}, {}, std::vector<uint16_t>{x, x, 2, 3});
  const TraceLocality loc = trace_locality(t);
  EXPECT_EQ(loc.predicted_steps, 2u);
  EXPECT_DOUBLE_EQ(loc.reuse_next_token, 0.5);
  EXPECT_DOUBLE_EQ(loc.prediction_accuracy, 0.5);
  EXPECT_DOUBLE_EQ(loc.prediction_precision, 0.5);
  EXPECT_DOUBLE_EQ(loc.new_expert_recall, 1.0);
  EXPECT_DOUBLE_EQ(loc.new_expert_precision, 2.0 / 3.0);
}

TEST(CacheSim, PolicyNames) {
  for (CachePolicy p :
       {CachePolicy::Engine, CachePolicy::Global, CachePolicy::Lru, CachePolicy::PerLayer, CachePolicy::Belady})
    EXPECT_EQ(parse_cache_policy(cache_policy_name(p)), p);
  EXPECT_THROW(parse_cache_policy("fifo"), Error);
}

}  // namespace
}  // namespace swiftlet
