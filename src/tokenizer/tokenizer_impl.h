// Internals of Tokenizer shared by tokenizer.cpp (encode/decode) and tokenizer_load.cpp
// (tokenizer.json parsing). Not part of the public API.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace swiftlet {

// Finds added tokens in a text with leftmost-longest semantics (HF uses an Aho-Corasick
// automaton with MatchKind::LeftmostLongest; with a few dozen tokens a first-byte table and
// direct comparison is as fast and much simpler).
class AddedTokenMatcher {
 public:
  struct Match {
    size_t begin;
    size_t end;
    size_t token;  // index into Tokenizer::Impl::added
  };

  void add(std::string pattern, size_t token);
  void finalize();  // call once after the last add()
  bool empty() const { return patterns_.empty(); }
  // The leftmost match starting at or after `from`, the longest one at that position.
  bool find(std::string_view text, size_t from, Match& match) const;

 private:
  struct Pattern {
    std::string text;
    size_t token;
  };
  std::vector<Pattern> patterns_;            // by first byte, then longest first
  std::array<uint32_t, 257> first_begin_{};  // patterns_ range for each first byte
  int only_first_byte_ = -1;                  // when all patterns start alike: memchr for it
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringToId = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct Tokenizer::Impl {
  enum Kind : uint8_t { kNone, kVocab, kAdded, kAddedSpecial };

  // Indexed by id; size = vocab_size().
  std::vector<std::string> id_text;   // as in tokenizer.json
  std::vector<std::string> id_bytes;  // what the ByteLevel decoder turns it into
  std::vector<uint8_t> id_kind;
  StringToId text_to_id;  // added tokens take precedence over the vocabulary, as in HF

  std::vector<AddedToken> added;
  AddedTokenMatcher raw_matcher;         // added tokens with normalized == false
  AddedTokenMatcher normalized_matcher;  // normalized == true, patterns in NFC

  bool nfc = false;
  std::vector<std::unique_ptr<RegexSplitter>> splitters;  // applied in sequence
  std::unique_ptr<BpeModel> bpe;
  bool ignore_merges = false;  // HF BPE option: a word found whole in the vocab is one token
  StringToId bytes_to_id;      // raw bytes -> id, filled only when ignore_merges

  void encode(std::string_view text, bool parse_special, std::vector<int32_t>& ids) const;

 private:
  template <typename OnText>
  void split_added(std::string_view text, const AddedTokenMatcher& matcher, bool parse_special,
                   std::vector<int32_t>& ids, OnText&& on_text) const;
  void encode_normalized(std::string_view text, bool parse_special, std::vector<int32_t>& ids) const;
  void encode_plain(std::string_view text, std::vector<int32_t>& ids) const;
};

std::shared_ptr<Tokenizer::Impl> load_tokenizer_json(std::string_view json);

}  // namespace swiftlet
