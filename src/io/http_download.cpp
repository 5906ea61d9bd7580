#include "io/http_download.h"

#include "core/error.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

namespace swiftlet {
namespace {

constexpr size_t kSniffBytes = 64;         // start of a body held back to spot an HTML page
constexpr size_t kErrorBodyBytes = 4096;   // start of an error answer kept for the message
constexpr double kProgressInterval = 0.1;  // seconds between progress reports

// A failed attempt worth retrying: connection trouble, a timeout, 5xx/429/408.
struct Retryable {
  std::string reason;
  double retry_after_s = -1;  // from the server; < 0 when it said nothing usable
};

std::string getenv_str(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string trim(std::string s) {
  auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!s.empty() && ws(s.back())) s.pop_back();
  size_t i = 0;
  while (i < s.size() && ws(s[i])) ++i;
  return s.substr(i);
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool starts_with_ci(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  return true;
}

// RFC 3986 percent-encoding; `keep_slash` for multi-segment paths.
std::string url_encode(const std::string& s, bool keep_slash) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || (keep_slash && c == '/'))
      out += char(c);
    else
      out += fmt::format("%{:02X}", c);
  }
  return out;
}

bool looks_like_html(std::string_view head) {
  if (head.size() >= 3 && head.substr(0, 3) == "\xEF\xBB\xBF") head.remove_prefix(3);  // BOM
  while (!head.empty() && std::isspace(static_cast<unsigned char>(head.front())))
    head.remove_prefix(1);
  return starts_with_ci(head, "<!doctype html") || starts_with_ci(head, "<html");
}

bool is_html_name(const std::string& name) {
  std::string l = lower(name);
  return l.ends_with(".html") || l.ends_with(".htm");
}

struct Origin {
  std::string scheme, host, port;
  bool operator==(const Origin&) const = default;
};

Origin parse_origin(const std::string& url) {
  Origin o;
  CURLU* u = curl_url();
  if (!u) return o;
  if (curl_url_set(u, CURLUPART_URL, url.c_str(), 0) == CURLUE_OK) {
    auto part = [&](CURLUPart what, unsigned flags) {
      char* p = nullptr;
      std::string s;
      if (curl_url_get(u, what, &p, flags) == CURLUE_OK && p) s = p;
      curl_free(p);
      return s;
    };
    o.scheme = lower(part(CURLUPART_SCHEME, 0));
    o.host = lower(part(CURLUPART_HOST, 0));
    o.port = part(CURLUPART_PORT, CURLU_DEFAULT_PORT);
  }
  curl_url_cleanup(u);
  return o;
}

// Owns a file descriptor.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

uint64_t fd_size(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail("cannot stat '{}': {}", path, std::strerror(errno));
  return uint64_t(st.st_size);
}

void write_all(int fd, const uint8_t* p, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      fail("cannot write '{}': {} — free some space (or fix permissions) and re-run to resume",
           path, std::strerror(errno));
    p += w;
    n -= size_t(w);
  }
}

// Where a transfer's bytes go. `offset` is how many the sink already holds.
struct Sink {
  uint64_t offset = 0;
  std::function<void(const uint8_t*, size_t)> write;
  std::function<void()> rewind;  // back to zero bytes; empty: cannot (bytes get skipped instead)
};

// Turns byte counts into throttled TransferProgress reports.
class Reporter {
 public:
  Reporter(const ProgressFn& fn, std::string name) : fn_(fn), name_(std::move(name)) {}
  void report(uint64_t done, std::optional<uint64_t> total, bool finished) {
    if (!fn_) return;
    auto now = std::chrono::steady_clock::now();
    meter_.add(done, now);
    if (!finished && std::chrono::duration<double>(now - last_).count() < kProgressInterval)
      return;
    last_ = now;
    TransferProgress p;
    p.name = name_;
    p.done = done;
    p.total = total.value_or(0);
    p.rate_bps = meter_.rate_bps();
    if (total && p.rate_bps > 0 && *total >= done) p.eta_s = double(*total - done) / p.rate_bps;
    p.finished = finished;
    fn_(p);
  }

 private:
  const ProgressFn& fn_;
  std::string name_;
  RateMeter meter_;
  std::chrono::steady_clock::time_point last_{};
};

// What one transfer is for, to word the errors.
struct Target {
  std::string url;
  std::string repo, revision, filename;  // filename empty for API calls
  std::string what;                      // "'config.json' of ORG/REPO at revision main"
  bool reject_html = true;
  std::optional<uint64_t> expected_size;
};

// One HTTP exchange (one request, one answer) of one attempt.
struct Exchange {
  const Target* target = nullptr;
  Sink* sink = nullptr;
  Reporter* reporter = nullptr;

  long status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  bool body_started = false;
  uint64_t pos = 0;  // position in the file of the next body byte
  std::optional<uint64_t> total;
  bool sniffing = false;
  std::string head;  // held-back first bytes of the file while sniffing
  std::string error_body;
  std::exception_ptr error;

  bool ok() const { return status >= 200 && status < 300; }
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }

  void on_header(std::string_view line) {
    std::string l = trim(std::string(line));
    if (l.starts_with("HTTP/")) {  // a new answer (after 100 Continue, say): start over
      headers.clear();
      size_t sp = l.find(' ');
      status = sp == std::string::npos ? 0 : std::strtol(l.c_str() + sp + 1, nullptr, 10);
      return;
    }
    size_t colon = l.find(':');
    if (colon == std::string::npos) return;
    headers[lower(trim(l.substr(0, colon)))] = trim(l.substr(colon + 1));
  }

  // First body byte of a 2xx answer (or its end, for an empty body): checks what the server
  // sent against what we asked for.
  void begin_body() {
    body_started = true;
    if (!ok()) return;
    const Target& t = *target;
    if (t.reject_html && lower(header("content-type")).starts_with("text/html"))
      fail_html();
    std::string cr = header("content-range");
    // A range answer is a 206; some servers (cpp-httplib 0.11) send the range with a 200, so
    // trust Content-Range over the status code rather than mistake a tail for the whole file.
    if (status == 206 || (!cr.empty() && sink->offset > 0)) {
      // Content-Range: bytes FIRST-LAST/TOTAL (RFC 9110 14.4)
      unsigned long long first = 0, last = 0;
      char total_str[32] = {0};
      if (std::sscanf(cr.c_str(), "bytes %llu-%llu/%31s", &first, &last, total_str) != 3)
        fail("{}: the server answered {} with an unreadable Content-Range '{}' — retry later",
             t.what, status, cr);
      if (first != sink->offset)
        fail("{}: asked the server for bytes from {} and it sent bytes from {} — retry later",
             t.what, sink->offset, first);
      pos = first;
      if (std::strcmp(total_str, "*") != 0) total = std::strtoull(total_str, nullptr, 10);
    } else {
      pos = 0;
      std::string cl = header("content-length");
      if (!cl.empty()) total = std::strtoull(cl.c_str(), nullptr, 10);
      // The server ignored our Range: start over where the sink can, else skip what it holds.
      if (sink->offset > 0 && sink->rewind) {
        sink->rewind();
        sink->offset = 0;
      }
    }
    if (total && t.expected_size && *total != *t.expected_size)
      fail("{}: the server sends {} bytes but the repo listing says {} — the repo changed while "
           "downloading? Re-run to start over",
           t.what, *total, *t.expected_size);
    sniffing = t.reject_html && pos == 0;
  }

  [[noreturn]] void fail_html() const {
    fail("{}: the server sent an HTML page instead of the file ({}) — a proxy, captive portal "
         "or hub error page? Check HF_ENDPOINT ('{}') and the network",
         target->what, target->url, target->url.substr(0, target->url.find('/', 8)));
  }

  void deliver(const uint8_t* p, size_t n) {
    if (pos < sink->offset) {  // bytes the sink already holds (a 200 to a resumed request)
      size_t skip = size_t(std::min<uint64_t>(n, sink->offset - pos));
      p += skip;
      n -= skip;
      pos += skip;
    }
    if (n == 0) return;
    pos += n;
    if (sniffing) {
      head.append(reinterpret_cast<const char*>(p), n);
      if (head.size() < kSniffBytes) return;
      flush_head();
      return;
    }
    sink->write(p, n);
    sink->offset += n;
    reporter->report(sink->offset, total ? total : target->expected_size, false);
  }

  void flush_head() {
    if (!sniffing) return;
    sniffing = false;
    if (looks_like_html(head)) fail_html();
    std::string h;
    h.swap(head);
    sink->write(reinterpret_cast<const uint8_t*>(h.data()), h.size());
    sink->offset += h.size();
    reporter->report(sink->offset, total ? total : target->expected_size, false);
  }

  size_t on_body(const char* data, size_t n) {
    try {
      if (!body_started) begin_body();
      if (!ok()) {  // an error answer: keep its start for the message, never deliver it
        if (error_body.size() < kErrorBodyBytes)
          error_body.append(data, std::min(n, kErrorBodyBytes - error_body.size()));
        return n;
      }
      deliver(reinterpret_cast<const uint8_t*>(data), n);
      return n;
    } catch (...) {
      error = std::current_exception();
      return CURL_WRITEFUNC_ERROR;  // aborts the transfer with CURLE_WRITE_ERROR
    }
  }

  // The hub explains errors in X-Error-Message, or a JSON {"error": ...} body.
  std::string server_message() const {
    std::string m = header("x-error-message");
    if (m.empty() && !error_body.empty() && error_body.front() == '{') {
      auto j = nlohmann::json::parse(error_body, nullptr, false);
      if (j.is_object() && j.contains("error") && j["error"].is_string())
        m = j["error"].get<std::string>();
    }
    if (m.size() > 300) m = m.substr(0, 300) + "...";
    return m.empty() ? m : " (\"" + m + "\")";
  }
};

size_t header_cb(char* data, size_t size, size_t n, void* user) {
  static_cast<Exchange*>(user)->on_header(std::string_view(data, size * n));
  return size * n;
}

size_t body_cb(char* data, size_t size, size_t n, void* user) {
  return static_cast<Exchange*>(user)->on_body(data, size * n);
}

double parse_retry_after(const std::string& v, double cap) {
  if (v.empty() || !std::all_of(v.begin(), v.end(), [](char c) { return std::isdigit(c); }))
    return -1;  // absent, or an HTTP date: fall back to our own backoff
  return std::min(double(std::strtoll(v.c_str(), nullptr, 10)), cap);
}

bool stderr_chatty(HubOptions::Progress mode) {
  return mode == HubOptions::Progress::Always ||
         (mode == HubOptions::Progress::Auto && ::isatty(STDERR_FILENO) == 1);
}

std::string read_token_file() {
  std::string path = getenv_str("HF_TOKEN_PATH");
  if (path.empty()) {
    std::string home = getenv_str("HF_HOME");
    if (!home.empty()) {
      path = home + "/token";
    } else {
      std::string cache = getenv_str("XDG_CACHE_HOME");
      if (cache.empty() && !getenv_str("HOME").empty()) cache = getenv_str("HOME") + "/.cache";
      if (!cache.empty()) path = cache + "/huggingface/token";
    }
  }
  if (path.empty()) return {};
  std::ifstream f(path);
  std::string token;
  if (f) std::getline(f, token);
  return trim(token);
}

}  // namespace

void check_repo_id(const std::string& repo) {
  size_t slash = repo.find('/');
  bool ok = slash != std::string::npos && slash > 0 && slash + 1 < repo.size() &&
            repo.find('/', slash + 1) == std::string::npos && repo.find("..") == std::string::npos;
  for (char c : repo)
    ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
                c == '/');
  if (!ok)
    fail("'{}' is not a Hugging Face repo id: expected ORG/REPO, e.g. Qwen/Qwen3-Next-80B-A3B-Instruct",
         repo);
}

HubOptions HubOptions::from_env() {
  HubOptions o;
  std::string ep = trim(getenv_str("HF_ENDPOINT"));
  if (!ep.empty()) o.endpoint = ep;
  o.token = trim(getenv_str("HF_TOKEN"));
  if (o.token.empty()) o.token = trim(getenv_str("HUGGING_FACE_HUB_TOKEN"));
  if (o.token.empty()) o.token = read_token_file();
  std::string no_bars = lower(getenv_str("HF_HUB_DISABLE_PROGRESS_BARS"));
  if (no_bars == "1" || no_bars == "true" || no_bars == "yes") o.progress = Progress::Never;
  return o;
}

const HubFile* RepoListing::find(const std::string& name) const {
  for (const HubFile& f : files)
    if (f.name == name) return &f;
  return nullptr;
}

struct HubClient::Impl {
  HubOptions opts;
  CURL* curl = nullptr;
  Origin endpoint_origin;
  std::string user_agent;

  explicit Impl(HubOptions o) : opts(std::move(o)) {
    while (!opts.endpoint.empty() && opts.endpoint.back() == '/') opts.endpoint.pop_back();
    if (!opts.endpoint.starts_with("http://") && !opts.endpoint.starts_with("https://"))
      fail("hub endpoint '{}' is not an http(s) URL — fix HF_ENDPOINT (e.g. {})", opts.endpoint,
           kDefaultHubEndpoint);
    if (opts.token.find_first_of("\r\n") != std::string::npos)
      fail("HF_TOKEN contains a line break — set it to the token alone");
    static std::once_flag once;
    std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
    curl = curl_easy_init();
    SWIFTLET_CHECK(curl != nullptr, "curl_easy_init failed");
    endpoint_origin = parse_origin(opts.endpoint);
    user_agent = opts.user_agent.empty()
                     ? fmt::format("swiftlet/0.1 libcurl/{}", curl_version_info(CURLVERSION_NOW)->version)
                     : opts.user_agent;
  }
  ~Impl() { curl_easy_cleanup(curl); }

  // Runs one transfer to completion, retrying with backoff. Returns the bytes the sink holds.
  uint64_t transfer(const Target& t, Sink& sink, const ProgressFn& progress) {
    Reporter reporter(progress, t.filename.empty() ? t.url : t.filename);
    int failures = 0;
    for (;;) {
      uint64_t before = sink.offset;
      try {
        attempt(t, sink, reporter);
        reporter.report(sink.offset, sink.offset, true);
        return sink.offset;
      } catch (const Retryable& r) {
        if (sink.offset > before) failures = 0;  // progress: a flaky link, not a dead one
        if (failures >= opts.max_retries)
          fail("{}: giving up after {} attempts: {} — check the network (and HF_ENDPOINT) and "
               "re-run{}",
               t.what, failures + 1, r.reason,
               t.filename.empty() ? "" : "; the download resumes where it stopped");
        double wait = std::min(opts.backoff_initial_s * std::pow(2.0, failures), opts.backoff_max_s);
        if (r.retry_after_s >= 0) wait = r.retry_after_s;
        ++failures;
        if (stderr_chatty(opts.progress))
          std::fprintf(stderr, "\n%s: %s; retry %d/%d in %.1fs\n", t.what.c_str(),
                       r.reason.c_str(), failures, opts.max_retries, wait);
        std::this_thread::sleep_for(std::chrono::duration<double>(wait));
      }
    }
  }

  // One attempt: a request to the hub URL and the redirects it answers with.
  void attempt(const Target& t, Sink& sink, Reporter& reporter) {
    std::string url = t.url;
    for (int hop = 0;; ++hop) {
      if (hop > opts.max_redirects)
        fail("{}: more than {} redirects from {} — check HF_ENDPOINT", t.what, opts.max_redirects,
             t.url);
      bool send_token = !opts.token.empty() && parse_origin(url) == endpoint_origin;
      Exchange ex;
      ex.target = &t;
      ex.sink = &sink;
      ex.reporter = &reporter;
      CURLcode rc = perform(url, send_token, sink.offset, ex);
      if (ex.error) std::rethrow_exception(ex.error);
      long status = 0;
      curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
      ex.status = status;
      if (rc != CURLE_OK && status < 400) {
        std::string reason = curl_easy_strerror(rc);
        if (!errbuf_.empty() && errbuf_[0]) reason += std::string(": ") + errbuf_.data();
        throw Retryable{reason};
      }
      if (status >= 300 && status < 400) {
        char* loc = nullptr;
        curl_easy_getinfo(curl, CURLINFO_REDIRECT_URL, &loc);
        if (!loc || !*loc)
          fail("{}: the server answered {} without a Location to follow", t.what, status);
        url = loc;
        std::string scheme = parse_origin(url).scheme;
        if (scheme != "http" && scheme != "https")
          fail("{}: refusing a redirect to '{}' (not http/https)", t.what, url);
        continue;
      }
      if (ex.ok()) {
        finish(t, sink, ex);
        return;
      }
      if (status == 416) {  // Range not satisfiable: the .part is complete, or stale
        unsigned long long total = 0;
        if (std::sscanf(ex.header("content-range").c_str(), "bytes */%llu", &total) == 1 &&
            total == sink.offset)
          return;
        if (!sink.rewind)
          fail("{}: the server refused to resume at byte {} (416)", t.what, sink.offset);
        sink.rewind();
        sink.offset = 0;
        throw Retryable{"the partial file does not match the server's (416); starting over", 0};
      }
      fail_status(t, ex);
    }
  }

  CURLcode perform(const std::string& url, bool send_token, uint64_t offset, Exchange& ex) {
    curl_easy_reset(curl);  // keeps the connection cache
    errbuf_.assign(CURL_ERROR_SIZE, '\0');
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf_.data());
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);  // redirects are ours: see the header
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl, CURLOPT_USERAGENT, user_agent.c_str());
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, opts.connect_timeout_s);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, opts.low_speed_bytes_per_s);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, opts.low_speed_time_s);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, header_cb);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, &ex);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, body_cb);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &ex);
    std::string range = fmt::format("{}-", offset);
    if (offset > 0) curl_easy_setopt(curl, CURLOPT_RANGE, range.c_str());
    curl_slist* hdrs = nullptr;
    std::string auth = "Authorization: Bearer " + opts.token;
    if (send_token) hdrs = curl_slist_append(hdrs, auth.c_str());
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, hdrs);
    CURLcode rc = curl_easy_perform(curl);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, nullptr);
    curl_slist_free_all(hdrs);
    return rc;
  }

  // A 2xx answer ended cleanly: check that every byte arrived.
  void finish(const Target& t, Sink& sink, Exchange& ex) {
    if (!ex.body_started) ex.begin_body();  // an empty body
    ex.flush_head();
    std::optional<uint64_t> total = ex.total ? ex.total : t.expected_size;
    if (total && sink.offset < *total)
      throw Retryable{fmt::format("the connection ended after {} of {} bytes", sink.offset, *total)};
    if (total && sink.offset > *total)
      fail("{}: received {} bytes but expected {} — re-run to start over", t.what, sink.offset,
           *total);
  }

  [[noreturn]] void fail_status(const Target& t, const Exchange& ex) {
    long s = ex.status;
    std::string msg = ex.server_message();
    std::string code = ex.header("x-error-code");
    if (s == 408 || s == 429 || s >= 500)
      throw Retryable{fmt::format("the server answered {}{}", s, msg),
                      parse_retry_after(ex.header("retry-after"), opts.retry_after_max_s)};
    if (s == 401)
      fail("{}: the hub answered 401 Unauthorized{}. The repo may be private or gated, or may not "
           "exist: {}",
           t.what, msg,
           opts.token.empty() ? "set HF_TOKEN to a token with read access "
                                "(https://huggingface.co/settings/tokens)"
                              : "the token in HF_TOKEN was refused — check that it is valid");
    if (s == 403)
      fail("{}: the hub answered 403 Forbidden{}. If the model is gated, accept its licence on its "
           "hub page with the account whose token is in HF_TOKEN{}",
           t.what, msg, opts.token.empty() ? " (HF_TOKEN is not set)" : "");
    if (s == 404) {
      if (code == "RepoNotFound")
        fail("no such repo '{}' on {}{} — check ORG/REPO (a private repo also needs HF_TOKEN)",
             t.repo, opts.endpoint, msg);
      if (code == "RevisionNotFound")
        fail("repo '{}' has no revision '{}'{} — check --revision", t.repo, t.revision, msg);
      fail("{}: not found (404){} — check the repo id, --revision and file name", t.what, msg);
    }
    fail("{}: the server answered HTTP {}{} for {}", t.what, s, msg, t.url);
  }

  std::vector<char> errbuf_;
};

HubClient::HubClient(HubOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
HubClient::~HubClient() = default;

const HubOptions& HubClient::options() const { return impl_->opts; }

std::string HubClient::file_url(const std::string& repo, const std::string& revision,
                                const std::string& filename) const {
  check_repo_id(repo);
  if (filename.empty() || filename.front() == '/' || filename.find("..") != std::string::npos)
    fail("'{}' is not a file name inside a repo", filename);
  return fmt::format("{}/{}/resolve/{}/{}", impl_->opts.endpoint, repo,
                     url_encode(revision, false), url_encode(filename, true));
}

RepoListing HubClient::list_files(const std::string& repo, const std::string& revision) {
  check_repo_id(repo);
  Target t;
  t.url = fmt::format("{}/api/models/{}/revision/{}?blobs=true", impl_->opts.endpoint, repo,
                      url_encode(revision, false));
  t.repo = repo;
  t.revision = revision;
  t.what = fmt::format("listing of {} at revision {}", repo, revision);
  std::string body;
  Sink sink;
  sink.write = [&](const uint8_t* p, size_t n) { body.append(reinterpret_cast<const char*>(p), n); };
  sink.rewind = [&] { body.clear(); };
  impl_->transfer(t, sink, {});

  auto j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_object() || !j.contains("siblings") || !j["siblings"].is_array())
    fail("{}: the answer from {} is not a hub model listing (no \"siblings\") — check HF_ENDPOINT",
         t.what, t.url);
  RepoListing out;
  out.repo = repo;
  out.revision = revision;
  if (j.contains("sha") && j["sha"].is_string()) out.commit = j["sha"].get<std::string>();
  for (const auto& s : j["siblings"]) {
    if (!s.is_object() || !s.contains("rfilename") || !s["rfilename"].is_string()) continue;
    HubFile f;
    f.name = s["rfilename"].get<std::string>();
    if (s.contains("size") && s["size"].is_number_unsigned()) f.size = s["size"].get<uint64_t>();
    if (s.contains("lfs") && s["lfs"].is_object()) {
      const auto& lfs = s["lfs"];
      if (lfs.contains("sha256") && lfs["sha256"].is_string())
        f.sha256 = lfs["sha256"].get<std::string>();
      if (!f.size && lfs.contains("size") && lfs["size"].is_number_unsigned())
        f.size = lfs["size"].get<uint64_t>();
    }
    out.files.push_back(std::move(f));
  }
  return out;
}

namespace {
Target file_target(const HubClient& c, const std::string& repo, const std::string& revision,
                   const std::string& filename, std::optional<uint64_t> expected_size) {
  Target t;
  t.url = c.file_url(repo, revision, filename);
  t.repo = repo;
  t.revision = revision;
  t.filename = filename;
  t.what = fmt::format("'{}' of {} at revision {}", filename, repo, revision);
  t.reject_html = !is_html_name(filename);
  t.expected_size = expected_size;
  return t;
}

ProgressFn default_progress(const ProgressFn& given, HubOptions::Progress mode,
                            std::shared_ptr<ProgressBar>& bar) {
  if (given || mode == HubOptions::Progress::Never) return given;
  bar = std::make_shared<ProgressBar>(mode == HubOptions::Progress::Always);
  return [bar](const TransferProgress& p) { bar->update(p); };
}
}  // namespace

std::string HubClient::fetch_text(const std::string& repo, const std::string& revision,
                                  const std::string& filename, size_t max_bytes) {
  Target t = file_target(*this, repo, revision, filename, std::nullopt);
  std::string body;
  Sink sink;
  sink.write = [&](const uint8_t* p, size_t n) {
    if (body.size() + n > max_bytes)
      fail("{}: larger than {} — not a small text file", t.what, format_bytes(max_bytes));
    body.append(reinterpret_cast<const char*>(p), n);
  };
  sink.rewind = [&] { body.clear(); };
  impl_->transfer(t, sink, {});
  return body;
}

uint64_t HubClient::download(const std::string& repo, const std::string& revision,
                             const std::string& filename, const std::string& dest_path,
                             std::optional<uint64_t> expected_size, const ProgressFn& progress) {
  Target t = file_target(*this, repo, revision, filename, expected_size);
  struct stat st {};
  if (expected_size && ::stat(dest_path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
      uint64_t(st.st_size) == *expected_size)
    return *expected_size;  // finished by an earlier run

  std::string part = dest_path + ".part";
  std::error_code ec;
  std::filesystem::path parent = std::filesystem::path(dest_path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  Fd f;
  f.fd = ::open(part.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (f.fd < 0)
    fail("cannot create '{}': {} — check that the directory is writable", part,
         std::strerror(errno));
  // Two processes appending to one .part would interleave garbage.
  if (::flock(f.fd, LOCK_EX | LOCK_NB) != 0)
    fail("'{}' is locked: another process is downloading it — wait for it or stop it", part);
  Sink sink;
  sink.offset = fd_size(f.fd, part);
  auto rewind = [&] {
    if (::ftruncate(f.fd, 0) != 0 || ::lseek(f.fd, 0, SEEK_SET) != 0)
      fail("cannot truncate '{}': {}", part, std::strerror(errno));
  };
  if (expected_size && sink.offset > *expected_size) {  // stale leftover of another version
    rewind();
    sink.offset = 0;
  }
  if (::lseek(f.fd, off_t(sink.offset), SEEK_SET) < 0)
    fail("cannot seek in '{}': {}", part, std::strerror(errno));
  sink.write = [&](const uint8_t* p, size_t n) { write_all(f.fd, p, n, part); };
  sink.rewind = rewind;

  std::shared_ptr<ProgressBar> bar;
  ProgressFn report = default_progress(progress, impl_->opts.progress, bar);
  try {
    if (!(expected_size && sink.offset == *expected_size)) impl_->transfer(t, sink, report);
  } catch (...) {
    // Keep a partial file for the next run to resume; drop an empty one.
    if (fd_size(f.fd, part) == 0) ::unlink(part.c_str());
    throw;
  }
  if (::fdatasync(f.fd) != 0)
    fail("cannot flush '{}': {} — check free space and re-run", part, std::strerror(errno));
  ::close(f.fd);
  f.fd = -1;
  if (::rename(part.c_str(), dest_path.c_str()) != 0)
    fail("cannot rename '{}' to '{}': {}", part, dest_path, std::strerror(errno));
  return sink.offset;
}

uint64_t HubClient::stream(const std::string& repo, const std::string& revision,
                           const std::string& filename, const ChunkFn& on_chunk,
                           std::optional<uint64_t> expected_size, const ProgressFn& progress) {
  Target t = file_target(*this, repo, revision, filename, expected_size);
  Sink sink;
  sink.write = on_chunk;
  std::shared_ptr<ProgressBar> bar;
  ProgressFn report = default_progress(progress, impl_->opts.progress, bar);
  return impl_->transfer(t, sink, report);
}

}  // namespace swiftlet
