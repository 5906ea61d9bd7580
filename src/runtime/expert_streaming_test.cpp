// Streaming experts through a bounded cache changes when bytes are read, never what the model
// computes: logits are identical from a one-slot cache to one holding every expert, with
// parallel or serial reads, with or without next-layer prediction. And the RAM budget is
// turned into a cache size, or refused with the numbers.
#include "runtime/model_loader.h"

#include "runtime/session.h"

#include "experts/qpack_experts.h"
#include "format/qpack.h"
#include "support/greedy_decode.h"
#include "support/test_util.h"
#include "support/tiny_model.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <random>

namespace swiftlet {
namespace {

struct ModelRun {
  std::vector<float> logits;  // prefill's last row, then each decode step's
  ExpertStats stats;
  PredictionStats prediction;
};

ModelRun run_model(const std::string& path, LoadOptions opts, bool predict) {
  auto lm = load_model(path, opts);
  Forward fwd(lm->model, Backend::CpuF32);
  fwd.set_routing({.predict_next = predict});
  SessionState st = SessionState::create(lm->model.config);
  const std::vector<int32_t> prompt = testing::random_tokens(23, 1000, 11);
  ModelRun r;
  r.logits = testing::greedy_logits(fwd, st, prompt, 6);
  r.stats = lm->experts->expert_stats();
  r.prediction = fwd.prediction_stats();
  return r;
}

TEST(ExpertStreaming, LogitsAreIdenticalFromOneSlotToUnlimited) {
  const std::string path = testing::tiny_qpack_with_tokenizer();
  const QpackContainer qc = QpackContainer::open(path);
  const uint64_t stride = qc.layout.expert_stride;
  LoadOptions all;
  all.cache_bytes = 0;
  const ModelRun want = run_model(path, all, false);
  EXPECT_EQ(want.stats.evictions, 0u);
  for (IoMode io : {IoMode::Uring, IoMode::Serial})
    for (uint64_t slots : {1, 2, 7, 40})
      for (bool predict : {false, true}) {
        LoadOptions o;
        o.cache_bytes = slots * stride;
        o.io = io;
        const ModelRun got = run_model(path, o, predict);
        SCOPED_TRACE(::testing::Message() << "slots " << slots << (io == IoMode::Serial ? " serial" : " uring")
                                          << (predict ? " predict" : ""));
        ASSERT_EQ(got.logits.size(), want.logits.size());
        EXPECT_EQ(got.logits, want.logits);  // bit for bit
        EXPECT_LE(got.stats.cache_bytes, slots * stride);
        EXPECT_EQ(got.stats.hits + got.stats.misses, want.stats.hits + want.stats.misses);
        if (slots == 1) {
          EXPECT_GT(got.stats.evictions, 0u);
        }
        if (predict && io == IoMode::Uring) {
          EXPECT_GT(got.prediction.total, 0u);
        }
      }
}

// A prompt goes through the model in calls of up to kPrefillChunk tokens, each routing all its
// tokens layer by layer, so a streamed expert is read once per layer for the whole prompt (not
// once per 256-token piece, as when the mixers' chunk was also the MoE's); the mixers run in
// kMixerChunk pieces inside the call, and the result is the same bits as feeding the prompt in
// small pieces.
TEST(ExpertStreaming, LongPromptReadsEachExpertOncePerLayer) {
  const std::string path = testing::tiny_qpack_with_tokenizer();
  const QpackContainer qc = QpackContainer::open(path);
  const int64_t P = 2 * kMixerChunk + 77;
  ASSERT_LE(P, kPrefillChunk);
  std::vector<int32_t> prompt;
  std::mt19937 rng(5);
  for (int64_t i = 0; i < P; ++i) prompt.push_back(int32_t(rng() % 1000));
  auto prefill = [&](int chunk, uint64_t slots) {
    LoadOptions o;
    o.cache_bytes = slots * qc.layout.expert_stride;
    auto lm = load_model(path, o);
    SessionOptions so;
    so.backend = Backend::CpuF32;
    so.prefill_chunk = chunk;
    Session s(lm->model, nullptr, so);
    s.prepare(prompt);
    return std::make_pair(s.last_logits(), lm->experts->expert_stats());
  };
  const auto [whole, whole_stats] = prefill(kPrefillChunk, 1);
  const uint64_t layer_experts = uint64_t(qc.config.num_layers) * uint64_t(qc.config.num_experts);
  EXPECT_LE(whole_stats.misses, layer_experts);                          // one read per (layer, expert) at most
  EXPECT_EQ(whole_stats.hits + whole_stats.misses, whole_stats.misses);  // one acquire each
  const auto [pieces, piece_stats] = prefill(100, 1);
  EXPECT_GT(piece_stats.misses, 2 * whole_stats.misses);  // six calls: experts read again each time
  ASSERT_EQ(pieces.size(), whole.size());
  EXPECT_EQ(pieces, whole);  // bit for bit
  const auto [unlimited, unlimited_stats] = prefill(kPrefillChunk, layer_experts);
  EXPECT_EQ(unlimited, whole);
}

TEST(ExpertStreaming, RamBudgetSizesTheCacheOrIsRefusedWithTheNumbers) {
  const std::string path = testing::tiny_qpack_with_tokenizer();
  const QpackContainer qc = QpackContainer::open(path);
  LoadOptions o;
  o.budget_context = 512;
  const MemoryPlan base = plan_memory(path, o);
  const uint64_t fixed = base.resident + base.state + base.buffers + base.runtime;
  const uint64_t stride = qc.layout.expert_stride;
  o.ram_budget = fixed + 5 * stride + 10;
  const MemoryPlan p = plan_memory(path, o);
  EXPECT_EQ(p.cache_experts, 5);
  EXPECT_LE(p.resident + p.state + p.buffers + p.runtime + p.cache, o.ram_budget);
  o.ram_budget = fixed + 100;  // less than one layer's experts
  const std::string e = testing::error_of([&] { plan_memory(path, o); });
  EXPECT_NE(e.find("cannot be met"), std::string::npos) << e;
  EXPECT_NE(e.find("resident weights take"), std::string::npos) << e;
  EXPECT_NE(e.find("raise the budget to at least"), std::string::npos) << e;
  // The loader refuses it too, before reading anything.
  EXPECT_NE(testing::error_of([&] { load_model(path, o); }).find("cannot be met"), std::string::npos);
  // With the CUDA runtime in the process (--gpu) the same budget leaves less for the cache.
  const uint64_t all = uint64_t(qc.config.num_layers) * uint64_t(qc.config.num_experts) * stride;
  const uint64_t budget = fixed + (192ull << 20) + all / 2;  // every expert on the CPU, half with --gpu
  o.ram_budget = budget;
  const MemoryPlan cpu = plan_memory(path, o);
  o.gpu = true;
  const MemoryPlan gpu = plan_memory(path, o);
  EXPECT_GT(gpu.runtime, cpu.runtime);
  EXPECT_LT(gpu.cache, cpu.cache);
  EXPECT_LE(gpu.resident + gpu.state + gpu.buffers + gpu.runtime + gpu.cache, budget);

  // swiftlet-server --sessions N (default --parallel): the plan counts N session states, and a
  // budget that fits one but not N says to lower them.
  o.gpu = false;
  o.ram_budget = budget;
  o.budget_sessions = 4;
  const MemoryPlan four = plan_memory(path, o);
  EXPECT_EQ(four.state, 4 * base.state);
  o.ram_budget = fixed + 5 * stride + 10;
  o.budget_sessions = 1 + int((5 * stride) / std::max<uint64_t>(1, base.state)) + 1;
  const std::string many = testing::error_of([&] { plan_memory(path, o); });
  EXPECT_NE(many.find(fmt::format("the state of {} sessions", o.budget_sessions)), std::string::npos) << many;
  EXPECT_NE(many.find("or --sessions / --parallel"), std::string::npos) << many;
}

TEST(ExpertStreaming, ParseBytes) {
  EXPECT_EQ(parse_bytes("4G", "x"), 4000000000ull);
  EXPECT_EQ(parse_bytes("3.5GB", "x"), 3500000000ull);
  EXPECT_EQ(parse_bytes("512M", "x"), 512000000ull);
  EXPECT_EQ(parse_bytes("2GiB", "x"), 2147483648ull);
  EXPECT_EQ(parse_bytes("1000", "x"), 1000ull);
  for (const char* bad : {"", "G", "4Q", "-1G", "four"})
    EXPECT_NE(testing::error_of([&] { parse_bytes(bad, "--ram-budget"); }).find("--ram-budget"), std::string::npos)
        << bad;
}

}  // namespace
}  // namespace swiftlet
