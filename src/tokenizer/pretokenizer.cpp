#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"

namespace swiftlet {
namespace {

struct MatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ~MatchState() {
    if (data) pcre2_match_data_free(data);
    if (context) pcre2_match_context_free(context);
    if (stack) pcre2_jit_stack_free(stack);
  }
};

// The default JIT stack (32 KiB on the machine stack) suffices for ordinary text; a
// pathological run gets a private heap stack instead of failing.
constexpr size_t kLargeJitStack = 64u << 20;

size_t utf8_char_length(uint8_t lead) {
  return lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
}

}  // namespace

struct RegexSplitter::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() {
    if (code) pcre2_code_free(code);
  }
};

RegexSplitter::RegexSplitter(std::string_view pattern, bool literal, Behavior behavior, bool invert)
    : compiled_(std::make_unique<Compiled>()), behavior_(behavior), invert_(invert) {
  uint32_t options = PCRE2_UTF | PCRE2_UCP;
  if (literal) options |= PCRE2_LITERAL;
  int error = 0;
  PCRE2_SIZE offset = 0;
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                  options, &error, &offset, nullptr);
  if (!compiled_->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    fail("tokenizer.json: the pre-tokenizer pattern /{}/ does not compile (PCRE2, offset {}): {}; "
         "only Oniguruma syntax that PCRE2 shares is supported",
         pattern, offset, reinterpret_cast<const char*>(message));
  }
  // Without JIT PCRE2 still matches (interpreted, slower), so a JIT failure is not an error.
  compiled_->jit = pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE) == 0;
}

RegexSplitter::~RegexSplitter() = default;

void RegexSplitter::split(std::string_view text, std::vector<std::string_view>& out) const {
  const auto emit = [&](size_t begin, size_t end, bool is_match) {
    if (begin == end) return;
    if (behavior_ == Behavior::kRemoved && is_match != invert_) return;
    out.push_back(text.substr(begin, end - begin));
  };
  MatchState state;
  state.data = pcre2_match_data_create_from_pattern(compiled_->code, nullptr);
  SWIFTLET_CHECK(state.data != nullptr, "out of memory creating PCRE2 match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t pos = 0;
  size_t last = 0;  // end of the previous match
  while (pos <= n) {
    // pcre2_jit_match skips pcre2_match's per-call checks; the text is valid UTF-8 already.
    const int rc = compiled_->jit
                       ? pcre2_jit_match(compiled_->code, subject, n, pos, 0, state.data, state.context)
                       : pcre2_match(compiled_->code, subject, n, pos, PCRE2_NO_UTF_CHECK, state.data,
                                     state.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && state.stack == nullptr) {
      state.stack = pcre2_jit_stack_create(32u << 10, kLargeJitStack, nullptr);
      state.context = pcre2_match_context_create(nullptr);
      SWIFTLET_CHECK(state.stack && state.context, "out of memory creating a PCRE2 JIT stack");
      pcre2_jit_stack_assign(state.context, nullptr, state.stack);
      continue;
    }
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      fail("pre-tokenizer regex failed on a {}-byte text: {}", n, reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    emit(last, begin, false);
    emit(begin, end, true);
    last = end;
    if (end > begin) {
      pos = end;
    } else {
      // An empty match: resume after the next character, as Rust's find_iter does.
      if (begin >= n) break;
      pos = begin + utf8_char_length(static_cast<uint8_t>(text[begin]));
    }
  }
  emit(last, n, false);
}

}  // namespace swiftlet
