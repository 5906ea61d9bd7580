// tokenizer.json loading: any text either loads or throws Error; a loaded tokenizer encodes and
// decodes its own file's text without crashing.
#include "core/error.h"
#include "tokenizer/tokenizer.h"

#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const swiftlet::Tokenizer t = swiftlet::Tokenizer::from_json_string(text);
    const std::vector<int32_t> ids = t.encode(text.substr(0, 256), /*parse_special=*/true);
    (void)t.decode(ids);
    for (int32_t id : {-1, 0, 1, t.vocab_size() - 1, t.vocab_size()}) {
      (void)t.token_text(id);
      (void)t.token_bytes(id);
      (void)t.is_special(id);
    }
  } catch (const swiftlet::Error&) {
  }
  return 0;
}
