#include "server/http_server.h"

#include "core/error.h"
#include "server/metrics.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <poll.h>
#include <sys/socket.h>

#include <xxhash.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

namespace swiftlet::server {

using namespace std::chrono_literals;

bool is_loopback_host(const std::string& host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  in_addr a{};
  return inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

namespace {

// Tells whether the client of a request has closed its connection, without writing to it.
// cpp-httplib 0.11 does not hand the connection's socket to handlers (later versions have
// Request::is_connection_closed), so the socket is found once by its two addresses among this
// process's descriptors; it stays open for as long as the handler runs.
class ConnectionProbe {
 public:
  explicit ConnectionProbe(const httplib::Request& req)
      : remote_addr_(req.remote_addr), remote_port_(req.remote_port), local_port_(req.local_port) {}

  bool peer_closed() {
    if (fd_ == kUnknown) fd_ = find_socket();
    if (fd_ < 0) return false;
    pollfd p{fd_, POLLRDHUP, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
  }

 private:
  static constexpr int kUnknown = -2;

  static bool address_of(int fd, bool peer, std::string& addr, int& port) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    auto* sa = reinterpret_cast<sockaddr*>(&ss);
    if ((peer ? getpeername(fd, sa, &len) : getsockname(fd, sa, &len)) != 0) return false;
    char buf[INET6_ADDRSTRLEN] = {};
    if (ss.ss_family == AF_INET) {
      auto* in = reinterpret_cast<sockaddr_in*>(&ss);
      inet_ntop(AF_INET, &in->sin_addr, buf, sizeof buf);
      port = ntohs(in->sin_port);
    } else if (ss.ss_family == AF_INET6) {
      auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
      inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof buf);
      port = ntohs(in6->sin6_port);
    } else {
      return false;
    }
    addr = buf;
    return true;
  }

  int find_socket() const {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
      const std::string name = entry.path().filename().string();
      int fd = -1;
      if (std::from_chars(name.data(), name.data() + name.size(), fd).ec != std::errc()) continue;
      std::string addr;
      int port = 0;
      if (!address_of(fd, /*peer=*/false, addr, port) || port != local_port_) continue;
      if (!address_of(fd, /*peer=*/true, addr, port) || port != remote_port_ || addr != remote_addr_) continue;
      return fd;
    }
    return -1;
  }

  std::string remote_addr_;
  int remote_port_, local_port_;
  int fd_ = kUnknown;
};

// A generic error for statuses cpp-httplib produces itself (404 for unknown paths, 400 for a
// malformed request line, ...).
ApiError error_for_status(const httplib::Request& req, int status) {
  switch (status) {
    case 404: return not_found(fmt::format("Invalid URL ({} {})", req.method, req.path), "unknown_url");
    case 413: return payload_too_large("the request body is too large");
    default:
      return ApiError(status, status >= 500 ? "server_error" : "invalid_request_error",
                      status == 400 ? "malformed HTTP request"
                                    : fmt::format("the request failed with HTTP status {}", status));
  }
}

void set_reply(httplib::Response& res, const Reply& r) {
  res.status = r.status;
  res.set_content(r.body, r.content_type);
  for (const auto& [name, value] : r.headers) res.set_header(name, value);
}

// The request line and every header, as they came (name, ": ", value, CRLF).
size_t header_bytes(const httplib::Request& req) {
  size_t n = req.method.size() + req.target.size() + req.version.size() + 4;
  for (const auto& [k, v] : req.headers) n += k.size() + v.size() + 4;
  return n;
}

}  // namespace

bool api_key_matches(std::string_view given, std::string_view key) {
  // A keyed hash: the seed is secret and differs per process, so digests cannot be precomputed.
  static const uint64_t seed = [] {
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ rd();
  }();
  const XXH128_hash_t a = XXH3_128bits_withSeed(given.data(), given.size(), seed);
  const XXH128_hash_t b = XXH3_128bits_withSeed(key.data(), key.size(), seed);
  volatile uint64_t diff = (a.low64 ^ b.low64) | (a.high64 ^ b.high64);
  return diff == 0 && given.size() == key.size();
}

HttpServer::HttpServer(Routes& routes, Metrics& metrics, ServerOptions opts)
    : routes_(routes), metrics_(metrics), opts_(std::move(opts)), svr_(std::make_unique<httplib::Server>()),
      stopping_(std::make_shared<std::atomic<bool>>(false)) {
  install_routes();
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::install_routes() {
  httplib::Server& svr = *svr_;
  const int threads = std::max(4, opts_.http_threads);
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  svr.set_keep_alive_timeout(opts_.idle_timeout_s);
  svr.set_read_timeout(opts_.read_timeout_s);
  svr.set_write_timeout(opts_.write_timeout_s);
  svr.set_payload_max_length(opts_.max_body_bytes);  // a second line behind the check below

  // Checks that need only the headers, made before any of the body is read: the size limit
  // (a 100 MB body is refused without receiving it) and the API key.
  auto admit = [this](const httplib::Request& req) -> std::optional<ApiError> {
    if (const size_t h = header_bytes(req); h > opts_.max_header_bytes)
      return ApiError(431, "invalid_request_error",
                      fmt::format("the request line and headers have {} bytes; the limit is {} bytes", h,
                                  opts_.max_header_bytes),
                      "", "headers_too_large");
    if (req.has_header("Content-Length")) {
      const std::string v = req.get_header_value("Content-Length");
      uint64_t len = 0;
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), len);
      if (ec != std::errc() || p != v.data() + v.size())
        return invalid_request(fmt::format("Content-Length '{}' is not a number", v));
      if (len > opts_.max_body_bytes)
        return payload_too_large(fmt::format("the request body has {} bytes; the limit is {} bytes", len, opts_.max_body_bytes));
    } else if (req.get_header_value("Transfer-Encoding").find("chunked") != std::string::npos) {
      return ApiError(411, "invalid_request_error", "send the request body with a Content-Length (chunked uploads are not accepted)");
    }
    const bool protected_path = req.path.rfind("/v1/", 0) == 0 || req.path == "/metrics";
    if (!opts_.api_key.empty() && protected_path) {
      // OpenAI's clients send 'Authorization: Bearer KEY', Anthropic's 'x-api-key: KEY'.
      const std::string auth = req.get_header_value("Authorization");
      const std::string prefix = "Bearer ";
      const bool bearer =
          auth.rfind(prefix, 0) == 0 && api_key_matches(std::string_view(auth).substr(prefix.size()), opts_.api_key);
      if (!bearer && !api_key_matches(req.get_header_value("x-api-key"), opts_.api_key))
        return unauthorized("Incorrect or missing API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'.");
    }
    return std::nullopt;
  };
  svr.set_expect_100_continue_handler([admit](const httplib::Request& req, httplib::Response& res) {
    if (auto err = admit(req)) {
      set_reply(res, Routes::error_reply_for(req.path, *err));
      res.set_header("Connection", "close");
      return err->status();
    }
    return 100;
  });
  svr.set_pre_routing_handler([admit](const httplib::Request& req, httplib::Response& res) {
    if (auto err = admit(req)) {
      set_reply(res, Routes::error_reply_for(req.path, *err));
      // The unread body would follow on this connection: the client must not reuse it.
      res.set_header("Connection", "close");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    // httplib answers 404 (or 400, for a method no route uses) to a known path with the wrong
    // method: say which.
    static const std::pair<const char*, const char*> routes[] = {
        {"/", "GET"}, {"/health", "GET"}, {"/metrics", "GET"}, {"/v1/models", "GET"},
        {"/v1/chat/completions", "POST"}, {"/v1/completions", "POST"}, {"/v1/messages", "POST"},
        {"/v1/messages/count_tokens", "POST"}, {"/tokenize", "POST"}, {"/detokenize", "POST"},
        {"/apply-template", "POST"}, {"/props", "GET"}};
    if (res.status == 400 || res.status == 404)
      for (const auto& [path, method] : routes)
        if (req.path == path && req.method != method) {
          res.status = 405;
          res.set_header("Allow", method);
          set_reply(res, Routes::error_reply(ApiError(405, "invalid_request_error",
                                                      fmt::format("{} {} is not supported: use {}", req.method, req.path, method),
                                                      "", "method_not_allowed")));
          return;
        }
    set_reply(res, Routes::error_reply(error_for_status(req, res.status)));
  });
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    set_reply(res, Routes::error_reply(internal_error(what)));
  });
  svr.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics_.on_http(req.path, res.status);
    if (opts_.log_requests)
      std::fprintf(stderr, "%s %s %s -> %d\n", req.remote_addr.c_str(), req.method.c_str(), req.path.c_str(), res.status);
  });

  // Runs a route and writes its reply. Streamed replies are pulled from the engine's job in
  // this (the connection's) thread; when the client goes away the job is cancelled.
  auto serve = [this](const httplib::Request& req, httplib::Response& res, const std::function<Reply()>& route) {
    Reply reply;
    try {
      reply = route();
    } catch (const ApiError& e) {
      reply = Routes::error_reply_for(req.path, e);
    } catch (const std::exception& e) {
      reply = Routes::error_reply_for(req.path, internal_error(e.what()));
    }
    if (!reply.stream) {
      set_reply(res, reply);
      return;
    }
    std::shared_ptr<ReplyStream> stream = reply.stream;
    for (const auto& [name, value] : reply.headers) res.set_header(name, value);
    auto probe = std::make_shared<ConnectionProbe>(req);
    auto stopping = stopping_;
    if (!stream->sse()) {
      std::string body;
      while (stream->poll(body, 200ms) != ReplyStream::Poll::Done) {
        if (probe->peer_closed() || *stopping) {
          stream->cancel();
          break;
        }
      }
      res.status = stream->status();
      res.set_content(body, reply.content_type);
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        reply.content_type,
        [stream, probe, stopping](size_t, httplib::DataSink& sink) {
          std::string out;
          for (;;) {
            const ReplyStream::Poll p = stream->poll(out, 200ms);
            if (!out.empty() && !sink.write(out.data(), out.size())) {
              stream->cancel();  // the client is gone (or stopped reading for write_timeout_s)
              return false;
            }
            out.clear();
            if (p == ReplyStream::Poll::Done) {
              sink.done();
              return true;
            }
            if (p == ReplyStream::Poll::Data) return true;
            if (probe->peer_closed() || *stopping) {
              stream->cancel();
              return false;
            }
          }
        },
        [stream](bool success) {
          if (!success) stream->cancel();
        });
  };

  svr.Get("/", [this, serve](const httplib::Request& q, httplib::Response& r) { serve(q, r, [&] { return routes_.chat_page(); }); });
  svr.Get("/health", [this, serve](const httplib::Request& q, httplib::Response& r) { serve(q, r, [&] { return routes_.health(); }); });
  svr.Get("/metrics", [this, serve](const httplib::Request& q, httplib::Response& r) { serve(q, r, [&] { return routes_.metrics(); }); });
  svr.Get("/v1/models", [this, serve](const httplib::Request& q, httplib::Response& r) { serve(q, r, [&] { return routes_.models(); }); });
  svr.Get(R"(/v1/models/(.+))", [this, serve](const httplib::Request& q, httplib::Response& r) {
    serve(q, r, [&] { return routes_.model(q.matches[1].str()); });
  });
  svr.Post("/v1/chat/completions", [this, serve](const httplib::Request& q, httplib::Response& r) {
    serve(q, r, [&] { return routes_.chat_completions(q.body); });
  });
  svr.Post("/v1/completions", [this, serve](const httplib::Request& q, httplib::Response& r) {
    serve(q, r, [&] { return routes_.completions(q.body); });
  });
  svr.Post("/v1/messages", [this, serve](const httplib::Request& q, httplib::Response& r) {
    serve(q, r, [&] { return routes_.messages(q.body); });
  });
  svr.Post("/v1/messages/count_tokens", [this, serve](const httplib::Request& q, httplib::Response& r) {
    serve(q, r, [&] { return routes_.count_tokens(q.body); });
  });
  svr.Post("/tokenize", [this, serve](const httplib::Request& q, httplib::Response& r) {
    serve(q, r, [&] { return routes_.tokenize(q.body); });
  });
  svr.Post("/detokenize", [this, serve](const httplib::Request& q, httplib::Response& r) {
    serve(q, r, [&] { return routes_.detokenize(q.body); });
  });
  svr.Post("/apply-template", [this, serve](const httplib::Request& q, httplib::Response& r) {
    serve(q, r, [&] { return routes_.apply_template(q.body); });
  });
  svr.Get("/props", [this, serve](const httplib::Request& q, httplib::Response& r) { serve(q, r, [&] { return routes_.props(); }); });
}

int HttpServer::bind() {
  const int port = opts_.port == 0 ? svr_->bind_to_any_port(opts_.host)
                                   : (svr_->bind_to_port(opts_.host, opts_.port) ? opts_.port : -1);
  if (port < 0) fail("cannot listen on {}:{}: the address is in use or not available (pick another --port / --host)", opts_.host, opts_.port);
  return port;
}

bool HttpServer::run() { return svr_->listen_after_bind(); }

void HttpServer::stop() {
  stopping_->store(true);
  // httplib's stop() does nothing before listening has started, and must be sent only once:
  // callers repeat stop() until run() has returned.
  std::lock_guard lock(stop_mu_);
  if (!stop_sent_ && svr_->is_running()) {
    svr_->stop();
    stop_sent_ = true;
  }
}

}  // namespace swiftlet::server
