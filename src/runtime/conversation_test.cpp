// Multi-turn chat keeps its state: later turns prefill only their own tokens and answer exactly
// as a fresh session fed the same conversation at once.
#include "runtime/conversation.h"

#include "support/tiny_model.h"

#include <gtest/gtest.h>

namespace swiftlet {
namespace {

TEST(Conversation, LaterTurnsPrefillOnlyNewTokensAndMatchAFreshRun) {
  EngineOptions eo;
  eo.model = swiftlet::testing::tiny_qpack_with_tokenizer();
  Engine engine(eo);
  Conversation conv(engine);
  conv.set_system("You are terse.");
  TurnOptions turn;
  turn.sampling.greedy = true;
  turn.max_new_tokens = 10;

  std::vector<GenerateResult> results;
  std::vector<size_t> seen_before;
  for (const char* text : {"Hello there!", "What is 2+2?", "Thanks, bye."}) {
    seen_before.push_back(conv.seen_tokens().size());
    results.push_back(conv.send(text, turn));
  }
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[0].stats.reused_tokens, 0);
  for (size_t i = 1; i < 3; ++i) {
    const GenerateStats& s = results[i].stats;
    // Everything the model had consumed is reused; what is prefilled is the new turn plus the
    // one or two tokens that ended the previous answer (its last token and <|im_end|>).
    EXPECT_GE(s.reused_tokens, int64_t(seen_before[i]) - 2) << "turn " << i + 1;
    EXPECT_EQ(s.reused_tokens + s.prefilled_tokens, s.prompt_tokens);
    const int64_t new_tokens = s.prompt_tokens - int64_t(seen_before[i]);
    EXPECT_GT(new_tokens, 0);
    EXPECT_LE(s.prefilled_tokens, new_tokens + 2) << "turn " << i + 1 << " re-read its history";
  }

  // The third turn from scratch: a fresh session fed the same tokens at once.
  GenerateRequest req;
  const auto& seen = conv.seen_tokens();
  const auto& last = results[2];
  req.prompt.assign(seen.begin(), seen.end() - int64_t(last.tokens.size()) - (seen.back() != last.tokens.back() ? 1 : 0));
  req.sampling.greedy = true;
  req.max_new_tokens = 10;
  req.stop_tokens = engine.stop_tokens();
  auto fresh = engine.new_session();
  GenerateResult again = fresh->generate(req);
  EXPECT_EQ(again.stats.reused_tokens, 0);
  EXPECT_EQ(again.tokens, last.tokens);
  EXPECT_EQ(again.text, last.text);
}

TEST(Session, DivergingPromptRewindsToASnapshot) {
  EngineOptions eo;
  eo.model = swiftlet::testing::tiny_qpack_with_tokenizer();
  Engine engine(eo);
  auto s = engine.new_session();
  const Tokenizer& tok = engine.require_tokenizer();
  GenerateRequest a;
  a.prompt = tok.encode("The quick brown fox jumps over the lazy dog, again and again.");
  a.sampling.greedy = true;
  a.max_new_tokens = 5;
  GenerateResult ra = s->generate(a);
  // Same prompt, different continuation than what was generated: rewinds to the end of the prompt.
  GenerateRequest b = a;
  b.prompt.push_back(tok.encode(" Then")[0]);
  if (b.prompt.back() == ra.tokens[0]) b.prompt.back() = tok.encode(" And")[0];
  GenerateResult rb = s->generate(b);
  EXPECT_EQ(rb.stats.reused_tokens, int64_t(a.prompt.size()));
  EXPECT_EQ(rb.stats.prefilled_tokens, 1);
  auto fresh = engine.new_session();
  GenerateResult rc = fresh->generate(b);
  EXPECT_EQ(rc.tokens, rb.tokens);
}

// A prompt's activation buffers are let go once it is in: a session does not keep prompt-sized
// buffers while it decodes or waits (a server keeps several), and the answer is the same.
TEST(Session, ReleasesPromptBuffersAfterThePrompt) {
  EngineOptions eo;
  eo.model = swiftlet::testing::tiny_qpack_with_tokenizer();
  Engine engine(eo);
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 300; ++i) prompt.push_back((i * 37) % 1000);
  auto s = engine.new_session();
  s->prepare(prompt);
  EXPECT_EQ(s->buffer_bytes(), 0u);
  GenerateRequest r;
  r.prompt = prompt;
  r.sampling.greedy = true;
  r.max_new_tokens = 6;
  const GenerateResult kept = s->generate(r);  // the prompt is reused; decode regrows one token's buffers
  if (!s->on_gpu()) {  // the GPU pass's one-token buffers are not prompt-sized: it holds none
    EXPECT_GT(s->buffer_bytes(), 0u);
  }
  EXPECT_LT(s->buffer_bytes(), 64u * prompt.size());
  const GenerateResult fresh = engine.new_session()->generate(r);
  EXPECT_EQ(kept.tokens, fresh.tokens);
}

TEST(Session, StopsOnLengthStopTokenAndCancel) {
  EngineOptions eo;
  eo.model = swiftlet::testing::tiny_qpack_with_tokenizer();
  Engine engine(eo);
  auto s = engine.new_session();
  GenerateRequest r;
  r.prompt = engine.require_tokenizer().encode("Count: one two three");
  r.sampling.greedy = true;
  r.max_new_tokens = 6;
  GenerateResult g = s->generate(r);
  EXPECT_EQ(g.finish, FinishReason::Length);
  ASSERT_EQ(g.tokens.size(), 6u);
  // Make the 3rd greedy token a stop token: generation ends there, with finish "stop".
  GenerateRequest r2 = r;
  r2.stop_tokens = {g.tokens[2]};
  auto s2 = engine.new_session();
  GenerateResult g2 = s2->generate(r2);
  EXPECT_EQ(g2.finish, FinishReason::Stop);
  EXPECT_EQ(g2.tokens, std::vector<int32_t>(g.tokens.begin(), g.tokens.begin() + 3));
  // The callback cancels after two pieces.
  auto s3 = engine.new_session();
  int calls = 0;
  GenerateResult g3 = s3->generate(r, [&](std::string_view, int32_t) { return ++calls < 2; });
  EXPECT_EQ(g3.finish, FinishReason::Cancelled);
  EXPECT_LT(g3.tokens.size(), 6u);
}

}  // namespace
}  // namespace swiftlet
