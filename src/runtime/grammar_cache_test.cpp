// Grammars and token masks shared across requests (grammar_cache.h) and made ahead of need
// (mask_prefetcher.h): the tokens sampled are those of a constraint of its own, whether the
// masks come from another request, from a prefetch, or were evicted and made again; a second
// request of a schema reuses the first one's masks, two schemas share none; threads sharing a
// grammar get the masks one thread gets alone; the cache stays within its bounds.
#include "runtime/grammar_cache.h"

#include "runtime/batch.h"
#include "runtime/engine.h"
#include "runtime/json_schema.h"
#include "runtime/mask_prefetcher.h"
#include "runtime/token_constraint.h"
#include "support/test_paths.h"
#include "support/tiny_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

namespace swiftlet {
namespace {

using ojson = nlohmann::ordered_json;

const Tokenizer& tok() {
  static const Tokenizer t = Tokenizer::from_file(testing::qwen3_tokenizer_json());
  return t;
}
std::shared_ptr<const VocabTrie> trie() {
  static const auto t = std::make_shared<const VocabTrie>(tok());
  return t;
}
const std::vector<int32_t>& stops() {
  static const std::vector<int32_t> s = {tok().token_id("<|im_end|>")};
  return s;
}
constexpr size_t kLogits = 151936;

const char* kWeather = R"({"type":"object","properties":{"city":{"type":"string","maxLength":12},
    "unit":{"enum":["celsius","fahrenheit"]},"days":{"type":"integer","minimum":1,"maximum":14}},
    "required":["city","unit","days"]})";
const char* kPerson = R"({"type":"object","properties":{"name":{"type":"string","maxLength":10},
    "age":{"type":"integer"},"tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":2}},
    "required":["name","age","tags"]})";

// A fresh compile each time, as each request compiles its own.
std::shared_ptr<const Grammar> compile(const char* schema) {
  return std::make_shared<const Grammar>(json_schema_grammar(ojson::parse(schema)));
}

// A document decoded greedily from random logits (the seed picks their order): nearly every
// structural pick is refused, so most steps need a mask. `each_step` runs after every accepted token.
// Random logits, a pool made once (filling 151,936 floats a step is slow under the sanitizers).
const std::vector<std::vector<float>>& logit_pool() {
  static const auto pool = [] {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-8.0f, 8.0f);
    std::vector<std::vector<float>> p(7, std::vector<float>(kLogits));
    for (auto& v : p)
      for (float& x : v) x = u(rng);
    return p;
  }();
  return pool;
}

std::vector<int32_t> decode(TokenConstraint& c, uint32_t seed, int budget, const std::function<void()>& each_step = {}) {
  SamplingParams p;
  p.greedy = true;
  Sampler sampler(p, int(kLogits));
  std::vector<float> logits;
  std::vector<int32_t> out;
  for (int i = 0; i < budget; ++i) {
    logits = logit_pool()[(seed * 3 + uint32_t(i) * (seed % 5 + 1)) % logit_pool().size()];
    const int32_t t = sample_constrained(sampler, c, logits, {}, budget - i);
    out.push_back(t);
    if (t == stops()[0]) break;
    if (each_step) each_step();
  }
  return out;
}

std::vector<int32_t> decode_alone(const char* schema, uint32_t seed, int budget) {
  TokenConstraint c(compile(schema), trie(), stops());
  return decode(c, seed, budget);
}

TEST(GrammarCache, SecondRequestReusesTheFirstOnesMasks) {
  const std::vector<int32_t> want = decode_alone(kWeather, 11, 60);
  ASSERT_GT(want.size(), 10u);

  GrammarCache cache(trie());
  TokenConstraint first(cache.get(compile(kWeather)), stops());
  EXPECT_EQ(decode(first, 11, 60), want);
  const GrammarCacheStats s1 = cache.stats();
  EXPECT_EQ(s1.grammar_misses, 1u);
  EXPECT_GT(first.masks_computed(), 3u);
  EXPECT_EQ(s1.masks_shared, 0u);

  TokenConstraint second(cache.get(compile(kWeather)), stops());
  EXPECT_EQ(&second.shared(), &first.shared()) << "the same rules must give the same shared grammar";
  EXPECT_EQ(decode(second, 11, 60), want);
  const GrammarCacheStats s2 = cache.stats();
  EXPECT_EQ(s2.grammar_hits, 1u);
  EXPECT_EQ(s2.grammars, 1u);
  // The same path through the grammar: every mask was there already.
  EXPECT_EQ(second.masks_computed(), 0u);
  EXPECT_EQ(second.masks_reused(), first.masks_computed() + first.masks_reused());
  EXPECT_EQ(s2.masks_shared, second.masks_reused());
  EXPECT_EQ(s2.masks_computed, s1.masks_computed);

  // Another path (another seed) through the warm grammar: the same tokens as alone.
  TokenConstraint third(cache.get(compile(kWeather)), stops());
  EXPECT_EQ(decode(third, 12, 60), decode_alone(kWeather, 12, 60));
}

TEST(GrammarCache, DifferentSchemasDoNotShare) {
  GrammarCache cache(trie());
  auto a = cache.get(compile(kWeather));
  auto b = cache.get(compile(kPerson));
  EXPECT_NE(a.get(), b.get());
  EXPECT_NE(compile(kWeather)->key(), compile(kPerson)->key());
  EXPECT_EQ(compile(kWeather)->key(), compile(kWeather)->key());
  TokenConstraint ca(a, stops());
  decode(ca, 3, 50);
  TokenConstraint cb(b, stops());
  EXPECT_EQ(decode(cb, 3, 50), decode_alone(kPerson, 3, 50));
  EXPECT_GT(cb.masks_computed(), 0u);
  const GrammarCacheStats s = cache.stats();
  EXPECT_EQ(s.masks_shared, 0u);
  EXPECT_EQ(s.grammars, 2u);
  EXPECT_EQ(s.grammar_misses, 2u);
  EXPECT_EQ(s.grammar_hits, 0u);
}

TEST(GrammarCache, PrefetchedMasksGiveTheSameTokens) {
  const std::vector<int32_t> want = decode_alone(kPerson, 5, 60);
  GrammarCache cache(trie());
  MaskPrefetcher pre;
  TokenConstraint c(cache.get(compile(kPerson)), stops());
  pre.submit(c.next_mask());  // the first state's mask, as during a prompt
  pre.drain();
  // Each step's next mask made on the worker while the "model" would run, drained only now and
  // then: the constraint keeps sampling while the worker walks.
  int step = 0;
  EXPECT_EQ(decode(c, 5, 60, [&] {
              pre.submit(c.next_mask());
              if (++step % 3 == 0) pre.drain();
            }),
            want);
  pre.drain();
  const GrammarCacheStats s = cache.stats();
  EXPECT_GT(s.masks_prefetched, 0u);
  EXPECT_GT(c.masks_reused(), 0u);
  EXPECT_GT(pre.jobs_done(), 0u);
  // Every prefetched mask was made on the worker, every other one by apply().
  EXPECT_EQ(s.masks_computed, s.masks_prefetched + c.masks_computed());
}

TEST(GrammarCache, ThreadsSharingAGrammarGetTheMasksOfOneThread) {
  const std::vector<std::string> prefixes = {"", "{", R"({"city": ")", R"({"city": "Par)", R"({"city": "Oslo", )",
                                             R"({"city": "Oslo", "unit": ")", R"({"city": "", "unit": "celsius", "days": )",
                                             R"({"city": "", "unit": "celsius", "days": 1)"};
  std::vector<std::vector<int32_t>> tokens;  // encoded here: threads only decode
  for (const std::string& p : prefixes) tokens.push_back(tok().encode(p));
  auto allowed = [&](TokenConstraint& c, size_t i) {
    for (int32_t t : tokens[i]) c.accept(t);
    EXPECT_FALSE(c.failed()) << prefixes[i];
    std::vector<float> logits(kLogits, 0.0f);
    c.apply(logits, 1000);
    std::vector<bool> ok(kLogits);
    for (size_t i = 0; i < kLogits; ++i) ok[i] = std::isfinite(logits[i]);
    return ok;
  };
  std::vector<std::vector<bool>> want;
  for (size_t i = 0; i < prefixes.size(); ++i) {
    TokenConstraint c(compile(kWeather), trie(), stops());
    want.push_back(allowed(c, i));
  }
  GrammarCache cache(trie());
  auto shared = cache.get(compile(kWeather));
  constexpr int kThreads = 4;
  std::vector<std::vector<std::vector<bool>>> got(kThreads, std::vector<std::vector<bool>>(prefixes.size()));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (size_t k = 0; k < prefixes.size(); ++k) {  // each thread in another order
        const size_t i = (k + size_t(t) * 3) % prefixes.size();
        TokenConstraint c(shared, stops());
        got[size_t(t)][i] = allowed(c, i);
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t)
    for (size_t i = 0; i < prefixes.size(); ++i) EXPECT_TRUE(got[size_t(t)][i] == want[i]) << "thread " << t << " prefix " << prefixes[i];
  const GrammarCacheStats s = cache.stats();
  EXPECT_LE(s.masks_computed, prefixes.size()) << "each state's mask made once";
  EXPECT_EQ(s.masks_computed + s.mask_hits, size_t(kThreads) * prefixes.size());
}

// A cached mask answers for any budget (TokenMask::within) what a walk with that budget finds:
// states after structural text, inside strings, numbers and enums, every budget from 0 up.
TEST(GrammarCache, MasksWithinABudgetAreThoseOfTheWalk) {
  const size_t vocab = size_t(trie()->vocab_size());
  auto members = [&](const TokenSet& set) {
    std::vector<bool> in(vocab);
    for (size_t t = 0; t < vocab; ++t) in[t] = t / 64 < set.bits.size() && (set.bits[t / 64] >> (t % 64)) & 1;
    for (int32_t t : set.ids) {
      EXPECT_FALSE(in[size_t(t)]) << "token " << t << " listed twice";
      in[size_t(t)] = true;
    }
    return in;
  };
  int listed = 0, cleared = 0;  // budgets answered from `below`, and by clearing `above`
  for (const auto& [schema, prefixes] : std::vector<std::pair<const char*, std::vector<std::string>>>{
           {kWeather, {"", "{", R"({"city": ")", R"({"city": "Par)", R"({"city": "Oslo\)",
                       R"({"city": "Oslo", "unit": "c)", R"({"city": "", "unit": "celsius", "days": 1)"}},
           {kPerson, {R"({"name": "Al)", R"({"name": "", "age": -)", R"({"name": "", "age": 3, "tags": [)"}}}) {
    GrammarCache cache(trie());
    const auto g = cache.get(compile(schema));
    for (const std::string& prefix : prefixes) {
      const int32_t state = g->step(g->start(), prefix);
      ASSERT_GE(state, 0) << prefix;
      const auto mask = g->mask(state, 0);
      std::vector<uint64_t> bits;
      std::vector<int32_t> ids;
      for (uint32_t budget = 0; budget <= mask->max_after + 2; ++budget) {
        const TokenMask walked = g->walk(state, budget);
        const TokenSet set = mask->within(budget, bits, ids);
        ASSERT_TRUE(members(set) == members(TokenSet{walked.bits, {}})) << prefix << " budget " << budget;
        EXPECT_EQ(!set.bits.empty() || !set.ids.empty(), walked.any);
        listed += budget < mask->common_after && !set.ids.empty();
        cleared += budget >= mask->common_after && budget < mask->max_after;
      }
    }
  }
  EXPECT_GT(listed, 0);
  EXPECT_GT(cleared, 0);
}

TEST(GrammarCache, StaysWithinItsBounds) {
  GrammarCacheOptions o;
  o.max_grammars = 2;
  TokenMask empty;
  empty.bits.resize((trie()->vocab_size() + 63) / 64);
  const size_t one = empty.bytes();
  o.max_mask_bytes = 3 * one;
  GrammarCache cache(trie(), o);
  for (const char* schema : {kWeather, kPerson}) {
    TokenConstraint c(cache.get(compile(schema)), stops());
    EXPECT_EQ(decode(c, 9, 60), decode_alone(schema, 9, 60)) << "an evicted mask is made again, the same";
    const GrammarCacheStats s = cache.stats();
    EXPECT_LE(s.mask_bytes, o.max_mask_bytes);
    EXPECT_LE(s.masks, 3u);
  }
  EXPECT_GT(cache.stats().masks_evicted, 0u);
  cache.get(compile(R"({"type":"boolean"})"));
  EXPECT_EQ(cache.stats().grammars, 2u);
  EXPECT_EQ(cache.stats().grammar_misses, 3u);
  // The least recently used grammar (kWeather) went out; kPerson is still there.
  cache.get(compile(kPerson));
  EXPECT_EQ(cache.stats().grammar_hits, 1u);
  cache.get(compile(kWeather));
  EXPECT_EQ(cache.stats().grammar_misses, 4u);
}

// The constrained pick is the sampler's pick from the logits with every forbidden token at -inf
// (penalties first), for greedy and sampled settings, up to the end of a tight budget.
TEST(TokenConstraint, PicksAreTheDrawFromMaskedLogits) {
  std::vector<SamplingParams> settings(4);
  settings[0].greedy = true;
  settings[1].temperature = 0.7f;  // top-k 20, top-p 0.8: the defaults
  settings[2].top_k = 0;            // top-p over the whole vocabulary
  settings[2].top_p = 0.9f;
  settings[3].top_k = 40;           // with penalties on the answer so far
  settings[3].repetition_penalty = 1.3f;
  settings[3].presence_penalty = 0.5f;
  for (SamplingParams& p : settings) p.seed = 21;
  int masked_picks = 0;
  for (const SamplingParams& p : settings) {
    for (int budget : {40, 64}) {  // 40: just over the shortest document, 37 bytes
      Sampler a(p, int(kLogits)), b(p, int(kLogits));
      TokenConstraint ca(compile(kWeather), trie(), stops()), cb(compile(kWeather), trie(), stops());
      std::vector<int32_t> history;
      std::vector<float> logits, reference;
      for (int i = 0; i < budget; ++i) {
        logits = reference = logit_pool()[size_t(i * 5 + budget) % logit_pool().size()];
        const int32_t got = sample_constrained(a, ca, logits, history, budget - i);
        b.penalize(reference, history);
        const auto best = int32_t(std::max_element(reference.begin(), reference.end()) - reference.begin());
        masked_picks += !cb.allows(best, budget - i);
        cb.apply(reference, budget - i);
        const int32_t want = b.pick(reference);
        ASSERT_EQ(got, want) << "setting " << (&p - settings.data()) << " budget " << budget << " step " << i;
        if (got == stops()[0]) break;
        cb.accept(want);
        history.push_back(got);
      }
      EXPECT_TRUE(ca.complete()) << "setting " << (&p - settings.data()) << " budget " << budget;
    }
  }
  EXPECT_GT(masked_picks, 20) << "the grammar must refuse the unconstrained picks often";
}

// Through the generation loop: a session with masks prefetched on a worker (forced on, on the
// CPU) and one sharing the engine's cache give the tokens of a session without either; so does
// a batch with prefetching.
TEST(MaskPrefetch, SessionsAndBatchesSampleTheSameTokens) {
  EngineOptions eo;
  eo.model = testing::tiny_qpack_with_tokenizer();
  eo.threads = 2;
  Engine engine(eo);
  const std::vector<int32_t> prompt = engine.require_tokenizer().encode("Numbers please:", false);
  const char* schema = R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string","maxLength":5}},
      "required":["a","b"]})";
  auto request = [&](std::shared_ptr<TokenConstraint> c, uint64_t seed) {
    GenerateRequest r;
    r.prompt = prompt;
    r.sampling.temperature = 1.0f;
    r.sampling.top_k = 40;
    r.sampling.top_p = 1.0f;
    r.sampling.seed = seed;
    r.max_new_tokens = 30;
    r.stop_tokens = engine.stop_tokens();
    r.constraint = std::move(c);
    return r;
  };
  auto alone = [&] {
    return std::make_shared<TokenConstraint>(compile(schema), engine.vocab_trie(), engine.stop_tokens());
  };
  auto cached = [&] { return std::make_shared<TokenConstraint>(engine.grammar_cache()->get(compile(schema)), engine.stop_tokens()); };
  std::vector<std::vector<int32_t>> want;
  for (uint64_t seed : {1, 2}) {
    SessionOptions so;
    so.prefetch_masks = false;
    auto s = engine.new_session(so);
    EXPECT_EQ(s->mask_prefetcher(), nullptr);
    want.push_back(s->generate(request(alone(), seed)).tokens);
  }
  {
    SessionOptions so;
    so.prefetch_masks = true;
    auto s = engine.new_session(so);
    ASSERT_NE(s->mask_prefetcher(), nullptr);
    EXPECT_EQ(s->generate(request(cached(), 1)).tokens, want[0]);
    EXPECT_EQ(s->generate(request(cached(), 2)).tokens, want[1]);
    s->mask_prefetcher()->drain();
    EXPECT_GT(s->mask_prefetcher()->jobs_done(), 0u);
  }
  const std::optional<GrammarCacheStats> st = engine.grammar_cache_stats();
  ASSERT_TRUE(st.has_value());
  EXPECT_GT(st->masks_prefetched, 0u);
  EXPECT_EQ(st->grammars, 1u);

  BatchOptions bo;
  bo.prefetch_masks = true;
  swiftlet::Batch batch(engine.model(), bo);
  ASSERT_NE(batch.mask_prefetcher(), nullptr);
  auto s1 = engine.new_session(), s2 = engine.new_session();
  EXPECT_EQ(s1->mask_prefetcher(), nullptr) << "never on the CPU unless asked";
  std::map<Batch::Id, size_t> which;
  which[batch.add(*s1, request(cached(), 1))] = 0;
  which[batch.add(*s2, request(cached(), 2))] = 1;
  size_t finished = 0;
  while (!batch.empty())
    for (Batch::Finished& f : batch.step()) {
      ASSERT_FALSE(f.error);
      EXPECT_EQ(f.result.tokens, want[which[f.id]]);
      ++finished;
    }
  EXPECT_EQ(finished, 2u);
  EXPECT_GT(engine.grammar_cache_stats()->masks_shared, 0u) << "the batch's requests found the sessions' masks";
}

}  // namespace
}  // namespace swiftlet
