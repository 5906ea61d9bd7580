// Several sessions decoded together on the GPU (gpu_decode_batch) against each one decoded alone
// on the CPU reference path: 1-8 sequences of different lengths and members leaving and joining
// between steps, with every expert in VRAM (the one-token kernels over the rows) and with a
// VRAM cache of one layer's experts (the batch layer by layer); the runtime Batch with GPU sessions;
// bad batches refused without a change. Skipped where there is no usable GPU.
#include "model/gpu_forward.h"

#include "core/error.h"
#include "experts/expert_slots.h"
#include "runtime/batch.h"
#include "runtime/model_loader.h"
#include "runtime/session.h"
#include "support/test_paths.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>

namespace swiftlet {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!gpu_usable(nullptr)) GTEST_SKIP() << "no usable CUDA GPU"

int32_t argmax(const float* v, int64_t n) { return int32_t(std::max_element(v, v + n) - v); }

float max_abs_diff(const float* a, const float* b, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// Sequence i's prompt: its own ids, 3 + 2 i of them (so the batch's positions differ).
std::vector<int32_t> prompt_of(const ModelConfig& c, int i) {
  std::vector<int32_t> p;
  for (int j = 0; j < 3 + 2 * i; ++j) p.push_back(int32_t((int64_t(j) * 131 + int64_t(i) * 977 + 5) % c.vocab_size));
  return p;
}

// Sequence i alone on the CPU reference: its prompt, then `steps` greedy steps; the logits after
// the prompt and after each step (steps + 1 rows).
std::vector<std::vector<float>> cpu_reference(const Model& m, int i, int steps) {
  Forward f(m, Backend::Reference);
  SessionState st = SessionState::create(m.config);
  std::vector<std::vector<float>> rows(1);
  f.run(st, prompt_of(m.config, i), LogitsMode::Last, rows[0]);
  for (int s = 0; s < steps; ++s) {
    const int32_t next = argmax(rows.back().data(), m.config.vocab_size);
    rows.emplace_back();
    f.run(st, std::span(&next, 1), LogitsMode::Last, rows.back());
  }
  return rows;
}

// One GPU sequence: its pass, state, and the logits rows it produced (after the prompt, then one per
// step it took part in).
struct Seq {
  std::unique_ptr<ForwardPass> pass;
  SessionState st;
  std::vector<std::vector<float>> rows;
  int id = 0;
};

Seq start_seq(const std::shared_ptr<GpuModel>& g, const Model& m, int i) {
  Seq s{make_gpu_forward(g), SessionState::create(m.config), {}, i};
  s.rows.emplace_back();
  s.pass->run(s.st, prompt_of(m.config, i), LogitsMode::Last, s.rows[0]);
  return s;
}

// One batched step of the listed sequences, each taking its greedy token.
void step(ForwardPass& runner, std::vector<Seq*> seqs, int64_t V) {
  std::vector<ForwardPass*> passes;
  std::vector<SessionState*> states;
  std::vector<int32_t> tokens;
  for (Seq* s : seqs) {
    passes.push_back(s->pass.get());
    states.push_back(&s->st);
    tokens.push_back(argmax(s->rows.back().data(), V));
  }
  std::vector<float> logits;
  gpu_decode_batch(runner, passes, states, tokens, logits);
  ASSERT_EQ(logits.size(), seqs.size() * size_t(V));
  for (size_t i = 0; i < seqs.size(); ++i)
    seqs[i]->rows.emplace_back(logits.begin() + int64_t(i) * V, logits.begin() + int64_t(i + 1) * V);
}

// Every row a sequence produced is its CPU reference's (within tol), so its greedy ids are too.
void expect_matches_cpu(const Model& m, const Seq& s, float tol, const std::string& what) {
  const int64_t V = m.config.vocab_size;
  const auto want = cpu_reference(m, s.id, int(s.rows.size()) - 1);
  for (size_t r = 0; r < s.rows.size(); ++r) {
    EXPECT_LE(max_abs_diff(want[r].data(), s.rows[r].data(), V), tol) << what << ", sequence " << s.id << ", row " << r;
    EXPECT_EQ(argmax(want[r].data(), V), argmax(s.rows[r].data(), V)) << what << ", sequence " << s.id << ", row " << r;
  }
}

// Every expert in VRAM (the one-token kernels over the members' rows), or with layer_cache a
// VRAM cache of one layer's experts (the batch goes layer by layer over the members' rows).
std::shared_ptr<GpuModel> gpu_model(const Model& m, bool layer_cache = false) {
  GpuOptions o;
  o.make_slots = make_expert_slots;
  std::string why;
  if (layer_cache) {
    o.cache_bytes = 1;  // one slot: learns the slot size
    auto probe = make_gpu_model(m, o, &why);
    EXPECT_TRUE(probe) << why;
    if (!probe) return nullptr;
    o.cache_bytes = size_t(m.config.num_experts) * gpu_stats(*probe).slot_bytes;
  }
  auto g = make_gpu_model(m, o, &why);
  EXPECT_TRUE(g) << why;
  // (Experts the grouped kernels do not take, e.g. float ones, never count as all resident.)
  if (g && layer_cache && m.config.num_layers > 1) {
    EXPECT_FALSE(gpu_stats(*g).all_resident);
  }
  return g;
}

class GpuBatchFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuBatchFixture, OneToEightSequencesMatchTheCpuOneByOne) {
  SKIP_WITHOUT_GPU();
  auto lm = load_model(swiftlet::testing::fixture_dir(GetParam()));
  const Model& m = lm->model;
  for (const bool layer_cache : {false, true}) {
    auto g = gpu_model(m, layer_cache);
    ASSERT_TRUE(g);
    for (int n : {1, 2, 3, 8}) {
      auto runner = make_gpu_forward(g);
      std::vector<Seq> seqs;
      for (int i = 0; i < n; ++i) seqs.push_back(start_seq(g, m, i));
      std::vector<Seq*> all;
      for (Seq& s : seqs) all.push_back(&s);
      for (int s = 0; s < 5; ++s) step(*runner, all, m.config.vocab_size);
      for (const Seq& s : seqs)
        expect_matches_cpu(m, s, 1e-3f,
                           GetParam() + ", " + std::to_string(n) + " sequences" + (layer_cache ? ", layer cache" : ""));
    }
  }
}

// Members leave, come back in another order and join with a fresh prompt between steps; each
// sequence's rows stay its own.
TEST_P(GpuBatchFixture, SequencesLeaveAndJoinMidBatch) {
  SKIP_WITHOUT_GPU();
  auto lm = load_model(swiftlet::testing::fixture_dir(GetParam()));
  const Model& m = lm->model;
  const int64_t V = m.config.vocab_size;
  for (const bool layer_cache : {false, true}) {
    auto g = gpu_model(m, layer_cache);
    ASSERT_TRUE(g);
    auto runner = make_gpu_forward(g);
    std::vector<std::unique_ptr<Seq>> seqs;
    for (int i = 0; i < 3; ++i) seqs.push_back(std::make_unique<Seq>(start_seq(g, m, i)));
    Seq *a = seqs[0].get(), *b = seqs[1].get(), *c = seqs[2].get();
    step(*runner, {a, b, c}, V);
    step(*runner, {a, b, c}, V);
    step(*runner, {a, c}, V);     // b left
    step(*runner, {c, b, a}, V);  // b back, another order
    step(*runner, {c, b, a}, V);
    seqs.push_back(std::make_unique<Seq>(start_seq(g, m, 3)));
    Seq* d = seqs[3].get();
    step(*runner, {d, a}, V);
    step(*runner, {b, d, c, a}, V);
    step(*runner, {b, d, c, a}, V);
    for (const auto& s : seqs)
      expect_matches_cpu(m, *s, 1e-3f, GetParam() + ", joining and leaving" + (layer_cache ? ", layer cache" : ""));
  }
}

// Every expert resident: a batch step (the one-token kernels over the rows) gives each member the
// logits its own one-token step gives, to float rounding, at different lengths and positions.
TEST_P(GpuBatchFixture, ResidentBatchStepEqualsEachMembersOwnStep) {
  SKIP_WITHOUT_GPU();
  auto lm = load_model(swiftlet::testing::fixture_dir(GetParam()));
  const Model& m = lm->model;
  const int64_t V = m.config.vocab_size;
  auto g = gpu_model(m);
  ASSERT_TRUE(g);
  auto runner = make_gpu_forward(g);
  std::vector<Seq> batched, alone;
  for (int i = 0; i < 4; ++i) {
    batched.push_back(start_seq(g, m, i));
    alone.push_back(start_seq(g, m, i));
  }
  std::vector<Seq*> all;
  for (Seq& s : batched) all.push_back(&s);
  for (int s = 0; s < 4; ++s) {
    step(*runner, all, V);
    for (Seq& a : alone) {
      const int32_t tok = argmax(a.rows.back().data(), V);
      a.rows.emplace_back();
      a.pass->run(a.st, std::span(&tok, 1), LogitsMode::Last, a.rows.back());
    }
  }
  for (size_t i = 0; i < alone.size(); ++i)
    for (size_t r = 0; r < alone[i].rows.size(); ++r) {
      float big = 0.0f;
      for (float v : alone[i].rows[r]) big = std::max(big, std::fabs(v));
      EXPECT_LE(max_abs_diff(alone[i].rows[r].data(), batched[i].rows[r].data(), V), 1e-5f * std::max(1.0f, big))
          << GetParam() << ", sequence " << i << ", row " << r;
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuBatchFixture, ::testing::ValuesIn(swiftlet::testing::fixture_names()),
                         [](const auto& info) { return info.param; });

// The runtime's Batch steps GPU sessions together: each answer is what the session gives alone.
TEST(GpuBatch, BatchOfGpuSessionsAnswersAsEachAlone) {
  SKIP_WITHOUT_GPU();
  auto lm = load_model(swiftlet::testing::fixture_dir(swiftlet::testing::fixture_names().front()));
  const Model& m = lm->model;
  auto g = gpu_model(m);
  ASSERT_TRUE(g);
  SessionOptions so;
  so.gpu = g;
  std::vector<GenerateRequest> reqs(4);
  for (int i = 0; i < 4; ++i) {
    reqs[size_t(i)].prompt = prompt_of(m.config, i);
    reqs[size_t(i)].sampling.greedy = true;
    reqs[size_t(i)].max_new_tokens = 4 + i;
  }
  std::vector<std::vector<int32_t>> alone;
  for (const GenerateRequest& r : reqs) {
    Session s(m, nullptr, so);
    alone.push_back(s.generate(r).tokens);
  }
  BatchOptions bo;
  bo.gpu = g;
  Batch batch(m, bo);
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<Batch::Id> ids;
  for (const GenerateRequest& r : reqs) {
    sessions.push_back(std::make_unique<Session>(m, nullptr, so));
    ids.push_back(batch.add(*sessions.back(), r));
  }
  std::vector<std::vector<int32_t>> got(reqs.size());
  int steps = 0;
  while (!batch.empty() && steps++ < 100)
    for (Batch::Finished& f : batch.step()) {
      ASSERT_FALSE(f.error);
      const size_t i = size_t(std::find(ids.begin(), ids.end(), f.id) - ids.begin());
      ASSERT_LT(i, reqs.size());
      got[i] = f.result.tokens;
    }
  EXPECT_EQ(got, alone);
  EXPECT_GT(batch.decoded_rows(), batch.steps());  // steps decoded more than one member
}

TEST(GpuBatch, BadBatchesAreRefusedAndChangeNothing) {
  SKIP_WITHOUT_GPU();
  auto lm = load_model(swiftlet::testing::fixture_dir(swiftlet::testing::fixture_names().front()));
  const Model& m = lm->model;
  const int64_t V = m.config.vocab_size;
  auto g = gpu_model(m), other = gpu_model(m);
  ASSERT_TRUE(g && other);
  auto runner = make_gpu_forward(g);
  Seq a = start_seq(g, m, 0), b = start_seq(g, m, 1), x = start_seq(other, m, 2);
  std::vector<float> logits;
  auto call = [&](std::vector<Seq*> seqs, std::vector<int32_t> tokens) {
    std::vector<ForwardPass*> passes;
    std::vector<SessionState*> states;
    for (Seq* s : seqs) {
      passes.push_back(s->pass.get());
      states.push_back(&s->st);
    }
    gpu_decode_batch(*runner, passes, states, tokens, logits);
  };
  EXPECT_THROW(call({&a, &b}, {1, int32_t(V)}), Error);  // a token outside the vocabulary
  EXPECT_THROW(call({&a, &b}, {1, -1}), Error);
  EXPECT_THROW(call({&a, &a}, {1, 2}), Error);  // listed twice
  EXPECT_THROW(call({&a, &x}, {1, 2}), Error);  // another GPU model's pass
  std::vector<ForwardPass*> self{runner.get()};
  SessionState st = SessionState::create(m.config);
  std::vector<SessionState*> self_state{&st};
  std::vector<int32_t> one{1};
  EXPECT_THROW(gpu_decode_batch(*runner, self, self_state, one, logits), Error);  // the runner as a member
  EXPECT_EQ(a.st.pos, int64_t(prompt_of(m.config, 0).size()));
  EXPECT_EQ(b.st.pos, int64_t(prompt_of(m.config, 1).size()));
  // Nothing moved: the two still decode as the CPU does.
  step(*runner, {&a, &b}, V);
  expect_matches_cpu(m, a, 1e-3f, "after refused batches");
  expect_matches_cpu(m, b, 1e-3f, "after refused batches");
}

}  // namespace
}  // namespace swiftlet
