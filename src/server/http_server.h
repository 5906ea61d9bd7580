// The HTTP transport (cpp-httplib): sockets, limits, the API key, and moving Replies onto the
// wire, streamed ones as chunked server-sent events. It knows no JSON and no model: each route
// is a call into Routes, and every error goes through Routes::error_reply.
#pragma once

#include "server/routes.h"

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace httplib {
class Server;
}

namespace swiftlet::server {

// The limits have safe defaults; README.md ("Server limits") documents them and their flags.
struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                      // 0: any free port (see bind())
  std::string api_key;                  // "": no authentication
  size_t max_body_bytes = 8u << 20;     // larger request bodies get 413 before being read
  // Request line and headers together; more gets 431. (cpp-httplib itself refuses a single
  // header line over 8 KiB with 400.)
  size_t max_header_bytes = 32u << 10;
  int http_threads = 40;                // connections served at once; more wait their turn
  int idle_timeout_s = 5;               // an open connection with no request is closed after this
  int read_timeout_s = 10;
  int write_timeout_s = 20;             // a client that reads nothing for this long is dropped
  bool log_requests = false;            // one line per request on stderr
};

// True for 127.0.0.0/8, ::1 and "localhost".
bool is_loopback_host(const std::string& host);

// Whether `given` is the API key, in a time that depends on neither (both are hashed first, then
// every byte of the digests is compared), so the answer time tells nothing about the key.
bool api_key_matches(std::string_view given, std::string_view key);

class HttpServer {
 public:
  HttpServer(Routes& routes, Metrics& metrics, ServerOptions opts);
  ~HttpServer();

  // Binds the listening socket; returns the port (the chosen one for port 0). Throws Error.
  int bind();
  // Serves until stop(). Returns false if the server could not run.
  bool run();
  // From any thread (a signal watcher): stops accepting, ends open streams, makes run() return.
  // Before run() has started listening it only marks the server as stopping: call it again
  // until run() returns.
  void stop();

 private:
  void install_routes();

  Routes& routes_;
  Metrics& metrics_;
  ServerOptions opts_;
  std::unique_ptr<httplib::Server> svr_;
  std::shared_ptr<std::atomic<bool>> stopping_;
  std::mutex stop_mu_;
  bool stop_sent_ = false;
};

}  // namespace swiftlet::server
