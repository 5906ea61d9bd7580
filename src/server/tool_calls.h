// Tool calls between the OpenAI wire shapes and the Qwen templates: the JSON forms the templates
// print (Python's json.dumps and str()), and the parser that finds calls in the model's output.
//
// The models write a call as
//   Qwen3 / Qwen3-Next:  <tool_call>\n{"name": "NAME", "arguments": {...}}\n</tool_call>
//   Qwen3.5 / 3.6:       <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n
//                        </function>\n</tool_call>
// The parser accepts either format whatever the model (it tells them apart by the first
// character after <tool_call>). Text around calls is content; whitespace between or after calls
// is dropped. A call that does not parse is returned as content, tags included.
#pragma once

#include "tokenizer/chat_template.h"

#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace swiftlet::server {

using ojson = nlohmann::ordered_json;  // keeps the client's key order, as Python dicts do

// `tojson` in transformers' templates: json.dumps(v, ensure_ascii=False) with ", " / ": ".
std::string py_json(const ojson& v);
// Jinja's `|string` of a JSON value: Python's str() (True, False, None; strings as they are).
std::string py_str(const ojson& v);

// A call as the templates take it. `arguments` must be an object.
ToolCall template_tool_call(const std::string& name, const ojson& arguments);

// A tool the client offered: its name and its JSON-schema parameters (may be null).
struct ToolSpec {
  std::string name;
  ojson parameters;
};

// A call found in the output: the name and the arguments as compact JSON text (OpenAI's
// `function.arguments`).
struct ParsedCall {
  std::string name;
  std::string arguments;
};

// Parses one call's text between <tool_call> and </tool_call>; nullopt when it is malformed.
// Qwen3.5 parameter values become JSON by the tool's schema: a string-typed parameter stays a
// string, anything else is read as JSON (True/False/None as Python writes them), else a string.
std::optional<ParsedCall> parse_tool_call(std::string_view body, const std::vector<ToolSpec>& tools);

// What the parser found in a piece of the answer, in the order of the text.
struct ToolEvent {
  enum class Kind {
    Content,    // `text`: text outside calls, safe to show now
    CallBegin,  // `call.name`: a call starts (streaming only)
    Arguments,  // `text`: the next fragment of the call's arguments (streaming only)
    CallEnd,    // `call`: the call is over; its arguments are the fragments' concatenation
  };
  Kind kind;
  std::string text;
  ParsedCall call;
};

// Streams content and calls out of the answer text as it arrives. Content is held back only
// while it could still be the start of <tool_call>.
//
// stream_arguments=false: a call is reported once, as a CallEnd, when its text is complete and
// parses (a call that does not parse is content). stream_arguments=true: a call is reported as
// CallBegin as soon as its name and the start of its arguments are known, then Arguments
// fragments as the model writes them: the arguments in the compact form the non-streamed
// answer gives, each fragment only what later text cannot change (a number once it ended, a
// string's characters as they come). A call whose text turns out malformed after it began (cut
// off by the token limit, a repeated key, broken JSON) still ends with a CallEnd whose arguments
// are the fragments sent; one that fails before is content. Either way the events depend only
// on the text, not on how it was cut into pieces.
class ToolCallParser {
 public:
  explicit ToolCallParser(std::vector<ToolSpec> tools, bool stream_arguments = false);
  ~ToolCallParser();
  ToolCallParser(ToolCallParser&&) noexcept;
  ToolCallParser& operator=(ToolCallParser&&) noexcept;

  using Out = std::vector<ToolEvent>;
  Out feed(std::string_view piece);
  Out finish();  // end of the answer: a call left open is parsed if it is complete, else content
  size_t calls_made() const { return calls_made_; }

  class ArgumentStreamer;  // tool_calls.cpp

 private:
  void emit_content(Out& out, std::string_view text);
  void stream_call(Out& out, size_t certain);
  void close_call(Out& out, bool closed);

  std::vector<ToolSpec> tools_;
  bool stream_arguments_ = false;
  bool in_call_ = false;
  std::string pending_;  // content: a possible start of <tool_call>; in a call: its body so far
  std::string held_ws_;  // whitespace after content, shown only if more content follows
  bool after_call_ = false;  // nothing but whitespace since the last call
  size_t calls_made_ = 0;
  // The call being streamed: its reader, and what went out of it.
  std::unique_ptr<ArgumentStreamer> streamer_;
  size_t streamed_bytes_ = 0;  // of pending_, read by streamer_
  bool begun_ = false;
  std::string sent_;  // the argument fragments sent
};

}  // namespace swiftlet::server
