// Forward::decode_batch against its oracle, the same sequences decoded one at a time by run():
// several sequences of different prompt lengths stepped together give each one the logits it
// gets alone (bit for bit: every product computes a row the same way whatever the other rows),
// so greedy decoding picks the same tokens; sequences may leave and join between steps; bad
// batches are refused with a message and change no state.
#include "model/qwen3_hybrid.h"

#include "core/error.h"
#include "runtime/model_loader.h"
#include "support/test_paths.h"
#include "support/test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace swiftlet {
namespace {

using swiftlet::testing::error_of;
using swiftlet::testing::fixture_dir;
using swiftlet::testing::max_abs_diff;
using swiftlet::testing::source_path;

// A model under test: two fixture checkpoints (one per family, quantised, experts mapped) and the
// shipped trained model (experts streamed from its .qpack through the default, one-token cache).
std::string model_path(const std::string& name) {
  return name == "toy" ? source_path("models/toy.qpack") : fixture_dir(name);
}

int32_t argmax(std::span<const float> row) { return int32_t(std::max_element(row.begin(), row.end()) - row.begin()); }

// A prompt of `len` tokens that differs per sequence.
std::vector<int32_t> prompt_for(int seq, int len, int64_t vocab) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(int32_t((1 + 37 * seq + 101 * i + i * i) % vocab));
  return p;
}

// One sequence twice: `alone` decoded by run(), `batched` by decode_batch, from the same prompt.
struct Pair {
  SessionState alone, batched;
  int32_t next = 0;  // the token both take next (greedy, from the oracle's logits)
};

class DecodeBatchTest : public ::testing::TestWithParam<std::tuple<std::string, Backend>> {
 protected:
  void SetUp() override {
    lm_ = load_model(model_path(std::get<0>(GetParam())));
    solo_ = std::make_unique<Forward>(lm_->model, std::get<1>(GetParam()));
    batch_ = std::make_unique<Forward>(lm_->model, std::get<1>(GetParam()));
  }
  const ModelConfig& config() const { return lm_->model.config; }

  // Prefills a new pair with a prompt of `len` tokens (both states by the solo pass).
  Pair start(int seq, int len) {
    Pair p{SessionState::create(config()), SessionState::create(config())};
    const std::vector<int32_t> prompt = prompt_for(seq, len, config().vocab_size);
    std::vector<float> logits;
    solo_->run(p.alone, prompt, LogitsMode::Last, logits);
    p.next = argmax(logits);
    solo_->run(p.batched, prompt, LogitsMode::None, logits);
    return p;
  }

  // One step of the members `ids` of `pairs`, batched in that order, each checked against its
  // one-by-one decode; then each takes its greedy token.
  void step(std::vector<Pair>& pairs, const std::vector<int>& ids) {
    std::vector<SessionState*> states;
    std::vector<int32_t> tokens;
    for (int i : ids) {
      states.push_back(&pairs[size_t(i)].batched);
      tokens.push_back(pairs[size_t(i)].next);
    }
    std::vector<float> got, want;
    batch_->decode_batch(states, tokens, got);
    const int64_t V = config().vocab_size;
    ASSERT_EQ(got.size(), ids.size() * size_t(V));
    for (size_t j = 0; j < ids.size(); ++j) {
      Pair& p = pairs[size_t(ids[j])];
      solo_->run(p.alone, std::span(&p.next, 1), LogitsMode::Last, want);
      const std::vector<float> row(got.begin() + int64_t(j) * V, got.begin() + int64_t(j + 1) * V);
      EXPECT_TRUE(row == want) << "max |difference| " << max_abs_diff(row, want) << ", sequence " << ids[j]
                               << " at position " << p.alone.pos - 1 << " (batch of " << ids.size() << ", place " << j
                               << ")";
      EXPECT_EQ(argmax(row), argmax(want));
      EXPECT_EQ(p.batched.pos, p.alone.pos);
      EXPECT_EQ(p.batched.tokens, p.alone.tokens);
      p.next = argmax(want);
    }
  }

  std::unique_ptr<LoadedModel> lm_;
  std::unique_ptr<Forward> solo_, batch_;
};

TEST_P(DecodeBatchTest, OneToEightSequencesMatchOneByOneDecode) {
  for (int n : {1, 2, 3, 5, 8}) {
    std::vector<Pair> pairs;
    std::vector<int> ids;
    // Prompts of different lengths, so the sequences sit at different positions.
    for (int i = 0; i < n; ++i) {
      pairs.push_back(start(i, 1 + 3 * i + n % 3));
      ids.push_back(i);
    }
    for (int s = 0; s < 2; ++s) step(pairs, ids);
    if (HasFailure()) FAIL() << "batch of " << n;
  }
}

TEST_P(DecodeBatchTest, SequencesLeaveAndJoinMidBatch) {
  std::vector<Pair> pairs;
  for (int i = 0; i < 3; ++i) pairs.push_back(start(i, 2 + 4 * i));
  step(pairs, {0, 1, 2});
  step(pairs, {0, 2});           // 1 leaves
  pairs.push_back(start(3, 7));  // 3 joins after its prompt
  step(pairs, {0, 2, 3});
  step(pairs, {3, 1, 0, 2});  // 1 comes back; the order of the batch is free
  step(pairs, {2});
  step(pairs, {1, 3});
}

std::string param_name(const ::testing::TestParamInfo<DecodeBatchTest::ParamType>& info) {
  return std::get<0>(info.param) + "_" + (std::get<1>(info.param) == Backend::Reference ? "reference" : "cpu");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DecodeBatchTest,
                         ::testing::Combine(::testing::Values("next_mlx4", "q35_mlx4"),
                                            ::testing::Values(Backend::Reference, Backend::Cpu)),
                         param_name);
// The trained model's 151669-token vocabulary makes each logits row cost: the fast backend only
// (a slow test all the same, CMakeLists.txt).
INSTANTIATE_TEST_SUITE_P(Trained, DecodeBatchTest,
                         ::testing::Combine(::testing::Values("toy"), ::testing::Values(Backend::Cpu)), param_name);

// Routes by layer and position only (as a replayed trace does): each row of a batch must be
// asked at its own position, so a batch picks the experts each sequence picks alone.
class PositionRoutes : public RouteOverride {
 public:
  explicit PositionRoutes(int experts) : experts_(experts) {}
  void route(int layer, int64_t pos, std::span<int32_t> out) override {
    for (size_t i = 0; i < out.size(); ++i) out[i] = int32_t((pos * 5 + layer * 3 + int64_t(i)) % experts_);
  }

 private:
  int experts_;
};

TEST(DecodeBatch, RouteOverrideIsAskedAtEachRowsPosition) {
  auto lm = load_model(fixture_dir("q35_mlx4"));
  const ModelConfig& c = lm->model.config;
  ASSERT_GE(c.num_experts, c.num_experts_per_tok);  // the ids above stay distinct
  PositionRoutes routes(c.num_experts);
  Forward solo(lm->model, Backend::Cpu), batch(lm->model, Backend::Cpu), plain(lm->model, Backend::Cpu);
  solo.set_routing({.route_override = &routes});
  batch.set_routing({.route_override = &routes});
  std::vector<SessionState> alone, batched, unrouted;
  std::vector<float> logits, want, other;
  for (int i = 0; i < 3; ++i) {
    const std::vector<int32_t> prompt = prompt_for(i, 2 + 3 * i, c.vocab_size);
    alone.push_back(SessionState::create(c));
    solo.run(alone.back(), prompt, LogitsMode::None, logits);
    batched.push_back(alone.back());
    unrouted.push_back(SessionState::create(c));
    plain.run(unrouted.back(), prompt, LogitsMode::None, logits);
  }
  std::vector<SessionState*> states;
  for (SessionState& s : batched) states.push_back(&s);
  const std::vector<int32_t> tokens{11, 12, 13};
  batch.decode_batch(states, tokens, logits);
  const int64_t V = c.vocab_size;
  bool differs_from_router = false;
  for (int i = 0; i < 3; ++i) {
    solo.run(alone[size_t(i)], std::span(&tokens[size_t(i)], 1), LogitsMode::Last, want);
    const std::vector<float> row(logits.begin() + i * V, logits.begin() + (i + 1) * V);
    EXPECT_TRUE(row == want) << "sequence " << i << ": max |difference| " << max_abs_diff(row, want);
    plain.run(unrouted[size_t(i)], std::span(&tokens[size_t(i)], 1), LogitsMode::Last, other);
    differs_from_router = differs_from_router || other != want;
  }
  EXPECT_TRUE(differs_from_router) << "the override chose what the router chooses: the test checks nothing";
}

class CountingObserver : public RoutingObserver {
 public:
  void routed(int, int64_t, std::span<const int32_t>, std::span<const int32_t>, std::span<const float>) override {}
};

TEST(DecodeBatch, BadBatchesAreRefusedAndChangeNothing) {
  auto lm = load_model(fixture_dir("q35_mlx4"));
  const ModelConfig& c = lm->model.config;
  Forward fwd(lm->model, Backend::Cpu);
  SessionState a = SessionState::create(c), b = SessionState::create(c);
  std::vector<float> logits;
  const std::vector<int32_t> prompt{3, 14, 15};
  fwd.run(a, prompt, LogitsMode::None, logits);
  fwd.run(b, std::span(prompt).first(2), LogitsMode::None, logits);

  auto other_lm = load_model(fixture_dir("next_8l"));
  SessionState other = SessionState::create(other_lm->model.config);
  SessionState one_more = SessionState::create(c);
  one_more.pos = 1;  // claims a token its KV cache does not hold (a state whose caches live on the GPU)
  one_more.tokens = {5};

  auto refused = [&](std::vector<SessionState*> states, std::vector<int32_t> tokens) {
    return error_of([&] { fwd.decode_batch(states, tokens, logits); });
  };
  EXPECT_NE(refused({}, {}).find("empty"), std::string::npos);
  EXPECT_NE(refused({&a, &b}, {1}).find("one token per state"), std::string::npos);
  EXPECT_NE(refused({&a, &b, &a}, {1, 2, 3}).find("same session state is at places 0 and 2"), std::string::npos);
  EXPECT_NE(refused({&a, &other}, {1, 2}).find("another model"), std::string::npos);
  EXPECT_NE(refused({&one_more}, {1}).find("another model"), std::string::npos);
  EXPECT_NE(refused({&a, nullptr}, {1, 2}).find("null"), std::string::npos);
  EXPECT_NE(refused({&a, &b}, {1, int32_t(c.vocab_size)}).find("outside the vocabulary"), std::string::npos);
  CountingObserver obs;
  fwd.set_routing({.observer = &obs});
  EXPECT_NE(refused({&a, &b}, {1, 2}).find("decode those sessions alone"), std::string::npos);
  fwd.set_routing({});

  // Nothing moved: both still continue exactly as a fresh decode of their prompts.
  EXPECT_EQ(a.pos, 3);
  EXPECT_EQ(b.pos, 2);
  EXPECT_EQ(a.tokens, prompt);
  SessionState a2 = SessionState::create(c);
  fwd.run(a2, prompt, LogitsMode::None, logits);
  std::vector<float> want;
  const int32_t next = 9;
  fwd.run(a2, std::span(&next, 1), LogitsMode::Last, want);
  SessionState* states[] = {&a};
  fwd.decode_batch(states, std::span(&next, 1), logits);
  EXPECT_EQ(logits, want);
}

}  // namespace
}  // namespace swiftlet
