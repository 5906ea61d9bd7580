#include "convert/hf_source.h"

#include "core/error.h"
#include "io/http_download.h"

#include <fmt/format.h>

#include <algorithm>
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

  uint64_t total = 0, missing = 0;
  for (auto* f : files) {
    const uint64_t size = f->size.value_or(0);
    total += size;
    if (held_bytes(dl / f->name) != size) missing += size - std::min(size, held_bytes(dl / (f->name + ".part")));
  }
  // The conversion's output is at most the checkpoint's size (bf16 -> 4 bits is ~3.5x smaller);
  // write_container checks the exact figure again before it writes.
  fs::create_directories(dl);
  const uint64_t out_estimate = container ? 0 : (opts.bits == 16 ? total : total / 2);
  require_free_space(dl.string(), missing + out_estimate,
                     fmt::format("downloading {} ({} files) and converting it", repo, files.size()));

  log(fmt::format("{}@{} (commit {}): {} files, {:.2f} GB, into {}", repo, revision, ls.commit,
                  files.size(), double(total) / 1e9, dl.string()));
  const std::string rev = ls.commit.empty() ? revision : ls.commit;
  for (auto* f : files) {
    fs::create_directories((dl / f->name).parent_path());
    hub.download(repo, rev, f->name, (dl / f->name).string(), f->size);
  }

  if (container) {
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

  RepackOptions o = opts;
  o.source_name = fmt::format("hf:{}@{}", repo, rev);
  RepackStats st = repack_from_dir(dl.string(), o);
  if (!keep_download) {
    std::error_code ec;
    fs::remove_all(dl, ec);
    log(fmt::format("removed the downloaded checkpoint '{}' (--keep-download keeps it)", dl.string()));
  }
  return st;
}

}  // namespace swiftlet
