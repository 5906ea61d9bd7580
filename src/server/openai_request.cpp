// Type checking of the OpenAI request bodies (/v1/chat/completions, /v1/completions): each field
// read once, a 400 naming its path when it has the wrong type or value (declared in routes.h).
#include "server/routes.h"

#include "server/request_json.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>

namespace swiftlet::server {

using json = nlohmann::ordered_json;

namespace {

// Fields both endpoints share.
void parse_common(const json& j, CompletionRequest& r) {
  if (auto m = get_string(j, "model")) r.model = *m;
  // max_completion_tokens is the newer name; it wins when both are given.
  for (const char* key : {"max_tokens", "max_completion_tokens"})
    if (auto n = get_integer(j, key)) {
      if (*n < 1) bad_value(key, fmt::format("{} is less than the minimum of 1", *n));
      r.max_tokens = *n;
    }
  r.temperature = get_in_range(j, "temperature", 0, 2);
  r.top_p = get_in_range(j, "top_p", 0, 1, /*lo_open=*/true);
  r.min_p = get_in_range(j, "min_p", 0, 1);
  r.presence_penalty = get_in_range(j, "presence_penalty", -2, 2);
  r.frequency_penalty = get_in_range(j, "frequency_penalty", -2, 2);
  r.repetition_penalty = get_in_range(j, "repetition_penalty", 0, 10, /*lo_open=*/true);
  if (auto k = get_integer(j, "top_k")) {
    if (*k < -1 || *k > INT_MAX) bad_value("top_k", fmt::format("{} is not -1 (off), 0 (off) or a positive count", *k));
    r.top_k = int(std::max<int64_t>(0, *k));
  }
  if (auto s = get_integer(j, "seed")) r.seed = uint64_t(*s);
  if (const json* stop = field(j, "stop")) {
    if (stop->is_string()) {
      r.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (size_t i = 0; i < stop->size(); ++i) {
        if (!(*stop)[i].is_string()) wrong_type(fmt::format("stop[{}]", i), "a string", (*stop)[i]);
        r.stop.push_back((*stop)[i].get<std::string>());
      }
    } else {
      wrong_type("stop", "a string or an array of strings", *stop);
    }
    if (r.stop.size() > 16) bad_value("stop", fmt::format("{} stop strings; at most 16 are supported", r.stop.size()));
    for (const auto& s : r.stop)
      if (s.empty()) bad_value("stop", "stop strings must not be empty");
  }
  if (auto n = get_integer(j, "n"); n && *n != 1)
    throw invalid_request(fmt::format("n={} is not supported: this server generates one choice per request (n=1)", *n),
                          "n", "unsupported_value");
  r.stream = get_bool(j, "stream").value_or(false);
  if (const json* so = field(j, "stream_options")) {
    if (!so->is_object()) wrong_type("stream_options", "an object", *so);
    r.include_usage = get_bool(*so, "include_usage").value_or(false);
  }
  if (auto u = get_string(j, "user")) r.user = *u;
}

// /v1/completions takes no tools and answers in text only.
void refuse_chat_only(const json& j) {
  if (const json* tools = field(j, "tools")) {
    if (!tools->is_array()) wrong_type("tools", "an array", *tools);
    if (!tools->empty())
      throw invalid_request("tools are supported on /v1/chat/completions only", "tools", "unsupported_parameter");
  }
  if (const json* rf = field(j, "response_format")) {
    if (!rf->is_object()) wrong_type("response_format", "an object", *rf);
    auto type = get_string(*rf, "type");
    if (type && *type != "text")
      throw invalid_request(fmt::format("response_format '{}' is supported on /v1/chat/completions only", *type),
                            "response_format", "unsupported_value");
  }
}

// OpenAI function names: letters, digits, '_' and '-', at most 64.
void check_function_name(const std::string& name, const std::string& param) {
  const bool ok = !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
  if (!ok) bad_value(param, fmt::format("'{}' is not a function name: use 1 to 64 letters, digits, '_' or '-'", name));
}

void parse_tools(const json& j, CompletionRequest& r) {
  if (const json* tools = field(j, "tools")) {
    if (!tools->is_array()) wrong_type("tools", "an array", *tools);
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      const std::string tp = fmt::format("tools[{}]", i);
      if (!t.is_object()) wrong_type(tp, "an object", t);
      auto type = get_string(t, "type");
      if (!type) missing(tp + ".type");
      if (*type != "function") bad_value(tp + ".type", fmt::format("'{}' is not a tool type: use 'function'", *type));
      const json* f = field(t, "function");
      if (!f) missing(tp + ".function");
      if (!f->is_object()) wrong_type(tp + ".function", "an object", *f);
      auto name = get_string(*f, "name");
      if (!name) missing(tp + ".function.name");
      check_function_name(*name, tp + ".function.name");
      for (const ToolSpec& other : r.tools)
        if (other.name == *name) bad_value(tp + ".function.name", fmt::format("two tools are named '{}'", *name));
      ToolSpec spec{*name, nullptr};
      if (const json* params = field(*f, "parameters")) {
        if (!params->is_object()) wrong_type(tp + ".function.parameters", "a JSON schema object", *params);
        spec.parameters = *params;
      }
      get_string(*f, "description");
      r.tools.push_back(std::move(spec));
      r.tools_json.push_back(py_json(t));  // the template's `tool | tojson`
    }
  }
  if (auto p = get_bool(j, "parallel_tool_calls")) r.parallel_tool_calls = *p;
  using TC = CompletionRequest::ToolChoice;
  if (const json* tc = field(j, "tool_choice")) {
    if (tc->is_string()) {
      const std::string c = tc->get<std::string>();
      if (c == "none") r.tool_choice = TC::None;
      else if (c == "auto") r.tool_choice = TC::Auto;
      else if (c == "required") r.tool_choice = TC::Required;
      else bad_value("tool_choice", fmt::format("'{}' is not one of 'none', 'auto', 'required' or a function", c));
    } else if (tc->is_object()) {
      const json* f = field(*tc, "function");
      if (!f) missing("tool_choice.function");
      if (!f->is_object()) wrong_type("tool_choice.function", "an object", *f);
      auto name = get_string(*f, "name");
      if (!name) missing("tool_choice.function.name");
      r.tool_choice = TC::Named;
      r.tool_choice_name = *name;
    } else {
      wrong_type("tool_choice", "a string or an object", *tc);
    }
  }
  if ((r.tool_choice == TC::Required || r.tool_choice == TC::Named) && r.tools.empty())
    bad_value("tool_choice", "a tool call is asked for, but the request offers no tools");
  if (r.tool_choice == TC::Named &&
      std::none_of(r.tools.begin(), r.tools.end(), [&](const ToolSpec& t) { return t.name == r.tool_choice_name; }))
    bad_value("tool_choice.function.name", fmt::format("no tool in 'tools' is named '{}'", r.tool_choice_name));
}

void parse_response_format(const json& j, CompletionRequest& r) {
  const json* rf = field(j, "response_format");
  if (!rf) return;
  if (!rf->is_object()) wrong_type("response_format", "an object", *rf);
  auto type = get_string(*rf, "type");
  if (!type) missing("response_format.type");
  using F = CompletionRequest::Format;
  if (*type == "text") {
    r.format = F::Text;
  } else if (*type == "json_object") {
    r.format = F::JsonObject;
  } else if (*type == "json_schema") {
    const json* js = field(*rf, "json_schema");
    if (!js) missing("response_format.json_schema");
    if (!js->is_object()) wrong_type("response_format.json_schema", "an object", *js);
    const json* schema = field(*js, "schema");
    if (!schema) missing("response_format.json_schema.schema");
    if (schema->is_string()) {
      // Some clients send the schema as JSON text.
      json parsed = json::parse(schema->get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded())
        bad_value("response_format.json_schema.schema", "the schema is a string that is not JSON");
      r.json_schema = std::move(parsed);
    } else {
      r.json_schema = *schema;
    }
    if (!r.json_schema.is_object() && !r.json_schema.is_boolean())
      wrong_type("response_format.json_schema.schema", "a JSON schema object", r.json_schema);
    get_string(*js, "name");
    get_bool(*js, "strict");
    r.format = F::JsonSchema;
  } else {
    bad_value("response_format.type", fmt::format("'{}' is not one of 'text', 'json_object', 'json_schema'", *type));
  }
}

// An assistant message's tool_calls, as the templates take them.
std::vector<ToolCall> parse_tool_calls(const json& tc, size_t i, std::vector<std::string>& ids) {
  const std::string where = fmt::format("messages[{}].tool_calls", i);
  if (!tc.is_array()) wrong_type(where, "an array", tc);
  std::vector<ToolCall> calls;
  for (size_t k = 0; k < tc.size(); ++k) {
    const std::string cp = fmt::format("{}[{}]", where, k);
    const json& c = tc[k];
    if (!c.is_object()) wrong_type(cp, "an object", c);
    auto id = get_string(c, "id");
    if (!id) missing(cp + ".id");
    ids.push_back(*id);
    if (auto type = get_string(c, "type"); type && *type != "function")
      bad_value(cp + ".type", fmt::format("'{}' is not a tool call type: use 'function'", *type));
    const json* f = field(c, "function");
    if (!f) missing(cp + ".function");
    if (!f->is_object()) wrong_type(cp + ".function", "an object", *f);
    auto name = get_string(*f, "name");
    if (!name) missing(cp + ".function.name");
    const json* a = field(*f, "arguments");
    json args = json::object();
    if (a && a->is_string()) {
      args = json::parse(a->get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (args.is_discarded() || !args.is_object())
        bad_value(cp + ".function.arguments", "the arguments must be the text of a JSON object");
    } else if (a && a->is_object()) {
      args = *a;
    } else if (a) {
      wrong_type(cp + ".function.arguments", "a string", *a);
    }
    calls.push_back(template_tool_call(*name, args));
  }
  return calls;
}

std::string message_content(const json& m, size_t i) {
  const std::string where = fmt::format("messages[{}].content", i);
  const json* c = field(m, "content");
  if (!c) return "";
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) wrong_type(where, "a string or an array of content parts", *c);
  std::string text;
  for (size_t k = 0; k < c->size(); ++k) {
    const json& part = (*c)[k];
    const std::string pw = fmt::format("{}[{}]", where, k);
    if (!part.is_object()) wrong_type(pw, "an object", part);
    auto type = get_string(part, "type");
    if (!type) missing(pw + ".type");
    if (*type != "text")
      throw invalid_request(fmt::format("content part type '{}' is not supported: this server takes text parts only", *type),
                            pw + ".type", "unsupported_value");
    const json* t = field(part, "text");
    if (!t || !t->is_string()) wrong_type(pw + ".text", "a string", t ? *t : json(nullptr));
    text += t->get<std::string>();
  }
  return text;
}

}  // namespace

json parse_json_body(std::string_view body) {
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    throw invalid_request("We could not parse the JSON body of your request: it is not valid JSON.", "", "invalid_json");
  if (!j.is_object()) throw invalid_request(fmt::format("The request body must be a JSON object, not {}.", type_name(j)));
  return j;
}

CompletionRequest parse_chat_request(const json& j) {
  CompletionRequest r;
  r.endpoint = Endpoint::ChatCompletions;
  parse_common(j, r);
  const json* msgs = field(j, "messages");
  if (!msgs) missing("messages");
  if (!msgs->is_array()) wrong_type("messages", "an array", *msgs);
  if (msgs->empty()) bad_value("messages", "the conversation is empty; give at least one message");
  std::vector<std::string> call_ids;  // of the assistant tool calls so far
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    if (!m.is_object()) wrong_type(fmt::format("messages[{}]", i), "an object", m);
    const std::string rp = fmt::format("messages[{}].role", i);
    const json* role = field(m, "role");
    if (!role) missing(rp);
    if (!role->is_string()) wrong_type(rp, "a string", *role);
    ChatMessage cm;
    cm.role = role->get<std::string>();
    if (cm.role == "developer") cm.role = "system";  // OpenAI's newer name for the system role
    if (cm.role != "system" && cm.role != "user" && cm.role != "assistant" && cm.role != "tool")
      bad_value(rp, fmt::format("'{}' is not one of 'system', 'developer', 'user', 'assistant', 'tool'", cm.role));
    cm.content = message_content(m, i);
    if (cm.role == "assistant") {
      if (auto rc = get_string(m, "reasoning_content")) cm.reasoning_content = *rc;
      if (const json* tc = field(m, "tool_calls")) cm.tool_calls = parse_tool_calls(*tc, i, call_ids);
    } else if (cm.role == "tool") {
      const std::string ip = fmt::format("messages[{}].tool_call_id", i);
      auto id = get_string(m, "tool_call_id");
      if (!id) missing(ip);
      if (std::find(call_ids.begin(), call_ids.end(), *id) == call_ids.end())
        bad_value(ip, fmt::format("no earlier assistant message has a tool call with id '{}'", *id));
    }
    r.messages.push_back(std::move(cm));
  }
  parse_tools(j, r);
  parse_response_format(j, r);
  if (auto lp = get_bool(j, "logprobs"); lp && *lp)
    throw invalid_request("logprobs are not supported by this server", "logprobs", "unsupported_parameter");
  if (const json* kw = field(j, "chat_template_kwargs")) {
    if (!kw->is_object()) wrong_type("chat_template_kwargs", "an object", *kw);
    r.enable_thinking = get_bool(*kw, "enable_thinking");
  }
  return r;
}

CompletionRequest parse_completion_request(const json& j) {
  CompletionRequest r;
  r.endpoint = Endpoint::Completions;
  parse_common(j, r);
  refuse_chat_only(j);
  const json* p = field(j, "prompt");
  if (!p) missing("prompt");
  auto ids_from = [&](const json& arr, const std::string& where) {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < arr.size(); ++i) {
      if (!arr[i].is_number_integer()) wrong_type(fmt::format("{}[{}]", where, i), "an integer token id", arr[i]);
      if (!integer_within(arr[i], 0, INT32_MAX))
        bad_value(fmt::format("{}[{}]", where, i), fmt::format("{} is not a token id", arr[i].dump()));
      ids.push_back(arr[i].get<int32_t>());
    }
    return ids;
  };
  if (p->is_string()) {
    r.prompt = p->get<std::string>();
  } else if (p->is_array()) {
    // A batch of prompts is one choice per prompt: only a batch of one is supported.
    if (!p->empty() && ((*p)[0].is_string() || (*p)[0].is_array())) {
      if (p->size() != 1)
        throw invalid_request(fmt::format("{} prompts given: this server completes one prompt per request", p->size()),
                              "prompt", "unsupported_value");
      const json& one = (*p)[0];
      if (one.is_string()) r.prompt = one.get<std::string>();
      else {
        r.prompt_ids = ids_from(one, "prompt[0]");
        r.prompt_is_ids = true;
      }
    } else {
      r.prompt_ids = ids_from(*p, "prompt");
      r.prompt_is_ids = true;
    }
  } else {
    wrong_type("prompt", "a string, an array of strings or an array of token ids", *p);
  }
  r.echo = get_bool(j, "echo").value_or(false);
  if (auto sfx = get_string(j, "suffix"); sfx && !sfx->empty())
    throw invalid_request("suffix is not supported by this server", "suffix", "unsupported_parameter");
  if (const json* lp = field(j, "logprobs"); lp && !(lp->is_number() && lp->get<double>() == 0))
    throw invalid_request("logprobs are not supported by this server", "logprobs", "unsupported_parameter");
  if (auto bo = get_integer(j, "best_of"); bo && *bo != 1)
    throw invalid_request("best_of is not supported (only 1)", "best_of", "unsupported_value");
  return r;
}

}  // namespace swiftlet::server
