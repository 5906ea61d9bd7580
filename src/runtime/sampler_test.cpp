// Sampler filters on hand-made logits whose surviving sets are known, empirical frequencies
// against the expected probabilities, reproducibility, and stop strings over split pieces.
#include "runtime/sampler.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"

namespace swiftlet {
namespace {

// Logits whose softmax at T=1 is `probs` (unnormalised is fine).
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(p > 0 ? static_cast<float>(std::log(p)) : -INFINITY);
  return l;
}

SamplingParams plain(uint64_t seed = 1234) {
  SamplingParams p;
  p.temperature = 1;
  p.top_k = 0;
  p.top_p = 1;
  p.min_p = 0;
  p.seed = seed;
  return p;
}

// Draws n tokens from fresh copies of `logits` and compares the counts with `expected`
// (normalised here; ids not in it must never appear). Pearson chi-square with a generous bound:
// 40 is far beyond the 1e-6 tail for the few degrees of freedom used here.
void expect_distribution(const SamplingParams& params, const std::vector<float>& logits,
                         std::map<int32_t, double> expected, int n = 20000) {
  Sampler s(params, static_cast<int>(logits.size()));
  double total = 0;
  for (auto& [id, p] : expected) total += p;
  std::map<int32_t, int> counts;
  std::vector<float> work(logits.size());
  for (int i = 0; i < n; ++i) {
    work = logits;
    const int32_t id = s.sample(work, {});
    ASSERT_TRUE(expected.count(id)) << "token " << id << " should have been filtered out";
    ++counts[id];
  }
  double chi2 = 0;
  for (auto& [id, p] : expected) {
    const double e = n * p / total;
    const double o = counts[id];
    chi2 += (o - e) * (o - e) / e;
    EXPECT_GT(o, 0) << "token " << id << " (p=" << p / total << ") never drawn";
  }
  EXPECT_LT(chi2, 40.0) << "empirical frequencies too far from the expected ones";
}

TEST(Sampler, GreedyIsArgmaxWithLowestIdOnTies) {
  SamplingParams p = plain();
  p.greedy = true;
  Sampler s(p, 6);
  std::vector<float> l = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f, NAN};
  EXPECT_EQ(s.sample(l, {}), 1);
  p.greedy = false;
  p.temperature = 0;
  Sampler t(p, 6);
  l = {0.5f, 3.0f, -1.0f, 3.0f, 2.9f, NAN};
  EXPECT_EQ(t.sample(l, {}), 1);
  l = {-INFINITY, -INFINITY, -5.0f, -INFINITY, -6.0f, NAN};
  EXPECT_EQ(t.sample(l, {}), 2);
}

// A real vocabulary's size (not a multiple of 8): the maximum in every lane of the 8-wide pass and
// in its tail, ties, and NaNs, against a plain first-maximum loop.
TEST(Sampler, GreedyOverALargeVocabularyMatchesAPlainArgmax) {
  const int V = 151936 + 5;
  SamplingParams p = plain();
  p.greedy = true;
  Sampler s(p, V);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (int at : {0, 3, 7, 8, 12345, 151935, 151936, V - 1}) {
    std::vector<float> l(static_cast<size_t>(V));
    for (float& x : l) x = nd(rng);
    for (int i = 1; i < V; i += 997) l[static_cast<size_t>(i)] = NAN;
    l[static_cast<size_t>(at)] = 50.0f;
    if (at + 9 < V) l[static_cast<size_t>(at + 9)] = 50.0f;  // a tie in another lane: the lower id wins
    if (at + 15 < V) l[static_cast<size_t>(at + 15)] = 50.0f;  // and in a lower lane further on
    int want = -1;
    float best = -INFINITY;
    for (int i = 0; i < V; ++i) {
      const float x = std::isnan(l[static_cast<size_t>(i)]) ? -INFINITY : l[static_cast<size_t>(i)];
      if (x > best) best = x, want = i;
    }
    ASSERT_EQ(want, at);
    EXPECT_EQ(s.sample(l, {}), want) << "maximum at " << at;
  }
}

TEST(Sampler, RepetitionPenaltyFollowsHf) {
  SamplingParams p = plain();
  p.greedy = true;
  p.repetition_penalty = 2;
  Sampler s(p, 4);
  std::vector<float> l = {2.0f, -2.0f, 1.0f, 0.5f};
  const std::vector<int32_t> history = {0, 1, 1, 1};  // once per distinct token, however often
  EXPECT_EQ(s.sample(l, history), 0);                 // 0 and 2 tie at 1.0: lowest id
  EXPECT_EQ(l, (std::vector<float>{1.0f, -4.0f, 1.0f, 0.5f}));
  // The counts are cleared between calls: the same call again penalises the same way.
  l = {2.0f, -2.0f, 1.0f, 0.5f};
  s.sample(l, history);
  EXPECT_EQ(l, (std::vector<float>{1.0f, -4.0f, 1.0f, 0.5f}));
}

TEST(Sampler, PresenceAndFrequencyPenaltiesFollowOpenAi) {
  SamplingParams p = plain();
  p.greedy = true;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler s(p, 4);
  std::vector<float> l = {1.0f, 1.0f, 1.0f, 0.1f};
  EXPECT_EQ(s.sample(l, std::vector<int32_t>{0, 0, 1}), 2);
  EXPECT_EQ(l, (std::vector<float>{0.0f, 0.25f, 1.0f, 0.1f}));
  // Repetition first, then presence/frequency.
  p.repetition_penalty = 2;
  Sampler r(p, 4);
  l = {4.0f, -1.0f, 0.0f, 0.0f};
  r.sample(l, std::vector<int32_t>{0, 1, 1});
  EXPECT_EQ(l, (std::vector<float>{4.0f / 2 - 0.75f, -2.0f - 1.0f, 0.0f, 0.0f}));
}

TEST(Sampler, PenalisedSamplingMatchesPenalisedDistribution) {
  SamplingParams p = plain();
  p.repetition_penalty = 2;
  Sampler s(p, 3);
  // log-probs ln(0.6), ln(0.3), ln(0.1): token 0 penalised -> ln(0.6)*2 (negative logit).
  const std::vector<float> base = logits_of({0.6, 0.3, 0.1});
  std::map<int32_t, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    std::vector<float> l = base;
    ++counts[s.sample(l, std::vector<int32_t>{0})];
  }
  const double w0 = std::exp(2 * std::log(0.6)), w1 = 0.3, w2 = 0.1, z = w0 + w1 + w2;
  EXPECT_NEAR(counts[0] / double(n), w0 / z, 0.02);
  EXPECT_NEAR(counts[1] / double(n), w1 / z, 0.02);
  EXPECT_NEAR(counts[2] / double(n), w2 / z, 0.02);
}

TEST(Sampler, PlainSamplingFollowsSoftmax) {
  expect_distribution(plain(), logits_of({0.5, 0.3, 0.15, 0.05}), {{0, 0.5}, {1, 0.3}, {2, 0.15}, {3, 0.05}});
}

TEST(Sampler, TemperatureSharpensAndFlattens) {
  const auto l = logits_of({1, 2, 4});  // 1:2:4 at T=1
  SamplingParams p = plain();
  p.temperature = 2;  // -> 1 : sqrt2 : 2
  expect_distribution(p, l, {{0, 1}, {1, std::sqrt(2.0)}, {2, 2}});
  p.temperature = 0.5f;  // -> 1 : 4 : 16
  expect_distribution(p, l, {{0, 1}, {1, 4}, {2, 16}});
}

TEST(Sampler, TopKKeepsExactlyKBest) {
  SamplingParams p = plain();
  p.top_k = 2;
  expect_distribution(p, logits_of({0.1, 0.4, 0.2, 0.3}), {{1, 0.4}, {3, 0.3}});
  // Ties at the boundary go to the lower id.
  p.top_k = 2;
  expect_distribution(p, logits_of({0.2, 0.5, 0.2, 0.2}), {{0, 0.2}, {1, 0.5}});
}

TEST(Sampler, TopPKeepsSmallestSetReachingP) {
  const auto l = logits_of({0.5, 0.3, 0.15, 0.05});
  SamplingParams p = plain();
  p.top_p = 0.7f;  // 0.5 < 0.7, 0.8 >= 0.7 -> {0, 1}
  expect_distribution(p, l, {{0, 0.5}, {1, 0.3}});
  p.top_p = 0.85f;  // mass before token 2 is 0.8 < 0.85 -> {0, 1, 2}
  expect_distribution(p, l, {{0, 0.5}, {1, 0.3}, {2, 0.15}});
  p.top_p = 0.4f;  // always at least the best token
  expect_distribution(p, l, {{0, 1}});
  // After top-k the distribution is renormalised: top_k=3 -> 0.5/0.95, 0.3/0.95, 0.15/0.95.
  p.top_k = 3;
  p.top_p = 0.8f;  // 0.526 < 0.8, 0.842 >= 0.8 -> {0, 1}
  expect_distribution(p, l, {{0, 0.5}, {1, 0.3}});
}

TEST(Sampler, MinPKeepsTokensNearTheBest) {
  const auto l = logits_of({0.5, 0.3, 0.15, 0.05});
  SamplingParams p = plain();
  p.min_p = 0.35f;  // threshold 0.175
  expect_distribution(p, l, {{0, 0.5}, {1, 0.3}});
  p.min_p = 0.25f;  // threshold 0.125
  expect_distribution(p, l, {{0, 0.5}, {1, 0.3}, {2, 0.15}});
  // min-p sees the tempered distribution: T=0.5 squares ratios, 0.3/0.5 -> 0.36 >= 0.35.
  p.min_p = 0.35f;
  p.temperature = 0.5f;
  expect_distribution(p, l, {{0, 0.25}, {1, 0.09}});
}

TEST(Sampler, FiltersCompose) {
  // top-k 3 -> {0,1,2}; top-p 0.9 of 0.5/0.95, 0.3/0.95, 0.15/0.95 -> all three;
  // min-p 0.5 -> threshold 0.25 (of the best 0.5) -> {0, 1}.
  SamplingParams p = plain();
  p.top_k = 3;
  p.top_p = 0.9f;
  p.min_p = 0.5f;
  expect_distribution(p, logits_of({0.5, 0.3, 0.15, 0.05}), {{0, 0.5}, {1, 0.3}});
}

// A nucleus wider than the first sorted head (256) exercises the widening search.
TEST(Sampler, TopPOverALargeVocabularyWithoutTopK) {
  const int vocab = 100000;
  std::vector<float> l(vocab, -30.0f);
  std::vector<int32_t> hot;
  for (int i = 0; i < 3000; ++i) hot.push_back(static_cast<int32_t>((int64_t{i} * 7919) % vocab));
  for (int32_t id : hot) l[id] = 0.0f;
  std::sort(hot.begin(), hot.end());
  SamplingParams p = plain();
  // 3000 equal tokens (and a tail of ~1e-8 mass): the nucleus is the 1500 with the lowest ids.
  p.top_p = 0.4999f;
  std::map<int32_t, double> expected;
  for (int i = 0; i < 1500; ++i) expected[hot[i]] = 1;
  Sampler s(p, vocab);
  std::vector<float> work;
  for (int i = 0; i < 300; ++i) {
    work = l;
    const int32_t id = s.sample(work, {});
    ASSERT_TRUE(expected.count(id)) << "token " << id << " is outside the nucleus";
  }
}

// Both top-k strategies (a heap for k <= 1024, nth_element above) keep exactly the k best,
// ties to the lower id. A huge temperature spreads the draws over the whole kept set.
TEST(Sampler, TopKKeepsTheSameSetForSmallAndLargeK) {
  const int vocab = 5000;
  std::vector<float> l(vocab);
  for (int i = 0; i < vocab; ++i) l[i] = static_cast<float>((i * 37) % 101);  // many ties
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  for (int k : {1, 7, 1024, 1025, 3000}) {
    SamplingParams p = plain(99);
    p.top_k = k;
    p.temperature = 1e4f;
    Sampler s(p, vocab);
    std::vector<char> kept(vocab, 0);
    for (int i = 0; i < k; ++i) kept[order[i]] = 1;
    int boundary_hits = 0;
    for (int i = 0; i < 1000; ++i) {
      std::vector<float> work = l;
      const int32_t id = s.sample(work, {});
      ASSERT_TRUE(kept[id]) << "k=" << k << ": token " << id << " (logit " << l[id] << ") is not among the k best";
      boundary_hits += l[id] == l[order[k - 1]];
    }
    if (k == 1) {
      EXPECT_EQ(order[0], 30);  // the lowest id with the top logit
    }
    EXPECT_GT(boundary_hits, 0) << "k=" << k;
  }
}

TEST(Sampler, SameSeedSameSequence) {
  SamplingParams p;  // the defaults: T 0.7, top-k 20, top-p 0.8
  p.seed = 42;
  std::vector<float> base(1000);
  for (int i = 0; i < 1000; ++i) base[i] = static_cast<float>(std::sin(i * 0.37) * 3);
  Sampler a(p, 1000), b(p, 1000);
  std::vector<int32_t> seq_a, seq_b;
  for (int i = 0; i < 500; ++i) {
    std::vector<float> la = base, lb = base;
    seq_a.push_back(a.sample(la, seq_a));
    seq_b.push_back(b.sample(lb, seq_b));
  }
  EXPECT_EQ(seq_a, seq_b);
  a.reset(42);
  std::vector<int32_t> again;
  for (int i = 0; i < 500; ++i) {
    std::vector<float> la = base;
    again.push_back(a.sample(la, again));
  }
  EXPECT_EQ(again, seq_a);
  p.seed = 43;
  Sampler c(p, 1000);
  std::vector<int32_t> seq_c;
  for (int i = 0; i < 500; ++i) {
    std::vector<float> lc = base;
    seq_c.push_back(c.sample(lc, seq_c));
  }
  EXPECT_NE(seq_c, seq_a);
  // seed 0 draws a random seed and reports it.
  p.seed = 0;
  Sampler r(p, 1000);
  EXPECT_NE(r.seed(), 0u);
}

// The draw is fixed by the documented algorithm (mt19937_64, 53-bit uniform), not by the
// standard library: on a flat distribution the token is floor(u * vocab).
// pick_among reads only the allowed logits where it can; it must give the token pick() gives
// over the same logits with every other token at -inf, from the same random stream, for every
// filter combination, allowed sets given as bits, as ids or both, smaller and larger than top-k,
// and logits with ties, NaN and -inf.
TEST(Sampler, PickAmongIsThePickOverMaskedLogits) {
  constexpr int kVocab = 3000;
  std::vector<SamplingParams> settings;
  SamplingParams greedy = plain();
  greedy.greedy = true;
  settings.push_back(greedy);
  settings.push_back(plain());
  SamplingParams top_k = plain();
  top_k.top_k = 20;
  settings.push_back(top_k);
  SamplingParams all = top_k;  // top-k, then top-p, then min-p, at a low temperature
  all.temperature = 0.7f;
  all.top_p = 0.8f;
  all.min_p = 0.05f;
  settings.push_back(all);
  SamplingParams nucleus = plain();  // top-p over the whole vocabulary
  nucleus.top_p = 0.9f;
  settings.push_back(nucleus);
  SamplingParams wide = top_k;  // more than the usual k: the heap's other branch
  wide.top_k = 1500;
  settings.push_back(wide);

  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-6, 6);
  int differing_from_unmasked = 0;
  for (const SamplingParams& params : settings) {
    Sampler among(params, kVocab), masked(params, kVocab), free(params, kVocab);
    for (int round = 0; round < 60; ++round) {
      std::vector<float> logits(kVocab);
      for (float& l : logits) l = std::round(u(rng) * 4) / 4;  // quarter steps: many ties
      logits[size_t(rng() % kVocab)] = NAN;
      logits[size_t(rng() % kVocab)] = -INFINITY;
      // Bits for a share of the tokens (1 in 2 to 1 in 400), ids for some others.
      const uint32_t one_in = std::array<uint32_t, 4>{2, 15, 90, 400}[size_t(round % 4)];
      std::vector<uint64_t> bits((kVocab + 63) / 64 + (round % 3 == 0 ? 2 : 0));
      std::vector<int32_t> ids;
      for (int32_t t = 0; t < kVocab; ++t) {
        if (rng() % one_in == 0) {
          bits[size_t(t) >> 6] |= uint64_t{1} << (t & 63);
        } else if (round % 2 && rng() % 500 == 0) {
          ids.push_back(t);
        }
      }
      std::shuffle(ids.begin(), ids.end(), rng);
      if (round % 5 == 4) bits.clear();  // ids alone
      std::vector<float> reference = logits;
      for (int32_t t = 0; t < kVocab; ++t) {
        const bool in = (size_t(t) >> 6 < bits.size() && (bits[size_t(t) >> 6] >> (t & 63)) & 1) ||
                        std::find(ids.begin(), ids.end(), t) != ids.end();
        if (!in) reference[size_t(t)] = -INFINITY;
      }
      if (std::none_of(reference.begin(), reference.end(), [](float l) { return std::isfinite(l); })) continue;
      std::vector<float> work = logits, unmasked = logits;
      const int32_t want = masked.pick(reference);
      const int32_t got = among.pick_among(work, TokenSet{bits, ids});
      ASSERT_EQ(got, want) << "setting " << (&params - settings.data()) << " round " << round;
      differing_from_unmasked += free.pick(unmasked) != want;
    }
  }
  EXPECT_GT(differing_from_unmasked, 100) << "the sets must bite for the comparison to mean anything";

  Sampler s(plain(), 8);
  std::vector<float> minus(8, -INFINITY);
  const std::vector<int32_t> none_finite = {1, 2};
  EXPECT_THROW(s.pick_among(minus, TokenSet{{}, none_finite}), Error);
}

TEST(Sampler, DrawIsThePortableUniform) {
  const int vocab = 1000;
  Sampler s(plain(987654321), vocab);
  std::mt19937_64 ref(987654321);
  for (int i = 0; i < 200; ++i) {
    std::vector<float> l(vocab, 0.0f);
    const double u = static_cast<double>(ref() >> 11) * 0x1.0p-53;
    EXPECT_EQ(s.sample(l, {}), static_cast<int32_t>(u * vocab)) << "draw " << i;
  }
}

TEST(Sampler, RejectsBadParams) {
  SamplingParams p;
  p.temperature = -1;
  EXPECT_THROW(Sampler(p, 10), Error);
  p = {};
  p.top_p = 0;
  EXPECT_THROW(Sampler(p, 10), Error);
  p = {};
  p.top_p = 1.5f;
  EXPECT_THROW(Sampler(p, 10), Error);
  p = {};
  p.min_p = 2;
  EXPECT_THROW(Sampler(p, 10), Error);
  p = {};
  p.repetition_penalty = 0;
  EXPECT_THROW(Sampler(p, 10), Error);
  p = {};
  p.top_k = -3;
  EXPECT_THROW(Sampler(p, 10), Error);
}

TEST(SamplingParams, ReadsGenerationConfig) {
  const auto cfg = nlohmann::json::parse(R"({
    "bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643],
    "temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": 0.05, "repetition_penalty": 1.1,
    "transformers_version": "4.57.0"})");
  const SamplingParams p = sampling_params_from_generation_config(cfg);
  EXPECT_FLOAT_EQ(p.temperature, 0.6f);
  EXPECT_EQ(p.top_k, 20);
  EXPECT_FLOAT_EQ(p.top_p, 0.95f);
  EXPECT_FLOAT_EQ(p.min_p, 0.05f);
  EXPECT_FLOAT_EQ(p.repetition_penalty, 1.1f);
  EXPECT_FALSE(p.greedy);

  SamplingParams d;
  d.temperature = 0.3f;
  const SamplingParams q = sampling_params_from_generation_config(nlohmann::json::parse(R"({"do_sample": false})"), d);
  EXPECT_TRUE(q.greedy);
  EXPECT_FLOAT_EQ(q.temperature, 0.3f);  // absent keys keep the defaults
  EXPECT_EQ(q.top_k, 20);

  EXPECT_THROW(sampling_params_from_generation_config(nlohmann::json::parse(R"({"top_k": 2.5})")), Error);
  EXPECT_THROW(sampling_params_from_generation_config(nlohmann::json::parse(R"({"temperature": "hot"})")), Error);
  EXPECT_THROW(sampling_params_from_generation_config(nlohmann::json::parse(R"({"do_sample": 1})")), Error);
  EXPECT_THROW(sampling_params_from_generation_config(nlohmann::json::parse(R"({"top_p": 0})")), Error);
  EXPECT_THROW(sampling_params_from_generation_config(nlohmann::json::parse("[]")), Error);
}

// ---- StopMatcher ---------------------------------------------------------------------------------

// Feeds the pieces; returns everything emitted (plus the flush when no stop was hit).
std::string stream(StopMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const auto& piece : pieces) out += m.feed(piece).text;
  if (!m.stopped()) out += m.flush();
  return out;
}

TEST(StopMatcher, PassesTextThroughWithoutStops) {
  StopMatcher m({});
  EXPECT_EQ(m.feed("hello ").text, "hello ");
  EXPECT_EQ(m.feed("world").text, "world");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, HoldsBackAStopSplitAcrossPieces) {
  StopMatcher m({"</s>"});
  auto r = m.feed("Hello <");
  EXPECT_EQ(r.text, "Hello ");
  EXPECT_EQ(m.held_back(), 1u);
  r = m.feed("/");
  EXPECT_EQ(r.text, "");
  EXPECT_FALSE(r.stopped);
  r = m.feed("s> and more");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(m.matched_stop(), "</s>");
  r = m.feed("ignored");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, ReleasesAFalseAlarm) {
  StopMatcher m({"</s>"});
  EXPECT_EQ(m.feed("a<").text, "a");
  EXPECT_EQ(m.feed("/b").text, "</b");
  EXPECT_EQ(m.feed("<").text, "");
  EXPECT_EQ(m.flush(), "<");
}

TEST(StopMatcher, StopInsideOnePiece) {
  StopMatcher m({"STOP"});
  const auto r = m.feed("abcSTOPdef");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "abc");
}

TEST(StopMatcher, EarliestStopWins) {
  StopMatcher m({"xyz", "bc"});
  const auto r = m.feed("abcxyz");
  EXPECT_EQ(r.text, "a");
  EXPECT_EQ(m.matched_stop(), "bc");
}

TEST(StopMatcher, SelfOverlappingStop) {
  StopMatcher m({"aab"});
  EXPECT_EQ(stream(m, {"a", "a", "a", "b", "tail"}), "a");
  EXPECT_TRUE(m.stopped());
  m.reset();
  EXPECT_EQ(stream(m, {"a", "a", "a", "c"}), "aaac");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, ByteSplitUtf8Stop) {
  StopMatcher m({"。\n"});
  const std::string text = "答案是四。\n多余";
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  EXPECT_EQ(stream(m, bytes), "答案是四");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcher, EveryPieceSplitGivesTheSameText) {
  const std::string text = "one <|im_end|> two";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    for (size_t cut2 = cut; cut2 <= text.size(); ++cut2) {
      StopMatcher m({"<|im_end|>", "<|endoftext|>"});
      EXPECT_EQ(stream(m, {text.substr(0, cut), text.substr(cut, cut2 - cut), text.substr(cut2)}), "one ")
          << cut << "," << cut2;
    }
  }
}

TEST(StopMatcher, RejectsEmptyStop) { EXPECT_THROW(StopMatcher({"ok", ""}), Error); }

}  // namespace
}  // namespace swiftlet
