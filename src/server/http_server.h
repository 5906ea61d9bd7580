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

namespace httplib {
class Server;
}

namespace swiftlet::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                      // 0: any free port (see bind())
  std::string api_key;                  // "": no authentication
  size_t max_body_bytes = 8u << 20;     // larger request bodies get 413 before being read
  int http_threads = 40;                // connections served at once
  int read_timeout_s = 10;
  int write_timeout_s = 20;             // a client that reads nothing for this long is dropped
  bool log_requests = false;            // one line per request on stderr
};

// True for 127.0.0.0/8, ::1 and "localhost".
bool is_loopback_host(const std::string& host);

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
