// The Split pre-tokenizer of HF tokenizers (pre_tokenizers/split.rs): cut a text at the matches
// of a pattern. The pattern is read from tokenizer.json (Qwen3 and Qwen3.5 differ, model-math.md
// 9) and compiled with PCRE2 in UTF + UCP mode with JIT: HF uses Oniguruma, whose \p{L},
// \p{N}, \s and (?i:...) the Qwen patterns need; RE2 and std::regex cannot run them.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace swiftlet {

// GPT-2's pattern, which HF's ByteLevel pre-tokenizer applies when use_regex is true.
inline constexpr std::string_view kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class RegexSplitter {
 public:
  // HF SplitDelimiterBehavior values we support: Isolated (matches and the text between them
  // are separate pieces) and Removed (matches are dropped).
  enum class Behavior { kIsolated, kRemoved };

  // `pattern` is a regex, or a literal string when `literal`. `invert`: the pieces are the
  // matches' complement (HF "invert": true). Throws swiftlet::Error if it does not compile.
  RegexSplitter(std::string_view pattern, bool literal, Behavior behavior, bool invert);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Appends the non-empty pieces of `text` (valid UTF-8) in order. Thread-safe.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  struct Compiled;
  std::unique_ptr<Compiled> compiled_;
  Behavior behavior_;
  bool invert_;
};

}  // namespace swiftlet
