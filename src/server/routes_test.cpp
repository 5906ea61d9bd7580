#include "server/routes.h"

#include "server/http_server.h"
#include "server/metrics.h"
#include "support/tiny_model.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace swiftlet::server {
namespace {

using json = nlohmann::ordered_json;

// The status and param of the ApiError `f` throws (status 0: nothing thrown).
template <typename F>
std::pair<int, std::string> api_error(F&& f) {
  try {
    f();
  } catch (const ApiError& e) {
    return {e.status(), e.param()};
  }
  return {0, ""};
}

json chat(json extra = json::object()) {
  json j = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
  j.update(extra);
  return j;
}

TEST(Routes, ParsesAChatRequest) {
  CompletionRequest r = parse_chat_request(chat({{"max_tokens", 5},
                                                 {"temperature", 0},
                                                 {"top_k", 3},
                                                 {"stop", "\n"},
                                                 {"seed", 7},
                                                 {"stream", true},
                                                 {"stream_options", {{"include_usage", true}}},
                                                 {"chat_template_kwargs", {{"enable_thinking", true}}},
                                                 {"some_future_field", {1, 2, 3}}}));
  EXPECT_EQ(r.model, "tiny");
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].content, "Hi");
  EXPECT_EQ(*r.max_tokens, 5);
  EXPECT_EQ(*r.temperature, 0.0f);
  EXPECT_EQ(*r.top_k, 3);
  EXPECT_EQ(r.stop, std::vector<std::string>{"\n"});
  EXPECT_EQ(*r.seed, 7u);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(*r.enable_thinking);
}

TEST(Routes, TextPartsAndNullsAndTheNewerNames) {
  json j = chat({{"max_completion_tokens", 9}, {"temperature", nullptr}, {"stop", {"a", "b"}}});
  j["messages"] = {{{"role", "developer"}, {"content", "Be brief."}},
                   {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "one "}}, {{"type", "text"}, {"text", "two"}}}}}};
  CompletionRequest r = parse_chat_request(j);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "one two");
  EXPECT_EQ(*r.max_tokens, 9);
  EXPECT_FALSE(r.temperature.has_value());
  EXPECT_EQ(r.stop.size(), 2u);
}

TEST(Routes, WrongTypesAndValuesAre400NamingTheField) {
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"messages", "Hi"}}, "messages"},
      {{{"temperature", "hot"}}, "temperature"},
      {{{"temperature", 3}}, "temperature"},
      {{{"max_tokens", 1.5}}, "max_tokens"},
      {{{"max_tokens", 0}}, "max_tokens"},
      {{{"stream", "yes"}}, "stream"},
      {{{"stop", 5}}, "stop"},
      {{{"stop", {"ok", 5}}}, "stop[1]"},
      {{{"top_p", 0}}, "top_p"},
      {{{"seed", "x"}}, "seed"},
      {{{"seed", 1e30}}, "seed"},
      {{{"seed", -1e30}}, "seed"},
      {{{"seed", 9223372036854775808.0}}, "seed"},
      {{{"seed", uint64_t(1) << 63}}, "seed"},
      {{{"max_tokens", 1e300}}, "max_tokens"},
      {{{"n", 2}}, "n"},
      {{{"user", 1}}, "user"},
      {{{"stream_options", true}}, "stream_options"},
      {{{"chat_template_kwargs", {{"enable_thinking", "no"}}}}, "enable_thinking"},
      {{{"messages", json::array({{{"role", "robot"}, {"content", "x"}}})}}, "messages[0].role"},
      {{{"messages", json::array({{{"content", "x"}}})}}, "messages[0].role"},
      {{{"messages", json::array({{{"role", "user"}, {"content", 5}}})}}, "messages[0].content"},
      {{{"messages", json::array({{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}})}}, "messages[0].content[0].type"},
      {{{"messages", json::array()}}, "messages"},
  };
  for (const auto& [extra_fields, param] : cases) {
    const json& extra = extra_fields;  // a lambda may not capture a structured binding in clang 14
    auto [status, p] = api_error([&] { parse_chat_request(chat(extra)); });
    EXPECT_EQ(status, 400) << extra.dump();
    EXPECT_EQ(p, param) << extra.dump();
  }
  json no_messages = {{"model", "tiny"}};
  EXPECT_EQ(api_error([&] { parse_chat_request(no_messages); }), std::make_pair(400, std::string("messages")));
}

// A required field that is absent: 400, its path as the param, OpenAI's code, and a message that
// names it.
TEST(Routes, MissingParametersAre400NamingThePath) {
  const auto expect_missing = [](auto&& parse, const std::string& path) {
    try {
      parse();
      ADD_FAILURE() << path << ": nothing thrown";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400) << path;
      EXPECT_EQ(e.param(), path);
      EXPECT_EQ(e.code(), "missing_required_parameter") << path;
      EXPECT_EQ(std::string(e.what()), "Missing required parameter: '" + path + "'.");
    }
  };
  expect_missing([] { parse_chat_request({{"model", "tiny"}}); }, "messages");
  expect_missing([] { parse_chat_request(chat({{"messages", json::array({{{"content", "x"}}})}})); },
                 "messages[0].role");
  expect_missing(
      [] {
        parse_chat_request(chat({{"messages", json::array({{{"role", "user"}, {"content", "x"}},
                                                           {{"role", "user"}, {"content", {{{"text", "x"}}}}}})}}));
      },
      "messages[1].content[0].type");
  expect_missing([] { parse_completion_request({{"model", "tiny"}}); }, "prompt");
}

TEST(Routes, MalformedJsonIs400) {
  EXPECT_EQ(api_error([] { parse_json_body("{\"messages\": ["); }).first, 400);
  EXPECT_EQ(api_error([] { parse_json_body("[1, 2]"); }).first, 400);
  EXPECT_EQ(api_error([] { parse_json_body(""); }).first, 400);
}

// Integers arrive as JSON numbers of any size: a whole float is an integer, one past 64 bits is a
// 400 naming the field, never a conversion the language leaves undefined.
TEST(Routes, IntegersAtAndPastTheirRange) {
  EXPECT_EQ(*parse_chat_request(chat({{"seed", 3.0}})).seed, 3u);
  EXPECT_EQ(*parse_chat_request(chat({{"seed", -0x1p63}})).seed, uint64_t(1) << 63);
  EXPECT_EQ(*parse_chat_request(chat({{"seed", INT64_MAX}})).seed, uint64_t(INT64_MAX));
  const std::string digits(100, '5');
  const std::string body = R"({"prompt": [[12, 2, 3]], "seed": )" + digits + "}";
  EXPECT_EQ(api_error([&] { parse_completion_request(parse_json_body(body)); }),
            std::make_pair(400, std::string("seed")));
  EXPECT_EQ(api_error([] { parse_chat_request(chat({{"max_tokens", 1e19}})); }).first, 400);
  // Token ids: [0, INT32_MAX], one past INT64_MAX named as written rather than as a negative id.
  EXPECT_EQ(parse_completion_request({{"prompt", {0, INT32_MAX}}}).prompt_ids, (std::vector<int32_t>{0, INT32_MAX}));
  for (const char* id : {"-1", "2147483648", "18446744073709551615"}) {
    try {
      parse_completion_request(parse_json_body(fmt::format(R"({{"prompt": [1, {}]}})", id)));
      ADD_FAILURE() << id << ": nothing thrown";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param(), "prompt[1]") << id;
      EXPECT_EQ(std::string(e.what()), fmt::format("Invalid value for 'prompt[1]': {} is not a token id", id));
    }
  }
}

TEST(Routes, CompletionPromptForms) {
  EXPECT_EQ(parse_completion_request({{"prompt", "abc"}}).prompt, "abc");
  EXPECT_EQ(parse_completion_request({{"prompt", {"abc"}}}).prompt, "abc");
  auto ids = parse_completion_request({{"prompt", {1, 2, 3}}});
  EXPECT_TRUE(ids.prompt_is_ids);
  EXPECT_EQ(ids.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(api_error([] { parse_completion_request({{"prompt", {"a", "b"}}}); }).first, 400);
  EXPECT_EQ(api_error([] { parse_completion_request({{"prompt", 5}}); }).second, "prompt");
  EXPECT_EQ(api_error([] { parse_completion_request(json::object()); }).second, "prompt");
}

TEST(Routes, ErrorsHaveOpenAIsShape) {
  json j = json::parse(error_json(invalid_request("bad", "temperature", "invalid_type")));
  EXPECT_EQ(j["error"]["message"], "bad");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "temperature");
  EXPECT_EQ(j["error"]["code"], "invalid_type");
  j = json::parse(error_json(queue_full("busy")));
  EXPECT_TRUE(j["error"]["param"].is_null());
  Reply r = Routes::error_reply(not_found("nope"));
  EXPECT_EQ(r.status, 404);
}

// SSE "data: " payloads of a stream's output.
std::vector<std::string> sse_data(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while ((i = s.find("data: ", i)) != std::string::npos) {
    const size_t end = s.find("\n\n", i);
    out.push_back(s.substr(i + 6, end - i - 6));
    i = end;
  }
  return out;
}

std::string drain(ReplyStream& rs) {
  std::string out;
  while (rs.poll(out, std::chrono::milliseconds(10)) != ReplyStream::Poll::Done) {
  }
  return out;
}

ReplyStream::Context context(bool stream, bool usage) {
  ReplyStream::Context c;
  c.endpoint = Endpoint::ChatCompletions;
  c.stream = stream;
  c.include_usage = usage;
  c.split_thinking = false;
  c.think_opened = false;
  c.id = "chatcmpl-test";
  c.model = "tiny";
  c.created = 1;
  return c;
}

void finish(Job& job, FinishReason f) {
  GenerateStats st;
  st.prompt_tokens = 10;
  st.reused_tokens = 6;
  st.prefilled_tokens = 4;
  st.generated_tokens = 3;
  job.push({JobEvent::Kind::Text, "Hel", FinishReason::Stop, {}, false});
  job.push({JobEvent::Kind::Text, "lo", FinishReason::Stop, {}, false});
  job.push({JobEvent::Kind::Done, "", f, st, false});
}

TEST(ReplyStream, ChatStreamIsRoleThenDeltasThenFinishThenUsageThenDone) {
  auto job = std::make_shared<Job>(JobSpec{});
  ReplyStream rs(job, context(true, true));
  std::string first;
  EXPECT_EQ(rs.poll(first, std::chrono::milliseconds(0)), ReplyStream::Poll::Data);  // the role chunk, at once
  finish(*job, FinishReason::Length);
  auto events = sse_data(first + drain(rs));
  ASSERT_EQ(events.size(), 5u);
  json role = json::parse(events[0]);
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(role["usage"].is_null());
  EXPECT_EQ(json::parse(events[1])["choices"][0]["delta"]["content"], "Hello");
  json last = json::parse(events[2]);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  json usage = json::parse(events[3]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(usage["usage"]["completion_tokens"], 3);
  EXPECT_EQ(usage["usage"]["total_tokens"], 13);
  EXPECT_EQ(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 6);
  EXPECT_EQ(usage["usage"]["prefilled_tokens"], 4);
  EXPECT_EQ(events[4], "[DONE]");
}

TEST(ReplyStream, NonStreamedBodyAndFailures) {
  auto job = std::make_shared<Job>(JobSpec{});
  ReplyStream rs(job, context(false, false));
  finish(*job, FinishReason::Stop);
  json body = json::parse(drain(rs));
  EXPECT_EQ(rs.status(), 200);
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 6);

  auto bad = std::make_shared<Job>(JobSpec{});
  ReplyStream failing(bad, context(false, false));
  bad->push({JobEvent::Kind::Failed, "boom", FinishReason::Stop, {}, false});
  json err = json::parse(drain(failing));
  EXPECT_EQ(failing.status(), 500);
  EXPECT_EQ(err["error"]["message"], "boom");
}

TEST(ReplyStream, ThinkingGoesToReasoningContent) {
  auto job = std::make_shared<Job>(JobSpec{});
  auto ctx = context(false, false);
  ctx.split_thinking = true;
  ReplyStream rs(job, ctx);
  job->push({JobEvent::Kind::Text, "<think>\nhmm\n</think>\n\n", FinishReason::Stop, {}, false});
  job->push({JobEvent::Kind::Text, "4", FinishReason::Stop, {}, false});
  job->push({JobEvent::Kind::Done, "", FinishReason::Stop, {}, false});
  json body = json::parse(drain(rs));
  EXPECT_EQ(body["choices"][0]["message"]["content"], "4");
  EXPECT_EQ(body["choices"][0]["message"]["reasoning_content"], "hmm\n");
}

TEST(Routes, ToolsToolCallsAndToolMessages) {
  json j = chat({{"tools", {{{"type", "function"},
                             {"function", {{"name", "get_weather"}, {"description", "d"},
                                           {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}}}},
                 {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
                 {"parallel_tool_calls", false}});
  j["messages"] = {{{"role", "user"}, {"content", "Weather?"}},
                   {{"role", "assistant"}, {"content", nullptr},
                    {"tool_calls", {{{"id", "call_1"}, {"type", "function"},
                                     {"function", {{"name", "get_weather"}, {"arguments", R"({"city": "Paris", "n": [1, true]})"}}}}}}},
                   {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "sunny"}}};
  CompletionRequest r = parse_chat_request(j);
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tools[0].name, "get_weather");
  // The template's `tool | tojson`: Python's separators, the client's key order.
  EXPECT_EQ(r.tools_json[0],
            R"({"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})");
  EXPECT_EQ(r.tool_choice, CompletionRequest::ToolChoice::Named);
  EXPECT_EQ(r.tool_choice_name, "get_weather");
  EXPECT_FALSE(r.parallel_tool_calls);
  ASSERT_EQ(r.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[1].tool_calls[0].arguments_json, R"({"city": "Paris", "n": [1, true]})");
  EXPECT_EQ(r.messages[2].role, "tool");
  EXPECT_EQ(r.messages[2].content, "sunny");

  const json rf = chat({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", {{"type", "object"}}}}}}}});
  EXPECT_EQ(parse_chat_request(rf).format, CompletionRequest::Format::JsonSchema);
  EXPECT_EQ(parse_chat_request(chat({{"response_format", {{"type", "json_object"}}}})).format, CompletionRequest::Format::JsonObject);
  // /v1/completions answers in text only.
  EXPECT_EQ(api_error([] { parse_completion_request({{"prompt", "x"}, {"tools", {{{"type", "function"}}}}}); }).second, "tools");
}

TEST(ReplyStream, CallsInTheAnswerBecomeToolCalls) {
  for (bool stream : {false, true}) {
    auto job = std::make_shared<Job>(JobSpec{});
    auto ctx = context(stream, false);
    ctx.parse_tools = true;
    ctx.tools = {{"now", nullptr}};
    ReplyStream rs(job, ctx);
    job->push({JobEvent::Kind::Text, "Checking.\n<tool_call>\n{\"name\": \"now\", \"argu", FinishReason::Stop, {}, false});
    job->push({JobEvent::Kind::Text, "ments\": {\"tz\": \"UTC\"}}\n</tool_call>", FinishReason::Stop, {}, false});
    job->push({JobEvent::Kind::Done, "", FinishReason::Stop, {}, false});
    const std::string out = drain(rs);
    if (!stream) {
      json msg = json::parse(out)["choices"][0];
      EXPECT_EQ(msg["finish_reason"], "tool_calls");
      EXPECT_EQ(msg["message"]["content"], "Checking.");
      EXPECT_EQ(msg["message"]["tool_calls"][0]["function"]["name"], "now");
      EXPECT_EQ(msg["message"]["tool_calls"][0]["function"]["arguments"], R"({"tz":"UTC"})");
      continue;
    }
    std::string content, args, name, finish;
    for (const std::string& e : sse_data(out)) {
      if (e == "[DONE]") continue;
      const json c = json::parse(e)["choices"][0];
      if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
      if (c["delta"].contains("tool_calls")) {
        const json& tc = c["delta"]["tool_calls"][0];
        EXPECT_EQ(tc["index"], 0);
        if (tc.contains("id")) name = tc["function"]["name"];
        args += tc["function"]["arguments"].get<std::string>();
      }
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    }
    EXPECT_EQ(content, "Checking.");
    EXPECT_EQ(name, "now");
    EXPECT_EQ(args, R"({"tz":"UTC"})");
    EXPECT_EQ(finish, "tool_calls");
  }
}

// Streamed, a call's arguments arrive in fragments as the model writes them: the first delta of
// an index carries id, type, name and "" (as OpenAI's API sends them), later ones only the index
// and a fragment. With parallel_tool_calls false the second call is not sent.
TEST(ReplyStream, StreamedCallsArriveInFragments) {
  auto job = std::make_shared<Job>(JobSpec{});
  auto ctx = context(true, false);
  ctx.parse_tools = true;
  ctx.parallel_tool_calls = false;
  ctx.tools = {{"now", nullptr}};
  ReplyStream rs(job, ctx);
  const std::string answer = "Checking.<tool_call>\n{\"name\": \"now\", \"arguments\": {\"tz\": \"Europe/Paris\", \"n\": 3}}"
                             "\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {\"x\": 1}}\n</tool_call>";
  for (size_t i = 0; i < answer.size(); i += 3)  // a token's worth of text each
    job->push({JobEvent::Kind::Text, answer.substr(i, 3), FinishReason::Stop, {}, false});
  job->push({JobEvent::Kind::Done, "", FinishReason::Stop, {}, false});
  std::string content, args;
  std::vector<json> deltas;
  for (const std::string& e : sse_data(drain(rs))) {
    if (e == "[DONE]") continue;
    const json c = json::parse(e)["choices"][0];
    if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
    if (c["delta"].contains("tool_calls")) deltas.push_back(c["delta"]["tool_calls"][0]);
  }
  EXPECT_EQ(content, "Checking.");
  ASSERT_GT(deltas.size(), 4u);
  EXPECT_EQ(deltas[0]["index"], 0);
  EXPECT_EQ(deltas[0]["type"], "function");
  EXPECT_EQ(deltas[0]["function"]["name"], "now");
  EXPECT_EQ(deltas[0]["function"]["arguments"], "");
  for (size_t i = 1; i < deltas.size(); ++i) {
    EXPECT_EQ(deltas[i]["index"], 0);
    EXPECT_FALSE(deltas[i].contains("id"));
    EXPECT_FALSE(deltas[i]["function"].contains("name"));
    EXPECT_FALSE(deltas[i]["function"]["arguments"].get<std::string>().empty());
    args += deltas[i]["function"]["arguments"].get<std::string>();
  }
  EXPECT_EQ(args, R"({"tz":"Europe/Paris","n":3})");
}

TEST(PlanJob, RendersLimitsAndResolvesSampling) {
  EngineOptions eo;
  eo.model = testing::tiny_qpack_with_tokenizer();
  Engine engine(eo);
  CompletionRequest req = parse_chat_request(chat({{"temperature", 0}, {"max_tokens", 50}}));
  PlannedJob plan = plan_job(req, engine, 1000);
  EXPECT_GT(plan.spec.prompt.size(), 3u);
  EXPECT_TRUE(plan.spec.sampling.greedy);
  EXPECT_EQ(plan.spec.max_new_tokens, 50);
  // The boundary is the last <|im_start|>: that of the generation prompt.
  EXPECT_EQ(plan.spec.prompt[plan.spec.snapshot_at], engine.tokenizer()->token_id("<|im_start|>"));

  // The answer is capped by what is left of the context ...
  const int64_t n = int64_t(plan.spec.prompt.size());
  EXPECT_EQ(plan_job(req, engine, n + 7).spec.max_new_tokens, 7);
  // ... and a prompt that leaves no room is refused, never truncated.
  auto [status, param] = api_error([&] { plan_job(req, engine, n); });
  EXPECT_EQ(status, 400);
  EXPECT_EQ(param, "messages");

  CompletionRequest c = parse_completion_request({{"prompt", "Once upon a time"}});
  PlannedJob pc = plan_job(c, engine, 1000);
  EXPECT_EQ(pc.spec.max_new_tokens, 16);  // OpenAI's default for completions
  EXPECT_EQ(pc.spec.snapshot_at, 0u);
  CompletionRequest out_of_vocab = parse_completion_request({{"prompt", {1, 999999}}});
  EXPECT_EQ(api_error([&] { plan_job(out_of_vocab, engine, 1000); }).second, "prompt[1]");
}

TEST(HttpServer, OnlyLoopbackCountsAsLocal) {
  // Anything else gets a warning at start when no --api-key is set.
  for (const char* h : {"127.0.0.1", "127.1.2.3", "::1", "localhost"}) EXPECT_TRUE(is_loopback_host(h)) << h;
  for (const char* h : {"0.0.0.0", "192.168.1.5", "::", "example.com"}) EXPECT_FALSE(is_loopback_host(h)) << h;
}

}  // namespace
}  // namespace swiftlet::server
