#include "convert/gguf_tokenizer.h"

#include "core/error.h"

#include <nlohmann/json.hpp>

namespace swiftlet {

namespace {

using json = nlohmann::ordered_json;

// llama.cpp's token types (llama.h `llama_token_type`).
constexpr int64_t kNormal = 1, kControl = 3, kUserDefined = 4;

// The Split regexes of the Qwen tokenizers llama.cpp names by tokenizer.ggml.pre (as their
// tokenizer.json files write them; Qwen3.5's adds combining marks, \p{M}, to letters).
std::string pre_regex(const std::string& pre, const std::string& path) {
  if (pre == "qwen2")
    return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  if (pre == "qwen35")
    return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  fail(
      "'{}': tokenizer.ggml.pre is '{}'; swiftlet rebuilds the qwen2 and qwen35 pre-tokenizers only "
      "(convert from the safetensors checkpoint, whose tokenizer.json is copied)",
      path, pre);
}

const std::string* token_name(const GgufFile& f, const char* key) {
  const GgufValue* id = f.find(key);
  const std::vector<std::string>& tokens = f.get_strings("tokenizer.ggml.tokens");
  if (!id || !id->is_integer() || id->i < 0 || uint64_t(id->i) >= tokens.size()) return nullptr;
  return &tokens[size_t(id->i)];
}

}  // namespace

std::string gguf_tokenizer_json(const GgufFile& f) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model != "gpt2")
    fail("'{}': tokenizer.ggml.model is '{}'; swiftlet rebuilds byte-level BPE ('gpt2') tokenizers only", f.path(),
         model);
  const std::string pre = f.find("tokenizer.ggml.pre") ? f.get_string("tokenizer.ggml.pre") : "qwen2";
  const std::vector<std::string>& tokens = f.get_strings("tokenizer.ggml.tokens");
  const std::vector<std::string>& merges = f.get_strings("tokenizer.ggml.merges");
  const std::vector<int64_t>* types =
      f.find("tokenizer.ggml.token_type") ? &f.get_ints("tokenizer.ggml.token_type") : nullptr;
  if (types && types->size() != tokens.size())
    fail("'{}': tokenizer.ggml.token_type has {} entries for {} tokens", f.path(), types->size(), tokens.size());

  // The vocabulary as a std::map-backed object: ordered_json's linear lookups would make
  // 150 000 insertions quadratic.
  nlohmann::json vocab = nlohmann::json::object();
  json added = json::array();
  for (size_t id = 0; id < tokens.size(); ++id) {
    const int64_t type = types ? (*types)[id] : kNormal;
    if (type == kControl || type == kUserDefined) {
      // Qwen's added tokens: matched as written (not normalised), special for control tokens.
      added.push_back({{"id", id},
                       {"content", tokens[id]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", type == kControl}});
    } else if (type == kNormal) {
      if (vocab.contains(tokens[id]))
        fail("'{}': token '{}' appears twice in tokenizer.ggml.tokens", f.path(), tokens[id]);
      vocab[tokens[id]] = id;
    }
    // Other types (unknown, unused, byte) have no place in a byte-level BPE vocabulary.
  }
  const json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = std::move(added);
  j["normalizer"] = {{"type", "NFC"}};
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"},
                           {"pattern", {{"Regex", pre_regex(pre, f.path())}}},
                           {"behavior", "Isolated"},
                           {"invert", false}},
                          byte_level}}};
  j["post_processor"] = byte_level;
  j["decoder"] = byte_level;
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", ""},
                {"end_of_word_suffix", ""},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", std::move(vocab)},
                {"merges", merges}};
  return j.dump(1) + "\n";
}

std::string gguf_chat_template(const GgufFile& f) {
  return f.find("tokenizer.chat_template") ? f.get_string("tokenizer.chat_template") : "";
}

std::string gguf_tokenizer_config(const GgufFile& f) {
  json j;
  j["tokenizer_class"] = "Qwen2Tokenizer";
  if (const std::string* eos = token_name(f, "tokenizer.ggml.eos_token_id")) j["eos_token"] = *eos;
  if (const std::string* pad = token_name(f, "tokenizer.ggml.padding_token_id")) j["pad_token"] = *pad;
  j["bos_token"] = nullptr;
  j["add_bos_token"] = false;
  const std::string t = gguf_chat_template(f);
  if (!t.empty()) j["chat_template"] = t;
  return j.dump(2) + "\n";
}

}  // namespace swiftlet
