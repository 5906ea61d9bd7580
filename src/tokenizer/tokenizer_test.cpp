// Golden tests against Hugging Face tokenizers on the real Qwen3 tokenizer.json
// (tests/data/tokenizer/qwen3_goldens.json, made by tools/oracles/make_tokenizer_goldens.js).
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/zstd_frame.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/tokenizer_test_data.h"
#include "tokenizer/utf8.h"

namespace swiftlet {
namespace {

using nlohmann::json;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<int32_t> ids_of(const json& j) { return j.get<std::vector<int32_t>>(); }

// Where two id sequences first differ, with a little context: a whole 15k-id vector in a
// failure message is useless.
std::string describe_mismatch(const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  std::ostringstream s;
  s << "sizes " << got.size() << " vs " << want.size() << ", first difference at " << i << ": got [";
  for (size_t k = i; k < std::min(got.size(), i + 8); ++k) s << got[k] << ' ';
  s << "] want [";
  for (size_t k = i; k < std::min(want.size(), i + 8); ++k) s << want[k] << ' ';
  s << "]";
  return s.str();
}

std::string escaped(std::string_view text) {
  const std::string shown(text.substr(0, 120));
  return json(utf8::to_valid(shown)).dump();
}

class TokenizerGolden : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(testing::oracle_data_present());
    if (!tokenizer_) tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_file(testing::qwen3_tokenizer_path()));
    if (!goldens_) {
      const std::string text = read_file(testing::qwen3_goldens_path());
      ASSERT_FALSE(text.empty()) << "missing " << testing::qwen3_goldens_path()
                                 << ": regenerate it with node tools/oracles/make_tokenizer_goldens.js";
      goldens_ = std::make_unique<json>(json::parse(text));
    }
    tok = tokenizer_.get();
    goldens = goldens_.get();
  }

  const Tokenizer* tok = nullptr;
  const json* goldens = nullptr;

 private:
  static inline std::unique_ptr<Tokenizer> tokenizer_;
  static inline std::unique_ptr<json> goldens_;
};

TEST_F(TokenizerGolden, CorpusIsLargeAndCoversTheBrief) {
  EXPECT_GE((*goldens)["encode"].size(), 400u);
  std::set<std::string> names;
  for (const json& c : (*goldens)["encode"]) names.insert(c["name"].get<std::string>());
  for (const char* required : {"empty", "french_nfd", "emoji_zwj_family", "emoji_flags", "crlf",
                               "contractions_upper", "chatml_prompt", "long_mixed_50k", "special_im"}) {
    EXPECT_TRUE(names.count(required)) << required;
  }
  EXPECT_EQ(tok->vocab_size(), (*goldens)["vocab_size"].get<int32_t>());
}

TEST_F(TokenizerGolden, EncodeMatchesHuggingFace) {
  int failures = 0;
  for (const json& c : (*goldens)["encode"]) {
    const std::string text = c["text"];
    const std::vector<int32_t> want = ids_of(c["ids"]);
    const std::vector<int32_t> got = tok->encode(text);
    if (got != want && ++failures <= 20) {
      ADD_FAILURE() << c["name"].get<std::string>() << " " << escaped(text) << "\n" << describe_mismatch(got, want);
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST_F(TokenizerGolden, EncodeWithoutSpecialParsingMatchesHuggingFace) {
  int failures = 0;
  for (const json& c : (*goldens)["encode"]) {
    const std::string text = c["text"];
    const std::vector<int32_t> want = ids_of(c.contains("ids_plain") ? c["ids_plain"] : c["ids"]);
    const std::vector<int32_t> got = tok->encode(text, /*parse_special=*/false);
    if (got != want && ++failures <= 20) {
      ADD_FAILURE() << c["name"].get<std::string>() << " " << escaped(text) << "\n" << describe_mismatch(got, want);
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST_F(TokenizerGolden, DecodeMatchesHuggingFace) {
  for (const json& c : (*goldens)["encode"]) {
    const std::vector<int32_t> ids = ids_of(c["ids"]);
    const std::string decoded = c.value("decoded", c["text"].get<std::string>());
    const std::string skipped = c.value("decoded_skip_special", decoded);
    EXPECT_EQ(tok->decode(ids), decoded) << c["name"];
    EXPECT_EQ(tok->decode(ids, /*skip_special=*/true), skipped) << c["name"];
  }
  for (const json& c : (*goldens)["decode"]) {
    const std::vector<int32_t> ids = ids_of(c["ids"]);
    EXPECT_EQ(tok->decode(ids), c["text"].get<std::string>()) << c["name"];
    if (c.contains("text_skip_special")) {
      EXPECT_EQ(tok->decode(ids, true), c["text_skip_special"].get<std::string>()) << c["name"];
    }
  }
}

TEST_F(TokenizerGolden, DecodeOfEncodeIsIdentityForNfcText) {
  int checked = 0;
  for (const json& c : (*goldens)["encode"]) {
    if (!c["nfc_stable"].get<bool>()) continue;
    const std::string text = c["text"];
    EXPECT_EQ(tok->decode(tok->encode(text)), text) << c["name"];
    EXPECT_EQ(tok->decode(tok->encode(text, false)), text) << c["name"];
    ++checked;
  }
  EXPECT_GT(checked, 350);
}

// Streaming must never emit a partial character and must add up to decode().
void expect_stream_equals_decode(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special,
                                 const std::string& name) {
  StreamDecoder stream(tok, skip_special);
  std::string joined;
  for (int32_t id : ids) {
    const std::string piece = stream.push(id);
    ASSERT_TRUE(utf8::is_valid(piece)) << name;
    joined += piece;
  }
  const std::string rest = stream.flush();
  ASSERT_TRUE(utf8::is_valid(rest)) << name;
  joined += rest;
  EXPECT_EQ(joined, tok.decode(ids, skip_special)) << name;
  EXPECT_EQ(stream.pending_bytes(), 0u);
}

TEST_F(TokenizerGolden, StreamDecoderMatchesDecode) {
  for (const json& c : (*goldens)["encode"]) {
    const std::vector<int32_t> ids = ids_of(c["ids"]);
    expect_stream_equals_decode(*tok, ids, false, c["name"]);
    expect_stream_equals_decode(*tok, ids, true, c["name"]);
  }
  for (const json& c : (*goldens)["decode"]) {
    expect_stream_equals_decode(*tok, ids_of(c["ids"]), false, c["name"]);
    expect_stream_equals_decode(*tok, ids_of(c["ids"]), true, c["name"]);
  }
}

// The same base json with extra added tokens using lstrip / rstrip / single_word / normalized.
TEST_F(TokenizerGolden, AddedTokenFlagsMatchHuggingFace) {
  json base = json::parse(read_file(testing::qwen3_tokenizer_path()));
  for (const json& t : (*goldens)["flags"]["added_tokens"]) base["added_tokens"].push_back(t);
  const Tokenizer flagged = Tokenizer::from_json_string(base.dump());
  for (const json& c : (*goldens)["flags"]["cases"]) {
    const std::string text = c["text"];
    const std::vector<int32_t> want = ids_of(c["ids"]);
    const std::vector<int32_t> got = flagged.encode(text);
    EXPECT_EQ(got, want) << escaped(text) << "\n" << describe_mismatch(got, want);
  }
}

// Qwen3.5's pre-tokenizer pattern (marks join letters) on the Qwen3 vocabulary: the split
// must agree with HF's Oniguruma for the new pattern too. The goldens list only the cases
// whose ids change; the rest keep the Qwen3 ids.
TEST_F(TokenizerGolden, Qwen35PatternMatchesHuggingFace) {
  const json& variant = (*goldens)["qwen35_pattern"];
  json base = json::parse(read_file(testing::qwen3_tokenizer_path()));
  json& split = base["pre_tokenizer"]["pretokenizers"][0];
  ASSERT_EQ(split["type"], "Split");
  split["pattern"]["Regex"] = variant["pattern"];
  const Tokenizer tok35 = Tokenizer::from_json_string(base.dump());
  std::map<std::string, std::vector<int32_t>> differing;
  for (const json& d : variant["differing"]) differing[d["name"]] = ids_of(d["ids"]);
  EXPECT_GE(differing.size(), 5u);
  int failures = 0;
  for (const json& c : (*goldens)["encode"]) {
    const std::string name = c["name"];
    const std::vector<int32_t> want = differing.count(name) ? differing[name] : ids_of(c["ids"]);
    const std::vector<int32_t> got = tok35.encode(c["text"].get<std::string>());
    if (got != want && ++failures <= 20) ADD_FAILURE() << name << "\n" << describe_mismatch(got, want);
  }
  EXPECT_EQ(failures, 0);
}

// Older tokenizer.json files write merges as "a b" strings, newer ones as ["a", "b"].
TEST_F(TokenizerGolden, BothMergeFormatsGiveTheSameIds) {
  json base = json::parse(read_file(testing::qwen3_tokenizer_path()));
  json& merges = base["model"]["merges"];
  ASSERT_TRUE(merges[0].is_array());
  for (json& m : merges) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  const Tokenizer strings = Tokenizer::from_json_string(base.dump());
  for (const json& c : (*goldens)["encode"]) {
    EXPECT_EQ(strings.encode(c["text"].get<std::string>()), ids_of(c["ids"])) << c["name"];
  }
}

// ---- behaviour on the real Qwen3 tokenizer beyond the goldens -----------------------------

TEST_F(TokenizerGolden, SpecialTokenIdsMatchModelSpec) {
  // model-math.md 9
  EXPECT_EQ(tok->token_id("<|endoftext|>"), 151643);
  EXPECT_EQ(tok->token_id("<|im_start|>"), 151644);
  EXPECT_EQ(tok->token_id("<|im_end|>"), 151645);
  EXPECT_EQ(tok->token_id("<tool_call>"), 151657);
  EXPECT_EQ(tok->token_id("<think>"), 151667);
  EXPECT_EQ(tok->token_id("</think>"), 151668);
  EXPECT_EQ(tok->vocab_size(), 151669);
  EXPECT_TRUE(tok->is_special(151644));
  EXPECT_FALSE(tok->is_special(151667));  // <think> is added but not special
  EXPECT_TRUE(tok->is_added(151667));
  EXPECT_FALSE(tok->is_added(198));
  EXPECT_EQ(tok->token_text(151645), "<|im_end|>");
  EXPECT_EQ(tok->token_id("Ġworld"), 1879);
  EXPECT_EQ(tok->token_text(1879), "Ġworld");
  EXPECT_EQ(tok->token_bytes(1879), " world");
  EXPECT_EQ(tok->token_id("no such token"), -1);
  EXPECT_EQ(tok->token_text(-1), "");
  EXPECT_EQ(tok->token_text(1 << 24), "");
  EXPECT_EQ(tok->encode("\n"), std::vector<int32_t>{198});
  EXPECT_EQ(tok->encode("\n\n"), std::vector<int32_t>{271});
  EXPECT_EQ(tok->encode("</think>\n\n"), (std::vector<int32_t>{151668, 271}));
}

TEST_F(TokenizerGolden, SpecialTokensParsedOnlyWhenAsked) {
  const std::string text = "<|im_start|>user\nhi<|im_end|><think>";
  const std::vector<int32_t> parsed = tok->encode(text, true);
  EXPECT_EQ(parsed.front(), 151644);
  EXPECT_EQ(parsed.back(), 151667);
  const std::vector<int32_t> plain = tok->encode(text, false);
  for (int32_t id : plain) EXPECT_FALSE(tok->is_special(id));
  EXPECT_EQ(plain.back(), 151667);  // non-special added tokens stay atomic, as in HF
  EXPECT_EQ(tok->decode(plain), text);
  EXPECT_EQ(tok->decode(parsed), text);
  EXPECT_EQ(tok->decode(parsed, /*skip_special=*/true), "user\nhi<think>");
}

TEST_F(TokenizerGolden, EmptyStringGivesNoIds) {
  EXPECT_TRUE(tok->encode("").empty());
  EXPECT_TRUE(tok->encode("", false).empty());
  EXPECT_EQ(tok->decode({}), "");
}

// HF cannot receive invalid UTF-8 (its API takes &str). We replace each maximal invalid
// subpart by U+FFFD first, i.e. encode(bytes) == HF encode(String::from_utf8_lossy(bytes)).
TEST_F(TokenizerGolden, InvalidUtf8IsRepairedNotFatal) {
  const std::pair<std::string, std::string> cases[] = {
      {"a\xFF" "b", "a\xEF\xBF\xBD" "b"},
      {"\xC3", "\xEF\xBF\xBD"},
      {"caf\xC3", "caf\xEF\xBF\xBD"},
      {"\xF0\x9F\x98", "\xEF\xBF\xBD"},                                 // truncated emoji: one U+FFFD
      {"\xE2\x82" "A\xE2\x82\xAC", "\xEF\xBF\xBD" "A\xE2\x82\xAC"},      // broken then valid euro sign
      {"\xED\xA0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},          // surrogate: 3 subparts
      {"\xC0\xAF", "\xEF\xBF\xBD\xEF\xBF\xBD"},                          // overlong
      {std::string("nul\0byte", 8), std::string("nul\0byte", 8)},        // NUL is valid UTF-8
      {"<|im_start|>\x80<|im_end|>", "<|im_start|>\xEF\xBF\xBD<|im_end|>"},
  };
  for (const auto& [bad, repaired] : cases) {
    EXPECT_EQ(tok->encode(bad), tok->encode(repaired)) << escaped(bad);
    EXPECT_EQ(tok->decode(tok->encode(bad)), repaired) << escaped(bad);
  }
  // Random bytes: never a crash, and the round trip is the NFC of the repaired text.
  std::mt19937 rng(7);
  for (int i = 0; i < 500; ++i) {
    std::string bytes(rng() % 40, '\0');
    for (char& b : bytes) b = static_cast<char>(rng() % 4 == 0 ? rng() % 128 : 0x80 + rng() % 128);
    const std::string repaired = utf8::to_valid(bytes);
    const std::vector<int32_t> ids = tok->encode(bytes);
    EXPECT_EQ(tok->decode(ids), unicode::nfc(repaired));
  }
}

TEST_F(TokenizerGolden, StreamDecoderHoldsBackPartialCharacters) {
  // U+1F600 as four single-byte tokens: nothing comes out until the last byte arrives.
  const std::string emoji = "\xF0\x9F\x98\x80";
  std::vector<int32_t> byte_ids;
  for (unsigned char b : emoji) {
    std::string text;
    utf8::append(text, utf8::byte_to_unicode()[b]);
    byte_ids.push_back(tok->token_id(text));
    ASSERT_GE(byte_ids.back(), 0);
  }
  StreamDecoder stream(*tok);
  EXPECT_EQ(stream.push(tok->token_id("a")), "a");
  EXPECT_EQ(stream.push(byte_ids[0]), "");
  EXPECT_EQ(stream.push(byte_ids[1]), "");
  EXPECT_EQ(stream.push(byte_ids[2]), "");
  EXPECT_EQ(stream.push(byte_ids[3]), emoji);
  // An incomplete character followed by text is replaced at once; at the end only by flush().
  EXPECT_EQ(stream.push(byte_ids[0]), "");
  EXPECT_EQ(stream.push(tok->token_id("b")), "\xEF\xBF\xBD" "b");
  EXPECT_EQ(stream.push(byte_ids[0]), "");
  EXPECT_EQ(stream.push(byte_ids[1]), "");
  EXPECT_EQ(stream.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(stream.flush(), "");
  // Special tokens: emitted, or skipped with skip_special.
  StreamDecoder skipping(*tok, /*skip_special=*/true);
  EXPECT_EQ(skipping.push(151645), "");
  StreamDecoder keeping(*tok);
  EXPECT_EQ(keeping.push(151645), "<|im_end|>");
}

TEST_F(TokenizerGolden, LongWordsAreNotQuadratic) {
  // One 1 MB pre-token goes through BPE in one piece; a quadratic merge loop would take minutes.
  const std::string word(1 << 20, 'a');
  const std::vector<int32_t> ids = tok->encode(word);
  EXPECT_LT(ids.size(), word.size() / 4);
  EXPECT_EQ(tok->decode(ids), word);
  const std::string spaces = std::string(200000, ' ') + "x" + std::string(200000, '\n');
  EXPECT_EQ(tok->decode(tok->encode(spaces)), spaces);
}

TEST_F(TokenizerGolden, EncodeIsThreadSafe) {
  std::vector<std::string> texts;
  for (const json& c : (*goldens)["encode"]) texts.push_back(c["text"]);
  std::vector<std::vector<int32_t>> want;
  for (const std::string& t : texts) want.push_back(tok->encode(t));
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = 0; i < texts.size(); ++i) {
        const size_t k = (i * 7 + static_cast<size_t>(t) * 13) % texts.size();
        if (tok->encode(texts[k]) != want[k]) ++mismatches;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST_F(TokenizerGolden, ZstdCompressedTokenizerInADirectoryEncodesTheSame) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("swiftlet_tok_zst_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream out(dir / "tokenizer.json.zst", std::ios::binary);
    const std::string z = zstd_compress(read_file(testing::qwen3_tokenizer_path()));
    out.write(z.data(), std::streamsize(z.size()));
  }
  EXPECT_EQ(Tokenizer::file_in(dir.string()), (dir / "tokenizer.json.zst").string());
  const Tokenizer compressed = Tokenizer::from_file(dir.string());
  int checked = 0;
  for (const json& c : (*goldens)["encode"]) {
    EXPECT_EQ(compressed.encode(c["text"].get<std::string>()), ids_of(c["ids"])) << c["name"];
    if (++checked == 40) break;
  }
  // A plain tokenizer.json beside it is preferred; none at all names the directory.
  fs::copy_file(testing::qwen3_tokenizer_path(), dir / "tokenizer.json");
  EXPECT_EQ(Tokenizer::file_in(dir.string()), (dir / "tokenizer.json").string());
  fs::remove_all(dir);
  fs::create_directories(dir);
  EXPECT_EQ(Tokenizer::file_in(dir.string()), "");
  EXPECT_THROW(Tokenizer::from_file(dir.string()), swiftlet::Error);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace swiftlet
