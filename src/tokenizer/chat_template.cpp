// Native renderers for the Qwen chat templates in tests/data/chat/templates/. Each render_*
// function follows its template top to bottom; comments quote the Jinja they stand for.
#include "tokenizer/chat_template.h"

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace swiftlet {
namespace {

constexpr std::string_view kImStart = "<|im_start|>";
constexpr std::string_view kImEnd = "<|im_end|>";
constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kToolResponseOpen = "<tool_response>";
constexpr std::string_view kToolResponseClose = "</tool_response>";

// Qwen3 / Qwen3-Next tools block: the text around the one-JSON-per-line tool list.
constexpr std::string_view kQwen3ToolsIntro =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
constexpr std::string_view kQwen3ToolsOutro =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";

// Qwen3.5 / 3.6 tools block (XML-style calls).
constexpr std::string_view kQwen35ToolsIntro =
    "# Tools\n\nYou have access to the following functions:\n\n<tools>";
constexpr std::string_view kQwen35ToolsOutro =
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO "
    "suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\n"
    "value_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second "
    "parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your "
    "function call in natural language BEFORE the function call, but NOT after\n- If there is no "
    "function call available, answer the question like normal with your current knowledge and do "
    "not tell the user about function calls\n</IMPORTANT>";

bool contains(std::string_view s, std::string_view needle) { return s.find(needle) != std::string_view::npos; }

// ---- Python string methods as the templates use them ---------------------------------------

// Python's str.isspace() set, which `|trim` (str.strip()) removes.
bool is_py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Decodes the UTF-8 code point at s[i]; sets `len`. Malformed bytes decode as themselves with
// len 1 (no Python whitespace is among them, so trimming stops there).
uint32_t decode_at(std::string_view s, size_t i, size_t& len) {
  const auto b = static_cast<unsigned char>(s[i]);
  int n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) {
    len = 1;
    return b;
  }
  uint32_t c = n == 1 ? b : b & (0x7F >> n);
  for (int k = 1; k < n; ++k) {
    const auto cb = static_cast<unsigned char>(s[i + k]);
    if ((cb & 0xC0) != 0x80) {
      len = 1;
      return b;
    }
    c = (c << 6) | (cb & 0x3F);
  }
  len = n;
  return c;
}

// Jinja `|trim` = Python str.strip().
std::string_view py_trim(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    size_t len = 0;
    if (!is_py_space(decode_at(s, begin, len))) break;
    begin += len;
  }
  size_t end = s.size();
  while (end > begin) {
    size_t start = end - 1;  // back up to the first byte of the last code point
    while (start > begin && end - start < 4 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t len = 0;
    const uint32_t c = decode_at(s, start, len);
    if (start + len != end) {  // malformed tail: not whitespace
      break;
    }
    if (!is_py_space(c)) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

// .lstrip('\n') / .rstrip('\n') / .strip('\n')
std::string_view lstrip_nl(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}
std::string_view rstrip_nl(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}
std::string_view strip_nl(std::string_view s) { return lstrip_nl(rstrip_nl(s)); }

// s.split(sep)[0] and s.split(sep)[-1]
std::string_view before_first(std::string_view s, std::string_view sep) { return s.substr(0, s.find(sep)); }
std::string_view after_last(std::string_view s, std::string_view sep) {
  const size_t pos = s.rfind(sep);
  return pos == std::string_view::npos ? s : s.substr(pos + sep.size());
}

// The templates' reasoning split for an assistant turn without reasoning_content:
//   reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
//   content   = content.split('</think>')[-1].lstrip('\n')
struct Split {
  std::string_view reasoning;
  std::string_view content;
};
Split split_reasoning(const ChatMessage& m, std::string_view content) {
  if (!m.reasoning_content.empty()) return {m.reasoning_content, content};
  if (!contains(content, kThinkClose)) return {{}, content};
  return {lstrip_nl(after_last(rstrip_nl(before_first(content, kThinkClose)), kThinkOpen)),
          lstrip_nl(after_last(content, kThinkClose))};
}

bool is_tool_response(std::string_view s) {
  return s.starts_with(kToolResponseOpen) && s.ends_with(kToolResponseClose);
}

// ---- Shared pieces -------------------------------------------------------------------------

void check_roles(std::span<const ChatMessage> messages, TemplateKind kind) {
  if (messages.empty()) fail("chat template {}: no messages to render; add at least a user message", template_kind_name(kind));
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant" && r != "tool")
      fail("chat message {}: unknown role '{}'; use system, user, assistant or tool", i, r);
  }
}

void turn(std::string& out, std::string_view role, std::string_view content) {
  out.append(kImStart).append(role).append("\n").append(content).append(kImEnd).append("\n");
}

void tools_list(std::string& out, const ChatOptions& opts) {
  for (const std::string& t : opts.tools_json) out.append("\n").append(t);
}

// Consecutive tool results share one user turn. Qwen3 family: the header opens when
// `loop.first or messages[i-1].role != "tool"`; Qwen3.5: when `loop.previtem and previtem.role
// != "tool"` (so never for a tool message at index 0). Both close on the last of a run.
void tool_result(std::string& out, std::span<const ChatMessage> m, size_t i, std::string_view content,
                 bool header_at_index0) {
  const bool open = i == 0 ? header_at_index0 : m[i - 1].role != "tool";
  if (open) out.append(kImStart).append("user");
  out.append("\n").append(kToolResponseOpen).append("\n").append(content).append("\n").append(kToolResponseClose);
  if (i + 1 == m.size() || m[i + 1].role != "tool") out.append(kImEnd).append("\n");
}

// Qwen3 family: `{%- if (loop.first and content) or (not loop.first) %}{{- '\n' }}` before each
// call, then `<tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>`.
void qwen3_tool_calls(std::string& out, const ChatMessage& msg, std::string_view content) {
  for (size_t k = 0; k < msg.tool_calls.size(); ++k) {
    const ToolCall& call = msg.tool_calls[k];
    if (k > 0 || !content.empty()) out.append("\n");
    out.append("<tool_call>\n{\"name\": \"").append(call.name).append("\", \"arguments\": ");
    out.append(call.arguments_json).append("}\n</tool_call>");
  }
}

// Qwen3.5/3.6: the first call opens with "\n\n" after non-blank content, later ones with "\n";
// each argument as `<parameter=NAME>\nVALUE\n</parameter>\n`. Values: 3.5 prints objects and
// arrays as JSON and anything else with `|string`; 3.6 prints strings as they are and anything
// else as JSON.
void qwen35_tool_calls(std::string& out, const ChatMessage& msg, std::string_view content, bool qwen36) {
  for (size_t k = 0; k < msg.tool_calls.size(); ++k) {
    const ToolCall& call = msg.tool_calls[k];
    if (k > 0) out.append("\n");
    else if (!py_trim(content).empty()) out.append("\n\n");
    out.append("<tool_call>\n<function=").append(call.name).append(">\n");
    for (const ToolCallArgument& a : call.arguments) {
      const bool as_json = qwen36 ? !a.is_string : a.is_container;
      out.append("<parameter=").append(a.name).append(">\n").append(as_json ? a.json : a.text).append("\n</parameter>\n");
    }
    out.append("</function>\n</tool_call>");
  }
}

// Qwen3 family header: tools block (with the system text inside) or a plain system turn.
void qwen3_header(std::string& out, std::span<const ChatMessage> m, const ChatOptions& opts) {
  const bool system_first = m[0].role == "system";
  if (!opts.tools_json.empty()) {
    out.append(kImStart).append("system\n");
    if (system_first) out.append(m[0].content).append("\n\n");
    out.append(kQwen3ToolsIntro);
    tools_list(out, opts);
    out.append(kQwen3ToolsOutro);
  } else if (system_first) {
    turn(out, "system", m[0].content);
  }
}

// ---- Qwen3 (hybrid) and Qwen3-Next Thinking -------------------------------------------------

void render_qwen3(std::string& out, std::span<const ChatMessage> m, const ChatOptions& opts, bool next_thinking) {
  qwen3_header(out, m, opts);
  // ns.last_query_index: the last user message that is not a wrapped tool response.
  size_t last_query = m.size() - 1;
  for (size_t i = m.size(); i-- > 0;) {
    if (m[i].role == "user" && !is_tool_response(m[i].content)) {
      last_query = i;
      break;
    }
  }
  for (size_t i = 0; i < m.size(); ++i) {
    const ChatMessage& msg = m[i];
    const bool last = i + 1 == m.size();
    if (msg.role == "user" || (msg.role == "system" && i != 0)) {
      turn(out, msg.role, msg.content);
    } else if (msg.role == "assistant") {
      const Split s = split_reasoning(msg, msg.content);
      out.append(kImStart).append("assistant\n");
      // {%- if loop.index0 > ns.last_query_index %}{%- if loop.last or reasoning_content %}
      if (i > last_query && (last || !s.reasoning.empty())) {
        out.append("<think>\n").append(strip_nl(s.reasoning)).append("\n</think>\n\n").append(lstrip_nl(s.content));
      } else {
        out.append(s.content);
      }
      qwen3_tool_calls(out, msg, s.content);
      out.append(kImEnd).append("\n");
    } else if (msg.role == "tool") {
      tool_result(out, m, i, msg.content, /*header_at_index0=*/true);
    }
  }
  if (opts.add_generation_prompt) {
    out.append(kImStart).append("assistant\n");
    if (next_thinking) {
      out.append("<think>\n");
    } else if (!opts.enable_thinking) {
      out.append("<think>\n\n</think>\n\n");
    }
  }
}

// ---- Qwen3-Next Instruct ---------------------------------------------------------------------

void render_qwen3_next_instruct(std::string& out, std::span<const ChatMessage> m, const ChatOptions& opts) {
  qwen3_header(out, m, opts);
  for (size_t i = 0; i < m.size(); ++i) {
    const ChatMessage& msg = m[i];
    if (msg.role == "user" || (msg.role == "system" && i != 0)) {
      turn(out, msg.role, msg.content);
    } else if (msg.role == "assistant") {
      out.append(kImStart).append("assistant\n").append(msg.content);  // reasoning_content is ignored
      qwen3_tool_calls(out, msg, msg.content);
      out.append(kImEnd).append("\n");
    } else if (msg.role == "tool") {
      tool_result(out, m, i, msg.content, /*header_at_index0=*/true);
    }
  }
  if (opts.add_generation_prompt) out.append(kImStart).append("assistant\n");
}

// ---- Qwen3.5 / 3.6 ---------------------------------------------------------------------------

void render_qwen35(std::string& out, std::span<const ChatMessage> m, const ChatOptions& opts, bool qwen36) {
  const bool system_first = m[0].role == "system";
  if (!opts.tools_json.empty()) {
    out.append(kImStart).append("system\n").append(kQwen35ToolsIntro);
    tools_list(out, opts);
    out.append(kQwen35ToolsOutro);
    if (system_first) {
      const std::string_view sys = py_trim(m[0].content);
      if (!sys.empty()) out.append("\n\n").append(sys);
    }
    out.append(kImEnd).append("\n");
  } else if (system_first) {
    turn(out, "system", py_trim(m[0].content));
  }

  size_t last_query = m.size();
  for (size_t i = m.size(); i-- > 0;) {
    if (m[i].role == "user" && !is_tool_response(py_trim(m[i].content))) {
      last_query = i;
      break;
    }
  }
  if (last_query == m.size())
    fail("chat template Qwen3.5: no user query in the messages (the template raises 'No user query "
         "found in messages.'); add a user message that is not only a <tool_response>");
  for (size_t i = 1; i < m.size(); ++i) {
    if (m[i].role == "system")
      fail("chat template Qwen3.5: the system message is message {}, but it must be the first one "
           "(the template raises 'System message must be at the beginning.'); move it to the front "
           "or merge it into the first system message",
           i);
  }

  for (size_t i = 0; i < m.size(); ++i) {
    const ChatMessage& msg = m[i];
    const std::string_view content = py_trim(msg.content);
    if (msg.role == "user") {
      turn(out, "user", content);
    } else if (msg.role == "assistant") {
      const Split s = split_reasoning(msg, content);
      out.append(kImStart).append("assistant\n");
      if ((qwen36 && opts.preserve_thinking) || i > last_query) {
        out.append("<think>\n").append(py_trim(s.reasoning)).append("\n</think>\n\n");
      }
      out.append(s.content);
      qwen35_tool_calls(out, msg, s.content, qwen36);
      out.append(kImEnd).append("\n");
    } else if (msg.role == "tool") {
      tool_result(out, m, i, content, /*header_at_index0=*/false);
    }
  }
  if (opts.add_generation_prompt) {
    out.append(kImStart).append("assistant\n");
    out.append(opts.enable_thinking ? "<think>\n" : "<think>\n\n</think>\n\n");
  }
}

}  // namespace

std::string_view template_kind_name(TemplateKind kind) {
  switch (kind) {
    case TemplateKind::Qwen3: return "Qwen3";
    case TemplateKind::Qwen3NextInstruct: return "Qwen3-Next-Instruct";
    case TemplateKind::Qwen3NextThinking: return "Qwen3-Next-Thinking";
    case TemplateKind::Qwen35: return "Qwen3.5";
    case TemplateKind::Qwen36: return "Qwen3.6";
  }
  return "?";
}

TemplateKind detect_template(std::string_view text, std::string_view model_type) {
  if (!text.empty()) {
    if (!contains(text, kImStart))
      fail("the chat template is not ChatML (no '<|im_start|>'); swiftlet renders only the Qwen "
           "ChatML templates — use a Qwen3, Qwen3-Next or Qwen3.5/3.6 checkpoint's tokenizer_config");
    // Qwen3.5/3.6: XML tool calls, content-part macro; 3.6 adds preserve_thinking.
    if (contains(text, "preserve_thinking")) return TemplateKind::Qwen36;
    if (contains(text, "<function=") || contains(text, "render_content(")) return TemplateKind::Qwen35;
    if (contains(text, "enable_thinking")) return TemplateKind::Qwen3;
    if (contains(text, "reasoning_content") || contains(text, "<think>")) return TemplateKind::Qwen3NextThinking;
    return TemplateKind::Qwen3NextInstruct;
  }
  if (model_type == "qwen3_5_moe" || model_type == "qwen3_5" || model_type == "qwen3_5_moe_text" ||
      model_type == "qwen3_5_text")
    return TemplateKind::Qwen35;
  if (model_type == "qwen3_next") return TemplateKind::Qwen3NextInstruct;  // config.json cannot tell Thinking
  if (model_type == "qwen3" || model_type == "qwen3_moe") return TemplateKind::Qwen3;
  fail("cannot tell which chat template to use: no chat_template text and model_type '{}' is not "
       "one of qwen3_next, qwen3_5_moe, qwen3_5, qwen3, qwen3_moe; check tokenizer_config.json "
       "(or chat_template.jinja) and config.json",
       model_type);
}

std::string render_chat(TemplateKind kind, std::span<const ChatMessage> messages, const ChatOptions& opts) {
  check_roles(messages, kind);
  std::string out;
  out.reserve(256 + messages.size() * 64);
  switch (kind) {
    case TemplateKind::Qwen3: render_qwen3(out, messages, opts, /*next_thinking=*/false); break;
    case TemplateKind::Qwen3NextThinking: render_qwen3(out, messages, opts, /*next_thinking=*/true); break;
    case TemplateKind::Qwen3NextInstruct: render_qwen3_next_instruct(out, messages, opts); break;
    case TemplateKind::Qwen35: render_qwen35(out, messages, opts, /*qwen36=*/false); break;
    case TemplateKind::Qwen36: render_qwen35(out, messages, opts, /*qwen36=*/true); break;
  }
  return out;
}

std::string render_seen(TemplateKind kind, std::span<const ChatMessage> history, const ChatOptions& opts) {
  if (history.empty()) return {};
  const ChatMessage& answer = history.back();
  if (answer.role != "assistant")
    fail("chat history must end with the assistant's answer to continue it, but its last message "
         "has role '{}'; append the generated text as an assistant message",
         answer.role);
  if (!answer.reasoning_content.empty())
    fail("the last assistant message must hold the raw generated text in content (reasoning and "
         "</think> included) with reasoning_content empty, to know what the model has seen");
  ChatOptions prompt_opts = opts;
  prompt_opts.add_generation_prompt = true;
  std::string seen = render_chat(kind, history.first(history.size() - 1), prompt_opts);
  seen.append(answer.content).append(kImEnd);
  return seen;
}

ChatContinuation plan_continuation(TemplateKind kind, std::span<const ChatMessage> history,
                                   std::span<const ChatMessage> new_messages, const ChatOptions& opts) {
  std::vector<ChatMessage> all(history.begin(), history.end());
  all.insert(all.end(), new_messages.begin(), new_messages.end());
  std::string full = render_chat(kind, all, opts);
  const std::string seen = render_seen(kind, history, opts);
  if (std::string_view(full).starts_with(seen)) return {true, full.substr(seen.size())};
  return {false, std::move(full)};
}

bool is_pure_append(TemplateKind kind, std::span<const ChatMessage> history, std::span<const ChatMessage> new_messages,
                    const ChatOptions& opts) {
  return plan_continuation(kind, history, new_messages, opts).pure_append;
}

std::string render_continuation(TemplateKind kind, std::span<const ChatMessage> history,
                                std::span<const ChatMessage> new_messages, const ChatOptions& opts) {
  ChatContinuation c = plan_continuation(kind, history, new_messages, opts);
  if (!c.pure_append)
    fail("the {} template re-renders earlier turns differently from what the model saw (see "
         "chat_template.h), so the next turn is not a pure append; re-prefill render_chat() of the "
         "whole conversation instead",
         template_kind_name(kind));
  return std::move(c.text);
}

}  // namespace swiftlet
