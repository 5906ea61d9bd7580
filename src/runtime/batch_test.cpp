// The public Batch (include/swiftlet/swiftlet.h) against its oracle, the same generations run one
// at a time by Engine::generate and Chat::send: greedy answers of 1-8 members with prompts of
// different lengths, members joining and leaving mid-batch (a newcomer's long prompt fed in
// chunks while the others keep decoding), one member cancelled, chats whose turns are batched;
// and bad use refused with a message.
#include <swiftlet/swiftlet.h>
#include <swiftlet/swiftlet_c.h>

#include "runtime/batch.h"
#include "runtime/engine.h"
#include "support/test_util.h"
#include "support/tiny_model.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace swiftlet {
namespace {

using api::Batch;
using api::GenerationOptions;

class BatchTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    api::EngineOptions ao;
    ao.model = testing::tiny_qpack_with_tokenizer();
    ao.threads = 2;
    engine_ = api::Engine::open(ao).release();
    EngineOptions o;
    o.model = testing::tiny_qpack_with_tokenizer();
    o.threads = 2;
    raw_ = new swiftlet::Engine(o);
  }
  static void TearDownTestSuite() {
    delete engine_;
    delete raw_;
    engine_ = nullptr;
    raw_ = nullptr;
  }

  // Prompts of different lengths (a few tokens to a few dozen).
  static std::string prompt(int i) {
    static const char* words[] = {"Once", "upon", "a", "time", "there", "was", "a", "small", "robot", "who", "liked", "trains"};
    std::string p = "Story " + std::to_string(i) + ":";
    for (int w = 0; w < 1 + 7 * i; ++w) p += std::string(" ") + words[(w * 5 + i) % 12];
    return p;
  }
  static GenerationOptions greedy(int max_new) {
    GenerationOptions o;
    o.greedy = true;
    o.max_new_tokens = max_new;
    return o;
  }
  // The oracle: each prompt alone.
  static std::string alone(int i, int max_new) {
    api::Stats st;
    std::string text = engine_->generate(prompt(i), greedy(max_new), {}, &st);
    EXPECT_GT(st.generated_tokens, 0);
    return text;
  }

  static api::Engine* engine_;  // the public API's
  static swiftlet::Engine* raw_;  // the runtime's, for the runtime Batch (same model file)
};
api::Engine* BatchTest::engine_ = nullptr;
swiftlet::Engine* BatchTest::raw_ = nullptr;

TEST_F(BatchTest, GreedyAnswersEqualOneByOne) {
  const int kNew = 10;
  std::vector<std::string> want;
  for (int i = 0; i < 8; ++i) want.push_back(alone(i, kNew));
  for (int n : {1, 2, 5, 8}) {
    SCOPED_TRACE(n);
    Batch batch(*engine_);
    std::map<Batch::Id, int> index;
    std::map<int, std::string> streamed;
    for (int i = 0; i < n; ++i) {
      const Batch::Id id = batch.add(prompt(i), greedy(kNew), [&streamed, i](std::string_view piece) {
        streamed[i] += piece;
        return true;
      });
      index[id] = i;
    }
    EXPECT_EQ(batch.active(), size_t(n));
    batch.run();
    EXPECT_EQ(batch.active(), 0u);
    for (auto [id, i] : index) {
      Batch::Result r = batch.result(id);
      EXPECT_EQ(r.text, want[size_t(i)]) << "member " << i;
      EXPECT_EQ(streamed[i], r.text);
      EXPECT_EQ(r.stats.prompt_tokens, int64_t(raw_->require_tokenizer().encode(prompt(i), true).size()));
    }
  }
}

// Members join while others decode and leave at their own lengths; a newcomer's long prompt is
// fed a chunk per step while the members already decoding take a token every step.
TEST_F(BatchTest, MembersJoinAndLeaveMidBatch) {
  const swiftlet::Engine& e = *raw_;
  const Tokenizer& tok = e.require_tokenizer();
  auto request = [&](int i, int max_new) {
    GenerateRequest r;
    r.prompt = tok.encode(prompt(i), true);
    r.sampling = e.default_sampling();
    r.sampling.greedy = true;
    r.max_new_tokens = max_new;
    return r;  // no stop tokens: every member runs to its length, so the steps are predictable
  };
  auto solo = [&](int i, int max_new) { return e.new_session()->generate(request(i, max_new)).tokens; };

  BatchOptions bo;
  bo.prefill_chunk = 8;
  swiftlet::Batch batch(e.model(), bo);
  std::vector<std::unique_ptr<Session>> sessions;
  std::map<swiftlet::Batch::Id, std::pair<int, int>> what;  // id -> (prompt, max_new)
  std::map<swiftlet::Batch::Id, std::vector<int32_t>> got;
  auto add = [&](int i, int max_new) {
    sessions.push_back(e.new_session());
    what[batch.add(*sessions.back(), request(i, max_new))] = {i, max_new};
  };
  auto step = [&] {
    for (auto& f : batch.step()) {
      ASSERT_FALSE(f.error);
      got[f.id] = f.result.tokens;
    }
  };
  add(0, 20);
  add(1, 16);
  for (int s = 0; s < 3; ++s) step();
  ASSERT_EQ(batch.decoding(), 2u);
  add(7, 12);  // ~57 tokens: several chunks of 8
  const uint64_t rows_before = batch.decoded_rows();
  int prefill_steps = 0;
  while (batch.prefilling() > 0) {
    const size_t decoding = batch.decoding();
    const uint64_t rows = batch.decoded_rows();
    step();
    ++prefill_steps;
    if (batch.prefilling() > 0) {
      EXPECT_EQ(batch.decoded_rows() - rows, decoding) << "a member waited for the newcomer's prompt";
    }
  }
  EXPECT_GE(prefill_steps, 5);
  EXPECT_GT(batch.decoded_rows(), rows_before);
  add(3, 4);
  while (!batch.empty()) step();
  ASSERT_EQ(got.size(), 4u);
  for (auto& [id, pm] : what) EXPECT_EQ(got[id], solo(pm.first, pm.second)) << "prompt " << pm.first;
  for (auto& [id, pm] : what) EXPECT_EQ(got[id].size(), size_t(pm.second));
}

TEST_F(BatchTest, CancellingOneLeavesTheOthersUnchanged) {
  const int kNew = 12;
  std::vector<std::string> want;
  for (int i = 0; i < 4; ++i) want.push_back(alone(i, kNew));
  Batch batch(*engine_);
  std::vector<Batch::Id> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(batch.add(prompt(i), greedy(kNew)));
  for (int s = 0; s < 8; ++s) batch.step();
  batch.cancel(ids[2]);
  batch.run();
  for (int i = 0; i < 4; ++i) {
    Batch::Result r = batch.result(ids[size_t(i)]);
    if (i == 2) {
      EXPECT_EQ(r.stats.finish_reason, "cancelled");
      EXPECT_LT(r.stats.generated_tokens, kNew);
      EXPECT_EQ(want[2].substr(0, r.text.size()), r.text);
    } else {
      EXPECT_EQ(r.text, want[size_t(i)]) << "member " << i;
    }
  }
}

// Two chats whose turns run in one batch answer as two chats sent to one after the other, and
// the second turn reuses the first's state.
TEST_F(BatchTest, ChatTurnsInABatchEqualSendingThemAlone) {
  const std::vector<std::string> turns[2] = {{"Hello there", "Tell me more"}, {"What is a train?", "Why?"}};
  std::vector<std::string> want[2];
  for (int c = 0; c < 2; ++c) {
    api::Chat chat(*engine_, {.system = "Be brief."});
    for (const auto& t : turns[c]) want[c].push_back(chat.send(t, {}, greedy(8)));
  }
  api::Chat a(*engine_, {.system = "Be brief."}), b(*engine_, {.system = "Be brief."});
  Batch batch(*engine_);
  for (size_t t = 0; t < 2; ++t) {
    const Batch::Id ia = batch.add(a, turns[0][t], greedy(8));
    const Batch::Id ib = batch.add(b, turns[1][t], greedy(8));
    batch.run();
    EXPECT_EQ(batch.result(ia).text, want[0][t]);
    Batch::Result rb = batch.result(ib);
    EXPECT_EQ(rb.text, want[1][t]);
    if (t == 1) {
      EXPECT_GT(rb.stats.reused_tokens, 0);
    }
  }
  EXPECT_GT(a.last_stats().reused_tokens, 0);
}

TEST_F(BatchTest, BadUseIsRefusedWithAMessage) {
  using swiftlet::testing::error_of;
  EXPECT_NE(error_of([&] { Batch(*engine_, {.max_sequences = 0}); }).find("max_sequences must be at least 1"), std::string::npos);
  Batch batch(*engine_, {.max_sequences = 2});
  EXPECT_NE(error_of([&] { batch.add("", greedy(4)); }).find("the prompt is empty"), std::string::npos);
  GenerationOptions bad = greedy(4);
  bad.max_new_tokens = -1;
  EXPECT_NE(error_of([&] { batch.add("Hi", bad); }).find("max new tokens must be >= 0"), std::string::npos);
  EXPECT_EQ(batch.active(), 0u);  // nothing joined

  api::Chat chat(*engine_);
  const Batch::Id first = batch.add(chat, "Hi", greedy(4));
  EXPECT_NE(error_of([&] { batch.add(chat, "Again", greedy(4)); }).find("still being generated"), std::string::npos);
  EXPECT_NE(error_of([&] { chat.send("Meanwhile"); }).find("being generated in a Batch"), std::string::npos);
  batch.add("Hi", greedy(4));
  EXPECT_NE(error_of([&] { batch.add("One more", greedy(4)); }).find("the batch is full"), std::string::npos);
  EXPECT_NE(error_of([&] { batch.result(first); }).find("still generating"), std::string::npos);
  EXPECT_NE(error_of([&] { batch.result(12345); }).find("unknown"), std::string::npos);
  batch.run();
  batch.result(first);
  EXPECT_NE(error_of([&] { batch.result(first); }).find("already taken"), std::string::npos);
  EXPECT_NO_THROW(chat.send("Now it is free", {}, greedy(2)));

  // A session may be in a batch only once, and only in a batch of its own model.
  const swiftlet::Engine& e = *raw_;
  swiftlet::Batch raw(e.model());
  auto s = e.new_session();
  GenerateRequest r;
  r.prompt = {1, 2, 3};
  r.max_new_tokens = 2;
  raw.add(*s, r);
  EXPECT_NE(error_of([&] { raw.add(*s, r); }).find("already generating in the batch"), std::string::npos);

  // The C API reports through swiftlet_last_error.
  EXPECT_EQ(swiftlet_batch_new(nullptr, 4), nullptr);
  EXPECT_NE(std::string(swiftlet_last_error()).find("engine is NULL"), std::string::npos);
  EXPECT_EQ(swiftlet_batch_add(nullptr, "x", 4, 1, nullptr, nullptr), -1);
  EXPECT_NE(std::string(swiftlet_last_error()).find("must not be NULL"), std::string::npos);
}

// The C API's batch: two raw prompts stepped to the end stream the texts they get alone.
TEST_F(BatchTest, TheCApiStepsABatch) {
  swiftlet_engine* e = swiftlet_open(testing::tiny_qpack_with_tokenizer().c_str(), "cpu");
  ASSERT_NE(e, nullptr) << swiftlet_last_error();
  swiftlet_batch* b = swiftlet_batch_new(e, 2);
  ASSERT_NE(b, nullptr) << swiftlet_last_error();
  std::string text[2];
  auto collect = [](const char* piece, int length, void* user) {
    static_cast<std::string*>(user)->append(piece, size_t(length));
    return 1;
  };
  EXPECT_GT(swiftlet_batch_add(b, prompt(1).c_str(), 8, 1, collect, &text[0]), 0) << swiftlet_last_error();
  EXPECT_GT(swiftlet_batch_add(b, prompt(4).c_str(), 8, 1, collect, &text[1]), 0) << swiftlet_last_error();
  EXPECT_EQ(swiftlet_batch_add(b, prompt(2).c_str(), 8, 1, collect, nullptr), -1);  // max_sequences 2
  EXPECT_NE(std::string(swiftlet_last_error()).find("the batch is full"), std::string::npos);
  int left = 2, steps = 0;
  while (left > 0 && steps++ < 100) left = swiftlet_batch_step(b);
  EXPECT_EQ(left, 0) << swiftlet_last_error();
  EXPECT_EQ(text[0], alone(1, 8));
  EXPECT_EQ(text[1], alone(4, 8));
  swiftlet_batch_free(b);
  swiftlet_close(e);
}

}  // namespace
}  // namespace swiftlet
