// Constrained documents for tests/server/constrained.test.mjs, which checks them with ajv.
// Reads one JSON request per line on stdin,
//   {"schema": ..., "greedy": true|false, "seed": N, "max_tokens": N}   (or "bytes": N: walk_bytes)
// and answers one line per request on stdout, {"text", "tokens", "complete", "unenforced"} or
// {"error"} (unenforced: the schema keywords the grammar leaves out, keyword@pointer): the
// answer of a "model" whose logits are random (as a random-weight model's are), decoded under the
// schema's constraint by sample_constrained, exactly as a request's tokens are picked, on the
// real Qwen3 vocabulary. A model is not run: the sanitizer builds would take minutes per schema.
//
//   swiftlet_constrain_docs TOKENIZER_JSON < requests.jsonl
#include "runtime/json_schema.h"
#include "runtime/token_constraint.h"
#include "tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <random>
#include <string>

namespace {

using namespace swiftlet;
using ojson = nlohmann::ordered_json;

// The "model's" logits at each step: one of a pool of random vectors, drawn at random (drawing
// 150k numbers per step would cost more than the decoding under test).
const std::vector<std::vector<float>>& logit_pool(size_t n) {
  static const auto pool = [n] {
    std::mt19937_64 rng(1);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::vector<std::vector<float>> p(64, std::vector<float>(n));
    for (auto& v : p)
      for (float& x : v) x = nd(rng);
    return p;
  }();
  return pool;
}

// {"bytes": N} instead of "max_tokens": a walk byte by byte, each step a random byte the grammar
// allows that still leaves room to finish within N bytes, stopping at random where the document
// is complete. No vocabulary: microseconds a document, so a whole corpus can be checked.
ojson walk_bytes(const Grammar& g, uint64_t seed, int budget) {
  GrammarMatcher m(g);
  std::mt19937_64 rng(seed);
  int32_t state = m.start();
  std::string text;
  for (int left = budget; left > 0; --left) {
    if (m.accepting(state) && (rng() % 4 == 0 || !m.can_continue(state))) break;
    std::vector<std::pair<uint8_t, int32_t>> next;
    for (int b = 0; b < 256; ++b) {
      const int32_t s = m.step(state, uint8_t(b));
      if (s != GrammarMatcher::kDead && m.min_remaining(s) < uint32_t(left)) next.push_back({uint8_t(b), s});
    }
    if (next.empty()) break;
    const auto& [byte, s] = next[rng() % next.size()];
    text += char(byte);
    state = s;
  }
  return {{"text", text}, {"bytes", text.size()}, {"complete", m.accepting(state)}};
}

ojson decode(const ojson& req, const Tokenizer& tok, const std::shared_ptr<const VocabTrie>& trie) {
  std::vector<std::string> unenforced;
  auto grammar = std::make_shared<const Grammar>(json_schema_grammar(req.at("schema"), &unenforced));
  if (req.contains("bytes")) {
    ojson out = walk_bytes(*grammar, req.at("seed").get<uint64_t>(), req.at("bytes").get<int>());
    out["unenforced"] = unenforced;
    return out;
  }
  const std::vector<int32_t> stops = {tok.token_id("<|im_end|>")};
  TokenConstraint c(grammar, trie, stops);
  SamplingParams p;
  p.greedy = req.at("greedy").get<bool>();
  p.temperature = 1;
  p.top_k = 0;
  p.top_p = 1;
  p.seed = req.at("seed").get<uint64_t>();
  const int logits_size = tok.vocab_size() + 256;  // a model's embedding has padding rows
  Sampler sampler(p, logits_size);
  std::mt19937_64 rng(p.seed);
  const auto& pool = logit_pool(size_t(logits_size));
  std::vector<float> logits;
  std::vector<int32_t> out;
  const int max_tokens = req.at("max_tokens").get<int>();
  for (int i = 0; i < max_tokens; ++i) {
    logits = pool[rng() % pool.size()];
    const int32_t t = sample_constrained(sampler, c, logits, out, max_tokens - i);
    if (t == stops[0]) break;
    out.push_back(t);
  }
  return {{"text", tok.decode(out)}, {"tokens", out.size()}, {"complete", c.complete()}, {"unenforced", unenforced}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: swiftlet_constrain_docs TOKENIZER_JSON < requests.jsonl\n");
    return 2;
  }
  try {
    const Tokenizer tok = Tokenizer::from_file(argv[1]);
    const auto trie = std::make_shared<const VocabTrie>(tok);
    std::string line;
    while (std::getline(std::cin, line)) {
      ojson answer;
      try {
        answer = decode(ojson::parse(line), tok, trie);
      } catch (const std::exception& e) {
        answer = {{"error", e.what()}};
      }
      std::cout << answer.dump(-1, ' ', false, ojson::error_handler_t::replace) << std::endl;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "swiftlet_constrain_docs: %s\n", e.what());
    return 1;
  }
  return 0;
}
