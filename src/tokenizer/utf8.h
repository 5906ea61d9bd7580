// UTF-8 helpers for the tokenizer: validation, lossy repair, code point iteration and the
// GPT-2 byte-level alphabet (bytes_to_unicode in openai/gpt-2 encoder.py, used by HF ByteLevel).
//
// Lossy repair follows the Unicode "substitution of maximal subparts" practice (Unicode 15
// section 3.9, U+FFFD substitution), which is what Rust's String::from_utf8_lossy does, so our
// decode() is byte-identical to Hugging Face tokenizers' ByteLevel decoder.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace swiftlet::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// True when `s` is well-formed UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF).
bool is_valid(std::string_view s);

// Appends `bytes` to `out`, replacing each maximal invalid subpart by one U+FFFD.
void append_lossy(std::string& out, std::string_view bytes);
inline std::string to_valid(std::string_view bytes) {
  std::string out;
  append_lossy(out, bytes);
  return out;
}

// For streaming: the length of the longest prefix of `bytes` that can be converted now, i.e.
// everything except a trailing sequence that is a proper prefix of a valid character and may
// still be completed by later bytes. Converting the prefix now and the rest later gives the same
// text as converting everything at once.
size_t stable_prefix_length(std::string_view bytes);

// Decodes the code point at `pos` of VALID UTF-8 and advances `pos`.
char32_t next(std::string_view s, size_t& pos);
// Decodes the code point that ends at `end` of VALID UTF-8 and moves `end` back to its start.
char32_t prev(std::string_view s, size_t& end);
void append(std::string& out, char32_t cp);

// GPT-2 byte-level alphabet: each byte maps to one printable code point (printable Latin-1
// bytes map to themselves, the others to U+0100 onwards in byte order).
const std::array<char32_t, 256>& byte_to_unicode();
// Inverse of byte_to_unicode(); -1 for a code point outside the alphabet.
int unicode_to_byte(char32_t cp);

}  // namespace swiftlet::utf8
