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
      spec.constraint = std::make_shared<TokenConstraint>(engine.grammar_cache()->get(std::move(answer.grammar)),
                                                          engine.stop_tokens());
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
          {"sample_ms", s.sample_seconds * 1e3},  // within time_to_first_token_ms + decode_ms
          {"expert_cache_hit_rate", s.experts.hit_rate()},
          {"expert_bytes_read", s.experts.bytes_read},
          {"experts_skipped", s.experts.skipped},
          {"on_miss", s.on_miss.name()},  // "exact" or "skip:W" (lossy): what made these figures
          {"lossy", s.on_miss.lossy()},
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
  if (const Engine* e = worker_.engine()) g.grammar_cache = e->grammar_cache_stats();
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
