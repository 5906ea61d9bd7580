// Hugging Face hub client: list a repo, fetch small files, download or stream large ones.
//
// Hub HTTP API used (what huggingface_hub does too):
//   GET {endpoint}/api/models/{repo}/revision/{revision}?blobs=true
//       -> {"sha": COMMIT, "siblings": [{"rfilename": NAME, "size": N, "lfs": {"sha256": ..}}]}
//   GET {endpoint}/{repo}/resolve/{revision}/{filename}
//       -> the bytes, or a 302 to a CDN with a signed URL for LFS/Xet files; honours Range.
//   Errors carry X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo) and
//   X-Error-Message headers.
//
// Robustness: every transfer retries connection errors, timeouts (including a low-speed timeout)
// and 5xx/429/408 answers with exponential backoff (honouring a numeric Retry-After), resuming
// with `Range: bytes=N-` from the bytes already held. 401/403/404 and other 4xx are final. A body
// that is an HTML page (Content-Type text/html, or starting with <!DOCTYPE html / <html) is
// rejected: proxies, captive portals and the hub's own error pages answer that way.
//
// Token and redirects: `Authorization: Bearer TOKEN` goes only to the endpoint's origin (scheme,
// host and port). Redirects to another origin, such as the hub's 302 to cdn-lfs.hf.co or
// cas-bridge.xethub.hf.co, carry a pre-signed URL and need no token, so it is not sent there —
// the same policy as huggingface_hub (python-requests drops Authorization on a cross-host
// redirect). Same-origin redirects (a renamed repo answers 307 to its new path) keep it.
// A retry starts again from the hub URL, since signed CDN URLs expire.
//
// A HubClient reuses one connection cache; use one client per thread.
#pragma once

#include "io/progress.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace swiftlet {

inline constexpr const char* kDefaultHubEndpoint = "https://huggingface.co";

struct HubOptions {
  enum class Progress { Auto, Always, Never };  // Auto: a bar only when stderr is a terminal

  std::string endpoint = kDefaultHubEndpoint;  // no trailing slash needed
  std::string token;                           // empty: anonymous
  int max_retries = 5;          // consecutive failed attempts (without new bytes) per transfer
  double backoff_initial_s = 0.5;
  double backoff_max_s = 30;
  double retry_after_max_s = 300;  // cap on a server's Retry-After
  int max_redirects = 10;
  long connect_timeout_s = 30;
  long low_speed_bytes_per_s = 1024;  // abort an attempt that stays below this rate ...
  long low_speed_time_s = 30;         // ... for this many seconds (then retry and resume)
  Progress progress = Progress::Auto;
  std::string user_agent;  // empty: "swiftlet/VERSION libcurl/VERSION"

  // Defaults overridden by the environment, as huggingface_hub reads it: HF_ENDPOINT; HF_TOKEN
  // (else HUGGING_FACE_HUB_TOKEN, else the token file at $HF_TOKEN_PATH, $HF_HOME/token or
  // ~/.cache/huggingface/token, as written by `huggingface-cli login`);
  // HF_HUB_DISABLE_PROGRESS_BARS=1 turns the bar off.
  static HubOptions from_env();
};

struct HubFile {
  std::string name;               // path inside the repo ("model-00001-of-00040.safetensors")
  std::optional<uint64_t> size;   // bytes, when the hub listed it
  std::string sha256;             // LFS files only, hex; empty otherwise
};

struct RepoListing {
  std::string repo;      // ORG/REPO
  std::string revision;  // as asked ("main")
  std::string commit;    // the commit it resolved to: pass it as the revision of the downloads
                         // so that every file comes from the same commit even if main moves
  std::vector<HubFile> files;

  const HubFile* find(const std::string& name) const;  // nullptr when absent
};

using ProgressFn = std::function<void(const TransferProgress&)>;
// Receives a file's bytes in order, each byte exactly once, across retries.
using ChunkFn = std::function<void(const uint8_t* data, size_t n)>;

class HubClient {
 public:
  explicit HubClient(HubOptions options = HubOptions::from_env());
  ~HubClient();
  HubClient(const HubClient&) = delete;
  HubClient& operator=(const HubClient&) = delete;

  const HubOptions& options() const;

  // The files of `repo` at `revision`, with sizes. Throws Error for a missing repo/revision,
  // a private or gated repo without a valid token, or an unreadable answer.
  RepoListing list_files(const std::string& repo, const std::string& revision = "main");

  // A small file (config.json, manifest.json, tokenizer.json) as a string, at most `max_bytes`.
  std::string fetch_text(const std::string& repo, const std::string& revision,
                         const std::string& filename, size_t max_bytes = size_t(256) << 20);

  // Downloads into `dest_path`, through `dest_path + ".part"`: an existing .part (from an
  // interrupted run) is resumed, and the rename to `dest_path` happens only once every byte is
  // there and the size matches Content-Length / Content-Range (and `expected_size` when given).
  // When `dest_path` already exists with exactly `expected_size` bytes, nothing is fetched.
  // Progress goes to `progress`, or to a ProgressBar on stderr per options().progress.
  // Returns the file size.
  uint64_t download(const std::string& repo, const std::string& revision,
                    const std::string& filename, const std::string& dest_path,
                    std::optional<uint64_t> expected_size = std::nullopt,
                    const ProgressFn& progress = {});

  // Like download() without a file: the bytes go to `on_chunk` (e.g. a converter that writes a
  // container as it reads a checkpoint shard). A resumed attempt continues where `on_chunk`
  // left off; if a server ignores Range, the bytes already delivered are skipped, not repeated.
  // An exception thrown by `on_chunk` aborts the transfer and propagates. Returns the size.
  uint64_t stream(const std::string& repo, const std::string& revision,
                  const std::string& filename, const ChunkFn& on_chunk,
                  std::optional<uint64_t> expected_size = std::nullopt,
                  const ProgressFn& progress = {});

  // {endpoint}/{repo}/resolve/{revision}/{filename}, percent-encoded.
  std::string file_url(const std::string& repo, const std::string& revision,
                       const std::string& filename) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Throws Error unless `repo` looks like ORG/REPO (letters, digits, '-', '_', '.').
void check_repo_id(const std::string& repo);

}  // namespace swiftlet
