// --on-miss on the tiny model: exact and skip:0 give the bits of a run without the option through
// a small streamed cache; skip:W leaves a missed low-weight expert unread and renormalises the
// others, which the layer's output shows against outputs made with experts zeroed; a hit below W
// and a token's top-1 are kept; a session counts the low-bit copies it read; the engine refuses a
// lossy policy on the GPU.
#include "runtime/engine.h"
#include "runtime/model_loader.h"
#include "runtime/session.h"

#include "convert/repack.h"
#include "convert/synthetic.h"
#include "format/qpack.h"
#include "support/greedy_decode.h"
#include "support/test_util.h"
#include "support/tiny_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

namespace swiftlet {
namespace {

struct TinyRun {
  std::vector<float> logits;  // prefill's last row, then each decode step's
  ExpertStats stats;
};

// 17 prompt tokens and 6 greedy steps through a cache of `slots` experts.
TinyRun run_tiny(uint64_t slots, const MissPolicy* policy) {
  const std::string path = testing::tiny_qpack_with_tokenizer();
  LoadOptions o;
  o.cache_bytes = slots * QpackContainer::open(path).layout.expert_stride;
  auto lm = load_model(path, o);
  Forward fwd(lm->model, Backend::CpuF32);
  if (policy) fwd.set_miss_policy(*policy);
  SessionState st = SessionState::create(lm->model.config);
  const std::vector<int32_t> prompt = testing::random_tokens(17, 1000, 3);
  TinyRun r;
  r.logits = testing::greedy_logits(fwd, st, prompt, 6);
  r.stats = lm->experts->expert_stats();
  return r;
}

TEST(OnMiss, ExactAndSkipZeroAreTheBitsOfARunWithoutTheOption) {
  const TinyRun plain = run_tiny(2, nullptr);
  ASSERT_GT(plain.stats.misses, 0u);
  for (const char* flag : {"exact", "skip:0"}) {
    SCOPED_TRACE(flag);
    const MissPolicy p = parse_miss_policy(flag);
    const TinyRun got = run_tiny(2, &p);
    EXPECT_EQ(got.logits, plain.logits);  // bit for bit
    EXPECT_EQ(got.stats.skipped, 0u);
    EXPECT_EQ(got.stats.misses, plain.stats.misses);
    EXPECT_EQ(got.stats.bytes_read, plain.stats.bytes_read);
  }
  // A lossy threshold through the same cache leaves experts out: fewer reads, counted.
  const MissPolicy lossy = parse_miss_policy("skip:0.3");
  const TinyRun skip = run_tiny(2, &lossy);
  EXPECT_GT(skip.stats.skipped, 0u);
  EXPECT_LT(skip.stats.misses, plain.stats.misses);
  EXPECT_LT(skip.stats.bytes_read, plain.stats.bytes_read);
}

using Key = std::pair<int, int32_t>;  // (layer, expert)

// The model's expert source as the test scripts it: listed experts are misses (ready() false),
// the others hits; listed experts' weights come back zeroed (their products are 0). Records what
// the model prefetched, acquired and left out.
class ScriptedSource final : public ExpertSource {
 public:
  explicit ScriptedSource(ExpertSource& inner) : inner_(inner), zeros_(size_t(1) << 20, 0) {}
  std::set<Key> missing, zeroed, prefetched, acquired;
  int skipped_count = 0;

  int max_batch() const override { return inner_.max_batch(); }
  void prefetch(int layer, std::span<const int32_t> experts) override {
    for (int32_t e : experts) prefetched.insert({layer, e});
  }
  bool ready(int layer, int expert) const override { return missing.count({layer, expert}) == 0; }
  void acquire(int layer, std::span<const int32_t> experts, std::span<ExpertWeights> out) override {
    inner_.acquire(layer, experts, out);
    for (size_t i = 0; i < experts.size(); ++i) {
      acquired.insert({layer, experts[i]});
      if (zeroed.count({layer, experts[i]}))
        for (QMatrix* m : {&out[i].gate, &out[i].up, &out[i].down}) zero(*m);
    }
  }
  void release(int layer) override { inner_.release(layer); }
  void skipped(int /*layer*/, int count) override { skipped_count += count; }

 private:
  void zero(QMatrix& m) const {
    EXPECT_LE(m.total_bytes(), zeros_.size());
    if (m.format == WeightFormat::Affine)
      m.scales = m.biases = zeros_.data();  // w = 0 * q + 0
    else
      m.data = zeros_.data();
  }
  ExpertSource& inner_;
  std::vector<uint8_t> zeros_;
};

struct Routed : RoutingObserver {
  std::vector<std::vector<int32_t>> experts;  // [layer] the token's choices, router order
  std::vector<std::vector<float>> weights;
  void routed(int layer, int64_t, std::span<const int32_t>, std::span<const int32_t> e,
              std::span<const float> w) override {
    experts.resize(size_t(layer) + 1);
    weights.resize(size_t(layer) + 1);
    experts[size_t(layer)].assign(e.begin(), e.end());
    weights[size_t(layer)].assign(w.begin(), w.end());
  }
};

class OnMissScripted : public ::testing::Test {
 protected:
  void SetUp() override {
    LoadOptions o;
    o.cache_bytes = 0;  // every expert fits: the script alone says what misses
    lm_ = load_model(testing::tiny_qpack_with_tokenizer(), o);
    model_ = lm_->model;
    src_ = std::make_unique<ScriptedSource>(*lm_->experts);
    model_.experts = src_.get();
    Forward f(model_, Backend::CpuF32);
    f.set_routing({.observer = &routes_});
    run(f);
    ASSERT_GT(int(routes_.experts.size()), kLayer);
    src_->prefetched.clear();
    src_->acquired.clear();
  }
  // One token from a fresh state; the residual stream after layer kLayer.
  std::vector<float> run(Forward& f) {
    SessionState st = SessionState::create(model_.config);
    f.set_capture(true);
    std::vector<float> row;
    const int32_t token = 77;
    f.run(st, std::span(&token, 1), LogitsMode::Last, row);
    const int64_t H = model_.config.hidden_size;
    const auto& out = f.layer_outputs();
    return std::vector<float>(out.begin() + kLayer * H, out.begin() + (kLayer + 1) * H);
  }
  // The layer's output with `zero` experts of kLayer zeroed, exact policy, nothing missing.
  std::vector<float> exact_with_zeroed(std::set<int32_t> zero) {
    src_->missing.clear();
    src_->zeroed.clear();
    for (int32_t e : zero) src_->zeroed.insert({kLayer, e});
    Forward f(model_, Backend::CpuF32);
    std::vector<float> out = run(f);
    src_->zeroed.clear();
    return out;
  }
  static constexpr int kLayer = 1;
  std::unique_ptr<LoadedModel> lm_;
  Model model_;
  std::unique_ptr<ScriptedSource> src_;
  Routed routes_;
};

// out(kept experts, weights scaled by s) = base + s * (out(kept, unscaled) - base), where base has
// every routed expert zeroed (the residual, the mixer and the shared expert): the sum is linear.
void expect_scaled(const std::vector<float>& got, const std::vector<float>& base, const std::vector<float>& kept,
                   double s) {
  ASSERT_EQ(got.size(), base.size());
  float scale = 0;
  for (float v : got) scale = std::max(scale, std::abs(v));
  double worst = 0;
  for (size_t d = 0; d < got.size(); ++d)
    worst = std::max(worst, std::abs(double(got[d]) - (double(base[d]) + s * (double(kept[d]) - double(base[d])))));
  EXPECT_LT(worst, 2e-6 * scale) << "largest difference from the hand-worked output";
}

TEST_F(OnMissScripted, AMissBelowWIsNotReadAndTheOthersAreRenormalised) {
  const std::vector<int32_t>& e = routes_.experts[kLayer];
  const std::vector<float>& w = routes_.weights[kLayer];
  ASSERT_EQ(e.size(), 4u);
  ASSERT_GT(w[1], w[2]) << "the tiny model's weights should differ";
  // W between the 2nd and 3rd weights: the 4th expert misses (left out), the 3rd is below W but
  // a hit (kept), the 2nd misses above W (read), the top-1 is a hit.
  const float W = (w[1] + w[2]) / 2;
  src_->missing = {{kLayer, e[1]}, {kLayer, e[3]}};
  Forward f(model_, Backend::CpuF32);
  f.set_miss_policy(MissPolicy::skip(W));
  const std::vector<float> got = run(f);
  EXPECT_EQ(src_->skipped_count, 1);
  EXPECT_EQ(src_->prefetched.count({kLayer, e[3]}), 0u);
  EXPECT_EQ(src_->acquired.count({kLayer, e[3]}), 0u);
  for (int i : {0, 1, 2}) EXPECT_EQ(src_->acquired.count({kLayer, e[size_t(i)]}), 1u) << i;
  const double s = (double(w[0]) + w[1] + w[2] + w[3]) / (double(w[0]) + w[1] + w[2]);
  expect_scaled(got, exact_with_zeroed({e[0], e[1], e[2], e[3]}), exact_with_zeroed({e[3]}), s);
}

TEST_F(OnMissScripted, TheTopOneIsKeptWhateverW) {
  const std::vector<int32_t>& e = routes_.experts[kLayer];
  const std::vector<float>& w = routes_.weights[kLayer];
  src_->missing = {{kLayer, e[0]}, {kLayer, e[1]}, {kLayer, e[2]}, {kLayer, e[3]}};
  Forward f(model_, Backend::CpuF32);
  f.set_miss_policy(MissPolicy::skip(0.999f));
  const std::vector<float> got = run(f);
  EXPECT_EQ(src_->skipped_count, 3);
  std::set<Key> at_layer;
  for (const Key& k : src_->acquired)
    if (k.first == kLayer) at_layer.insert(k);
  EXPECT_EQ(at_layer, (std::set<Key>{{kLayer, e[0]}}));
  const double s = (double(w[0]) + w[1] + w[2] + w[3]) / double(w[0]);
  expect_scaled(got, exact_with_zeroed({e[0], e[1], e[2], e[3]}), exact_with_zeroed({e[1], e[2], e[3]}), s);
}

// Through an engine session (what generate, chat, the server and the library report): the copies
// read are counted in the request's stats.
TEST(OnMiss, ASessionCountsTheLowBitCopiesItRead) {
  testing::ScratchDir dir;
  RepackOptions ro;
  ro.output = dir / "tiny.qpack";
  repack_synthetic("tiny-256", ro);
  const std::string path = ro.output;
  add_miss_copies(path, {2, 2, {}});
  EngineOptions eo;
  eo.model = path;
  eo.load.cache_bytes = 2 * QpackContainer::open(path).layout.expert_stride;
  eo.on_miss = parse_miss_policy("low-bit");
  eo.threads = 1;
  Engine engine(eo);
  GenerateRequest r;
  r.prompt = {1, 2, 3, 4, 5};
  r.sampling.greedy = true;
  r.max_new_tokens = 4;
  const GenerateResult got = engine.new_session()->generate(r);
  EXPECT_GT(got.stats.experts.low_bit, 0u);
  EXPECT_LE(got.stats.experts.low_bit, got.stats.experts.misses);
  EXPECT_EQ(got.stats.on_miss.name(), "low-bit");
}

TEST(OnMiss, TheGpuRefusesALossyPolicy) {
  EngineOptions eo;
  eo.model = testing::tiny_qpack_with_tokenizer();
  eo.gpu = true;
  eo.on_miss = parse_miss_policy("skip:0.1");
  const std::string msg = testing::error_of([&] { Engine e(eo); });
  EXPECT_NE(msg.find("--on-miss skip:0.1 is CPU-only for now; drop --gpu or the flag"), std::string::npos) << msg;
}

}  // namespace
}  // namespace swiftlet
