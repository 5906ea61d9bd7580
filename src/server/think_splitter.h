// Splits a thinking model's streamed answer into reasoning and content at <think> ... </think>,
// the way OpenAI-compatible servers report it (message.reasoning_content / delta.reasoning_content,
// as vLLM and llama.cpp do). Text that could still become a tag is held back until it either
// completes one or cannot; the concatenation of every output equals the input minus the tags
// and the newlines the Qwen templates put right after them.
#pragma once

#include <string>
#include <string_view>

namespace swiftlet::server {

class ThinkSplitter {
 public:
  // opened: the prompt already opened the think block (Qwen3-Next-Thinking's generation
  // prompt ends with "<think>\n"), so the answer starts inside it. Otherwise a think block is
  // recognised only at the very start of the answer.
  explicit ThinkSplitter(bool opened = false) : state_(opened ? State::Reasoning : State::Start) {
    strip_newlines_ = opened;
  }

  struct Out {
    std::string reasoning, content;
  };
  Out feed(std::string_view piece);
  Out flush();  // end of the answer: whatever is held back

 private:
  enum class State { Start, Reasoning, Content };
  void emit(Out& out, std::string_view text);
  State state_;
  bool strip_newlines_ = false;  // drop newlines at the start of the next segment
  std::string pending_;
};

}  // namespace swiftlet::server
