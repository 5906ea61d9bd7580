// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (model-math.md 9),
// producing the same ids as HF tokenizers' `encode(text, add_special_tokens=false)`:
//
//   1. added tokens are cut out first, leftmost-longest, atomically (lstrip / rstrip /
//      single_word / normalized honoured as HF added_vocabulary.rs does);
//   2. the rest is NFC-normalised (when the json says so), split by the pre-tokenizer regex
//      read from the json (PCRE2), mapped through the GPT-2 byte alphabet and BPE-merged.
//
// Never added: BOS/EOS or any post-processor template (Qwen adds none).
//
// Invalid UTF-8 input (HF cannot receive it: its API takes a Rust &str) is repaired before
// anything else by replacing each maximal invalid subpart with U+FFFD, exactly like Rust's
// String::from_utf8_lossy; so encode(bytes) == HF encode(from_utf8_lossy(bytes)).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace swiftlet {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;      // skipped by decode(skip_special); plain text when !parse_special
  bool lstrip = false;       // the match swallows whitespace on its left
  bool rstrip = false;       // ... and on its right
  bool single_word = false;  // only matches when not inside a word (Rust regex \w)
  bool normalized = false;   // matched in the NFC-normalised text instead of the raw text
};

class Tokenizer {
 public:
  // `path`: a tokenizer.json (plain or a Zstandard frame, as tokenizer.json.zst), or a directory
  // that contains one. Throws swiftlet::Error.
  static Tokenizer from_file(const std::string& path);
  // The tokenizer file of a model directory: tokenizer.json, else tokenizer.json.zst; "" if none.
  static std::string file_in(const std::string& dir);
  static Tokenizer from_json_string(std::string_view json);

  // parse_special = false: special added tokens (special: true, e.g. <|im_start|>) are
  // tokenised as plain text, as HF does with encode_special_tokens / transformers'
  // split_special_tokens. Non-special added tokens (<think>, <tool_call> in Qwen) stay
  // atomic either way, as in HF and llama.cpp. Thread-safe.
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;

  // Concatenates the tokens' bytes and repairs invalid UTF-8 with U+FFFD (HF ByteLevel
  // decoder). Ids outside the vocabulary are skipped, as HF does.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // Token as written in tokenizer.json: byte-level form for the BPE vocabulary ("Ġworld"),
  // content for added tokens ("<|im_start|>"). token_id returns -1 if absent; token_text
  // returns "" for an id with no token.
  int32_t token_id(std::string_view token) const;
  std::string_view token_text(int32_t id) const;
  // The raw bytes the token stands for (" world"); may be a partial UTF-8 character.
  std::string_view token_bytes(int32_t id) const;

  int32_t vocab_size() const;  // max id + 1 (added tokens included)
  bool is_special(int32_t id) const;
  bool is_added(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const;

  ~Tokenizer();
  Tokenizer(const Tokenizer&);
  Tokenizer& operator=(const Tokenizer&);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  struct Impl;  // defined in tokenizer_impl.h, internal to src/tokenizer

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;  // immutable after load (its word cache is internally locked)
};

// Incremental detokenisation for streaming output: feed ids one at a time and get back only
// complete UTF-8 characters; bytes of a character split across tokens (emoji, CJK in byte
// tokens) are held until a later token completes them. The concatenation of every push() and
// the final flush() is byte-identical to Tokenizer::decode of all the ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false);

  std::string push(int32_t id);
  // Emits what is held back, each incomplete sequence replaced by U+FFFD, and resets.
  std::string flush();
  size_t pending_bytes() const { return pending_.size(); }

 private:
  Tokenizer tokenizer_;  // a cheap shared handle: the decoder may outlive the caller's copy
  bool skip_special_;
  std::string pending_;
};

}  // namespace swiftlet
