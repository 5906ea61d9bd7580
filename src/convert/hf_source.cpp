#include "convert/hf_source.h"

#include "convert/shard_feed.h"

#include "core/error.h"
#include "io/http_download.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

namespace swiftlet {

namespace fs = std::filesystem;

namespace {

// Files a checkpoint conversion needs (weights, config, tokenizer); everything else in a repo
// (README, images, PyTorch .bin duplicates) is skipped.
bool wanted_for_conversion(const std::string& name) {
  if (name.find('/') != std::string::npos) return false;
  if (name.ends_with(".safetensors")) return true;
  for (const char* f : {"config.json", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
                        "chat_template.jinja", "chat_template.json", "generation_config.json",
                        "special_tokens_map.json", "vocab.json", "merges.txt", "added_tokens.json"})
    if (name == f) return true;
  return false;
}

uint64_t held_bytes(const fs::path& p) {
  std::error_code ec;
  const uint64_t n = fs::file_size(p, ec);
  return ec ? 0 : n;
}

// The first bytes of a shard up to the end of its header, with one request cut short.
std::string fetch_head(HubClient& hub, const std::string& repo, const std::string& rev, const ShardInfo& s) {
  struct Enough {};
  std::string head;
  uint64_t want = UINT64_MAX;
  try {
    hub.stream(repo, rev, s.name, [&](const uint8_t* p, size_t n) {
      head.append(reinterpret_cast<const char*>(p), n);
      if (want == UINT64_MAX && head.size() >= 8) want = safetensors_head_bytes(reinterpret_cast<const uint8_t*>(head.data()));
      if (head.size() >= want) throw Enough{};
    }, s.size, [](const TransferProgress&) {});
  } catch (const Enough&) {
  }
  if (want == UINT64_MAX || head.size() < want || want > s.size)
    fail("'{}' of {} is not a safetensors file (its header does not fit in its {} bytes)", s.name, repo, s.size);
  head.resize(size_t(want));
  return head;
}

// A checkpoint repo, converted shard by shard (shard_feed.h): the small files first, then each
// shard downloaded while the one before converts, and deleted once converted.
RepackStats repack_hub_checkpoint(HubClient& hub, const RepoListing& ls, const std::string& rev,
                                  const std::vector<const HubFile*>& files, const fs::path& dl, bool keep_download,
                                  const RepackOptions& opts) {
  auto log = [&](const std::string& s) {
    if (opts.log) opts.log(s);
  };
  const std::string& repo = ls.repo;
  if (auto done = finish_interrupted_build(opts)) {
    std::error_code ec;
    if (!keep_download) fs::remove_all(dl, ec);
    return *done;
  }
  fs::create_directories(dl);
  std::vector<std::string> listed;
  uint64_t small = 0;
  for (auto* f : files) {
    listed.push_back(f->name);
    if (!f->name.ends_with(".safetensors")) small += f->size.value_or(0);
  }
  require_free_space(dl.string(), small, fmt::format("the configuration and tokenizer files of {}", repo));
  for (auto* f : files)
    if (!f->name.ends_with(".safetensors")) hub.download(repo, rev, f->name, (dl / f->name).string(), f->size);

  std::vector<ShardInfo> shards;
  uint64_t total = 0;
  for (const std::string& name : checkpoint_shard_names(dl.string(), listed)) {
    const HubFile* f = ls.find(name);
    if (!f) fail("hub repo '{}' has no '{}', which its model.safetensors.index.json names", repo, name);
    if (!f->size) fail("the hub listing of '{}' gives no size for '{}'; cannot plan the conversion", repo, name);
    shards.push_back({name, *f->size});
    total += *f->size;
  }
  log(fmt::format("{}@{} (commit {}): {} shards, {:.2f} GB, downloaded into {} one after another", repo,
                  ls.revision, ls.commit, shards.size(), double(total) / 1e9, dl.string()));
  const auto heads =
      shard_heads(opts.output, rev, shards, [&](const ShardInfo& s) { return fetch_head(hub, repo, rev, s); });
  TensorSet tensors = reserved_checkpoint(dl.string(), shards, heads);
  const std::string dir = dl.string();
  ShardFiles feed(dir, shards, tensors, [repo, rev, dir, log](const ShardInfo& s, const std::atomic<bool>& stop) {
    HubClient client;
    const auto t0 = std::chrono::steady_clock::now();
    client.download(repo, rev, s.name, (fs::path(dir) / s.name).string(), s.size, [&](const TransferProgress&) {
      if (stop) fail("stopped");
    });
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    log(fmt::format("{}: {:.2f} GB downloaded in {:.1f} s", s.name, double(s.size) / 1e9, secs));
  }, !keep_download);
  RepackOptions o = opts;
  o.source_name = fmt::format("hf:{}@{}", repo, rev);
  auto src = open_checkpoint_source(dir, std::move(tensors), o);
  RepackStats st = write_container(*src, o, &feed);
  if (!keep_download) {
    std::error_code ec;
    fs::remove_all(dl, ec);
    log(fmt::format("removed the download folder '{}' (--keep-download keeps the checkpoint)", dl.string()));
  }
  return st;
}

}  // namespace

RepackStats repack_from_hf(const std::string& repo, const std::string& revision,
                           const std::string& download_dir, bool keep_download, const RepackOptions& opts) {
  check_repo_id(repo);
  if (opts.output.empty()) fail("no output given (--output OUT.qpack)");
  const fs::path out = fs::absolute(fs::path(opts.output)).lexically_normal();
  if (fs::exists(out) && !opts.force) fail("'{}' already exists; pass --force to replace it", out.string());
  const fs::path dl = download_dir.empty() ? fs::path(out.string() + ".download") : fs::absolute(download_dir);
  auto log = [&](const std::string& s) {
    if (opts.log) opts.log(s);
  };

  HubClient hub;
  const RepoListing ls = hub.list_files(repo, revision);
  const bool container = ls.find("manifest.json") && ls.find("packed_experts/layout.json");
  std::vector<const HubFile*> files;
  for (const auto& f : ls.files) {
    if (container ? (f.name != ".gitattributes" && !f.name.ends_with(".md")) : wanted_for_conversion(f.name))
      files.push_back(&f);
  }
  if (!container) {
    if (!ls.find("config.json")) fail("hub repo '{}' has no config.json; is it a model repo?", repo);
    if (std::none_of(files.begin(), files.end(), [](auto* f) { return f->name.ends_with(".safetensors"); }))
      fail("hub repo '{}' has no .safetensors files (PyTorch .bin checkpoints are not read)", repo);
  }
  // A container's manifest marks it complete: fetch it last.
  std::stable_partition(files.begin(), files.end(), [](auto* f) { return f->name != "manifest.json"; });

  const std::string rev = ls.commit.empty() ? revision : ls.commit;
  if (!container) return repack_hub_checkpoint(hub, ls, rev, files, dl, keep_download, opts);

  uint64_t total = 0, missing = 0;
  for (auto* f : files) {
    const uint64_t size = f->size.value_or(0);
    total += size;
    if (held_bytes(dl / f->name) != size) missing += size - std::min(size, held_bytes(dl / (f->name + ".part")));
  }
  fs::create_directories(dl);
  require_free_space(dl.string(), missing, fmt::format("downloading {} ({} files)", repo, files.size()));
  log(fmt::format("{}@{} (commit {}): {} files, {:.2f} GB, into {}", repo, revision, ls.commit,
                  files.size(), double(total) / 1e9, dl.string()));
  for (auto* f : files) {
    fs::create_directories((dl / f->name).parent_path());
    hub.download(repo, rev, f->name, (dl / f->name).string(), f->size);
  }

  const QpackContainer qc = QpackContainer::open(dl.string());
  if (qc.checksums) {
    log("verifying checksums");
    const QpackVerifyReport rep = verify_qpack(qc);
    if (!rep.ok())
      fail("the container downloaded from {} into '{}' is corrupt: {} (and {} more problems)", repo,
           dl.string(), rep.problems.front(), rep.problems.size() - 1);
  }
  move_into_place(dl.string(), out.string());
  RepackStats st;
  st.output = out.string();
  for (const auto& [rel, n] : qc.manifest.files) st.total_bytes += n;
  return st;
}

}  // namespace swiftlet
