#include "server/engine_worker.h"

#include "runtime/json_schema.h"
#include "server/metrics.h"
#include "support/test_util.h"
#include "support/tiny_model.h"

#include <gtest/gtest.h>

namespace swiftlet::server {
namespace {

using namespace std::chrono_literals;

struct Outcome {
  std::string text;
  JobEvent done;
};

Outcome wait_done(Job& job) {
  Outcome o;
  std::vector<JobEvent> evs;
  for (;;) {
    evs.clear();
    job.wait_events(evs, 100ms);
    for (auto& ev : evs) {
      if (ev.kind == JobEvent::Kind::Text) {
        o.text += ev.text;
        continue;
      }
      o.done = ev;
      return o;
    }
  }
}

class EngineWorkerTest : public ::testing::Test {
 protected:
  void start(size_t max_queue = 8, int sessions = 2, int parallel = 0, bool state_cache = false) {
    WorkerOptions o;
    o.state_cache = state_cache;
    o.state_cache_options.block = 16;  // the tiny prompts' messages are a few dozen tokens
    o.state_cache_options.interval = 64;
    o.engine.model = testing::tiny_qpack_with_tokenizer();
    o.sessions = sessions;
    o.parallel = parallel;
    o.max_queue = max_queue;
    o.max_context = 4096;
    worker_ = std::make_unique<EngineWorker>(o, metrics_);
    ASSERT_EQ(worker_->wait_loaded(), EngineWorker::Status::Ready) << worker_->load_error();
  }
  std::vector<int32_t> encode(const std::string& s) { return worker_->engine()->tokenizer()->encode(s); }
  JobSpec spec(std::vector<int32_t> prompt, int max_new) {
    JobSpec s;
    s.prompt = std::move(prompt);
    s.sampling.greedy = true;
    s.max_new_tokens = max_new;
    return s;
  }
  // A chat prompt of 6 new tokens whose snapshot is at the start of its last turn (the last
  // <|im_start|>), as the routes make it.
  JobSpec chat_spec(const std::string& text) {
    const int32_t im_start = worker_->engine()->tokenizer()->token_id("<|im_start|>");
    JobSpec s = spec(encode(text), 6);
    for (size_t i = s.prompt.size(); i-- > 0;)
      if (s.prompt[i] == im_start) {
        s.snapshot_at = i;
        break;
      }
    return s;
  }
  Metrics metrics_;
  std::unique_ptr<EngineWorker> worker_;
};

TEST_F(EngineWorkerTest, GreedyIsRepeatableAndFollowUpsReuseThePrefix) {
  start();
  // Qwen3 with enable_thinking=false: the generation prompt holds an empty think block, which
  // the next turn's rendering of this answer drops.
  const auto turn1 = encode("<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  JobSpec s1 = spec(turn1, 12);
  for (size_t i = turn1.size(); i-- > 0;)
    if (turn1[i] == worker_->engine()->tokenizer()->token_id("<|im_start|>")) {
      s1.snapshot_at = i;
      break;
    }
  ASSERT_GT(s1.snapshot_at, 0u);
  auto j1 = worker_->submit(s1);
  ASSERT_TRUE(j1);
  Outcome a = wait_done(*j1);
  EXPECT_EQ(a.done.kind, JobEvent::Kind::Done);
  EXPECT_EQ(a.done.stats.reused_tokens, 0);
  EXPECT_EQ(a.done.stats.prefilled_tokens, int64_t(turn1.size()));

  // The same request again: the same answer, the prompt (up to a snapshot) not run again.
  auto j2 = worker_->submit(s1);
  Outcome b = wait_done(*j2);
  EXPECT_EQ(b.text, a.text);
  EXPECT_EQ(b.done.finish, a.done.finish);
  EXPECT_GE(b.done.stats.reused_tokens, int64_t(s1.snapshot_at));

  // A follow-up that re-renders the last turn differently (as Qwen3's template does) rewinds
  // to the turn boundary: everything before it is reused.
  std::vector<int32_t> turn2(turn1.begin(), turn1.begin() + long(s1.snapshot_at));
  const auto more = encode("<|im_start|>assistant\nHi!<|im_end|>\n<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n");
  turn2.insert(turn2.end(), more.begin(), more.end());
  auto j3 = worker_->submit(spec(turn2, 4));
  Outcome c = wait_done(*j3);
  EXPECT_EQ(c.done.stats.reused_tokens, int64_t(s1.snapshot_at));
  EXPECT_EQ(c.done.stats.prefilled_tokens, int64_t(turn2.size() - s1.snapshot_at));

  Metrics::Totals t = metrics_.totals();
  EXPECT_EQ(t.jobs, 3u);
  EXPECT_GT(t.reused_tokens, 0u);
}

TEST_F(EngineWorkerTest, ANewConversationDoesNotOverwriteAnother) {
  start(/*max_queue=*/8, /*sessions=*/2);
  const std::string system = "<|im_start|>system\nYou are terse.<|im_end|>\n";
  const std::string gen = "<|im_start|>assistant\n";
  JobSpec a1 = chat_spec(system + "<|im_start|>user\nFirst question<|im_end|>\n" + gen);
  wait_done(*worker_->submit(a1));
  // B shares only the system prompt with A: it goes to the unused session ...
  JobSpec b1 = chat_spec(system + "<|im_start|>user\nSomething else entirely<|im_end|>\n" + gen);
  EXPECT_EQ(wait_done(*worker_->submit(b1)).done.stats.reused_tokens, 0);
  // ... so A's follow-up still finds A's state.
  JobSpec a2 = chat_spec(system + "<|im_start|>user\nFirst question<|im_end|>\n" + gen +
                         "An answer<|im_end|>\n<|im_start|>user\nNext<|im_end|>\n" + gen);
  EXPECT_GE(wait_done(*worker_->submit(a2)).done.stats.reused_tokens, int64_t(a1.snapshot_at));
}

// With the prefix state cache a new conversation in another slot starts from the state after
// the shared system prompt (a message start of the first), and answers as without it.
TEST_F(EngineWorkerTest, ANewConversationReusesTheSharedPrefixFromTheStateCache) {
  const std::string system = "<|im_start|>system\nYou are terse. Use the tools below when they help: a "
                             "calculator, a search engine, a calendar and a mailbox.<|im_end|>\n";
  const std::string gen = "<|im_start|>assistant\n";
  const std::string b_text = system + "<|im_start|>user\nSomething else entirely<|im_end|>\n" + gen;
  start(/*max_queue=*/8, /*sessions=*/1);
  const Outcome want = wait_done(*worker_->submit(chat_spec(b_text)));
  worker_.reset();

  start(/*max_queue=*/8, /*sessions=*/2, /*parallel=*/0, /*state_cache=*/true);
  const JobSpec a1 = chat_spec(system + "<|im_start|>user\nFirst question<|im_end|>\n" + gen);
  EXPECT_EQ(wait_done(*worker_->submit(a1)).done.stats.reused_tokens, 0);
  const int32_t im_start = worker_->engine()->tokenizer()->token_id("<|im_start|>");
  const size_t preamble = size_t(std::find(a1.prompt.begin() + 1, a1.prompt.end(), im_start) - a1.prompt.begin());
  ASSERT_GE(preamble, 16u);
  ASSERT_LT(preamble, a1.snapshot_at);
  const Outcome b = wait_done(*worker_->submit(chat_spec(b_text)));  // the unused slot
  EXPECT_EQ(b.done.stats.reused_tokens, int64_t(preamble));
  EXPECT_EQ(b.text, want.text);
  const std::optional<StateCacheStats> st = worker_->state_cache_stats();
  ASSERT_TRUE(st);
  EXPECT_EQ(st->hits_ram, 1u);
  EXPECT_EQ(st->tokens_saved, preamble);
  LiveGauges g;
  g.state_cache = st;
  const std::string page = metrics_.prometheus(g);
  EXPECT_NE(page.find("swiftlet_state_cache_tokens_saved_total " + std::to_string(preamble) + "\n"),
            std::string::npos)
      << page;
}

// Two requests of one schema, each with its own compile of it as the routes make them: the
// second finds the first one's grammar and masks in the engine's cache, answers as a constraint
// of its own would, and /metrics counts it.
TEST_F(EngineWorkerTest, RequestsOfOneSchemaShareItsMasks) {
  start(/*max_queue=*/8, /*sessions=*/2);
  const Engine& e = *worker_->engine();
  const char* schema = R"({"type":"object","properties":{"n":{"type":"integer"},"s":{"type":"string","maxLength":6}},
      "required":["n","s"]})";
  auto grammar = [&] { return std::make_shared<const Grammar>(json_schema_grammar(nlohmann::ordered_json::parse(schema))); };
  auto constrained = [&](std::shared_ptr<TokenConstraint> c) {
    JobSpec s = spec(encode("Give me JSON:"), 24);
    s.constraint = std::move(c);
    return wait_done(*worker_->submit(std::move(s)));
  };
  const Outcome want = constrained(std::make_shared<TokenConstraint>(grammar(), e.vocab_trie(), e.stop_tokens()));
  ASSERT_EQ(want.done.kind, JobEvent::Kind::Done);
  EXPECT_FALSE(e.grammar_cache_stats()) << "made on the first constrained request that uses it";
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(constrained(std::make_shared<TokenConstraint>(e.grammar_cache()->get(grammar()), e.stop_tokens())).text,
              want.text);
  const std::optional<GrammarCacheStats> st = e.grammar_cache_stats();
  ASSERT_TRUE(st);
  EXPECT_EQ(st->grammars, 1u);
  EXPECT_EQ(st->grammar_hits, 1u);
  EXPECT_GT(st->masks_computed, 0u);
  EXPECT_GE(st->masks_shared, st->masks_computed) << "the second request takes the same path";
  LiveGauges g;
  g.grammar_cache = st;
  const std::string page = metrics_.prometheus(g);
  EXPECT_NE(page.find("swiftlet_grammar_cache_grammar_hits_total 1\n"), std::string::npos) << page;
  EXPECT_NE(page.find("swiftlet_token_masks_shared_total " + std::to_string(st->masks_shared) + "\n"), std::string::npos);
}

TEST_F(EngineWorkerTest, BoundedQueueAndCancel) {
  start(/*max_queue=*/1, /*sessions=*/1);  // one slot: a second job waits in the queue
  const auto prompt = encode("Once upon a time");
  auto running = worker_->submit(spec(prompt, 100000));
  ASSERT_TRUE(running);
  // Wait until the engine has taken it, so the queue is empty again.
  std::vector<JobEvent> evs;
  while (!running->wait_events(evs, 100ms)) {
  }
  auto waiting = worker_->submit(spec(prompt, 4));
  ASSERT_TRUE(waiting);
  EXPECT_EQ(worker_->queued(), 1u);
  EXPECT_FALSE(worker_->submit(spec(prompt, 4)));  // full

  waiting->cancel();  // the client left while queued: never run
  running->cancel();
  Outcome r = wait_done(*running);
  EXPECT_EQ(r.done.finish, FinishReason::Cancelled);
  EXPECT_LT(r.done.stats.generated_tokens, 100000);
  Outcome w = wait_done(*waiting);
  EXPECT_EQ(w.done.finish, FinishReason::Cancelled);
  EXPECT_EQ(w.done.stats.generated_tokens, 0);

  // Still serving.
  auto next = worker_->submit(spec(prompt, 3));
  ASSERT_TRUE(next);
  EXPECT_EQ(wait_done(*next).done.stats.generated_tokens, 3);
  EXPECT_EQ(metrics_.totals().jobs_cancelled, 2u);
}

TEST_F(EngineWorkerTest, EngineErrorsReachTheClient) {
  start();
  JobSpec s = spec(encode("Hello"), 4);
  s.sampling.top_p = 5;  // rejected by the sampler's validation inside generate()
  auto job = worker_->submit(s);
  Outcome o = wait_done(*job);
  EXPECT_EQ(o.done.kind, JobEvent::Kind::Failed);
  EXPECT_TRUE(o.done.client_error);
  auto ok = worker_->submit(spec(encode("Hello"), 2));
  EXPECT_EQ(wait_done(*ok).done.kind, JobEvent::Kind::Done);
}

// --parallel 4: jobs submitted together run in one batch (more than one sequence per step on
// average), the two beyond the slots wait their turn, and every answer equals the one it gets
// alone.
TEST_F(EngineWorkerTest, JobsRunTogetherAndAnswerAsAlone) {
  start(/*max_queue=*/8, /*sessions=*/4);
  std::vector<JobSpec> specs;
  for (int i = 0; i < 6; ++i) {
    std::string p = "Request " + std::to_string(i) + ":";
    for (int w = 0; w < 3 + 9 * i; ++w) p += (w % 3 == 0) ? " trains" : (w % 3 == 1) ? " and" : " rain";
    specs.push_back(spec(encode(p), 8 + 2 * i));
  }
  std::vector<std::string> alone;
  for (const auto& s : specs) alone.push_back(wait_done(*worker_->submit(s)).text);
  const BatchGauges before = worker_->gauges();
  EXPECT_EQ(before.slots.size(), 4u);

  std::vector<std::shared_ptr<Job>> jobs;
  for (const auto& s : specs) jobs.push_back(worker_->submit(s));
  for (size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_TRUE(jobs[i]);
    Outcome o = wait_done(*jobs[i]);
    EXPECT_EQ(o.done.kind, JobEvent::Kind::Done);
    EXPECT_EQ(o.text, alone[i]) << "request " << i;
  }
  const BatchGauges after = worker_->gauges();
  EXPECT_GT(double(after.rows - before.rows), 1.5 * double(after.steps - before.steps)) << "the jobs did not run together";
  EXPECT_EQ(after.running, 0u);
  uint64_t generated = 0;
  for (const auto& sl : after.slots) generated += sl.generated_tokens;
  EXPECT_GT(generated, 0u);
}

// --parallel 1 --sessions 3: one request generates at a time, and three conversations keep their
// state: after two others ran, the first one's follow-up still continues from its own.
TEST_F(EngineWorkerTest, MoreConversationsThanParallelRequestsKeepTheirState) {
  start(/*max_queue=*/8, /*sessions=*/3, /*parallel=*/1);
  const std::string gen = "<|im_start|>assistant\n";
  const std::string a_turn = "<|im_start|>user\nTell me about trains<|im_end|>\n" + gen;
  const JobSpec a1 = chat_spec(a_turn);
  // Three conversations submitted at once: they run one after another, never two in a step.
  const BatchGauges before = worker_->gauges();
  std::vector<std::shared_ptr<Job>> jobs = {worker_->submit(a1),
                                            worker_->submit(chat_spec("<|im_start|>user\nAnd rain?<|im_end|>\n" + gen)),
                                            worker_->submit(chat_spec("<|im_start|>user\nCoffee<|im_end|>\n" + gen))};
  for (auto& j : jobs) {
    ASSERT_TRUE(j);
    EXPECT_EQ(wait_done(*j).done.kind, JobEvent::Kind::Done);
  }
  const BatchGauges after = worker_->gauges();
  EXPECT_GT(after.steps, before.steps);
  EXPECT_LE(after.rows - before.rows, after.steps - before.steps) << "two requests ran in one step";
  EXPECT_EQ(after.slots.size(), 3u);
  // A's follow-up finds A's state although two other conversations ran since.
  const JobSpec a2 = chat_spec(a_turn + "Trains run on rails.<|im_end|>\n<|im_start|>user\nMore<|im_end|>\n" + gen);
  EXPECT_GE(wait_done(*worker_->submit(a2)).done.stats.reused_tokens, int64_t(a1.snapshot_at));
}

TEST(EngineWorker, RefusesMoreParallelRequestsThanSessions) {
  Metrics m;
  WorkerOptions o;
  o.sessions = 2;
  o.parallel = 3;
  const std::string e = swiftlet::testing::error_of([&] { EngineWorker w(o, m); });
  EXPECT_NE(e.find("--sessions (2) must be at least --parallel (3)"), std::string::npos) << e;
}

TEST(EngineWorker, ReportsALoadFailure) {
  Metrics m;
  WorkerOptions o;
  o.engine.model = "/nonexistent/model.qpack";
  EngineWorker w(o, m);
  EXPECT_EQ(w.wait_loaded(), EngineWorker::Status::Failed);
  EXPECT_FALSE(w.load_error().empty());
  EXPECT_EQ(w.engine(), nullptr);
}

}  // namespace
}  // namespace swiftlet::server
