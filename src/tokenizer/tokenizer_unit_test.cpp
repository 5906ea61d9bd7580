// Tokenizer tests on tiny hand-made tokenizer.json files: BPE rank order, json formats and
// load errors. They need no downloaded data.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace swiftlet {
namespace {

using nlohmann::json;

// A byte-level BPE whose vocabulary is the 256 byte symbols (id = byte) plus the merges'
// results, numbered from 256 in merge order.
json tiny_tokenizer(const std::vector<std::pair<std::string, std::string>>& merges) {
  json vocab = json::object();
  const auto& alphabet = utf8::byte_to_unicode();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    utf8::append(s, alphabet[b]);
    vocab[s] = b;
  }
  json merge_list = json::array();
  int next_id = 256;
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = next_id++;
    merge_list.push_back(json::array({a, b}));
  }
  return json{
      {"version", "1.0"},
      {"added_tokens", json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}},
  };
}

TEST(TokenizerUnit, MergesApplyInRankOrder) {
  const Tokenizer bc_first = Tokenizer::from_json_string(tiny_tokenizer({{"b", "c"}, {"a", "b"}, {"ab", "c"}}).dump());
  EXPECT_EQ(bc_first.encode("abc"), (std::vector<int32_t>{'a', bc_first.token_id("bc")}));
  const Tokenizer ab_first = Tokenizer::from_json_string(tiny_tokenizer({{"a", "b"}, {"b", "c"}, {"ab", "c"}}).dump());
  EXPECT_EQ(ab_first.encode("abc"), (std::vector<int32_t>{ab_first.token_id("abc")}));
}

// Merges are written either as "a b" (older files) or as ["a", "b"]; both read the same.
TEST(TokenizerUnit, MergesAsStringsOrPairsReadTheSame) {
  json pairs = tiny_tokenizer({{"Ġ", "a"}, {"b", "c"}, {"Ġa", "bc"}});
  json strings = pairs;
  for (json& m : strings["model"]["merges"]) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  const Tokenizer a = Tokenizer::from_json_string(pairs.dump()), b = Tokenizer::from_json_string(strings.dump());
  for (const std::string text : {"abc abc", " abcbc a", "bc"}) EXPECT_EQ(a.encode(text), b.encode(text)) << text;
  EXPECT_EQ(b.encode(" abc"), (std::vector<int32_t>{b.token_id("Ġabc")}));
}

TEST(TokenizerUnit, EqualRanksMergeLeftmostFirst) {
  const Tokenizer tok = Tokenizer::from_json_string(tiny_tokenizer({{"a", "a"}}).dump());
  const int32_t aa = tok.token_id("aa");
  EXPECT_EQ(tok.encode("aaa"), (std::vector<int32_t>{aa, 'a'}));
  EXPECT_EQ(tok.encode("aaaaa"), (std::vector<int32_t>{aa, aa, 'a'}));
}

TEST(TokenizerUnit, ByteLevelRegexSplitsWordsAndSpaces) {
  const Tokenizer tok = Tokenizer::from_json_string(tiny_tokenizer({{"Ġ", "a"}}).dump());
  // GPT-2 pattern: " a" is one pre-token and merges; the space before "  b" stays separate.
  EXPECT_EQ(tok.encode("a a"), (std::vector<int32_t>{'a', tok.token_id("Ġa")}));
  EXPECT_EQ(tok.decode(tok.encode("a a  b\n")), "a a  b\n");
  EXPECT_EQ(tok.vocab_size(), 257);
}

TEST(TokenizerUnit, IgnoreMergesTakesWholeWordsFromTheVocab) {
  json j = tiny_tokenizer({{"a", "b"}});
  j["model"]["vocab"]["abc"] = 300;  // reachable by no merge
  j["model"]["ignore_merges"] = true;
  const Tokenizer tok = Tokenizer::from_json_string(j.dump());
  EXPECT_EQ(tok.encode("abc"), std::vector<int32_t>{300});
  EXPECT_EQ(tok.encode("abd"), (std::vector<int32_t>{tok.token_id("ab"), 'd'}));
}

TEST(TokenizerUnit, NfcNormalizerComposes) {
  json j = tiny_tokenizer({});
  j["normalizer"] = {{"type", "NFC"}};
  const Tokenizer tok = Tokenizer::from_json_string(j.dump());
  EXPECT_EQ(tok.decode(tok.encode("e\xCC\x81")), "\xC3\xA9");  // e + U+0301 -> U+00E9
}

TEST(TokenizerUnit, AddedTokensMatchLeftmostLongest) {
  json j = tiny_tokenizer({});
  j["added_tokens"] = json::array({
      {{"id", 400}, {"content", "<a>"}, {"special", true}, {"normalized", false}},
      {{"id", 401}, {"content", "<a>b"}, {"special", false}, {"normalized", false}},
  });
  const Tokenizer tok = Tokenizer::from_json_string(j.dump());
  EXPECT_EQ(tok.encode("<a>b<a>"), (std::vector<int32_t>{401, 400}));
  EXPECT_EQ(tok.encode("x<a>"), (std::vector<int32_t>{'x', 400}));
  EXPECT_EQ(tok.encode("<a>", /*parse_special=*/false), (std::vector<int32_t>{'<', 'a', '>'}));
  EXPECT_EQ(tok.vocab_size(), 402);
  EXPECT_EQ(tok.token_text(300), "");  // a hole in the id space
  EXPECT_EQ(tok.decode(std::vector<int32_t>{'a', 300, 5000, -3, 'b'}), "ab");  // unknown ids skipped
}

void expect_load_error(const std::string& text, const std::string& needle) {
  try {
    Tokenizer::from_json_string(text);
    ADD_FAILURE() << "no error for: " << text.substr(0, 80);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TokenizerUnit, LoadErrorsSayWhatIsWrong) {
  expect_load_error("{not json", "not valid JSON");
  expect_load_error("{}", "no \"model\"");
  json j = tiny_tokenizer({});
  j["normalizer"] = {{"type", "Lowercase"}};
  expect_load_error(j.dump(), "normalizer");
  j = tiny_tokenizer({});
  j["model"]["merges"].push_back(json::array({"zz", "q"}));
  expect_load_error(j.dump(), "\"zz\"");
  j = tiny_tokenizer({});
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  expect_load_error(j.dump(), "does not compile");
  j = tiny_tokenizer({});
  j["model"]["byte_fallback"] = true;
  expect_load_error(j.dump(), "byte_fallback");
  // Found by fuzz/tokenizer_load_fuzz.cpp: an id of 4.4e70 was converted to an integer (undefined
  // behaviour); ids far beyond the file's token count would size tables of gigabytes.
  j = tiny_tokenizer({});
  j["model"]["vocab"]["!"] = 4.4e70;
  expect_load_error(j.dump(), "not an integer");
  j = tiny_tokenizer({});
  j["model"]["vocab"]["!"] = 1000000000;
  expect_load_error(j.dump(), "token '!' has id 1000000000, outside [0, ");
  j = tiny_tokenizer({});
  j["model"]["vocab"]["!"] = uint64_t(1) << 63;  // beyond int64
  expect_load_error(j.dump(), "token '!' has id 9223372036854775808, outside [0, ");
  j = tiny_tokenizer({});
  j["model"]["vocab"] = json::array();
  expect_load_error(j.dump(), "model.vocab must be an object");
  j = tiny_tokenizer({});
  j["model"].erase("merges");
  expect_load_error(j.dump(), "model has no \"merges\"");
  j = tiny_tokenizer({});
  j["model"]["merges"].push_back(7);
  expect_load_error(j.dump(), "expected \"a b\" or [\"a\", \"b\"]");
  j = tiny_tokenizer({});
  j["model"]["merges"].push_back("a b c");
  expect_load_error(j.dump(), "is not two tokens separated by one space");
  j = tiny_tokenizer({});
  j["model"] = "BPE";
  expect_load_error(j.dump(), "\"model\" must be an object");
  expect_load_error(R"({"model": {"vocab": {}, "merges": []}, "pre_tokenizer": {"type": "ByteLevel"}, "x": [1,)",
                    "not valid JSON");
  j = tiny_tokenizer({});
  j["added_tokens"] = json::array({{{"id", -3}, {"content", "<x>"}}});
  expect_load_error(j.dump(), "token '<x>' has id -3");
  try {
    Tokenizer::from_file("/nonexistent/model/dir");
    ADD_FAILURE() << "no error for a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace swiftlet
