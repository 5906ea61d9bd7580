// The Anthropic Messages API without sockets: request conversion, errors, and the event
// sequence of a streamed answer (expected shapes from Anthropic's API reference; the npm test
// tests/server/anthropic.test.mjs drives the official SDK against a live server).
#include "server/anthropic.h"

#include <gtest/gtest.h>

namespace swiftlet::server {
namespace {

using json = nlohmann::ordered_json;

std::pair<int, std::string> api_error(const json& body, bool count_only = false) {
  try {
    parse_messages_request(body, count_only);
  } catch (const ApiError& e) {
    return {e.status(), e.param()};
  }
  return {0, ""};
}

json body(json messages) {
  return {{"model", "tiny"}, {"max_tokens", 16}, {"messages", std::move(messages)}};
}

TEST(Anthropic, MessagesBecomeChatMessages) {
  json b = body({{{"role", "user"}, {"content", "Weather?"}},
                 {{"role", "assistant"},
                  {"content", {{{"type", "thinking"}, {"thinking", "call it"}, {"signature", "s"}},
                               {{"type", "text"}, {"text", "Checking."}},
                               {{"type", "tool_use"}, {"id", "toolu_1"}, {"name", "get_weather"}, {"input", {{"city", "Paris"}}}}}}},
                 {{"role", "user"},
                  {"content", {{{"type", "tool_result"}, {"tool_use_id", "toolu_1"}, {"content", {{{"type", "text"}, {"text", "sunny"}}}}},
                               {{"type", "text"}, {"text", "Thanks"}}}}}});
  b["system"] = {{{"type", "text"}, {"text", "Be brief."}}};
  b["stop_sequences"] = {"END"};
  b["thinking"] = {{"type", "enabled"}, {"budget_tokens", 1024}};
  b["tools"] = {{{"name", "get_weather"}, {"description", "d"}, {"input_schema", {{"type", "object"}}}}};
  b["tool_choice"] = {{"type", "any"}, {"disable_parallel_tool_use", true}};
  const CompletionRequest r = parse_messages_request(b, false);
  ASSERT_EQ(r.messages.size(), 5u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].content, "Be brief.");
  EXPECT_EQ(r.messages[2].role, "assistant");
  EXPECT_EQ(r.messages[2].content, "Checking.");
  EXPECT_EQ(r.messages[2].reasoning_content, "call it");
  ASSERT_EQ(r.messages[2].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[2].tool_calls[0].arguments_json, R"({"city": "Paris"})");
  EXPECT_EQ(r.messages[3].role, "tool");
  EXPECT_EQ(r.messages[3].content, "sunny");
  EXPECT_EQ(r.messages[4].role, "user");
  EXPECT_EQ(r.messages[4].content, "Thanks");
  EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(*r.enable_thinking);
  EXPECT_EQ(r.tool_choice, CompletionRequest::ToolChoice::Required);
  EXPECT_FALSE(r.parallel_tool_calls);
  // Tools are printed in OpenAI's shape, as the templates expect.
  EXPECT_EQ(r.tools_json[0],
            R"({"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": {"type": "object"}}})");
}

TEST(Anthropic, BadRequestsName400sInDots) {
  const json user = {{"role", "user"}, {"content", "x"}};
  EXPECT_EQ(api_error({{"model", "tiny"}, {"messages", {user}}}).second, "max_tokens");
  EXPECT_EQ(api_error({{"model", "tiny"}, {"messages", {user}}}, /*count_only=*/true).first, 0);
  EXPECT_EQ(api_error(body({{{"role", "user"}, {"content", {{{"type", "video"}}}}}})).second, "messages.0.content.0.type");
  EXPECT_EQ(api_error(body({{{"role", "user"}, {"content", {{{"type", "image"}}}}}})).second, "messages.0.content.0.type");
  EXPECT_EQ(api_error(body({{{"role", "user"}, {"content", {{{"type", "tool_result"}, {"tool_use_id", "nope"}}}}}})).second,
            "messages.0.content.0.tool_use_id");
  EXPECT_EQ(api_error(body({user, {{"role", "assistant"}, {"content", "prefill"}}})).second, "messages.1");
  EXPECT_EQ(api_error(body({{{"role", "system"}, {"content", "x"}}})).second, "messages.0.role");
  json b = body(json::array({user}));
  b["tool_choice"] = {{"type", "tool"}, {"name", "missing"}};
  EXPECT_EQ(api_error(b).second, "tool_choice.name");
  const ApiError e = invalid_request("bad", "messages.0.role");
  const json err = json::parse(anthropic_error_json(e));
  EXPECT_EQ(err["type"], "error");
  EXPECT_EQ(err["error"]["type"], "invalid_request_error");
  EXPECT_EQ(err["error"]["message"], "messages.0.role: bad");
  EXPECT_EQ(json::parse(anthropic_error_json(unauthorized("k")))["error"]["type"], "authentication_error");
}

std::string drain(ReplyStream& rs) {
  std::string out;
  while (rs.poll(out, std::chrono::milliseconds(10)) != ReplyStream::Poll::Done) {
  }
  return out;
}

// (event name, data) pairs of an SSE text.
std::vector<std::pair<std::string, json>> events(const std::string& s) {
  std::vector<std::pair<std::string, json>> out;
  for (size_t pos = 0; (pos = s.find("event: ", pos)) != std::string::npos;) {
    const size_t nl = s.find('\n', pos);
    const size_t data = s.find("data: ", nl);
    const size_t end = s.find("\n\n", data);
    out.push_back({s.substr(pos + 7, nl - pos - 7), json::parse(s.substr(data + 6, end - data - 6))});
    pos = end;
  }
  return out;
}

ReplyStream::Context context(bool stream) {
  ReplyStream::Context c;
  c.endpoint = Endpoint::ChatCompletions;
  c.stream = stream;
  c.include_usage = false;
  c.split_thinking = true;
  c.think_opened = true;
  c.id = "msg_test";
  c.model = "tiny";
  c.created = 1;
  c.parse_tools = true;
  c.tools = {{"now", nullptr}};
  c.prompt_tokens = 12;
  return c;
}

void answer(Job& job) {
  GenerateStats st;
  st.prompt_tokens = 12;
  st.generated_tokens = 9;
  job.push({JobEvent::Kind::Text, "plan\n</think>\n\nOK", FinishReason::Stop, {}, false});
  job.push({JobEvent::Kind::Text, ".\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>", FinishReason::Stop, {}, false});
  job.push({JobEvent::Kind::Done, "", FinishReason::Stop, st, false});
}

TEST(AnthropicStream, EventsFollowTheDocumentedSequence) {
  auto job = std::make_shared<Job>(JobSpec{});
  AnthropicStream rs(job, context(true));
  answer(*job);
  const auto ev = events(drain(rs));
  std::vector<std::string> names;
  for (const auto& [n, d] : ev) {
    names.push_back(n);
    EXPECT_EQ(d["type"], n);  // each data's type repeats its event name
  }
  EXPECT_EQ(names, (std::vector<std::string>{"message_start", "content_block_start", "content_block_delta",
                                             "content_block_stop", "content_block_start", "content_block_delta",
                                             "content_block_stop", "content_block_start", "content_block_delta",
                                             "content_block_stop", "message_delta", "message_stop"}));
  EXPECT_EQ(ev[0].second["message"]["usage"]["input_tokens"], 12);
  EXPECT_EQ(ev[1].second["content_block"]["type"], "thinking");
  EXPECT_EQ(ev[2].second["delta"]["thinking"], "plan\n");
  EXPECT_EQ(ev[4].second["index"], 1);
  EXPECT_EQ(ev[5].second["delta"]["text"], "OK.");
  EXPECT_EQ(ev[7].second["content_block"]["type"], "tool_use");
  EXPECT_EQ(ev[7].second["content_block"]["name"], "now");
  EXPECT_EQ(ev[8].second["delta"]["partial_json"], "{}");
  EXPECT_EQ(ev[10].second["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(ev[10].second["usage"]["output_tokens"], 9);
}

// A tool_use block streams its input as input_json_delta fragments, piece by piece.
TEST(AnthropicStream, ToolInputStreamsInFragments) {
  auto job = std::make_shared<Job>(JobSpec{});
  auto ctx = context(true);
  ctx.split_thinking = false;
  ctx.think_opened = false;
  AnthropicStream rs(job, ctx);
  const std::string answer = "<tool_call>\n{\"name\": \"now\", \"arguments\": {\"tz\": \"Europe/Paris\", \"n\": [1, 2]}}\n</tool_call>";
  for (size_t i = 0; i < answer.size(); i += 4)
    job->push({JobEvent::Kind::Text, answer.substr(i, 4), FinishReason::Stop, {}, false});
  job->push({JobEvent::Kind::Done, "", FinishReason::Stop, {}, false});
  const auto ev = events(drain(rs));
  ASSERT_GT(ev.size(), 6u);
  EXPECT_EQ(ev[1].first, "content_block_start");
  EXPECT_EQ(ev[1].second["content_block"]["type"], "tool_use");
  EXPECT_EQ(ev[1].second["content_block"]["input"], json::object());
  std::string input;
  size_t fragments = 0;
  size_t i = 2;
  for (; i < ev.size() && ev[i].first == "content_block_delta"; ++i, ++fragments) {
    EXPECT_EQ(ev[i].second["index"], 0);
    EXPECT_EQ(ev[i].second["delta"]["type"], "input_json_delta");
    input += ev[i].second["delta"]["partial_json"].get<std::string>();
  }
  EXPECT_GT(fragments, 3u);
  EXPECT_EQ(input, R"({"tz":"Europe/Paris","n":[1,2]})");
  ASSERT_LT(i, ev.size());
  EXPECT_EQ(ev[i].first, "content_block_stop");
  EXPECT_EQ(ev[i + 1].second["delta"]["stop_reason"], "tool_use");
}

TEST(AnthropicStream, NonStreamedMessage) {
  auto job = std::make_shared<Job>(JobSpec{});
  AnthropicStream rs(job, context(false));
  answer(*job);
  const json m = json::parse(drain(rs));
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["stop_reason"], "tool_use");
  ASSERT_EQ(m["content"].size(), 3u);
  EXPECT_EQ(m["content"][0]["thinking"], "plan\n");
  EXPECT_EQ(m["content"][1]["text"], "OK.");
  EXPECT_EQ(m["content"][2]["input"], json::object());
  EXPECT_EQ(m["usage"]["input_tokens"], 12);

  auto bad = std::make_shared<Job>(JobSpec{});
  AnthropicStream failing(bad, context(false));
  bad->push({JobEvent::Kind::Failed, "boom", FinishReason::Stop, {}, false});
  const json err = json::parse(drain(failing));
  EXPECT_EQ(failing.status(), 500);
  EXPECT_EQ(err["error"]["type"], "api_error");
}

}  // namespace
}  // namespace swiftlet::server
