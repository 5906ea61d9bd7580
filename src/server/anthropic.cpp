#include "server/anthropic.h"

#include "core/error.h"
#include "server/request_json.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>

namespace swiftlet::server {

namespace {

// Anthropic names nested parameters with dots: messages.1.content.0.type
std::string at(const std::string& base, size_t i) { return fmt::format("{}.{}", base, i); }

std::string text_of(const json& v, const std::string& where) {
  if (!v.is_string()) wrong_type(where, "a string", v);
  return v.get<std::string>();
}

// A string, or an array of text blocks (system prompts, tool results).
std::string text_blocks(const json& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) wrong_type(where, "a string or an array of text blocks", c);
  std::string out;
  for (size_t k = 0; k < c.size(); ++k) {
    const json& b = c[k];
    const std::string bp = at(where, k);
    if (!b.is_object()) wrong_type(bp, "an object", b);
    const json* type = field(b, "type");
    if (!type) missing(bp + ".type");
    if (*type != "text")
      throw invalid_request(fmt::format("content block type {} is not supported here: only text blocks are", type->dump()),
                            bp + ".type", "unsupported_value");
    const json* t = field(b, "text");
    if (!t) missing(bp + ".text");
    out += text_of(*t, bp + ".text");
  }
  return out;
}

void parse_anthropic_tools(const json& j, CompletionRequest& r) {
  if (const json* tools = field(j, "tools")) {
    if (!tools->is_array()) wrong_type("tools", "an array", *tools);
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      const std::string tp = at("tools", i);
      if (!t.is_object()) wrong_type(tp, "an object", t);
      if (const json* type = field(t, "type"); type && *type != "custom")
        throw invalid_request(fmt::format("tool type {} is not supported: this server runs client tools only", type->dump()),
                              tp + ".type", "unsupported_value");
      const json* name = field(t, "name");
      if (!name) missing(tp + ".name");
      const std::string n = text_of(*name, tp + ".name");
      if (n.empty() || n.size() > 128 || !std::all_of(n.begin(), n.end(), [](char c) {
            return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
          }))
        bad_value(tp + ".name", fmt::format("'{}' is not a tool name: use 1 to 128 letters, digits, '_' or '-'", n));
      for (const ToolSpec& other : r.tools)
        if (other.name == n) bad_value(tp + ".name", fmt::format("two tools are named '{}'", n));
      const json* schema = field(t, "input_schema");
      if (!schema) missing(tp + ".input_schema");
      if (!schema->is_object()) wrong_type(tp + ".input_schema", "a JSON schema object", *schema);
      // The templates print tools in OpenAI's shape, as servers hand them to transformers.
      json fn = {{"name", n}};
      if (const json* d = field(t, "description")) fn["description"] = text_of(*d, tp + ".description");
      fn["parameters"] = *schema;
      r.tools_json.push_back(py_json(json{{"type", "function"}, {"function", fn}}));
      r.tools.push_back({n, *schema});
      r.tool_schema_at = "input_schema";
    }
  }
  using TC = CompletionRequest::ToolChoice;
  if (const json* tc = field(j, "tool_choice")) {
    if (!tc->is_object()) wrong_type("tool_choice", "an object", *tc);
    const json* type = field(*tc, "type");
    if (!type) missing("tool_choice.type");
    const std::string t = text_of(*type, "tool_choice.type");
    if (t == "auto") r.tool_choice = TC::Auto;
    else if (t == "any") r.tool_choice = TC::Required;
    else if (t == "none") r.tool_choice = TC::None;
    else if (t == "tool") {
      const json* name = field(*tc, "name");
      if (!name) missing("tool_choice.name");
      r.tool_choice = TC::Named;
      r.tool_choice_name = text_of(*name, "tool_choice.name");
      if (std::none_of(r.tools.begin(), r.tools.end(), [&](const ToolSpec& s) { return s.name == r.tool_choice_name; }))
        bad_value("tool_choice.name", fmt::format("no tool in 'tools' is named '{}'", r.tool_choice_name));
    } else {
      bad_value("tool_choice.type", fmt::format("'{}' is not one of 'auto', 'any', 'tool', 'none'", t));
    }
    if (auto d = get_bool(*tc, "disable_parallel_tool_use")) r.parallel_tool_calls = !*d;
    if ((r.tool_choice == TC::Required || r.tool_choice == TC::Named) && r.tools.empty())
      bad_value("tool_choice", "a tool call is asked for, but the request offers no tools");
  }
}

// One message's blocks onto the chat messages; tool ids seen so far in `ids`.
void add_message(const json& m, size_t i, std::vector<ChatMessage>& out, std::vector<std::string>& ids) {
  const std::string mp = at("messages", i);
  if (!m.is_object()) wrong_type(mp, "an object", m);
  const json* role = field(m, "role");
  if (!role) missing(mp + ".role");
  const std::string r = text_of(*role, mp + ".role");
  if (r != "user" && r != "assistant") bad_value(mp + ".role", fmt::format("'{}' is not one of 'user', 'assistant'", r));
  const json* content = field(m, "content");
  if (!content) missing(mp + ".content");
  if (content->is_string()) {
    out.push_back({r, content->get<std::string>(), ""});
    return;
  }
  if (!content->is_array()) wrong_type(mp + ".content", "a string or an array of content blocks", *content);
  ChatMessage cur{r, "", ""};
  bool have = false;  // cur holds something to add
  auto flush = [&] {
    if (have) out.push_back(std::move(cur));
    cur = {r, "", ""};
    have = false;
  };
  for (size_t k = 0; k < content->size(); ++k) {
    const json& b = (*content)[k];
    const std::string bp = at(mp + ".content", k);
    if (!b.is_object()) wrong_type(bp, "an object", b);
    const json* type = field(b, "type");
    if (!type) missing(bp + ".type");
    const std::string t = text_of(*type, bp + ".type");
    if (t == "text") {
      const json* text = field(b, "text");
      if (!text) missing(bp + ".text");
      if (!cur.tool_calls.empty()) flush();  // text after a call starts a new turn's content
      cur.content += text_of(*text, bp + ".text");
      have = true;
    } else if (t == "thinking" && r == "assistant") {
      const json* th = field(b, "thinking");
      if (!th) missing(bp + ".thinking");
      cur.reasoning_content += text_of(*th, bp + ".thinking");
      have = true;
    } else if (t == "redacted_thinking" && r == "assistant") {
      continue;  // opaque to this server
    } else if (t == "tool_use" && r == "assistant") {
      const json* id = field(b, "id");
      if (!id) missing(bp + ".id");
      const json* name = field(b, "name");
      if (!name) missing(bp + ".name");
      const json* input = field(b, "input");
      if (input && !input->is_object()) wrong_type(bp + ".input", "an object", *input);
      ids.push_back(text_of(*id, bp + ".id"));
      cur.tool_calls.push_back(template_tool_call(text_of(*name, bp + ".name"), input ? *input : json::object()));
      have = true;
    } else if (t == "tool_result" && r == "user") {
      const json* id = field(b, "tool_use_id");
      if (!id) missing(bp + ".tool_use_id");
      const std::string tid = text_of(*id, bp + ".tool_use_id");
      if (std::find(ids.begin(), ids.end(), tid) == ids.end())
        bad_value(bp + ".tool_use_id", fmt::format("no earlier assistant message has a tool_use block with id '{}'", tid));
      flush();
      const json* c = field(b, "content");
      out.push_back({"tool", c ? text_blocks(*c, bp + ".content") : "", ""});
    } else if (t == "image" || t == "document" || t == "search_result" || t == "server_tool_use") {
      throw invalid_request(fmt::format("content blocks of type '{}' are not supported: this server takes text", t),
                            bp + ".type", "unsupported_value");
    } else {
      bad_value(bp + ".type", fmt::format("'{}' is not a content block type a {} message can hold", t, r));
    }
  }
  flush();
}

const char* error_type(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

const char* stop_reason(const JobEvent& ev, bool called) {
  if (ev.finish == FinishReason::Length) return "max_tokens";
  if (called) return "tool_use";
  if (!ev.stop_string.empty()) return "stop_sequence";
  return "end_turn";
}

}  // namespace

CompletionRequest parse_messages_request(const json& j, bool count_only) {
  CompletionRequest r;
  r.endpoint = Endpoint::ChatCompletions;
  const json* model = field(j, "model");
  if (!model) missing("model");
  r.model = text_of(*model, "model");
  if (!count_only) {
    auto n = get_integer(j, "max_tokens");
    if (!n) missing("max_tokens");
    if (*n < 1) bad_value("max_tokens", fmt::format("{} is less than the minimum of 1", *n));
    r.max_tokens = *n;
  }
  r.temperature = get_in_range(j, "temperature", 0, 1);
  r.top_p = get_in_range(j, "top_p", 0, 1, /*lo_open=*/true);
  if (auto k = get_integer(j, "top_k")) {
    if (*k < 0 || *k > INT_MAX) bad_value("top_k", fmt::format("{} is not a count of tokens", *k));
    r.top_k = int(*k);
  }
  if (const json* stop = field(j, "stop_sequences")) {
    if (!stop->is_array()) wrong_type("stop_sequences", "an array of strings", *stop);
    for (size_t i = 0; i < stop->size(); ++i) {
      r.stop.push_back(text_of((*stop)[i], at("stop_sequences", i)));
      if (r.stop.back().empty()) bad_value(at("stop_sequences", i), "stop sequences must not be empty");
    }
    if (r.stop.size() > 16) bad_value("stop_sequences", fmt::format("{} stop sequences; at most 16 are supported", r.stop.size()));
  }
  r.stream = get_bool(j, "stream").value_or(false);
  if (const json* th = field(j, "thinking")) {
    if (!th->is_object()) wrong_type("thinking", "an object", *th);
    const json* type = field(*th, "type");
    if (!type) missing("thinking.type");
    const std::string t = text_of(*type, "thinking.type");
    if (t != "enabled" && t != "disabled") bad_value("thinking.type", fmt::format("'{}' is not 'enabled' or 'disabled'", t));
    r.enable_thinking = t == "enabled";
  }
  if (const json* sys = field(j, "system")) r.messages.push_back({"system", text_blocks(*sys, "system"), ""});
  const json* msgs = field(j, "messages");
  if (!msgs) missing("messages");
  if (!msgs->is_array()) wrong_type("messages", "an array", *msgs);
  if (msgs->empty()) bad_value("messages", "the conversation is empty; give at least one message");
  std::vector<std::string> ids;
  for (size_t i = 0; i < msgs->size(); ++i) add_message((*msgs)[i], i, r.messages, ids);
  if (r.messages.back().role == "assistant")
    bad_value(at("messages", msgs->size() - 1),
              "a final assistant message (a prefill to continue) is not supported; end with a user message");
  parse_anthropic_tools(j, r);
  return r;
}

std::string anthropic_error_json(const ApiError& e) {
  const std::string message = e.param().empty() ? e.what() : fmt::format("{}: {}", e.param(), e.what());
  return json{{"type", "error"}, {"error", {{"type", error_type(e.status())}, {"message", message}}}}.dump(
      -1, ' ', false, json::error_handler_t::replace);
}

Reply anthropic_error_reply(const ApiError& e) {
  Reply r;
  r.status = e.status();
  r.body = anthropic_error_json(e);
  return r;
}

Reply Routes::error_reply_for(const std::string& path, const ApiError& e) {
  return path.starts_with("/v1/messages") ? anthropic_error_reply(e) : error_reply(e);
}

// ------------------------------------------------------------------------------- stream

void AnthropicStream::event(std::string& out, const char* name, const json& data) const {
  out += fmt::format("event: {}\ndata: {}\n\n", name, data.dump(-1, ' ', false, json::error_handler_t::replace));
}

void AnthropicStream::on_start(std::string& out) {
  if (!sse_) return;
  event(out, "message_start",
        {{"type", "message_start"},
         {"message",
          {{"id", ctx_.id}, {"type", "message"}, {"role", "assistant"}, {"model", ctx_.model}, {"content", json::array()},
           {"stop_reason", nullptr}, {"stop_sequence", nullptr},
           {"usage", {{"input_tokens", ctx_.prompt_tokens}, {"output_tokens", 0}}}}}});
}

void AnthropicStream::close_block(std::string& out) {
  if (open_ == Block::None) return;
  on_flush(out);
  if (sse_) event(out, "content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
  open_ = Block::None;
}

// Streamed, a text or thinking block's text waits for on_flush: the pieces that came together
// go out as one delta.
void AnthropicStream::emit(std::string& out, Block kind, std::string_view text) {
  if (text.empty()) return;
  const bool thinking = kind == Block::Thinking;
  const char* key = thinking ? "thinking" : "text";
  if (open_ != kind) {
    close_block(out);
    ++index_;
    open_ = kind;
    json block = thinking ? json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}} : json{{"type", "text"}, {"text", ""}};
    if (sse_) event(out, "content_block_start", {{"type", "content_block_start"}, {"index", index_}, {"content_block", block}});
    else blocks_.push_back(std::move(block));
  }
  if (sse_) delta_ += text;
  else blocks_.back()[key] = blocks_.back()[key].get<std::string>() + std::string(text);
}

void AnthropicStream::on_flush(std::string& out) {
  if (delta_.empty()) return;
  const bool thinking = open_ == Block::Thinking;
  json delta = {{"type", thinking ? "thinking_delta" : "text_delta"}, {thinking ? "thinking" : "text", delta_}};
  event(out, "content_block_delta", {{"type", "content_block_delta"}, {"index", index_}, {"delta", delta}});
  delta_.clear();
}

// A streamed call is a tool_use block with empty input, then input_json_delta events with the
// arguments' fragments as the model writes them, then its stop.
void AnthropicStream::on_tool_event(std::string& out, ToolEvent ev) {
  switch (ev.kind) {
    case ToolEvent::Kind::Content: emit(out, Block::Text, ev.text); return;
    case ToolEvent::Kind::CallBegin:  // streamed only
      skip_call_ = !ctx_.parallel_tool_calls && called_;
      if (skip_call_) return;
      called_ = true;
      close_block(out);
      ++index_;
      open_ = Block::ToolUse;
      event(out, "content_block_start",
            {{"type", "content_block_start"}, {"index", index_},
             {"content_block", {{"type", "tool_use"}, {"id", random_id("toolu_")}, {"name", ev.call.name}, {"input", json::object()}}}});
      return;
    case ToolEvent::Kind::Arguments:
      if (skip_call_) return;
      event(out, "content_block_delta",
            {{"type", "content_block_delta"}, {"index", index_}, {"delta", {{"type", "input_json_delta"}, {"partial_json", ev.text}}}});
      return;
    case ToolEvent::Kind::CallEnd:
      if (sse_) {
        if (!skip_call_) close_block(out);
        skip_call_ = false;
        return;
      }
      if (!ctx_.parallel_tool_calls && called_) return;
      called_ = true;
      close_block(out);
      ++index_;
      blocks_.push_back({{"type", "tool_use"}, {"id", random_id("toolu_")}, {"name", ev.call.name}, {"input", json::parse(ev.call.arguments)}});
      return;
  }
}

void AnthropicStream::on_text(std::string& out, std::string_view text) {
  ThinkSplitter::Out parts;
  if (ctx_.split_thinking) parts = think_.feed(text);
  else parts.content = text;
  emit(out, Block::Thinking, parts.reasoning);
  if (!tool_parser_) {
    emit(out, Block::Text, parts.content);
    return;
  }
  for (ToolEvent& ev : tool_parser_->feed(parts.content)) on_tool_event(out, std::move(ev));
}

void AnthropicStream::on_done(std::string& out, const JobEvent& ev) {
  if (ctx_.split_thinking) {
    ThinkSplitter::Out rest = think_.flush();
    ctx_.split_thinking = false;
    emit(out, Block::Thinking, rest.reasoning);
    if (!rest.content.empty()) on_text(out, rest.content);
  }
  if (tool_parser_)
    for (ToolEvent& ev : tool_parser_->finish()) on_tool_event(out, std::move(ev));
  close_block(out);
  const char* reason = stop_reason(ev, called_);
  const json stop_sequence = ev.stop_string.empty() ? json(nullptr) : json(ev.stop_string);
  if (sse_) {
    event(out, "message_delta",
          {{"type", "message_delta"}, {"delta", {{"stop_reason", reason}, {"stop_sequence", stop_sequence}}},
           {"usage", {{"output_tokens", ev.stats.generated_tokens}}}});
    event(out, "message_stop", {{"type", "message_stop"}});
    return;
  }
  const json body = {{"id", ctx_.id},
                     {"type", "message"},
                     {"role", "assistant"},
                     {"model", ctx_.model},
                     {"content", blocks_},
                     {"stop_reason", reason},
                     {"stop_sequence", stop_sequence},
                     {"usage", {{"input_tokens", ev.stats.prompt_tokens}, {"output_tokens", ev.stats.generated_tokens}}}};
  out += body.dump(-1, ' ', false, json::error_handler_t::replace);
}

void AnthropicStream::on_failed(std::string& out, const JobEvent& ev) {
  const ApiError e = ev.client_error ? invalid_request(ev.text) : internal_error(ev.text);
  status_ = e.status();
  if (sse_) out += "event: error\ndata: " + anthropic_error_json(e) + "\n\n";
  else out = anthropic_error_json(e);
}

// ------------------------------------------------------------------------------- routes

Reply Routes::messages(std::string_view body) {
  try {
    const CompletionRequest req = parse_messages_request(parse_json_body(body), /*count_only=*/false);
    Started s = start(req, "msg_");
    Reply r;
    r.content_type = req.stream ? "text/event-stream" : "application/json";
    r.stream = std::make_shared<AnthropicStream>(std::move(s.job), std::move(s.ctx));
    add_unenforced_header(r, s.unenforced);
    return r;
  } catch (const ApiError& e) {
    return anthropic_error_reply(e);
  }
}

Reply Routes::count_tokens(std::string_view body) {
  try {
    const CompletionRequest req = parse_messages_request(parse_json_body(body), /*count_only=*/true);
    const Engine& engine = ready_engine();
    Reply r;
    r.body = json{{"input_tokens", engine.require_tokenizer().encode(render_prompt(req, engine), true).size()}}.dump();
    return r;
  } catch (const ApiError& e) {
    return anthropic_error_reply(e);
  }
}

}  // namespace swiftlet::server
