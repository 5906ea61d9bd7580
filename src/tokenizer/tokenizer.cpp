#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/zstd_frame.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace swiftlet {

// ---- AddedTokenMatcher ---------------------------------------------------------------------

void AddedTokenMatcher::add(std::string pattern, size_t token) {
  if (pattern.empty()) return;  // HF ignores empty added tokens
  for (const Pattern& p : patterns_) {
    if (p.text == pattern) return;  // the first token with this content wins
  }
  patterns_.push_back(Pattern{std::move(pattern), token});
}

void AddedTokenMatcher::finalize() {
  std::stable_sort(patterns_.begin(), patterns_.end(), [](const Pattern& a, const Pattern& b) {
    const auto fa = static_cast<uint8_t>(a.text[0]);
    const auto fb = static_cast<uint8_t>(b.text[0]);
    return fa != fb ? fa < fb : a.text.size() > b.text.size();
  });
  size_t i = 0;
  for (int byte = 0; byte <= 256; ++byte) {
    while (i < patterns_.size() && static_cast<uint8_t>(patterns_[i].text[0]) < byte) ++i;
    first_begin_[byte] = static_cast<uint32_t>(i);
  }
  only_first_byte_ = -1;
  if (!patterns_.empty() && patterns_.front().text[0] == patterns_.back().text[0]) {
    only_first_byte_ = static_cast<uint8_t>(patterns_.front().text[0]);
  }
}

bool AddedTokenMatcher::find(std::string_view text, size_t from, Match& match) const {
  for (size_t pos = from; pos < text.size(); ++pos) {
    if (only_first_byte_ >= 0) {
      const void* hit = std::memchr(text.data() + pos, only_first_byte_, text.size() - pos);
      if (!hit) return false;
      pos = static_cast<size_t>(static_cast<const char*>(hit) - text.data());
    }
    const auto byte = static_cast<uint8_t>(text[pos]);
    const uint32_t end = first_begin_[byte + 1];
    for (uint32_t k = first_begin_[byte]; k < end; ++k) {
      const std::string& p = patterns_[k].text;
      if (text.compare(pos, p.size(), p) == 0) {
        match = Match{pos, pos + p.size(), patterns_[k].token};
        return true;
      }
    }
  }
  return false;
}

// ---- encoding ------------------------------------------------------------------------------

namespace {

// Rust regex `\w$` / `^\w` and `\s*$` / `^\s*`, used by HF for single_word, lstrip, rstrip.
bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t end = s.size();
  return unicode::is_word_char(utf8::prev(s, end));
}
bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t pos = 0;
  return unicode::is_word_char(utf8::next(s, pos));
}
size_t trailing_space_start(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end;
    if (!unicode::is_white_space(utf8::prev(s, start))) break;
    end = start;
  }
  return end;
}
size_t leading_space_length(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t next = pos;
    if (!unicode::is_white_space(utf8::next(s, next))) break;
    pos = next;
  }
  return pos;
}

}  // namespace

// HF AddedVocabulary::find_matches: non-overlapping leftmost-longest matches; a match that is
// rejected (special while !parse_special, or single_word inside a word) is skipped as a whole
// and scanning resumes after it, exactly like iterating the Aho-Corasick matches.
template <typename OnText>
void Tokenizer::Impl::split_added(std::string_view text, const AddedTokenMatcher& matcher,
                                  bool parse_special, std::vector<int32_t>& ids, OnText&& on_text) const {
  if (matcher.empty()) {
    on_text(text);
    return;
  }
  size_t consumed = 0;  // HF start_offset: end of the last accepted token (with its stripping)
  size_t search = 0;
  AddedTokenMatcher::Match m;
  while (matcher.find(text, search, m)) {
    search = m.end;
    const AddedToken& token = added[m.token];
    if (token.special && !parse_special) continue;
    size_t start = m.begin;
    size_t stop = m.end;
    if (token.single_word) {
      const bool left_ok = start == 0 || !ends_with_word(text.substr(0, start));
      const bool right_ok = stop == text.size() || !starts_with_word(text.substr(stop));
      if (!left_ok || !right_ok) continue;
    }
    if (token.lstrip) start = std::max(trailing_space_start(text.substr(0, start)), consumed);
    if (token.rstrip) stop += leading_space_length(text.substr(stop));
    if (consumed < start) on_text(text.substr(consumed, start - consumed));
    ids.push_back(token.id);
    consumed = stop;
  }
  if (consumed < text.size()) on_text(text.substr(consumed));
}

void Tokenizer::Impl::encode(std::string_view text, bool parse_special, std::vector<int32_t>& ids) const {
  std::string repaired;
  if (!utf8::is_valid(text)) {
    repaired = utf8::to_valid(text);
    text = repaired;
  }
  split_added(text, raw_matcher, parse_special, ids,
              [&](std::string_view piece) { encode_normalized(piece, parse_special, ids); });
}

void Tokenizer::Impl::encode_normalized(std::string_view text, bool parse_special,
                                        std::vector<int32_t>& ids) const {
  std::string normalized;
  if (nfc && unicode::to_nfc(text, normalized)) text = normalized;
  split_added(text, normalized_matcher, parse_special, ids,
              [&](std::string_view piece) { encode_plain(piece, ids); });
}

void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<int32_t>& ids) const {
  std::vector<std::string_view> pieces{text};
  std::vector<std::string_view> next;
  for (const auto& splitter : splitters) {
    next.clear();
    for (std::string_view p : pieces) splitter->split(p, next);
    pieces.swap(next);
  }
  for (std::string_view word : pieces) {
    if (ignore_merges) {
      auto it = bytes_to_id.find(word);
      if (it != bytes_to_id.end()) {
        ids.push_back(it->second);
        continue;
      }
    }
    bpe->encode_word(word, ids);
  }
}

// ---- Tokenizer -----------------------------------------------------------------------------

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(const Tokenizer&) = default;
Tokenizer& Tokenizer::operator=(const Tokenizer&) = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::from_json_string(std::string_view json) { return Tokenizer(load_tokenizer_json(json)); }

std::string Tokenizer::file_in(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const char* name : {"tokenizer.json", "tokenizer.json.zst"}) {
    const fs::path p = fs::path(dir) / name;
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  return "";
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path file = path;
  std::error_code ec;
  if (fs::is_directory(file, ec)) {
    const std::string found = file_in(path);
    file = found.empty() ? file / "tokenizer.json" : fs::path(found);
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    fail("cannot open {}: pass a tokenizer.json or a model directory that contains one", file.string());
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  try {
    std::string text = std::move(buffer).str();
    if (is_zstd_frame(text)) text = zstd_decompress(text, file.string());
    return from_json_string(text);
  } catch (const Error& e) {
    fail("{}: {}", file.string(), e.what());
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  impl_->encode(text, parse_special, ids);
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    if (skip_special && impl_->id_kind[id] == Impl::kAddedSpecial) continue;
    bytes += impl_->id_bytes[id];
  }
  if (utf8::is_valid(bytes)) return bytes;
  return utf8::to_valid(bytes);
}

int32_t Tokenizer::token_id(std::string_view token) const {
  auto it = impl_->text_to_id.find(token);
  return it == impl_->text_to_id.end() ? -1 : it->second;
}

std::string_view Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return impl_->id_text[id];
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return impl_->id_bytes[id];
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_text.size()); }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->id_kind[id] == Impl::kAddedSpecial;
}

bool Tokenizer::is_added(int32_t id) const {
  return id >= 0 && id < vocab_size() &&
         (impl_->id_kind[id] == Impl::kAdded || impl_->id_kind[id] == Impl::kAddedSpecial);
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }

// ---- StreamDecoder -------------------------------------------------------------------------

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string StreamDecoder::push(int32_t id) {
  if (skip_special_ && tokenizer_.is_special(id)) return {};
  pending_ += tokenizer_.token_bytes(id);
  const size_t ready = utf8::stable_prefix_length(pending_);
  if (ready == 0) return {};
  std::string out;
  utf8::append_lossy(out, std::string_view(pending_).substr(0, ready));
  pending_.erase(0, ready);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8::to_valid(pending_);
  pending_.clear();
  return out;
}

}  // namespace swiftlet
