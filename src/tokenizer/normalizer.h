// Unicode services the tokenizer needs, from ICU: NFC normalisation (HF normalizers::NFC) and
// the character classes HF's added-token matching uses (Rust regex \s and \w).
#pragma once

#include <string>
#include <string_view>

namespace swiftlet::unicode {

// NFC of valid UTF-8. Returns false (and leaves `out` alone) when `s` is already in NFC,
// which is the common case and costs one quick check; ASCII returns at once.
bool to_nfc(std::string_view s, std::string& out);
inline std::string nfc(std::string_view s) {
  std::string out;
  return to_nfc(s, out) ? out : std::string(s);
}

bool is_white_space(char32_t cp);  // Unicode White_Space (Rust regex \s)
bool is_word_char(char32_t cp);    // Rust regex \w: Alphabetic, M, Nd, Pc, Join_Control

}  // namespace swiftlet::unicode
