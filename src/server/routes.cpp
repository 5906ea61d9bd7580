#include "server/routes.h"

#include "core/error.h"
#include "server/chat_page.h"
#include "server/metrics.h"
#include "server/output_grammar.h"
#include "server/request_json.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <ctime>
#include <random>

namespace swiftlet::server {

using json = nlohmann::ordered_json;

// ------------------------------------------------------------------------------------ errors

ApiError invalid_request(std::string m, std::string param, std::string code) {
  return {400, "invalid_request_error", std::move(m), std::move(param), std::move(code)};
}
ApiError not_found(std::string m, std::string code) { return {404, "invalid_request_error", std::move(m), "", std::move(code)}; }
ApiError unauthorized(std::string m) { return {401, "invalid_request_error", std::move(m), "", "invalid_api_key"}; }
ApiError payload_too_large(std::string m) { return {413, "invalid_request_error", std::move(m), "", "payload_too_large"}; }
ApiError queue_full(std::string m) { return {429, "rate_limit_error", std::move(m), "", "queue_full"}; }
ApiError unavailable(std::string m, std::string code) { return {503, "server_error", std::move(m), "", std::move(code)}; }
ApiError internal_error(std::string m) { return {500, "server_error", std::move(m), "", "internal_error"}; }

std::string error_json(const ApiError& e) {
  auto str_or_null = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
  json j = {{"error",
             {{"message", e.what()}, {"type", e.type()}, {"param", str_or_null(e.param())}, {"code", str_or_null(e.code())}}}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Reply Routes::error_reply(const ApiError& e) {
  Reply r;
  r.status = e.status();
  r.body = error_json(e);
  return r;
}

// --------------------------------------------------------------------- request type checking

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
      const int64_t id = arr[i].get<int64_t>();
      if (id < 0 || id > INT32_MAX) bad_value(fmt::format("{}[{}]", where, i), fmt::format("{} is not a token id", id));
      ids.push_back(int32_t(id));
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

// ------------------------------------------------------------------------------- planning

std::string render_prompt(const CompletionRequest& req, const Engine& engine) {
  ChatOptions co;
  co.enable_thinking = req.enable_thinking.value_or(false);
  co.tools_json = req.tools_json;
  try {
    return render_chat(engine.template_kind(), req.messages, co);
  } catch (const Error& e) {
    throw invalid_request(e.what(), "messages", "invalid_value");
  }
}

PlannedJob plan_job(const CompletionRequest& req, const Engine& engine, int64_t max_context,
                    int default_completion_tokens) {
  const Tokenizer& tok = engine.require_tokenizer();
  const bool chat = req.endpoint == Endpoint::ChatCompletions;
  PlannedJob out;
  JobSpec& spec = out.spec;
  if (chat) {
    const std::string text = render_prompt(req, engine);
    spec.prompt = tok.encode(text, /*parse_special=*/true);
    out.think_opened = text.ends_with("<think>\n");
    AnswerGrammar answer = answer_grammar(req, engine.template_kind(), out.think_opened);
    if (answer.grammar)
      spec.constraint = std::make_shared<TokenConstraint>(std::move(answer.grammar), engine.vocab_trie(), engine.stop_tokens());
    out.unenforced = std::move(answer.unenforced);
    const int32_t im_start = tok.token_id("<|im_start|>");
    for (size_t i = spec.prompt.size(); i-- > 0;)
      if (spec.prompt[i] == im_start) {
        spec.snapshot_at = i;
        break;
      }
  } else if (req.prompt_is_ids) {
    for (size_t i = 0; i < req.prompt_ids.size(); ++i)
      if (req.prompt_ids[i] >= engine.config().vocab_size)
        bad_value(fmt::format("prompt[{}]", i),
                  fmt::format("token id {} is outside the vocabulary of {} tokens", req.prompt_ids[i], engine.config().vocab_size));
    spec.prompt = req.prompt_ids;
    if (req.echo) out.prompt_text = tok.decode(spec.prompt);
  } else {
    spec.prompt = tok.encode(req.prompt, /*parse_special=*/true);
    out.prompt_text = req.prompt;
  }
  if (spec.prompt.empty()) bad_value("prompt", "the prompt is empty; give at least one token");

  const int64_t n = int64_t(spec.prompt.size());
  if (n >= max_context)
    throw invalid_request(
        fmt::format("This model's context is {} tokens (--ctx), but the prompt has {} tokens, which leaves no room for "
                    "an answer. Shorten the {} or restart the server with a larger --ctx.",
                    max_context, n, chat ? "conversation" : "prompt"),
        chat ? "messages" : "prompt", "context_length_exceeded");
  // The answer may use what is left of the context; asking for more ends it with "length".
  const int64_t room = max_context - n;
  const int64_t want = req.max_tokens ? *req.max_tokens : (chat ? room : default_completion_tokens);
  spec.max_new_tokens = int(std::min({want, room, int64_t(INT_MAX)}));
  spec.stop = req.stop;

  SamplingParams p = engine.default_sampling();
  if (req.temperature) {
    p.temperature = *req.temperature;
    p.greedy = *req.temperature == 0;  // OpenAI's temperature 0: the most likely token
  }
  if (req.top_p) p.top_p = *req.top_p;
  if (req.top_k) p.top_k = *req.top_k;
  if (req.min_p) p.min_p = *req.min_p;
  if (req.presence_penalty) p.presence_penalty = *req.presence_penalty;
  if (req.frequency_penalty) p.frequency_penalty = *req.frequency_penalty;
  if (req.repetition_penalty) p.repetition_penalty = *req.repetition_penalty;
  // SamplingParams treats seed 0 as "draw one"; a client's explicit 0 must be reproducible.
  if (req.seed) p.seed = *req.seed == 0 ? 0x5eed5eed5eed5eedULL : *req.seed;
  try {
    validate(p);
  } catch (const Error& e) {
    throw invalid_request(e.what(), "", "invalid_value");
  }
  spec.sampling = p;
  return out;
}

// ----------------------------------------------------------------------------- responses

namespace {

const char* kFingerprint = "swiftlet-0.1.0";

std::string sse_event(const json& j) {
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

json usage_json(const GenerateStats& s) {
  return {{"prompt_tokens", s.prompt_tokens},
          {"completion_tokens", s.generated_tokens},
          {"total_tokens", s.prompt_tokens + s.generated_tokens},
          {"prompt_tokens_details", {{"cached_tokens", s.reused_tokens}}},
          // Ours: how much of the prompt was run through the model / kept from before.
          {"prefilled_tokens", s.prefilled_tokens},
          {"reused_tokens", s.reused_tokens}};
}

json timings_json(const GenerateStats& s) {
  return {{"prefill_tokens_per_second", s.prefill_tok_s()},
          {"decode_tokens_per_second", s.decode_tok_s()},
          {"time_to_first_token_ms", s.ttft_seconds * 1e3},
          {"prefill_ms", s.prefill_seconds * 1e3},
          {"decode_ms", s.decode_seconds * 1e3},
          {"expert_cache_hit_rate", s.experts.hit_rate()},
          {"expert_bytes_read", s.experts.bytes_read},
          {"peak_rss_bytes", s.peak_rss}};
}

}  // namespace

ReplyStream::ReplyStream(std::shared_ptr<Job> job, Context ctx)
    : ctx_(std::move(ctx)), sse_(ctx_.stream), think_(ctx_.think_opened), job_(std::move(job)) {
  if (ctx_.parse_tools) tool_parser_.emplace(ctx_.tools, /*stream_arguments=*/sse_);
}

json ReplyStream::chunk(json choice) const {
  const bool chat = ctx_.endpoint == Endpoint::ChatCompletions;
  json j = {{"id", ctx_.id},
            {"object", chat ? "chat.completion.chunk" : "text_completion"},
            {"created", ctx_.created},
            {"model", ctx_.model},
            {"system_fingerprint", kFingerprint},
            {"choices", json::array({std::move(choice)})}};
  if (ctx_.include_usage) j["usage"] = nullptr;  // OpenAI: null on every chunk but the last
  return j;
}

void ReplyStream::on_start(std::string& out) {
  if (!sse_) return;
  if (ctx_.endpoint == Endpoint::ChatCompletions)
    out += sse_event(chunk({{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
  else if (!ctx_.echo.empty())
    out += sse_event(chunk({{"text", ctx_.echo}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
}

// Streamed, text waits for on_flush: the pieces that came together go out as one delta.
void ReplyStream::emit_chat(std::string_view reasoning, std::string_view content) {
  if (!sse_) {
    content_ += content;
    reasoning_ += reasoning;
    return;
  }
  delta_reasoning_ += reasoning;
  delta_content_ += content;
}

void ReplyStream::on_flush(std::string& out) {
  if (!sse_ || (delta_reasoning_.empty() && delta_content_.empty())) return;
  if (ctx_.endpoint == Endpoint::Completions) {
    out += sse_event(chunk({{"text", delta_content_}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
  } else {
    json delta = json::object();
    if (!delta_reasoning_.empty()) delta["reasoning_content"] = delta_reasoning_;
    if (!delta_content_.empty()) delta["content"] = delta_content_;
    out += sse_event(chunk({{"index", 0}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
  }
  delta_reasoning_.clear();
  delta_content_.clear();
}

// A streamed call is a delta with its index, id, name and empty arguments, then deltas of
// argument fragments as the model writes them (OpenAI's clients concatenate the fragments of
// an index).
void ReplyStream::on_tool_event(std::string& out, ToolEvent ev) {
  auto tool_delta = [&](const json& tc) {
    on_flush(out);
    out += sse_event(chunk({{"index", 0}, {"delta", {{"tool_calls", json::array({tc})}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}}));
  };
  switch (ev.kind) {
    case ToolEvent::Kind::Content: emit_chat("", ev.text); return;
    case ToolEvent::Kind::CallBegin:  // streamed only
      skip_call_ = !ctx_.parallel_tool_calls && !calls_.empty();
      if (skip_call_) return;
      calls_.push_back({random_id("call_"), std::move(ev.call)});
      tool_delta({{"index", calls_.size() - 1},
                  {"id", calls_.back().first},
                  {"type", "function"},
                  {"function", {{"name", calls_.back().second.name}, {"arguments", ""}}}});
      return;
    case ToolEvent::Kind::Arguments:
      if (!skip_call_) tool_delta({{"index", calls_.size() - 1}, {"function", {{"arguments", ev.text}}}});
      return;
    case ToolEvent::Kind::CallEnd:
      if (sse_) {
        if (!skip_call_) calls_.back().second = std::move(ev.call);
        skip_call_ = false;
      } else if (ctx_.parallel_tool_calls || calls_.empty()) {
        calls_.push_back({random_id("call_"), std::move(ev.call)});
      }
      return;
  }
}

void ReplyStream::on_text(std::string& out, std::string_view text) {
  if (ctx_.endpoint == Endpoint::Completions) {
    emit_chat("", text);
    return;
  }
  ThinkSplitter::Out parts;
  if (ctx_.split_thinking) parts = think_.feed(text);
  else parts.content = text;
  emit_chat(parts.reasoning, tool_parser_ ? "" : parts.content);
  if (tool_parser_)
    for (ToolEvent& ev : tool_parser_->feed(parts.content)) on_tool_event(out, std::move(ev));
}

void ReplyStream::on_done(std::string& out, const JobEvent& ev) {
  const bool chat = ctx_.endpoint == Endpoint::ChatCompletions;
  if (chat && ctx_.split_thinking) {
    // Whatever the splitter held back (a partial tag at the very end) is text after all.
    ThinkSplitter::Out rest = think_.flush();
    ctx_.split_thinking = false;
    if (!rest.reasoning.empty()) emit_chat(rest.reasoning, "");
    if (!rest.content.empty()) on_text(out, rest.content);
  }
  if (tool_parser_)
    for (ToolEvent& ev : tool_parser_->finish()) on_tool_event(out, std::move(ev));
  on_flush(out);
  const char* finish = !calls_.empty() && ev.finish == FinishReason::Stop ? "tool_calls" : finish_reason_name(ev.finish);
  if (sse_) {
    json last = chat ? json{{"index", 0}, {"delta", json::object()}, {"logprobs", nullptr}, {"finish_reason", finish}}
                     : json{{"text", ""}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish}};
    json c = chunk(std::move(last));
    c["timings"] = timings_json(ev.stats);
    out += sse_event(c);
    if (ctx_.include_usage) {
      json u = chunk(json::object());
      u["choices"] = json::array();
      u["usage"] = usage_json(ev.stats);
      u["timings"] = timings_json(ev.stats);
      out += sse_event(u);
    }
    out += "data: [DONE]\n\n";
    return;
  }
  json choice;
  if (chat) {
    json msg = {{"role", "assistant"}, {"content", content_.empty() && !calls_.empty() ? json(nullptr) : json(content_)}};
    if (!reasoning_.empty()) msg["reasoning_content"] = reasoning_;
    if (!calls_.empty()) {
      json calls = json::array();
      for (const auto& [id, c] : calls_)
        calls.push_back({{"id", id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      msg["tool_calls"] = std::move(calls);
    }
    choice = {{"index", 0}, {"message", msg}, {"logprobs", nullptr}, {"finish_reason", finish}};
  } else {
    choice = {{"text", ctx_.echo + content_}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish}};
  }
  json body = {{"id", ctx_.id},
               {"object", chat ? "chat.completion" : "text_completion"},
               {"created", ctx_.created},
               {"model", ctx_.model},
               {"system_fingerprint", kFingerprint},
               {"choices", json::array({choice})},
               {"usage", usage_json(ev.stats)},
               {"timings", timings_json(ev.stats)}};
  out += body.dump(-1, ' ', false, json::error_handler_t::replace);
}

void ReplyStream::on_failed(std::string& out, const JobEvent& ev) {
  const ApiError e = ev.client_error ? invalid_request(ev.text) : internal_error(ev.text);
  status_ = e.status();
  // A stream has already said 200: the error goes in an event (the OpenAI SDKs raise it).
  if (sse_) out += "data: " + error_json(e) + "\n\n";
  else out = error_json(e);
}

ReplyStream::Poll ReplyStream::poll(std::string& out, std::chrono::milliseconds timeout) {
  if (done_) return Poll::Done;
  const size_t before = out.size();
  if (!started_) {
    started_ = true;
    on_start(out);
    if (out.size() > before) return Poll::Data;
  }
  events_.clear();
  if (!job_->wait_events(events_, timeout)) return Poll::Idle;
  // Each piece goes through the parsers on its own (tool-call fragments follow the model's
  // tokens); text that came together goes out as one delta.
  for (const JobEvent& ev : events_) {
    if (ev.kind == JobEvent::Kind::Text) {
      on_text(out, ev.text);
      continue;
    }
    on_flush(out);
    if (ev.kind == JobEvent::Kind::Done) on_done(out, ev);
    else on_failed(out, ev);
    done_ = true;
    break;
  }
  if (!done_) on_flush(out);
  if (done_) return Poll::Done;
  return out.size() > before ? Poll::Data : Poll::Idle;
}

// --------------------------------------------------------------------------------- routes

Routes::Routes(EngineWorker& worker, Metrics& metrics, RouteOptions opts)
    : worker_(worker), metrics_(metrics), opts_(std::move(opts)), started_at_(int64_t(std::time(nullptr))) {}

const Engine& Routes::ready_engine() const {
  if (const Engine* e = worker_.engine()) return *e;
  if (worker_.status() == EngineWorker::Status::Failed)
    throw unavailable("the model failed to load: " + worker_.load_error(), "model_load_failed");
  throw unavailable("the model is still loading; retry when GET /health answers 200", "model_loading");
}

Reply Routes::health() const {
  ready_engine();
  Reply r;
  r.body = json{{"status", "ok"}}.dump();
  return r;
}

json Routes::model_json() const {
  json m = {{"id", opts_.model_id}, {"object", "model"}, {"created", started_at_}, {"owned_by", "swiftlet"}};
  if (const Engine* e = worker_.engine()) {
    m["meta"] = {{"family", e->config().family_name()},
                 {"model_type", e->config().model_type},
                 {"vocab_size", e->config().vocab_size},
                 {"context_length", worker_.options().max_context},
                 {"chat_template", std::string(template_kind_name(e->template_kind()))}};
  }
  return m;
}

Reply Routes::models() const {
  Reply r;
  r.body = json{{"object", "list"}, {"data", json::array({model_json()})}}.dump();
  return r;
}

Reply Routes::model(const std::string& id) const {
  if (id != opts_.model_id)
    throw not_found(fmt::format("The model '{}' does not exist: this server serves '{}'.", id, opts_.model_id),
                    "model_not_found");
  Reply r;
  r.body = model_json().dump();
  return r;
}

Reply Routes::metrics() const {
  LiveGauges g;
  g.queue_length = worker_.queued();
  g.queue_capacity = worker_.options().max_queue;
  g.busy = worker_.busy();
  g.batch = worker_.gauges();
  g.ready = worker_.status() == EngineWorker::Status::Ready;
  g.sessions = worker_.options().sessions;
  g.parallel = worker_.options().parallel > 0 ? worker_.options().parallel : worker_.options().sessions;
  g.max_context = worker_.options().max_context;
  g.state_cache = worker_.state_cache_stats();
  Reply r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = metrics_.prometheus(g);
  return r;
}

Reply Routes::chat_page() const {
  Reply r;
  r.content_type = "text/html; charset=utf-8";
  r.body = std::string(chat_page_html());
  return r;
}

Reply Routes::chat_completions(std::string_view body) { return generate(parse_chat_request(parse_json_body(body))); }

Reply Routes::completions(std::string_view body) { return generate(parse_completion_request(parse_json_body(body))); }

Routes::Started Routes::start(const CompletionRequest& req, const char* id_prefix) {
  if (!req.model.empty() && req.model != opts_.model_id)
    throw not_found(fmt::format("The model '{}' does not exist: this server serves '{}' (see GET /v1/models).", req.model,
                                opts_.model_id),
                    "model_not_found");
  const Engine& engine = ready_engine();
  PlannedJob plan = plan_job(req, engine, worker_.options().max_context, opts_.default_completion_tokens);
  const auto prompt_tokens = int64_t(plan.spec.prompt.size());
  std::shared_ptr<Job> job = worker_.submit(std::move(plan.spec));
  if (!job) {
    metrics_.on_rejected_queue_full();
    throw queue_full(fmt::format("The server is busy: {} requests are already waiting (--max-queue). Retry later.",
                                 worker_.options().max_queue));
  }
  const bool chat = req.endpoint == Endpoint::ChatCompletions;
  ReplyStream::Context ctx;
  ctx.endpoint = req.endpoint;
  ctx.stream = req.stream;
  ctx.include_usage = req.stream && req.include_usage;
  ctx.split_thinking = chat && (req.enable_thinking.value_or(false) || engine.template_kind() == TemplateKind::Qwen3NextThinking ||
                                plan.think_opened);
  ctx.think_opened = plan.think_opened;
  ctx.id = random_id(id_prefix);
  ctx.model = opts_.model_id;
  ctx.echo = req.echo ? plan.prompt_text : "";
  ctx.created = int64_t(std::time(nullptr));
  ctx.parse_tools = chat && !req.tools.empty() && req.tool_choice != CompletionRequest::ToolChoice::None;
  ctx.parallel_tool_calls = req.parallel_tool_calls;
  ctx.tools = req.tools;
  ctx.prompt_tokens = prompt_tokens;
  if (!plan.unenforced.empty()) {
    // One line per request: what the answer may break (docs/server.md, "JSON schemas").
    std::string list;
    for (const std::string& u : plan.unenforced) list += (list.empty() ? "" : ", ") + u;
    std::fprintf(stderr, "%s: schema keywords not enforced: %s\n", ctx.id.c_str(), list.c_str());
  }
  return {std::move(job), std::move(ctx), std::move(plan.unenforced)};
}

void Routes::add_unenforced_header(Reply& r, const std::vector<std::string>& unenforced) {
  if (!unenforced.empty()) r.headers.emplace_back("X-Swiftlet-Schema-Unenforced", unenforced_header(unenforced));
}

Reply Routes::generate(const CompletionRequest& req) {
  const bool chat = req.endpoint == Endpoint::ChatCompletions;
  Started s = start(req, chat ? "chatcmpl-" : "cmpl-");
  Reply r;
  r.content_type = req.stream ? "text/event-stream" : "application/json";
  r.stream = std::make_shared<ReplyStream>(std::move(s.job), std::move(s.ctx));
  add_unenforced_header(r, s.unenforced);
  return r;
}

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += alphabet[rng() % 62];
  return id;
}

}  // namespace swiftlet::server
