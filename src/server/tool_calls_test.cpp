// Tool calls: the template forms of call arguments against what Python Jinja2 printed (the chat
// goldens), and the output parser on call texts rendered by the real templates (the goldens'
// assistant turns), streamed in every split, malformed and cut off.
#include "server/tool_calls.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace swiftlet::server {
namespace {

ojson load_golden(const std::string& name) {
  std::ifstream f(std::filesystem::path(SWIFTLET_SOURCE_DIR) / "tests" / "data" / "chat" / name, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ojson::parse(ss.str());
}

// Every structured call in the goldens: its OpenAI form and the forms Python printed.
struct GoldenCall {
  ojson openai;    // {"id", "type", "function": {"name", "arguments": {...}}}
  ojson prepared;  // {"name", "arguments_json", "arguments": [...]}
};
std::vector<GoldenCall> golden_calls(const std::string& file) {
  std::vector<GoldenCall> out;
  const ojson doc = load_golden(file);
  for (const auto& c : doc.at("cases"))
    for (const auto& m : c.at("messages"))
      if (m.contains("prepared_calls"))
        for (size_t k = 0; k < m["tool_calls"].size(); ++k) out.push_back({m["tool_calls"][k], m["prepared_calls"][k]});
  return out;
}

TEST(ToolCalls, TemplateFormsMatchPythonJinja) {
  const auto calls = golden_calls("qwen3.5.json");
  ASSERT_GT(calls.size(), 5u);
  for (const auto& g : calls) {
    const ToolCall c = template_tool_call(g.openai["function"]["name"], g.openai["function"]["arguments"]);
    EXPECT_EQ(c.name, g.prepared["name"]);
    EXPECT_EQ(c.arguments_json, g.prepared["arguments_json"]);
    ASSERT_EQ(c.arguments.size(), g.prepared["arguments"].size());
    for (size_t i = 0; i < c.arguments.size(); ++i) {
      const auto& want = g.prepared["arguments"][i];
      EXPECT_EQ(c.arguments[i].name, want["name"]);
      EXPECT_EQ(c.arguments[i].json, want["json"]);
      EXPECT_EQ(c.arguments[i].is_string, want["is_string"]);
      EXPECT_EQ(c.arguments[i].is_container, want["is_container"]);
      if (!c.arguments[i].is_container) {  // str() of a dict is never printed
        EXPECT_EQ(c.arguments[i].text, want["text"]);
      }
    }
  }
}

// The text of each assistant call in a rendered golden: from "<tool_call>" to "</tool_call>".
std::vector<std::string> call_texts(const std::string& rendered) {
  std::vector<std::string> out;
  for (size_t pos = 0; (pos = rendered.find("<tool_call>\n", pos)) != std::string::npos;) {
    const size_t end = rendered.find("</tool_call>", pos);
    const std::string call = rendered.substr(pos, end + 12 - pos);
    if (call.find("<function-name>") != std::string::npos || call.find("example_function_name") != std::string::npos) {
      pos = end;  // the system prompt's example of the format
      continue;
    }
    out.push_back(call);
    pos = end;
  }
  return out;
}

const std::vector<ToolSpec> kTools = {
    {"get_weather", ojson::parse(R"({"type":"object","properties":{"city":{"type":"string"},"text":{"type":"string"},
        "empty":{"type":"string"},"when":{"type":"string"}}})")},
    {"now", ojson::parse(R"({"type":"object","properties":{}})")}};

// Each call the real template rendered parses back to the call the conversation held.
void expect_parsed_as_golden(const std::string& file) {
  const ojson doc = load_golden(file);
  int checked = 0;
  for (const auto& c : doc.at("cases")) {
    if (!c.contains("expected")) continue;
    std::vector<ojson> want;  // the calls of the conversation, in order
    for (const auto& m : c.at("messages"))
      if (m.contains("tool_calls"))
        for (const auto& tc : m["tool_calls"]) want.push_back(tc["function"]);
    if (want.empty()) continue;
    const std::vector<std::string> texts = call_texts(c["expected"].get<std::string>());
    ASSERT_EQ(texts.size(), want.size()) << c["name"];
    for (size_t i = 0; i < texts.size(); ++i) {
      SCOPED_TRACE(texts[i]);
      const std::string body = texts[i].substr(11, texts[i].size() - 11 - 12);
      auto call = parse_tool_call(body, kTools);
      ASSERT_TRUE(call.has_value());
      EXPECT_EQ(call->name, want[i]["name"]);
      // Qwen3.5 prints booleans and null with str() (True, None): they parse back as what they were.
      EXPECT_EQ(ojson::parse(call->arguments), want[i]["arguments"]);
      ++checked;
    }
  }
  EXPECT_GT(checked, 10);
}

TEST(ToolCalls, ParsesCallsRenderedByEveryTemplate) {
  for (const char* f : {"qwen3.json", "qwen3-next-instruct.json", "qwen3-next-thinking.json", "qwen3.5.json", "qwen3.6.json"}) {
    SCOPED_TRACE(f);
    expect_parsed_as_golden(f);
  }
}

// What a client assembles from the parser's events.
struct Answer {
  std::string content;
  std::vector<ParsedCall> calls;
  size_t fragments = 0;  // Arguments events
};

void add(Answer& a, ToolCallParser::Out events, bool streamed) {
  for (ToolEvent& e : events) {
    switch (e.kind) {
      case ToolEvent::Kind::Content:
        EXPECT_FALSE(e.text.empty());
        a.content += e.text;
        break;
      case ToolEvent::Kind::CallBegin:
        ASSERT_TRUE(streamed);
        a.calls.push_back({e.call.name, ""});
        break;
      case ToolEvent::Kind::Arguments:
        ASSERT_TRUE(streamed);
        ASSERT_FALSE(a.calls.empty());
        EXPECT_FALSE(e.text.empty());
        a.calls.back().arguments += e.text;
        ++a.fragments;
        break;
      case ToolEvent::Kind::CallEnd:
        if (streamed) {  // the end repeats what the fragments said
          ASSERT_FALSE(a.calls.empty());
          EXPECT_EQ(e.call.name, a.calls.back().name);
          EXPECT_EQ(e.call.arguments, a.calls.back().arguments);
        } else {
          a.calls.push_back(e.call);
        }
        break;
    }
  }
}

// Feeds `text` to a parser in the pieces that `cuts` (increasing offsets) make.
Answer run_cut(std::string_view text, const std::vector<size_t>& cuts, bool streamed,
               const std::vector<ToolSpec>& tools = kTools) {
  ToolCallParser p(tools, streamed);
  Answer a;
  size_t from = 0;
  for (size_t c : cuts) {
    add(a, p.feed(text.substr(from, c - from)), streamed);
    from = c;
  }
  add(a, p.feed(text.substr(from)), streamed);
  add(a, p.finish(), streamed);
  return a;
}

// Feeds `text` in pieces of `step` bytes.
Answer run(std::string_view text, size_t step, bool streamed = false, const std::vector<ToolSpec>& tools = kTools) {
  std::vector<size_t> cuts;
  for (size_t i = step; i < text.size(); i += step) cuts.push_back(i);
  return run_cut(text, cuts, streamed, tools);
}

TEST(ToolCalls, StreamsContentAndCallsInAnySplit) {
  const std::string answer =
      "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
  for (size_t step : {1, 2, 3, 5, 7, 11, 64, 1000}) {
    SCOPED_TRACE(step);
    const auto out = run(answer, step);
    EXPECT_EQ(out.content, "Let me check.");
    ASSERT_EQ(out.calls.size(), 2u);
    EXPECT_EQ(out.calls[0].name, "get_weather");
    EXPECT_EQ(out.calls[0].arguments, R"({"city":"Paris"})");
    EXPECT_EQ(out.calls[1].name, "now");
    EXPECT_EQ(out.calls[1].arguments, "{}");
  }
  // Plain text, '<' that is not a tag, and trailing whitespace pass through unchanged.
  for (size_t step : {1, 4, 100}) {
    const std::string plain = "a < b and <tool but not a call\n\n";
    EXPECT_EQ(run(plain, step).content, plain);
    EXPECT_TRUE(run(plain, step).calls.empty());
  }
}

TEST(ToolCalls, MalformedAndCutCallsStayContent) {
  for (const std::string bad : {
           "<tool_call>\n{\"name\": \"now\", \"arguments\": [1]}\n</tool_call>",  // arguments not an object
           "<tool_call>\n{\"arguments\": {}}\n</tool_call>",                      // no name
           "<tool_call>\nnot json\n</tool_call>",
           "<tool_call>\n<function=now>\n<parameter=x>\n1\n</function>\n</tool_call>",  // parameter never closed
           "<tool_call>\n{\"name\": \"now\", \"argu",                                 // cut off
       }) {
    SCOPED_TRACE(bad);
    const auto out = run(bad, 3);
    EXPECT_TRUE(out.calls.empty());
    EXPECT_EQ(out.content, bad);
  }
  // A call the model did not close but whose text is complete is still a call.
  const auto open = run("<tool_call>\n{\"name\": \"now\", \"arguments\": {\"a\": 1}}\n", 4);
  ASSERT_EQ(open.calls.size(), 1u);
  EXPECT_EQ(open.calls[0].arguments, R"({"a":1})");
}

TEST(ToolCalls, XmlValuesFollowTheParameterTypes) {
  const std::vector<ToolSpec> tools = {
      {"f", ojson::parse(R"({"properties":{"s":{"type":"string"},"n":{"type":"integer"},"b":{"type":"boolean"},
          "o":{"type":"object"},"u":{}}})")}};
  auto c = parse_tool_call(
      "<function=f>\n<parameter=s>\n42\n</parameter>\n<parameter=n>\n42\n</parameter>\n<parameter=b>\nTrue\n</parameter>\n"
      "<parameter=o>\n{\"k\": [1]}\n</parameter>\n<parameter=u>\nfree text\n</parameter>\n</function>",
      tools);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->arguments, R"({"s":"42","n":42,"b":true,"o":{"k":[1]},"u":"free text"})");
}

TEST(ToolCalls, PythonJsonAndStr) {
  EXPECT_EQ(py_json(ojson::parse(R"({"b": [1, 2.5, "é\n"], "a": {}, "c": null})")),
            "{\"b\": [1, 2.5, \"é\\n\"], \"a\": {}, \"c\": null}");
  EXPECT_EQ(py_str(ojson(true)), "True");
  EXPECT_EQ(py_str(ojson(nullptr)), "None");
  EXPECT_EQ(py_str(ojson("x y")), "x y");
}

// ---- streamed arguments

const std::vector<ToolSpec> kTypedTools = {
    {"f", ojson::parse(R"({"properties":{"s":{"type":"string"},"n":{"type":"integer"},"b":{"type":"boolean"},
        "o":{"type":"object"},"u":{}}})")}};

// Answers whose calls are well-formed, in both formats and with what the compact form rewrites:
// spacing, escapes (\/, \u00e9, a surrogate pair), numbers (1.50, 1e2), nesting, empty containers.
const std::vector<std::string> kWellFormed = {
    "Let me check.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris \\u00e9t\\u00e9\", "
    "\"days\": [1, 2.50, 1e2, -0.5], \"opts\": {\"a\": true, \"b\": null, \"c\": {}, \"d\": []}}}\n</tool_call>",
    "<tool_call>\n{ \"name\" : \"now\" , \"arguments\" : { } }\n</tool_call>\n\n<tool_call>\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"text\": \"a\\/b \\\"q\\\" \\ud83d\\ude00 \\n\\t\\\\ done\"}}\n</tool_call>",
    "Sure.<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n\n</parameter>\n<parameter=text>\n"
    "line 1\nline </para 2 \"quoted\"\n</parameter>\n<parameter=empty>\n</parameter>\n</function>\n</tool_call>",
    "<tool_call>\n<function=f>\n<parameter=s>\n42\n</parameter>\n<parameter=n>\n42\n</parameter>\n<parameter=b>\nTrue\n"
    "</parameter>\n<parameter=o>\n{\"k\": [1]}\n</parameter>\n<parameter=u>\nfree text\n</parameter>\n</function>\n</tool_call>",
    "<tool_call>\n<function=now>\n</function>\n</tool_call> and text after",
    // the model did not close the call, but its text is complete
    "<tool_call>\n{\"name\": \"now\", \"arguments\": {\"a\": 1}}\n",
};

std::vector<ToolSpec> all_tools() {
  std::vector<ToolSpec> t = kTools;
  t.insert(t.end(), kTypedTools.begin(), kTypedTools.end());
  return t;
}

void expect_same(const Answer& streamed, const Answer& whole) {
  EXPECT_EQ(streamed.content, whole.content);
  ASSERT_EQ(streamed.calls.size(), whole.calls.size());
  for (size_t i = 0; i < whole.calls.size(); ++i) {
    EXPECT_EQ(streamed.calls[i].name, whole.calls[i].name);
    EXPECT_EQ(streamed.calls[i].arguments, whole.calls[i].arguments);
  }
}

TEST(ToolCallStream, FragmentsReassembleToTheWholeAnswerAtAnyCut) {
  const auto tools = all_tools();
  for (const std::string& text : kWellFormed) {
    SCOPED_TRACE(text);
    const Answer whole = run(text, text.size(), /*streamed=*/false, tools);
    ASSERT_FALSE(whole.calls.empty());
    for (size_t step = 1; step <= 12; ++step) {  // pieces of a token's size
      SCOPED_TRACE(step);
      expect_same(run(text, step, true, tools), whole);
    }
    for (size_t a = 1; a < text.size(); ++a) {  // every cut into two pieces, and three short ones
      SCOPED_TRACE(a);
      expect_same(run_cut(text, {a}, true, tools), whole);
      expect_same(run_cut(text, {a, std::min(a + 1, text.size())}, true, tools), whole);
      expect_same(run_cut(text, {a, std::min(a + 5, text.size())}, true, tools), whole);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

TEST(ToolCallStream, ArgumentsStreamAsTheModelWritesThem) {
  // JSON form: the call begins once its name and the start of its arguments are in; a string
  // streams by characters, a number once it ended.
  ToolCallParser p(kTools, /*stream_arguments=*/true);
  Answer a;
  add(a, p.feed("Checking the weather.\n<tool_call>\n{\"name\": \"get_"), true);
  EXPECT_EQ(a.content, "Checking the weather.");
  EXPECT_TRUE(a.calls.empty());
  add(a, p.feed("weather\", \"arguments\": {\"city\": \"Par"), true);
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0].name, "get_weather");
  EXPECT_EQ(a.calls[0].arguments, R"({"city":"Par)");
  add(a, p.feed("is\", \"days\": 12"), true);
  EXPECT_EQ(a.calls[0].arguments, R"({"city":"Paris","days":)");
  add(a, p.feed("}}\n</tool_"), true);
  EXPECT_EQ(a.calls[0].arguments, R"({"city":"Paris","days":12})");
  add(a, p.feed("call>"), true);
  add(a, p.finish(), true);
  EXPECT_EQ(a.fragments, 3u);

  // The XML form of Qwen3.5: the call begins with <function=NAME>; a string parameter streams,
  // holding back what may be the newline before </parameter>.
  ToolCallParser x(kTools, true);
  Answer b;
  add(b, x.feed("<tool_call>\n<function=get_weather>\n"), true);
  ASSERT_EQ(b.calls.size(), 1u);
  EXPECT_EQ(b.calls[0].arguments, "");
  add(b, x.feed("<parameter=city>\nNew\n"), true);
  EXPECT_EQ(b.calls[0].arguments, R"({"city":"New)");
  add(b, x.feed("York\n</para"), true);
  EXPECT_EQ(b.calls[0].arguments, R"({"city":"New\nYork)");
  add(b, x.feed("meter>\n</function>\n</tool_call>"), true);
  add(b, x.finish(), true);
  EXPECT_EQ(b.calls[0].arguments, R"({"city":"New\nYork"})");
}

TEST(ToolCallStream, OneFragmentPerPieceOfTheArguments) {
  const std::string text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"text\": "
                           "\"a longer text than a token\"}}\n</tool_call>";
  const Answer a = run(text, 4, true);
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0].arguments, R"({"city":"Paris","text":"a longer text than a token"})");
  EXPECT_GT(a.fragments, 10u);
}

TEST(ToolCallStream, MalformedCalls) {
  // Broken before the arguments began: content, as without streaming.
  for (const std::string bad : {"<tool_call>\n{\"arguments\": {}}\n</tool_call>", "<tool_call>\nnot json\n</tool_call>",
                                "<tool_call>\n{\"name\": \"now\", \"arguments\": [1]}\n</tool_call>",
                                "<tool_call>\n{\"name\": \"now\", \"argu"}) {
    SCOPED_TRACE(bad);
    for (size_t step : {1, 3, 100}) {
      const Answer a = run(bad, step, true);
      EXPECT_TRUE(a.calls.empty());
      EXPECT_EQ(a.content, bad);
    }
  }
  // Cut off inside the arguments (the token limit): the call ends with what was sent, a
  // number not yet ended held back. Without streaming it is content.
  const std::string cut = "<tool_call>\n{\"name\": \"now\", \"arguments\": {\"tz\": \"UTC\", \"n\": 12";
  for (size_t step : {1, 2, 5, 100}) {
    const Answer a = run(cut, step, true);
    ASSERT_EQ(a.calls.size(), 1u);
    EXPECT_EQ(a.calls[0].name, "now");
    EXPECT_EQ(a.calls[0].arguments, R"({"tz":"UTC","n":)");
    EXPECT_EQ(a.content, "");
  }
  EXPECT_TRUE(run(cut, 3, false).calls.empty());
  // Broken after the arguments began: the rest is not sent, the text is not repeated as content.
  for (const std::string bad : {"<tool_call>\n{\"name\": \"now\", \"arguments\": {\"a\": 1, \"a\": 2}}\n</tool_call>",
                                "<tool_call>\n{\"name\": \"now\", \"arguments\": {\"a\" 1}}\n</tool_call>",
                                "<tool_call>\n<function=now>\n<parameter=x>\n1\n</function>\n</tool_call>"}) {
    SCOPED_TRACE(bad);
    const Answer a = run(bad, 2, true);
    ASSERT_EQ(a.calls.size(), 1u);
    EXPECT_EQ(a.calls[0].name, "now");
    EXPECT_EQ(a.content, "");
  }
}

// Malformed or not, what a stream says depends only on the text, never on how it was cut.
TEST(ToolCallStream, MalformedCallsStreamTheSameAtAnyCut) {
  const auto tools = all_tools();
  for (const std::string& text : {
           std::string("<tool_call>\n{\"name\": \"now\", \"arguments\": {\"s\": \"ab\x01" "cd\", \"t\": 1}}\n</tool_call>"),
           std::string("<tool_call>\n{\"name\": \"now\", \"arguments\": {\"s\": \"ab\\qcd\"}}\n</tool_call> x"),
           std::string("<tool_call>\n{\"name\": \"now\", \"arguments\": {\"s\": \"ab\\ud83dxyz\\u00e9\"}}</tool_call>"),
           std::string("<tool_call>\n{\"name\": \"now\", \"arguments\": {\"n\": 01, \"m\": 2}}\n</tool_call>"),
           std::string("<tool_call>\n{\"name\": \"now\", \"arguments\": {\"a\": [1, 2}, \"b\": tru}}"),
           std::string("<tool_call>\n{\"name\": \"now\", \"arguments\": {\"a\": 1}, \"arguments\": {\"b\": 2}}\n</tool_call>"),
           std::string("<tool_call>\n<function=f>\n<parameter=s>\nhalf a value\n</parame"),
           std::string("<tool_call>\n<function=f>\n<parameter=n>\n12\n</parameter>\n<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>"),
           std::string("<tool_call>\n<function=f>\n<parameter=s>\nx\n</parameter>\njunk</function>\n</tool_call>"),
       }) {
    SCOPED_TRACE(text);
    const Answer whole = run(text, text.size(), /*streamed=*/true, tools);
    for (size_t step : {1, 2, 3, 5, 8}) expect_same(run(text, step, true, tools), whole);
    for (size_t a = 1; a < text.size(); ++a) {
      expect_same(run_cut(text, {a}, true, tools), whole);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

}  // namespace
}  // namespace swiftlet::server
