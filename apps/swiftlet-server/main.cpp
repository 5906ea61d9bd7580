// swiftlet-server: OpenAI- and Anthropic-compatible HTTP server (chat completions with tools and
// JSON-schema output, completions, messages, models, tokenize/detokenize/apply-template/props,
// health, Prometheus metrics, and a chat page at /).
//
//   swiftlet-server --model MODEL [--host 127.0.0.1] [--port 8080] [--api-key KEY] [--ctx N] [--parallel N]
//                   [--sessions M] [--state-cache DIR --state-cache-gb N] [--state-cache-ram-gb N]
//
// --parallel N: N slots decoded together (continuous batching, src/server/engine_worker.h).
//
// Listens at once (GET /health answers 503 while the model loads) and prints
// "listening on http://HOST:PORT" on stdout; --port 0 picks a free port.
#include "core/error.h"
#include "core/version.h"
#include "model_flags.h"
#include "server/engine_worker.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/routes.h"

#include <CLI/CLI.hpp>

#include <signal.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <thread>

namespace {

std::string default_model_id(const std::string& path) {
  std::filesystem::path p(path);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // a trailing slash
  std::string name = p.filename().string();
  if (name.ends_with(".qpack")) name.resize(name.size() - 6);
  return name.empty() ? "swiftlet" : name;
}

int serve(int argc, char** argv) {
  CLI::App app{"swiftlet-server: OpenAI-compatible server for Qwen3-Next / Qwen3.5-MoE models"};
  swiftlet::cli::ModelFlags mf;
  std::string alias;
  swiftlet::server::ServerOptions so;
  swiftlet::server::WorkerOptions wo;
  double max_body_mb = double(so.max_body_bytes) / (1 << 20);
  app.set_version_flag("--version", std::string(swiftlet::version()));
  size_t max_header_kb = so.max_header_bytes >> 10;
  mf.add(&app, swiftlet::cli::FlagSet::Server);
  app.add_option("--alias", alias, "model name to serve under (default: the model's file name)");
  app.add_option("--host", so.host, "address to listen on; anything but loopback should come with --api-key")
      ->capture_default_str();
  app.add_option("--port", so.port, "port (0: any free port, printed at start)")->capture_default_str();
  app.add_option("--api-key", so.api_key, "require 'Authorization: Bearer KEY' on /v1/* and /metrics")
      ->envname("SWIFTLET_API_KEY");
  app.add_option("--ctx", wo.max_context, "context length per conversation, in tokens (prompt + answer)")
      ->capture_default_str();
  wo.parallel = 4;
  wo.sessions = 0;
  app.add_option("--parallel", wo.parallel, "requests generated together (continuous batching)")
      ->capture_default_str();
  app.add_option("--sessions", wo.sessions,
                 "conversations whose state is kept for prefix reuse, each in a slot; a request takes the "
                 "slot that continues its conversation (default: --parallel; at least --parallel)");
  app.add_option("--prefill-chunk", wo.prefill_chunk,
                 "prompt tokens a new request feeds between two decode steps of the running ones")
      ->capture_default_str();
  app.add_option("--max-queue", wo.max_queue, "requests that may wait for a free slot (--parallel); more get 429")
      ->capture_default_str();
  app.add_option("--max-body-mb", max_body_mb, "largest request body accepted, in MiB (larger: 413)")
      ->capture_default_str();
  app.add_option("--max-header-kb", max_header_kb, "largest request line + headers accepted, in KiB (larger: 431)")
      ->capture_default_str();
  app.add_option("--max-connections,--http-threads", so.http_threads,
                 "connections served at once (at least --max-queue + 8); more wait for a free one")
      ->capture_default_str();
  app.add_option("--idle-timeout", so.idle_timeout_s, "seconds an open connection may stay without a request")
      ->capture_default_str();
  app.add_option("--max-tokens", wo.max_new_tokens,
                 "most tokens one request may generate, whatever it asks (0: what the context leaves)")
      ->capture_default_str();
  app.add_flag("--log-requests", so.log_requests, "print one line per request on stderr");
  std::string state_dir;
  double state_disk_gb = 0, state_ram_gb = -1;
  app.add_option("--state-cache", state_dir,
                 "directory of the prefix state cache's files: states after shared prompt prefixes, kept "
                 "across restarts (needs --state-cache-gb)");
  app.add_option("--state-cache-gb", state_disk_gb, "disk budget of --state-cache DIR in GB (least recently used out)");
  app.add_option("--state-cache-ram-gb", state_ram_gb,
                 "memory for prefix states shared by every conversation, in GB (default 2 with --state-cache, "
                 "else off; 0: off)");
  CLI11_PARSE(app, argc, argv);

  so.max_body_bytes = size_t(max_body_mb * (1 << 20));
  so.max_header_bytes = max_header_kb << 10;
  so.http_threads = std::max<int>(so.http_threads, int(wo.max_queue) + 8);
  // Every slot holds a session state with a KV cache of up to --ctx tokens: the RAM budget
  // leaves room for all of them (or says to lower --sessions / --parallel).
  if (wo.parallel < 1) swiftlet::fail("--parallel must be at least 1, got {}", wo.parallel);
  if (wo.sessions == 0) wo.sessions = wo.parallel;
  if (wo.sessions < wo.parallel)
    swiftlet::fail("--sessions ({}) must be at least --parallel ({}): each running request holds a session",
                   wo.sessions, wo.parallel);
  if (wo.prefill_chunk < 1) swiftlet::fail("--prefill-chunk must be at least 1, got {}", wo.prefill_chunk);
  if (!state_dir.empty() && !(state_disk_gb > 0))
    swiftlet::fail("--state-cache {} needs a disk budget: add --state-cache-gb N (N > 0)", state_dir);
  if (state_dir.empty() && state_disk_gb > 0)
    swiftlet::fail("--state-cache-gb needs --state-cache DIR (where the state files go)");
  if (state_ram_gb < 0) state_ram_gb = state_dir.empty() ? 0 : 2;
  wo.state_cache = !state_dir.empty() || state_ram_gb > 0;
  wo.state_cache_options.dir = state_dir;
  wo.state_cache_options.disk_bytes = uint64_t(state_disk_gb * 1e9);
  wo.state_cache_options.ram_bytes = uint64_t(state_ram_gb * 1e9);
  mf.context = wo.max_context;
  mf.sessions = wo.sessions;
  wo.engine = mf.engine_options();

  if (!swiftlet::server::is_loopback_host(so.host) && so.api_key.empty())
    std::fprintf(stderr,
                 "swiftlet-server: WARNING: listening on %s without an API key: anyone who can reach this address "
                 "can use the model. Pass --api-key KEY (or SWIFTLET_API_KEY).\n",
                 so.host.c_str());

  // Signals are handled by a watcher thread (sigtimedwait), never in a handler: block them
  // before any thread starts so every thread inherits the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);

  swiftlet::server::Metrics metrics;
  swiftlet::server::EngineWorker worker(wo, metrics);
  swiftlet::server::Routes routes(worker, metrics, {alias.empty() ? default_model_id(mf.model) : alias});
  swiftlet::server::HttpServer server(routes, metrics, so);
  const int port = server.bind();
  std::printf("swiftlet-server: listening on http://%s:%d (loading %s; experts %s)\n", so.host.c_str(), port,
              mf.model.c_str(), wo.engine.on_miss.label().c_str());
  std::fflush(stdout);

  std::atomic<bool> finished{false};
  std::atomic<int> exit_code{0};
  std::thread watcher([&] {
    const timespec tick{0, 100'000'000};
    bool reported = false;
    auto stop_server = [&] {
      while (!finished.load()) {
        server.stop();
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    };
    while (!finished.load()) {
      siginfo_t info;
      if (sigtimedwait(&sigs, &info, &tick) > 0) {
        std::fprintf(stderr, "swiftlet-server: stopping\n");
        stop_server();
        return;
      }
      if (!reported && worker.status() == swiftlet::server::EngineWorker::Status::Ready) {
        reported = true;
        std::printf("swiftlet-server: model ready\n");
        std::fflush(stdout);
      }
      if (worker.status() == swiftlet::server::EngineWorker::Status::Failed) {
        std::fprintf(stderr, "swiftlet-server: cannot load the model: %s\n", worker.load_error().c_str());
        exit_code.store(1);
        stop_server();
        return;
      }
    }
  });
  if (!server.run()) exit_code.store(exit_code.load() ? exit_code.load() : 1);
  finished.store(true);
  watcher.join();
  worker.shutdown();
  return exit_code.load();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return serve(argc, argv);
  } catch (const swiftlet::Error& e) {
    std::fprintf(stderr, "swiftlet-server: %s\n", e.what());
    return 1;
  }
}
