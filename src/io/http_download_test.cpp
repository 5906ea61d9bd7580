// The hub client against a loopback server that answers the way huggingface.co does:
// the api/models listing, /resolve/ URLs, a 302 to a "CDN" on another port for big files,
// Range requests, X-Error-Code headers. Faults are injected per file.
#include "io/http_download.h"

#include "core/error.h"
#include "io/progress.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

namespace swiftlet {
namespace {

namespace fs = std::filesystem;

constexpr const char* kRepo = "acme/tiny-moe";
constexpr const char* kCommit = "0123456789abcdef0123456789abcdef01234567";
constexpr const char* kBig = "model-00001-of-00001.safetensors";  // served through the CDN

std::string random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = char(rng());
  return s;
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

struct Seen {
  std::string server;  // "hub" or "cdn"
  std::string path;
  std::string range;   // Range header, "" when absent
  std::string auth;    // Authorization header
};

class FakeHub {
 public:
  // Repo content.
  std::map<std::string, std::string> files;
  // Faults, by file name.
  std::map<std::string, size_t> drop_after;    // first request: close after this many bytes
  std::map<std::string, size_t> stall_after;   // first request: stop sending after this many
  std::map<std::string, int> fail_500;         // answer 500 this many times first
  std::set<std::string> html_page;             // 200 text/html error page
  std::set<std::string> html_body;             // 200 octet-stream whose body is an HTML page
  std::set<std::string> ignore_range;          // always answer 200 with the whole file
  std::set<std::string> range_with_200;        // answer a range with status 200 + Content-Range
  std::string required_token;                  // non-empty: 401 without "Bearer <it>"

  FakeHub() {
    files["config.json"] = R"({"model_type": "qwen3_next", "num_experts": 4})";
    files["tokenizer.json"] = R"({"version": "1.0"})";
    files["model.safetensors"] = random_bytes(200000, 1);
    files[kBig] = random_bytes(3 << 20, 2);
  }
  ~FakeHub() { stop(); }

  void start() {
    hub_.Get(R"(/api/models/([^/]+/[^/]+)/revision/([^/]+))",
             [this](const httplib::Request& q, httplib::Response& r) { listing(q, r); });
    hub_.Get(R"(/([^/]+/[^/]+)/resolve/([^/]+)/(.+))",
             [this](const httplib::Request& q, httplib::Response& r) { resolve(q, r); });
    cdn_.Get(R"(/blobs/(.+))", [this](const httplib::Request& q, httplib::Response& r) {
      record("cdn", q);
      serve(q.matches[1], q, r);
    });
    for (httplib::Server* s : {&hub_, &cdn_}) {
      s->set_keep_alive_timeout(1);
      int port = s->bind_to_any_port("127.0.0.1");
      ASSERT_GT(port, 0);
      (s == &hub_ ? hub_port_ : cdn_port_) = port;
      threads_.emplace_back([s] { s->listen_after_bind(); });
    }
    // httplib's stop() is a no-op until the accept loop runs: wait for it, or a quick test's
    // TearDown would join a server that never stops.
    while (!hub_.is_running() || !cdn_.is_running())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  void stop() {
    stopping_ = true;
    hub_.stop();
    cdn_.stop();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

  std::string endpoint() const { return fmt::format("http://127.0.0.1:{}", hub_port_); }

  std::vector<Seen> seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }
  std::vector<Seen> seen_for(const std::string& needle) {
    std::vector<Seen> out;
    for (auto& s : seen())
      if (s.path.find(needle) != std::string::npos) out.push_back(s);
    return out;
  }

 private:
  void record(const char* server, const httplib::Request& q) {
    std::lock_guard<std::mutex> lock(mu_);
    seen_.push_back({server, q.path, q.get_header_value("Range"),
                     q.get_header_value("Authorization")});
  }

  // The hub's error answers: JSON body plus X-Error-Code / X-Error-Message headers.
  static void hub_error(httplib::Response& r, int status, const std::string& code,
                        const std::string& message) {
    r.status = status;
    if (!code.empty()) r.set_header("X-Error-Code", code);
    r.set_header("X-Error-Message", message);
    r.set_content(nlohmann::json{{"error", message}}.dump(), "application/json");
  }

  bool authorized(const httplib::Request& q, httplib::Response& r) {
    if (required_token.empty() || q.get_header_value("Authorization") == "Bearer " + required_token)
      return true;
    hub_error(r, 401, "RepoNotFound", "Invalid username or password.");
    return false;
  }

  bool known_repo(const std::string& repo, const std::string& rev, httplib::Response& r) {
    if (repo != kRepo) {
      hub_error(r, 404, "RepoNotFound", "Repository not found");
      return false;
    }
    if (rev != "main" && rev != kCommit) {
      hub_error(r, 404, "RevisionNotFound", "Invalid rev id: " + rev);
      return false;
    }
    return true;
  }

  void listing(const httplib::Request& q, httplib::Response& r) {
    record("hub", q);
    if (!authorized(q, r) || !known_repo(q.matches[1], q.matches[2], r)) return;
    nlohmann::json siblings = nlohmann::json::array();
    for (auto& [name, data] : files) {
      nlohmann::json s{{"rfilename", name}};
      if (q.has_param("blobs")) {
        s["size"] = data.size();
        if (name.ends_with(".safetensors"))
          s["lfs"] = {{"sha256", std::string(64, 'a')}, {"size", data.size()}, {"pointerSize", 134}};
      }
      siblings.push_back(s);
    }
    r.set_content(nlohmann::json{{"id", kRepo}, {"sha", kCommit}, {"siblings", siblings}}.dump(),
                  "application/json");
  }

  void resolve(const httplib::Request& q, httplib::Response& r) {
    record("hub", q);
    if (q.matches[1] == "acme/old-name") {  // a renamed repo: relative 307 to its new path
      r.set_redirect(fmt::format("/{}/resolve/{}/{}", kRepo, q.matches[2].str(), q.matches[3].str()),
                     307);
      return;
    }
    if (!authorized(q, r) || !known_repo(q.matches[1], q.matches[2], r)) return;
    std::string name = q.matches[3];
    if (!files.count(name)) {
      hub_error(r, 404, "EntryNotFound", name + " does not exist on \"main\"");
      return;
    }
    if (name == kBig) {  // LFS file: the hub hands out a (pre-signed) CDN URL
      r.set_redirect(fmt::format("http://127.0.0.1:{}/blobs/{}?X-Amz-Signature=abc", cdn_port_, name),
                     302);
      return;
    }
    serve(name, q, r);
  }

  void serve(const std::string& name, const httplib::Request& q, httplib::Response& r) {
    int n = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      n = ++requests_[name];
    }
    if (fail_500.count(name) && n <= fail_500[name]) {
      r.status = 500;
      r.set_content("Internal Error", "text/plain");
      return;
    }
    if (html_page.count(name)) {
      r.set_content("<!DOCTYPE html>\n<html><body>Service unavailable</body></html>", "text/html");
      return;
    }
    if (html_body.count(name)) {
      r.set_content("\n<html><head><title>Login</title></head><body>portal</body></html>",
                    "application/octet-stream");
      return;
    }
    size_t cut = SIZE_MAX;
    bool stall = false;
    if (n == 1 && drop_after.count(name)) cut = drop_after[name];
    if (n == 1 && stall_after.count(name)) cut = stall_after[name], stall = true;
    if (ignore_range.count(name)) {
      // cpp-httplib 0.11 applies a request's Range even to a 200 (with Content-Range); a server
      // that ignores Range sends the whole file, so drop the parsed ranges.
      r.status = 200;
      const_cast<httplib::Request&>(q).ranges.clear();
    }
    if (range_with_200.count(name)) r.status = 200;  // the httplib quirk above, as is
    const std::string* data = &files.at(name);
    r.set_content_provider(
        data->size(), "application/octet-stream",
        [this, data, cut, stall](size_t offset, size_t length, httplib::DataSink& sink) {
          if (offset >= cut) {
            if (stall)  // stay connected but silent; the client's low-speed timeout fires
              for (int i = 0; i < 1000 && !stopping_; ++i)  // 10 s at most
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
            return false;  // closes the connection mid-file
          }
          size_t k = std::min({length, size_t(64) << 10, cut - offset});
          sink.write(data->data() + offset, k);
          return true;
        });
  }

  httplib::Server hub_, cdn_;
  int hub_port_ = 0, cdn_port_ = 0;
  std::vector<std::thread> threads_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::vector<Seen> seen_;
  std::map<std::string, int> requests_;
};

class HubClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("swiftlet_dl_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    hub_.stop();
    fs::remove_all(dir_);
  }

  HubOptions options() {
    HubOptions o;
    o.endpoint = hub_.endpoint();
    o.backoff_initial_s = 0.01;
    o.backoff_max_s = 0.05;
    o.progress = HubOptions::Progress::Never;
    return o;
  }

  FakeHub hub_;
  fs::path dir_;
};

TEST_F(HubClientTest, ListsFilesWithSizesAndCommit) {
  hub_.start();
  HubClient c(options());
  RepoListing l = c.list_files(kRepo, "main");
  EXPECT_EQ(l.commit, kCommit);
  ASSERT_EQ(l.files.size(), hub_.files.size());
  const HubFile* big = l.find(kBig);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(big->size, hub_.files[kBig].size());
  EXPECT_EQ(big->sha256, std::string(64, 'a'));
  EXPECT_EQ(l.find("config.json")->size, hub_.files["config.json"].size());
  EXPECT_EQ(l.find("nope"), nullptr);
  EXPECT_NE(hub_.seen()[0].path.find("/api/models/acme/tiny-moe/revision/main"), std::string::npos);
}

TEST_F(HubClientTest, FetchesTextAndDownloadsFiles) {
  hub_.start();
  HubClient c(options());
  EXPECT_EQ(c.fetch_text(kRepo, "main", "config.json"), hub_.files["config.json"]);
  fs::path dest = dir_ / "sub" / "model.safetensors";  // parent directories are created
  EXPECT_EQ(c.download(kRepo, kCommit, "model.safetensors", dest), hub_.files["model.safetensors"].size());
  EXPECT_TRUE(read_file(dest) == hub_.files["model.safetensors"]);
  EXPECT_FALSE(fs::exists(dest.string() + ".part"));
}

TEST_F(HubClientTest, FollowsCdnRedirectWithoutLeakingToken) {
  hub_.required_token = "hf_secret";
  hub_.start();
  HubOptions o = options();
  o.token = "hf_secret";
  HubClient c(o);
  fs::path dest = dir_ / kBig;
  std::vector<TransferProgress> reports;
  c.download(kRepo, "main", kBig, dest, hub_.files[kBig].size(),
             [&](const TransferProgress& p) { reports.push_back(p); });
  EXPECT_TRUE(read_file(dest) == hub_.files[kBig]);
  auto seen = hub_.seen();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].server, "hub");
  EXPECT_EQ(seen[0].auth, "Bearer hf_secret");
  EXPECT_EQ(seen[1].server, "cdn");
  EXPECT_EQ(seen[1].auth, "");  // another origin: the signed URL is the credential
  ASSERT_FALSE(reports.empty());
  EXPECT_TRUE(reports.back().finished);
  EXPECT_EQ(reports.back().done, hub_.files[kBig].size());
  EXPECT_EQ(reports.back().total, hub_.files[kBig].size());
}

TEST_F(HubClientTest, KeepsTokenOnSameOriginRedirect) {
  hub_.required_token = "hf_secret";
  hub_.start();
  HubOptions o = options();
  o.token = "hf_secret";
  HubClient c(o);
  EXPECT_EQ(c.fetch_text("acme/old-name", "main", "config.json"), hub_.files["config.json"]);
  auto seen = hub_.seen();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].path, "/acme/tiny-moe/resolve/main/config.json");
  EXPECT_EQ(seen[1].auth, "Bearer hf_secret");
}

TEST_F(HubClientTest, ResumesWithRangeAfterDroppedConnection) {
  hub_.drop_after[kBig] = 1 << 20;
  hub_.start();
  HubClient c(options());
  fs::path dest = dir_ / kBig;
  c.download(kRepo, "main", kBig, dest);
  EXPECT_TRUE(read_file(dest) == hub_.files[kBig]);
  auto cdn = hub_.seen_for("/blobs/");
  ASSERT_EQ(cdn.size(), 2u);
  EXPECT_EQ(cdn[0].range, "");
  EXPECT_EQ(cdn[1].range, "bytes=1048576-");
  // The retry went back through the hub (signed CDN URLs expire).
  EXPECT_EQ(hub_.seen_for("/resolve/").size(), 2u);
}

TEST_F(HubClientTest, ResumesPartialFileOfEarlierRun) {
  hub_.start();
  fs::path dest = dir_ / "model.safetensors";
  const std::string& data = hub_.files["model.safetensors"];
  std::ofstream(dest.string() + ".part", std::ios::binary) << data.substr(0, 12345);
  HubClient c(options());
  c.download(kRepo, "main", "model.safetensors", dest, data.size());
  EXPECT_TRUE(read_file(dest) == data);
  auto seen = hub_.seen_for("/resolve/");
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].range, "bytes=12345-");
  // Already complete: nothing is fetched again.
  c.download(kRepo, "main", "model.safetensors", dest, data.size());
  EXPECT_EQ(hub_.seen_for("/resolve/").size(), 1u);
}

TEST_F(HubClientTest, RestartsWhenServerIgnoresRange) {
  hub_.drop_after["model.safetensors"] = 50000;
  hub_.ignore_range.insert("model.safetensors");
  hub_.start();
  HubClient c(options());
  fs::path dest = dir_ / "model.safetensors";
  c.download(kRepo, "main", "model.safetensors", dest);
  EXPECT_TRUE(read_file(dest) == hub_.files["model.safetensors"]);
  auto seen = hub_.seen_for("/resolve/");
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].range, "bytes=50000-");
}

TEST_F(HubClientTest, TrustsContentRangeOnA200) {
  hub_.drop_after[kBig] = 1 << 20;
  hub_.range_with_200.insert(kBig);
  hub_.start();
  HubClient c(options());
  fs::path dest = dir_ / kBig;
  c.download(kRepo, "main", kBig, dest);
  EXPECT_TRUE(read_file(dest) == hub_.files[kBig]);
  auto cdn = hub_.seen_for("/blobs/");
  ASSERT_EQ(cdn.size(), 2u);
  EXPECT_EQ(cdn[1].range, "bytes=1048576-");
}

TEST_F(HubClientTest, StreamDeliversEachByteOnceAcrossRetries) {
  // Range ignored on the retry: the stream skips the bytes it already delivered.
  hub_.drop_after["model.safetensors"] = 70000;
  hub_.ignore_range.insert("model.safetensors");
  hub_.drop_after[kBig] = 100000;
  hub_.start();
  HubClient c(options());
  for (const char* name : {"model.safetensors", kBig}) {
    std::string got;
    uint64_t n = c.stream(kRepo, "main", name, [&](const uint8_t* p, size_t k) {
      got.append(reinterpret_cast<const char*>(p), k);
    });
    EXPECT_EQ(n, hub_.files[name].size());
    EXPECT_TRUE(got == hub_.files[name]) << name;
  }
}

TEST_F(HubClientTest, StreamPropagatesConsumerError) {
  hub_.start();
  HubClient c(options());
  EXPECT_THROW(c.stream(kRepo, "main", kBig,
                        [](const uint8_t*, size_t) { throw std::runtime_error("disk full"); }),
               std::runtime_error);
  EXPECT_EQ(hub_.seen_for("/blobs/").size(), 1u);  // not retried
}

TEST_F(HubClientTest, LowSpeedTimeoutRetriesAndResumes) {
  // curl measures the rate over a window of up to 5 s, so the stall must start early and the
  // limit be high for the timeout to fire within about a second.
  hub_.stall_after["model.safetensors"] = 1000;
  hub_.start();
  HubOptions o = options();
  o.low_speed_bytes_per_s = 100000;
  o.low_speed_time_s = 1;
  HubClient c(o);
  fs::path dest = dir_ / "model.safetensors";
  auto t0 = std::chrono::steady_clock::now();
  c.download(kRepo, "main", "model.safetensors", dest);
  // The server stalls for 10 s: finishing well before means the client gave up on its own.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(8));
  EXPECT_TRUE(read_file(dest) == hub_.files["model.safetensors"]);
  auto seen = hub_.seen_for("/resolve/");
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].range, "bytes=1000-");
}

TEST_F(HubClientTest, RefusesPartFileLockedByAnotherDownload) {
  hub_.start();
  HubClient c(options());
  fs::path dest = dir_ / "model.safetensors";
  int fd = ::open((dest.string() + ".part").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  try {
    c.download(kRepo, "main", "model.safetensors", dest);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another process"), std::string::npos) << e.what();
  }
  ::close(fd);
  EXPECT_TRUE(hub_.seen().empty());
}

TEST_F(HubClientTest, MissingFileIs404WithoutLeftovers) {
  hub_.start();
  HubClient c(options());
  fs::path dest = dir_ / "missing.bin";
  try {
    c.download(kRepo, "main", "missing.bin", dest);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("missing.bin"), std::string::npos) << m;
    EXPECT_NE(m.find("404"), std::string::npos) << m;
  }
  EXPECT_FALSE(fs::exists(dest));
  EXPECT_FALSE(fs::exists(dest.string() + ".part"));
  EXPECT_EQ(hub_.seen().size(), 1u);  // 404 is final: no retries
}

TEST_F(HubClientTest, MissingRepoAndRevisionAreNamed) {
  hub_.start();
  HubClient c(options());
  try {
    c.list_files("acme/nope", "main");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no such repo 'acme/nope'"), std::string::npos) << e.what();
  }
  try {
    c.fetch_text(kRepo, "v9", "config.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no revision 'v9'"), std::string::npos) << e.what();
  }
}

TEST_F(HubClientTest, RejectsHtmlPages) {
  hub_.html_page.insert("config.json");
  hub_.html_body.insert("model.safetensors");
  hub_.start();
  HubClient c(options());
  try {
    c.fetch_text(kRepo, "main", "config.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("HTML page instead of"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos) << e.what();
  }
  fs::path dest = dir_ / "model.safetensors";
  try {
    c.download(kRepo, "main", "model.safetensors", dest);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("HTML page instead of"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dest));
  EXPECT_FALSE(fs::exists(dest.string() + ".part"));
}

TEST_F(HubClientTest, RetriesServerErrors) {
  hub_.fail_500["config.json"] = 2;
  hub_.fail_500["tokenizer.json"] = 100;
  hub_.start();
  HubClient c(options());
  EXPECT_EQ(c.fetch_text(kRepo, "main", "config.json"), hub_.files["config.json"]);
  EXPECT_EQ(hub_.seen_for("config.json").size(), 3u);
  try {
    c.fetch_text(kRepo, "main", "tokenizer.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("giving up after 6 attempts"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("500"), std::string::npos) << e.what();
  }
  EXPECT_EQ(hub_.seen_for("tokenizer.json").size(), 6u);
}

TEST_F(HubClientTest, UnauthorizedMentionsHfToken) {
  hub_.required_token = "hf_secret";
  hub_.start();
  HubClient c(options());
  try {
    c.list_files(kRepo, "main");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("401"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("HF_TOKEN"), std::string::npos) << e.what();
  }
  EXPECT_EQ(hub_.seen().size(), 1u);
  EXPECT_EQ(hub_.seen()[0].auth, "");
}

TEST_F(HubClientTest, HonoursHfEndpointAndHfToken) {
  hub_.required_token = "hf_env_token";
  hub_.start();
  ::setenv("HF_ENDPOINT", (hub_.endpoint() + "/").c_str(), 1);
  ::setenv("HF_TOKEN", "hf_env_token", 1);
  HubOptions o = HubOptions::from_env();
  ::unsetenv("HF_ENDPOINT");
  ::unsetenv("HF_TOKEN");
  EXPECT_EQ(o.token, "hf_env_token");
  o.progress = HubOptions::Progress::Never;
  HubClient c(o);
  EXPECT_EQ(c.options().endpoint, hub_.endpoint());
  EXPECT_EQ(c.fetch_text(kRepo, "main", "config.json"), hub_.files["config.json"]);
  EXPECT_EQ(hub_.seen()[0].auth, "Bearer hf_env_token");
}

TEST(HubUrls, EncodesRevisionAndPath) {
  HubOptions o;
  o.endpoint = "https://hub.example/";
  HubClient c(o);
  EXPECT_EQ(c.file_url("acme/m", "refs/pr/1", "sub dir/a+b.json"),
            "https://hub.example/acme/m/resolve/refs%2Fpr%2F1/sub%20dir/a%2Bb.json");
  EXPECT_THROW(c.file_url("acme", "main", "x"), Error);
  EXPECT_THROW(c.file_url("a/b/c", "main", "x"), Error);
  EXPECT_THROW(c.file_url("acme/m", "main", "../etc/passwd"), Error);
  o.endpoint = "ftp://x";
  EXPECT_THROW(HubClient{o}, Error);
}

TEST(HubProgress, FormatsBytesRateAndEta) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1230000), "1.23 MB");
  EXPECT_EQ(format_bytes(85300000), "85.3 MB");
  EXPECT_EQ(format_bytes(4000000000ull), "4.00 GB");
  EXPECT_EQ(format_duration(32), "0:32");
  EXPECT_EQ(format_duration(3723), "1:02:03");
  EXPECT_EQ(format_duration(-1), "--:--");
  TransferProgress p;
  p.name = "shard";
  p.done = 1000000000;
  p.total = 4000000000;
  p.rate_bps = 85300000;
  p.eta_s = 35;
  EXPECT_EQ(format_progress_line(p, 8), "shard  [##------]  1.00 GB / 4.00 GB  85.3 MB/s  ETA 0:35");
  RateMeter m(5.0);
  auto t0 = RateMeter::Clock::now();
  m.add(0, t0);
  m.add(10000000, t0 + std::chrono::seconds(2));
  EXPECT_NEAR(m.rate_bps(), 5e6, 1);
}

}  // namespace
}  // namespace swiftlet
