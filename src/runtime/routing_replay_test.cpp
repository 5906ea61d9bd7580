// Expert traces on a real (tiny, synthetic) model: the trace a run writes holds exactly the
// experts its router chose and the guesses its predictor made; a trace replayed through
// TraceRouteOverride makes the model route exactly as recorded; Session::score returns every
// position's logits as a plain prefill does.
#include "experts/cache_sim.h"
#include "experts/routing_trace.h"
#include "runtime/model_loader.h"
#include "runtime/session.h"
#include "support/greedy_decode.h"
#include "support/tiny_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <random>
#include <set>

namespace swiftlet {
namespace {

std::vector<int32_t> some_tokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(int32_t(rng() % 1000));
  return ids;
}

// A prompt, then greedy decode steps; the routes the Forward captured, in order.
std::vector<RouteRecord> run(Forward& fwd, const ModelConfig& c, const std::vector<int32_t>& prompt, int steps) {
  SessionState st = SessionState::create(c);
  fwd.set_capture(true);
  std::vector<RouteRecord> routes;
  testing::greedy_decode(fwd, st, prompt, steps, [&](const std::vector<float>&) {
    routes.insert(routes.end(), fwd.routes().begin(), fwd.routes().end());
  });
  return routes;
}

TEST(RoutingReplay, TraceHoldsWhatTheRouterChose) {
  LoadOptions lo;
  lo.cache_bytes = 0;
  auto lm = load_model(testing::tiny_qpack_with_tokenizer(), lo);
  const ModelConfig& c = lm->model.config;
  const std::string path =
      (std::filesystem::temp_directory_path() / ("swiftlet_rt_" + std::to_string(::getpid()))).string();
  Forward fwd(lm->model, Backend::CpuF32);
  std::vector<RouteRecord> routes;
  const std::vector<int32_t> prompt = some_tokens(9, 1);
  {
    RoutingTraceWriter w(path, c, /*predictions=*/true);
    fwd.set_routing({.observer = &w, .predict_next = 1});
    routes = run(fwd, c, prompt, 5);
    w.finish();
    EXPECT_EQ(w.tokens_written(), 9u + 5u);
  }
  const RoutingTrace t = read_routing_trace(path);
  std::filesystem::remove(path);
  ASSERT_EQ(t.size(), 14u);
  EXPECT_EQ(t.layers, c.num_layers);
  EXPECT_EQ(t.experts, c.num_experts);
  EXPECT_EQ(t.top_k, c.num_experts_per_tok);
  ASSERT_EQ(routes.size(), 14u * size_t(c.num_layers));
  for (const RouteRecord& r : routes) {
    const size_t i = size_t(r.position);
    EXPECT_EQ(t.positions[i], r.position);
    auto got = t.experts_of(i, r.layer);
    EXPECT_EQ(std::vector<int32_t>(got.begin(), got.end()), r.experts) << "token " << i << " layer " << r.layer;
    float sum = 0;
    for (int k = 0; k < t.top_k; ++k) sum += t.weights[t.offset(i, r.layer) + size_t(k)];
    EXPECT_NEAR(sum, 1.0f, 4e-3f);  // norm_topk_prob: the weights sum to 1 (fp16)
  }
  for (size_t i = 0; i < prompt.size(); ++i) EXPECT_EQ(t.tokens[i], prompt[i]);
  // Guesses exist for the decoded tokens' layers 1.. only, and score as the Forward scored them.
  for (size_t i = 0; i < t.size(); ++i)
    for (int l = 0; l < t.layers; ++l)
      EXPECT_EQ(t.predicted_of(i, l).empty(), i < prompt.size() || l == 0) << i << " " << l;
  const TraceLocality loc = trace_locality(t);
  EXPECT_EQ(loc.predicted_steps, 5u * uint64_t(c.num_layers - 1));
  EXPECT_DOUBLE_EQ(loc.prediction_accuracy, fwd.prediction_stats().accuracy());
}

TEST(RoutingReplay, ModelRoutesAsTheTraceSays) {
  LoadOptions lo;
  lo.cache_bytes = 0;
  auto lm = load_model(testing::tiny_qpack_with_tokenizer(), lo);
  const ModelConfig& c = lm->model.config;
  // A trace of the model's own shape with arbitrary choices: replayed, it is the identity.
  RoutingTrace t;
  t.layers = c.num_layers;
  t.experts = c.num_experts;
  t.top_k = c.num_experts_per_tok;
  std::mt19937 rng(3);
  for (int i = 0; i < 6; ++i) {
    std::vector<uint16_t> rec;
    for (int l = 0; l < t.layers; ++l) {
      std::vector<uint16_t> all(size_t(t.experts));
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      rec.insert(rec.end(), all.begin(), all.begin() + t.top_k);
    }
    t.append(i, 0, rec);
  }
  TraceRouteOverride replay(t, c.num_layers, c.num_experts, c.num_experts_per_tok);
  Forward fwd(lm->model, Backend::CpuF32);
  // The trace has no guesses: nothing is guessed (the router's would be noise).
  fwd.set_routing({.route_override = &replay, .predict_next = 1});
  // 7 prompt tokens + 4 decoded: positions 6.. wrap around to trace token position % 6.
  const std::vector<RouteRecord> routes = run(fwd, c, some_tokens(7, 2), 4);
  ASSERT_EQ(routes.size(), 11u * size_t(c.num_layers));
  for (const RouteRecord& r : routes) {
    auto want = t.experts_of(size_t(r.position) % 6, r.layer);
    EXPECT_EQ(r.experts, std::vector<int32_t>(want.begin(), want.end())) << r.position << " " << r.layer;
  }
  // The cache then sees the replayed experts: with every expert cached, misses = distinct experts.
  std::set<std::pair<int, int32_t>> distinct;
  for (const RouteRecord& r : routes)
    for (int32_t e : r.experts) distinct.insert({r.layer, e});
  EXPECT_EQ(lm->experts->expert_stats().misses, distinct.size());
  EXPECT_EQ(fwd.prediction_stats().total, 0u);
  EXPECT_EQ(lm->experts->expert_stats().predicted, 0u);
}

TEST(RoutingReplay, ScoreReturnsEveryPositionFromAFreshState) {
  auto lm = load_model(testing::tiny_qpack_with_tokenizer());
  const ModelConfig& c = lm->model.config;
  const std::vector<int32_t> tokens = some_tokens(12, 4);
  Forward fwd(lm->model, Backend::Cpu);
  SessionState st = SessionState::create(c);
  std::vector<float> want;
  fwd.run(st, tokens, LogitsMode::All, want);
  SessionOptions so;
  so.prefill_chunk = 5;  // three calls: rows concatenated
  Session s(lm->model, nullptr, so);
  s.prepare(some_tokens(3, 9));  // state left over from something else
  const std::vector<float> got = s.score(tokens);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4f) << i;
  // A second window does not see the first.
  EXPECT_EQ(s.score(tokens), got);
  // From row `from` on: the same rows, the earlier ones not computed (from 7: the first call of
  // 5 tokens gives none, the second its last 3, the third both of its own).
  const size_t V = size_t(c.vocab_size);
  for (int64_t from : {1, 4, 5, 7, 11}) {
    const std::vector<float> part = s.score(tokens, from);
    ASSERT_EQ(part.size(), (tokens.size() - size_t(from)) * V) << from;
    for (size_t i = 0; i < part.size(); ++i) ASSERT_EQ(part[i], got[size_t(from) * V + i]) << from << " " << i;
  }
}

}  // namespace
}  // namespace swiftlet
