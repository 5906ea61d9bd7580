// Parses a Hugging Face tokenizer.json (the serialisation of tokenizers::Tokenizer) into
// Tokenizer::Impl. Only what byte-level BPE tokenizers (GPT-2, Qwen2/3, Qwen3.5) use is
// accepted; anything else fails with a message naming the unsupported field.
#include <nlohmann/json.hpp>
#include <simdjson.h>

#include <limits>
#include <optional>
#include <string_view>

#include "core/error.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace swiftlet {
namespace {

using nlohmann::json;

std::string type_of(const json& j) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) return "";
  return j["type"].get<std::string>();
}

bool flag(const json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) fail("tokenizer.json: \"{}\" must be true or false, got {}", key, it->dump());
  return it->get<bool>();
}

// The ByteLevel decoder's view of a token: each character of the byte alphabet is one byte;
// a token with any other character decodes to its own UTF-8 (HF decoders/byte_level.rs).
std::string token_to_bytes(std::string_view text) {
  std::string bytes;
  bytes.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const int b = utf8::unicode_to_byte(utf8::next(text, pos));
    if (b < 0) return std::string(text);
    bytes.push_back(static_cast<char>(b));
  }
  return bytes;
}

void parse_normalizer(const json& j, Tokenizer::Impl& impl) {
  if (j.is_null()) return;
  const std::string type = type_of(j);
  if (type == "NFC") {
    impl.nfc = true;
  } else if (type == "Sequence" && j.contains("normalizers") && j["normalizers"].is_array()) {
    for (const json& n : j["normalizers"]) parse_normalizer(n, impl);
  } else {
    fail("tokenizer.json: normalizer {} is not supported (only NFC, alone or in a Sequence)", j.dump());
  }
}

void parse_pre_tokenizer(const json& j, Tokenizer::Impl& impl, bool& byte_level) {
  const std::string type = type_of(j);
  if (byte_level) {
    fail("tokenizer.json: pre-tokenizer {} after ByteLevel is not supported", type);
  }
  if (type == "Sequence" && j.contains("pretokenizers") && j["pretokenizers"].is_array()) {
    for (const json& p : j["pretokenizers"]) parse_pre_tokenizer(p, impl, byte_level);
  } else if (type == "Split") {
    const json& pattern = j.at("pattern");
    const bool literal = pattern.contains("String");
    if (!literal && !pattern.contains("Regex")) {
      fail("tokenizer.json: Split pattern {} has neither \"Regex\" nor \"String\"", pattern.dump());
    }
    const std::string text = pattern.at(literal ? "String" : "Regex").get<std::string>();
    const std::string behavior = j.value("behavior", "Isolated");
    RegexSplitter::Behavior b;
    if (behavior == "Isolated") {
      b = RegexSplitter::Behavior::kIsolated;
    } else if (behavior == "Removed") {
      b = RegexSplitter::Behavior::kRemoved;
    } else {
      fail("tokenizer.json: Split behavior \"{}\" is not supported (Isolated or Removed)", behavior);
    }
    impl.splitters.push_back(std::make_unique<RegexSplitter>(text, literal, b, flag(j, "invert", false)));
  } else if (type == "ByteLevel") {
    if (flag(j, "add_prefix_space", false)) {
      fail("tokenizer.json: ByteLevel add_prefix_space = true is not supported");
    }
    if (flag(j, "use_regex", true)) {
      impl.splitters.push_back(std::make_unique<RegexSplitter>(
          kGpt2SplitPattern, false, RegexSplitter::Behavior::kIsolated, false));
    }
    byte_level = true;
  } else {
    fail("tokenizer.json: pre-tokenizer {} is not supported (Split, ByteLevel or a Sequence of them)",
         j.is_null() ? std::string("null") : j.dump().substr(0, 200));
  }
}

void check_decoder(const json& j) {
  const std::string type = type_of(j);
  if (type == "ByteLevel") return;
  if (type == "Sequence" && j.contains("decoders") && j["decoders"].is_array()) {
    for (const json& d : j["decoders"]) check_decoder(d);
    return;
  }
  fail("tokenizer.json: decoder {} is not supported (byte-level BPE needs a ByteLevel decoder)",
       j.is_null() ? std::string("null") : j.dump().substr(0, 200));
}

void check_bpe_options(const json& model) {
  if (type_of(model) != "BPE" && model.contains("type")) {
    fail("tokenizer.json: model type \"{}\" is not supported (only BPE)", type_of(model));
  }
  if (flag(model, "byte_fallback", false)) fail("tokenizer.json: BPE byte_fallback is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(key);
    if (it != model.end() && it->is_string() && !it->get<std::string>().empty()) {
      fail("tokenizer.json: BPE {} = \"{}\" is not supported", key, it->get<std::string>());
    }
  }
  auto dropout = model.find("dropout");
  if (dropout != model.end() && dropout->is_number() && dropout->get<double>() > 0.0) {
    fail("tokenizer.json: BPE dropout is not supported for inference");
  }
}

// A token id: an integer in [0, limit). The limit follows from the number of tokens the file
// lists (ids are dense in real tokenizers), so a stray huge id is an error, not gigabytes of
// empty table.
int64_t checked_id(std::optional<int64_t> id, std::string_view shown, int64_t limit, std::string_view token) {
  if (!id) fail("tokenizer.json: the id of token '{}' is {}, not an integer", token, shown);
  if (*id < 0 || *id >= limit)
    fail("tokenizer.json: token '{}' has id {}, outside [0, {}) for a file of this many tokens", token, shown, limit);
  return *id;
}

int64_t token_id(const json& v, int64_t limit, const std::string& token) {
  std::optional<int64_t> id;
  if (v.is_number_integer())
    id = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()) ? -1
                                                                                                        : v.get<int64_t>();
  return checked_id(id, v.dump(), limit, token);
}

int64_t token_id(simdjson::dom::element v, int64_t limit, std::string_view token) {
  std::optional<int64_t> id;
  if (v.is_int64()) {
    id = int64_t(v.get_int64());
  } else if (v.is_uint64()) {
    id = -1;  // beyond int64: outside any limit
  }
  return checked_id(id, simdjson::minify(v), limit, token);
}

void ensure_id(Tokenizer::Impl& impl, int64_t id) {
  if (id >= static_cast<int64_t>(impl.id_text.size())) {
    impl.id_text.resize(id + 1);
    impl.id_bytes.resize(id + 1);
    impl.id_kind.resize(id + 1, Tokenizer::Impl::kNone);
  }
}

std::pair<std::string_view, std::string_view> merge_pair(simdjson::dom::element m, size_t rank) {
  std::string_view s;
  if (!m.get_string().get(s)) {
    const size_t space = s.find(' ');
    if (space == std::string_view::npos || s.find(' ', space + 1) != std::string_view::npos) {
      fail("tokenizer.json: merge #{} \"{}\" is not two tokens separated by one space", rank, s);
    }
    return {s.substr(0, space), s.substr(space + 1)};
  }
  simdjson::dom::array pair;
  std::string_view a, b;
  if (!m.get_array().get(pair) && pair.size() == 2 && !pair.at(0).get_string().get(a) &&
      !pair.at(1).get_string().get(b)) {
    return {a, b};
  }
  fail("tokenizer.json: merge #{} is {}, expected \"a b\" or [\"a\", \"b\"]", rank, simdjson::minify(m));
}

// The model: its options from `options` (every field but the two tables), the vocabulary and the
// merges read straight from the parsed document, which is what makes loading fast: a DOM of
// 150,000 tokens costs several times the parse.
void load_model(const json& options, simdjson::dom::object vocab, simdjson::dom::array merges_json,
                Tokenizer::Impl& impl, int64_t id_limit) {
  check_bpe_options(options);
  impl.ignore_merges = flag(options, "ignore_merges", false);
  StringToId vocab_ids;
  vocab_ids.reserve(vocab.size());
  for (const auto [key, id_json] : vocab) {
    const int64_t id = token_id(id_json, id_limit, key);
    ensure_id(impl, id);
    impl.id_text[id] = std::string(key);
    impl.id_bytes[id] = token_to_bytes(key);
    impl.id_kind[id] = Tokenizer::Impl::kVocab;
    vocab_ids.emplace(std::string(key), static_cast<int32_t>(id));
  }

  std::array<int32_t, 256> byte_ids{};
  const auto& alphabet = utf8::byte_to_unicode();
  for (int b = 0; b < 256; ++b) {
    std::string text;
    utf8::append(text, alphabet[b]);
    auto it = vocab_ids.find(text);
    byte_ids[b] = it == vocab_ids.end() ? -1 : it->second;
  }

  std::vector<BpeModel::Merge> merges;
  merges.reserve(merges_json.size());
  const auto lookup = [&](std::string_view token, size_t rank) {
    auto it = vocab_ids.find(token);
    if (it == vocab_ids.end()) {
      fail("tokenizer.json: merge #{} needs token \"{}\", which is not in model.vocab", rank, token);
    }
    return it->second;
  };
  std::string joined;
  size_t rank = 0;
  for (const simdjson::dom::element m : merges_json) {
    const auto [a, b] = merge_pair(m, rank);
    joined.assign(a).append(b);
    merges.push_back(BpeModel::Merge{lookup(a, rank), lookup(b, rank), lookup(joined, rank)});
    ++rank;
  }
  impl.bpe = std::make_unique<BpeModel>(byte_ids, merges);

  impl.text_to_id = std::move(vocab_ids);
  if (impl.ignore_merges) {
    for (size_t id = 0; id < impl.id_kind.size(); ++id) {
      if (impl.id_kind[id] == Tokenizer::Impl::kVocab) impl.bytes_to_id.emplace(impl.id_bytes[id], static_cast<int32_t>(id));
    }
  }
}

void load_added_tokens(const json& list, Tokenizer::Impl& impl, int64_t id_limit) {
  if (list.is_null()) return;
  if (!list.is_array()) fail("tokenizer.json: added_tokens must be an array");
  for (const json& t : list) {
    AddedToken token;
    token.content = t.at("content").get<std::string>();
    token.id = int32_t(token_id(t.at("id"), id_limit, token.content));
    token.special = flag(t, "special", false);
    token.lstrip = flag(t, "lstrip", false);
    token.rstrip = flag(t, "rstrip", false);
    token.single_word = flag(t, "single_word", false);
    token.normalized = flag(t, "normalized", !token.special);
    if (token.content.empty()) continue;
    if (!utf8::is_valid(token.content)) fail("tokenizer.json: added token {} is not valid UTF-8", token.id);
    ensure_id(impl, token.id);
    impl.id_text[token.id] = token.content;
    impl.id_bytes[token.id] = token_to_bytes(token.content);
    impl.id_kind[token.id] = token.special ? Tokenizer::Impl::kAddedSpecial : Tokenizer::Impl::kAdded;
    impl.text_to_id.insert_or_assign(token.content, token.id);
    impl.added.push_back(token);
  }
  for (size_t i = 0; i < impl.added.size(); ++i) {
    const AddedToken& token = impl.added[i];
    if (token.normalized) {
      impl.normalized_matcher.add(impl.nfc ? unicode::nfc(token.content) : token.content, i);
    } else {
      impl.raw_matcher.add(token.content, i);
    }
  }
  impl.raw_matcher.finalize();
  impl.normalized_matcher.finalize();
}

// A small part of the document as nlohmann's json (null when absent), for the option checks.
json small_part(simdjson::dom::element e) { return json::parse(simdjson::minify(e)); }

json field_or_null(simdjson::dom::object o, std::string_view key) {
  simdjson::dom::element e;
  return o.at_key(key).get(e) ? json() : small_part(e);
}

}  // namespace

std::shared_ptr<Tokenizer::Impl> load_tokenizer_json(std::string_view text) {
  simdjson::dom::parser parser;
  const simdjson::padded_string padded(text);
  simdjson::dom::object root, model;
  simdjson::dom::element doc, model_el;
  if (const auto err = parser.parse(padded).get(doc))
    fail("tokenizer.json is not valid JSON: {}", simdjson::error_message(err));
  if (doc.get_object().get(root) || root.at_key("model").get(model_el)) {
    fail("not a Hugging Face tokenizer.json: no \"model\" object at the top level");
  }
  auto impl = std::make_shared<Tokenizer::Impl>();
  try {
    parse_normalizer(field_or_null(root, "normalizer"), *impl);
    bool byte_level = false;
    parse_pre_tokenizer(field_or_null(root, "pre_tokenizer"), *impl, byte_level);
    if (!byte_level) fail("tokenizer.json: only byte-level BPE is supported; the pre-tokenizer has no ByteLevel");
    check_decoder(field_or_null(root, "decoder"));
    const json added = field_or_null(root, "added_tokens");
    if (model_el.get_object().get(model)) fail("tokenizer.json: \"model\" must be an object, got {}", simdjson::minify(model_el));
    json options = json::object();
    simdjson::dom::object vocab;
    simdjson::dom::array merges;
    bool has_vocab = false, has_merges = false;
    for (const auto [key, value] : model) {
      if (key == "vocab") {
        if (value.get_object().get(vocab)) fail("tokenizer.json: model.vocab must be an object of token -> id");
        has_vocab = true;
      } else if (key == "merges") {
        if (value.get_array().get(merges)) fail("tokenizer.json: model.merges must be an array");
        has_merges = true;
      } else {
        options[std::string(key)] = small_part(value);
      }
    }
    if (!has_vocab) fail("tokenizer.json: model has no \"vocab\"");
    if (!has_merges) fail("tokenizer.json: model has no \"merges\"");
    const int64_t id_limit = 2 * int64_t(added.size() + vocab.size()) + 1024;
    load_model(options, vocab, merges, *impl, id_limit);
    load_added_tokens(added, *impl, id_limit);
  } catch (const json::exception& e) {
    fail("tokenizer.json has an unexpected shape: {}", e.what());
  }
  return impl;
}

}  // namespace swiftlet
