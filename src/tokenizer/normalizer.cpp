#include "tokenizer/normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>
#include <unicode/uchar.h>

#include "core/error.h"

namespace swiftlet::unicode {
namespace {

const icu::Normalizer2& nfc_instance() {
  static const icu::Normalizer2* instance = [] {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(status);
    SWIFTLET_CHECK(U_SUCCESS(status) && n != nullptr, "ICU NFC data unavailable: {}", u_errorName(status));
    return n;
  }();
  return *instance;
}

bool is_ascii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

}  // namespace

bool to_nfc(std::string_view s, std::string& out) {
  if (is_ascii(s)) return false;
  const icu::Normalizer2& n = nfc_instance();
  const icu::StringPiece piece(s.data(), static_cast<int32_t>(s.size()));
  UErrorCode status = U_ZERO_ERROR;
  if (n.isNormalizedUTF8(piece, status) && U_SUCCESS(status)) return false;
  status = U_ZERO_ERROR;
  std::string result;
  result.reserve(s.size());
  icu::StringByteSink<std::string> sink(&result);
  n.normalizeUTF8(0, piece, sink, nullptr, status);
  SWIFTLET_CHECK(U_SUCCESS(status), "ICU NFC normalisation failed: {}", u_errorName(status));
  out = std::move(result);
  return true;
}

bool is_white_space(char32_t cp) { return u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_WHITE_SPACE); }

bool is_word_char(char32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL)) return true;
  return (U_GET_GC_MASK(c) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0;
}

}  // namespace swiftlet::unicode
