// Qwen ChatML prompts, rendered natively (no Jinja engine): each TemplateKind reproduces one
// real chat template byte for byte for string contents (model-math.md 9). The template texts
// and where they came from are in tests/data/chat/templates/; chat_template_test.cpp compares
// every golden rendered from them by tools/oracles/make_chat_goldens.js.
//
// Semantics follow transformers' apply_chat_template (Python Jinja2): `|trim` strips Python's
// Unicode whitespace, `.strip('\n')` strips newlines only.
//
// Structured `tool_calls` on assistant messages are rendered as each template renders them
// (Qwen3 family: JSON inside <tool_call>; Qwen3.5/3.6: <function=...><parameter=...>). Not
// covered: image/video content parts and the `developer` role.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace swiftlet {

enum class TemplateKind {
  Qwen3,              // Qwen3 hybrid thinking: `enable_thinking` false closes an empty think block
  Qwen3NextInstruct,  // Qwen3-Next-80B-A3B-Instruct (and Qwen3-2507 Instruct): no thinking at all
  Qwen3NextThinking,  // Qwen3-Next-80B-A3B-Thinking: the generation prompt always opens <think>
  Qwen35,             // Qwen3.5
  Qwen36,             // Qwen3.6: Qwen3.5 + preserve_thinking, non-string call arguments as JSON
};

std::string_view template_kind_name(TemplateKind kind);

// Which renderer matches a tokenizer_config `chat_template` / chat_template.jinja text, by
// telltale substrings. An empty text, or a ChatML template we do not recognise (a fine-tune's),
// falls back on config.json's model_type. Throws Error for a non-ChatML template or an unknown
// model_type.
TemplateKind detect_template(std::string_view jinja_text, std::string_view model_type);

// One argument of a structured tool call, in the forms the templates print it. Each is made
// by the caller (the server knows JSON; this layer does not).
struct ToolCallArgument {
  std::string name;
  std::string json;  // `tojson`: Python json.dumps with ", " / ": " separators, non-ASCII kept
  std::string text;  // `|string`: the string itself; Python str() of anything else (True, None)
  bool is_string = false;
  bool is_container = false;  // an object or an array
};

struct ToolCall {
  std::string name;
  std::string arguments_json;  // `tojson` of the whole arguments object (Qwen3 family)
  std::vector<ToolCallArgument> arguments;  // the same object's members, in order (Qwen3.5/3.6)
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool"
  std::string content;
  // Assistant turns only. Empty means absent: the templates then split the reasoning out of
  // `content` at `</think>` (a template's explicit empty string is not representable).
  std::string reasoning_content;
  std::vector<ToolCall> tool_calls = {};  // assistant turns only
};

struct ChatOptions {
  bool add_generation_prompt = true;
  // Qwen3 / Qwen3.5 only. Off by default in swiftlet (the Qwen3.5 template defaults to on):
  // the prompt then ends with a closed empty `<think>\n\n</think>\n\n`.
  bool enable_thinking = false;
  // Qwen3.6: keep the `<think>` block of every earlier assistant turn, not only those after
  // the last user query (the other templates ignore it).
  bool preserve_thinking = false;
  // Tool (function) definitions, each already serialised the way the templates' `tojson` does
  // it in transformers: Python json.dumps with ", " and ": " separators and non-ASCII kept.
  std::vector<std::string> tools_json;
};

// The whole prompt. Throws Error for input the template rejects: no messages, an unknown role,
// and for Qwen3.5 a system message that is not first or no user query.
std::string render_chat(TemplateKind kind, std::span<const ChatMessage> messages, const ChatOptions& opts);

// ---- Multi-turn continuity -----------------------------------------------------------------
// A chat session keeps the model state of everything the model has seen and wants to prefill
// only the new tokens of the next turn. After a turn the model has seen
//     render_chat(history[:-1], generation prompt) + raw answer + "<|im_end|>"
// where history's last message is the assistant's answer with `content` = the raw generated
// text (everything after the generation prompt up to, not including, <|im_end|>; reasoning and
// `</think>` included) and `reasoning_content` empty. Re-rendering the conversation with the
// next messages is a pure append of that text only when the template renders the old turns
// exactly as they were seen. It is NOT when:
//   - Qwen3 / Qwen3-Next-Thinking / Qwen3.5 without preserve_thinking: a new user query moves
//     the answer before the last query, and its think block (also the closed empty one of
//     enable_thinking=false) is dropped from history;
//   - Qwen3.5: contents are trimmed, so an answer ending in whitespace or a newline differs;
//   - the options (enable_thinking, tools) changed between turns.
// It is for Qwen3-Next-Instruct, for Qwen3.5 tool loops (a tool result is not a user query),
// and for Qwen3.6 with preserve_thinking. When it is not, re-prefill the full prompt.

struct ChatContinuation {
  bool pure_append = false;
  // pure_append: the text to append after what the model has seen; else: the full prompt to
  // prefill from scratch.
  std::string text;
};

// What the model has seen at the end of `history` (see above); "" for an empty history.
std::string render_seen(TemplateKind kind, std::span<const ChatMessage> history, const ChatOptions& opts);

// Plans the next turn: `history` ends with the assistant's raw answer (or is empty, for the
// first turn), `new_messages` are the user/tool messages to add.
ChatContinuation plan_continuation(TemplateKind kind, std::span<const ChatMessage> history,
                                   std::span<const ChatMessage> new_messages, const ChatOptions& opts);

bool is_pure_append(TemplateKind kind, std::span<const ChatMessage> history,
                    std::span<const ChatMessage> new_messages, const ChatOptions& opts);

// The text to append; throws Error when the template does not make the next turn a pure append
// (check is_pure_append first, or use plan_continuation).
std::string render_continuation(TemplateKind kind, std::span<const ChatMessage> history,
                                std::span<const ChatMessage> new_messages, const ChatOptions& opts);

}  // namespace swiftlet
