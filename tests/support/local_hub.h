// Plays the Hugging Face hub on loopback for tests: serves the files of a local directory as any
// ORG/REPO at any revision (the model listing with file sizes, and resolve/ downloads, Range
// requests included). With a `pace`, a file goes out 16 KiB at a time with that pause before each
// piece, so that a test can kill a download in the middle of a transfer.
#pragma once

#include "support/test_util.h"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace swiftlet::testing {

class LocalHub {
 public:
  explicit LocalHub(const std::string& dir, std::chrono::milliseconds pace = {}) : dir_(dir) {
    namespace fs = std::filesystem;
    for (const auto& e : fs::recursive_directory_iterator(dir))
      if (e.is_regular_file()) files_.push_back(fs::relative(e.path(), dir).string());
    srv_.Get(R"(/api/models/([^/]+/[^/]+)/revision/([^/]+))", [this](const httplib::Request&, httplib::Response& r) {
      nlohmann::json sib = nlohmann::json::array();
      for (const auto& f : files_) sib.push_back({{"rfilename", f}, {"size", fs::file_size(fs::path(dir_) / f)}});
      r.set_content(nlohmann::json{{"sha", "0123abcd"}, {"siblings", sib}}.dump(), "application/json");
    });
    srv_.Get(R"(/([^/]+/[^/]+)/resolve/([^/]+)/(.+))", [this, pace](const httplib::Request& q, httplib::Response& r) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        served_.push_back(q.matches[3]);
      }
      auto bytes = std::make_shared<std::string>(read_file((fs::path(dir_) / q.matches[3].str()).string()));
      if (pace.count() == 0) return r.set_content(*bytes, "application/octet-stream");
      r.set_content_provider(bytes->size(), "application/octet-stream",
                             [bytes, pace](size_t off, size_t len, httplib::DataSink& sink) {
                               std::this_thread::sleep_for(pace);
                               return sink.write(bytes->data() + off, std::min<size_t>(len, 16 << 10));
                             });
    });
    port_ = srv_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { srv_.listen_after_bind(); });
  }
  ~LocalHub() {
    if (exported_) ::unsetenv("HF_ENDPOINT");
    srv_.stop();
    thread_.join();
  }
  LocalHub(const LocalHub&) = delete;
  LocalHub& operator=(const LocalHub&) = delete;

  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // Points this process's hub client at the hub (HF_ENDPOINT) until the hub goes.
  void export_endpoint() {
    ::setenv("HF_ENDPOINT", endpoint().c_str(), 1);
    exported_ = true;
  }
  // The files downloaded so far, in request order.
  std::vector<std::string> served() const {
    std::lock_guard<std::mutex> lock(mu_);
    return served_;
  }

 private:
  std::string dir_;
  std::vector<std::string> files_;
  mutable std::mutex mu_;
  std::vector<std::string> served_;
  httplib::Server srv_;
  int port_ = 0;
  bool exported_ = false;
  std::thread thread_;
};

}  // namespace swiftlet::testing
