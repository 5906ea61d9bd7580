#include "server/think_splitter.h"

#include <algorithm>

namespace swiftlet::server {

namespace {
constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

// Length of the longest suffix of `s` that is a proper prefix of `tag`.
size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}
}  // namespace

void ThinkSplitter::emit(Out& out, std::string_view text) {
  if (strip_newlines_) {
    while (!text.empty() && text.front() == '\n') text.remove_prefix(1);
    if (text.empty()) return;
    strip_newlines_ = false;
  }
  (state_ == State::Reasoning ? out.reasoning : out.content) += text;
}

ThinkSplitter::Out ThinkSplitter::feed(std::string_view piece) {
  Out out;
  pending_ += piece;
  for (;;) {
    if (state_ == State::Start) {
      // A think block counts only at the start of the answer (leading whitespace aside).
      const size_t ws = pending_.find_first_not_of(" \t\r\n");
      if (ws == std::string::npos) return out;  // only whitespace so far
      std::string_view rest = std::string_view(pending_).substr(ws);
      if (rest.starts_with(kOpen)) {
        pending_.erase(0, ws + kOpen.size());
        state_ = State::Reasoning;
        strip_newlines_ = true;
        continue;
      }
      if (kOpen.starts_with(rest)) return out;  // may still become <think>
      state_ = State::Content;
      continue;
    }
    if (state_ == State::Reasoning) {
      const size_t close = pending_.find(kClose);
      if (close != std::string::npos) {
        emit(out, std::string_view(pending_).substr(0, close));
        pending_.erase(0, close + kClose.size());
        state_ = State::Content;
        strip_newlines_ = true;
        continue;
      }
      const size_t hold = partial_tag_suffix(pending_, kClose);
      emit(out, std::string_view(pending_).substr(0, pending_.size() - hold));
      pending_.erase(0, pending_.size() - hold);
      return out;
    }
    // Content: everything goes through.
    emit(out, pending_);
    pending_.clear();
    return out;
  }
}

ThinkSplitter::Out ThinkSplitter::flush() {
  Out out;
  if (state_ == State::Start) state_ = State::Content;
  emit(out, pending_);
  pending_.clear();
  return out;
}

}  // namespace swiftlet::server
