#include "convert/shard_feed.h"

#include "core/error.h"
#include "io/mapped_file.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace swiftlet {

namespace fs = std::filesystem;

std::vector<std::string> checkpoint_shard_names(const std::string& dir, const std::vector<std::string>& listed) {
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> out;
  if (fs::exists(index)) {
    out = read_safetensors_index(dir).shards;
    for (const std::string& f : out)
      if (f.find('/') != std::string::npos || f == "." || f == "..")
        fail("'{}' names shard '{}' outside the checkpoint's folder", index.string(), f);
    std::sort(out.begin(), out.end());
    return out;
  }
  if (std::find(listed.begin(), listed.end(), "model.safetensors") != listed.end()) return {"model.safetensors"};
  for (const auto& f : listed)
    if (f.ends_with(".safetensors")) out.push_back(f);
  std::sort(out.begin(), out.end());
  if (out.empty()) fail("no .safetensors files in '{}'", dir);
  return out;
}

namespace {

// Where the headers of `version`'s shards are kept: OUT.partial/heads/VERSION ("local" for none).
fs::path kept_heads_dir(const std::string& output, const std::string& version) {
  std::string tag = version.empty() ? "local" : version;
  for (char& ch : tag)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_') ch = '_';
  return fs::path(partial_dir(output)) / kShardHeadsDir / tag;
}

}  // namespace

std::map<std::string, std::string> shard_heads(const std::string& output, const std::string& version,
                                               const std::vector<ShardInfo>& shards,
                                               const std::function<std::string(const ShardInfo&)>& read_head) {
  const fs::path dir = kept_heads_dir(output, version);
  fs::create_directories(dir);
  std::map<std::string, std::string> heads;
  for (const ShardInfo& s : shards) {
    const fs::path kept = dir / s.name;
    std::string head;
    if (fs::exists(kept)) {
      head = read_text_file(kept.string());
      const bool whole = head.size() >= 8 && head.size() <= s.size &&
                         head.size() == safetensors_head_bytes(reinterpret_cast<const uint8_t*>(head.data()));
      if (!whole) head.clear();  // torn by a kill: read it again
    }
    if (head.empty()) {
      head = read_head(s);
      const std::string tmp = kept.string() + ".tmp";
      const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0 || ::write(fd, head.data(), head.size()) != ssize_t(head.size()) || ::fdatasync(fd) != 0) {
        const int e = errno;
        if (fd >= 0) ::close(fd);
        fail("cannot write '{}': {}", tmp, std::strerror(e));
      }
      ::close(fd);
      fs::rename(tmp, kept);
    }
    heads[s.name] = std::move(head);
  }
  return heads;
}

TensorSet reserved_checkpoint(const std::string& dir, const std::vector<ShardInfo>& shards,
                              const std::map<std::string, std::string>& heads) {
  std::map<std::string, const ShardInfo*> by_path;
  for (const ShardInfo& s : shards) by_path[(fs::path(dir) / s.name).string()] = &s;
  auto open = [&](const std::string& path) {
    auto it = by_path.find(path);
    if (it == by_path.end()) fail("the index names shard '{}', which the checkpoint does not hold", path);
    return std::make_unique<SafetensorsFile>(path, it->second->size, heads.at(it->second->name));
  };
  if (fs::exists(fs::path(dir) / "model.safetensors.index.json")) return TensorSet::open_index(dir, open);
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  for (const ShardInfo& s : shards) files.push_back(open((fs::path(dir) / s.name).string()));
  return TensorSet::of_files(std::move(files), dir);
}

BuildJournal::BuildJournal(const fs::path& dir, const std::string& key) : path_((dir / kFile).string()) {
  bool same = false;
  if (std::ifstream in(path_); in) {
    std::string line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object()) break;
      if (j.contains("key")) {
        same = j["key"] == key;
        if (!same) break;
      } else if (same && j.contains("items")) {
        for (const auto& i : j["items"]) items_.insert(i.get<size_t>());
      } else if (same && j.contains("layer")) {
        layers_[j["layer"].get<int>()] = j["sums"].get<std::vector<uint64_t>>();
      }
    }
  }
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (same ? 0 : O_TRUNC), 0644);
  if (fd_ < 0) fail("cannot create '{}': {}", path_, std::strerror(errno));
  fresh_ = !same;
  if (fresh_) {
    items_.clear();
    layers_.clear();
    append(nlohmann::json{{"key", key}}.dump());
  }
}

BuildJournal::~BuildJournal() {
  if (fd_ >= 0) ::close(fd_);
}

void BuildJournal::add_items(const std::vector<size_t>& done) {
  if (done.empty()) return;
  append(nlohmann::json{{"items", done}}.dump());
  items_.insert(done.begin(), done.end());
}

void BuildJournal::add_layer(int layer, const std::vector<uint64_t>& sums) {
  append(nlohmann::json{{"layer", layer}, {"sums", sums}}.dump());
  layers_[layer] = sums;
}

void BuildJournal::append(const std::string& text) {
  const std::string line = text + "\n";
  if (::write(fd_, line.data(), line.size()) != ssize_t(line.size()) || ::fdatasync(fd_) != 0)
    fail("cannot write '{}': {}", path_, std::strerror(errno));
}

ShardSchedule schedule_shards(const std::vector<std::vector<int>>& reads, const std::vector<uint64_t>& shard_bytes,
                              bool deletes) {
  ShardSchedule s;
  std::set<int> wanted;
  for (const auto& r : reads) wanted.insert(r.begin(), r.end());
  s.order.assign(wanted.begin(), wanted.end());
  std::map<int, size_t> pos;
  for (size_t j = 0; j < s.order.size(); ++j) pos[s.order[j]] = j;
  s.last_step.assign(s.order.size(), 0);
  for (const auto& r : reads) {
    size_t step = 0;
    for (int sh : r) step = std::max(step, pos[sh]);
    s.step.push_back(step);
    for (int sh : r) s.last_step[pos[sh]] = std::max(s.last_step[pos[sh]], step);
  }
  for (int sh : s.order) s.total += shard_bytes.at(size_t(sh));
  if (!deletes) {
    s.peak = s.total;
    s.most_shards = s.order.size();
    return s;
  }
  for (size_t j = 0; j < s.order.size(); ++j) {
    uint64_t held = 0;
    size_t n = 0;
    for (size_t i = 0; i <= j; ++i)
      if (s.last_step[i] >= j) held += shard_bytes[size_t(s.order[i])], ++n;
    if (n <= 1 && j + 1 < s.order.size()) held += shard_bytes[size_t(s.order[j + 1])], ++n;
    if (held > s.peak) s.peak = held, s.most_shards = n;
  }
  return s;
}

namespace {

// The bytes of a safetensors file, from its header: the header and the last tensor's end.
uint64_t size_from_head(const std::string& head, const std::string& name) {
  const auto j = nlohmann::json::parse(head.begin() + 8, head.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) fail("the kept header of '{}' is not JSON; delete the .partial folder", name);
  uint64_t end = 0;
  for (const auto& [k, v] : j.items())
    if (k != "__metadata__" && v.contains("data_offsets")) end = std::max(end, v["data_offsets"][1].get<uint64_t>());
  return head.size() + end;
}

std::string read_local_head(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string head(8, '\0');
  if (!in.read(head.data(), 8)) fail("'{}' is not a safetensors file (shorter than 8 bytes)", path);
  const uint64_t n = safetensors_head_bytes(reinterpret_cast<const uint8_t*>(head.data()));
  if (n == UINT64_MAX || n > fs::file_size(path)) fail("'{}' has a corrupt safetensors header length", path);
  head.resize(size_t(n));
  if (!in.read(head.data() + 8, std::streamsize(n - 8))) fail("cannot read the header of '{}'", path);
  return head;
}

}  // namespace

RepackStats repack_from_dir_deleting(const std::string& dir_in, const RepackOptions& opts) {
  const std::string dir = fs::absolute(dir_in).lexically_normal().string();
  if (!fs::is_directory(dir)) fail("'{}' is not a directory", dir);
  if (opts.output.empty()) fail("no output given (--output OUT.qpack)");
  if (auto done = finish_interrupted_build(opts)) return *done;
  std::vector<std::string> listed;
  for (const auto& e : fs::directory_iterator(dir)) listed.push_back(e.path().filename().string());
  // A shard an earlier run converted and deleted is sized from the header it kept.
  const fs::path kept = kept_heads_dir(opts.output, "");
  std::vector<ShardInfo> shards;
  for (const std::string& name : checkpoint_shard_names(dir, listed)) {
    const fs::path p = fs::path(dir) / name;
    if (fs::exists(p)) {
      shards.push_back({name, uint64_t(fs::file_size(p))});
    } else if (fs::exists(kept / name)) {
      shards.push_back({name, size_from_head(read_text_file((kept / name).string()), name)});
    } else {
      fail("shard '{}' is missing, and no earlier --delete-source run converted it", p.string());
    }
  }
  const auto heads = shard_heads(opts.output, "", shards, [&](const ShardInfo& s) {
    return read_local_head((fs::path(dir) / s.name).string());
  });
  TensorSet tensors = reserved_checkpoint(dir, shards, heads);
  ShardFiles feed(dir, shards, tensors, [dir](const ShardInfo& s, const std::atomic<bool>&) {
    if (!fs::exists(fs::path(dir) / s.name))
      fail("shard '{}' was deleted before all of its tensors were converted; the container cannot be "
           "finished without it", (fs::path(dir) / s.name).string());
  }, /*delete_released=*/true);
  auto src = open_checkpoint_source(dir, std::move(tensors), opts);
  return write_container(*src, opts, &feed);
}

ShardFiles::ShardFiles(std::string dir, std::vector<ShardInfo> shards, const TensorSet& tensors, Fetch fetch,
                       bool delete_released)
    : dir_(std::move(dir)), shards_(std::move(shards)), fetch_(std::move(fetch)), delete_released_(delete_released) {
  for (size_t i = 0; i < shards_.size(); ++i) {
    const std::string path = (fs::path(dir_) / shards_[i].name).string();
    SafetensorsFile* file = nullptr;
    for (const auto& f : tensors.files())
      if (f->path() == path) file = f.get();
    SWIFTLET_CHECK(file, "shard '{}' is not among the checkpoint's files", path);
    files_.push_back(file);
    for (const TensorView& t : file->tensors()) shard_of_[t.name] = int(i);
  }
}

ShardFiles::~ShardFiles() {
  stop_ = true;
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

int ShardFiles::shard_of(const std::string& tensor) const {
  auto it = shard_of_.find(tensor);
  return it == shard_of_.end() ? -1 : it->second;
}

void ShardFiles::plan(const std::vector<int>& order) {
  SWIFTLET_CHECK(!worker_.joinable(), "a shard feed is planned once");
  order_ = order;
  worker_ = std::thread([this] { run(); });
}

// Fetches order_[j] ahead of the writer (once order_[j - 1] is with it) while the writer holds at
// most one shard, else when the writer asks for it: at most two shards on disk for parts that read
// at most two (write_container plans the same).
void ShardFiles::run() {
  for (size_t j = 0; j < order_.size(); ++j) {
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || (acquired_ >= j && (acquired_ - released_ <= 1 || asking_)); });
      if (stop_) return;
    }
    try {
      fetch_(shards_[size_t(order_[j])], stop_);
    } catch (...) {
      std::lock_guard lk(mu_);
      error_ = std::current_exception();
      cv_.notify_all();
      return;
    }
    std::lock_guard lk(mu_);
    fetched_ = j + 1;
    cv_.notify_all();
  }
}

void ShardFiles::acquire(int s) {
  {
    std::unique_lock lk(mu_);
    SWIFTLET_CHECK(acquired_ < order_.size() && order_[acquired_] == s, "shard {} acquired out of plan", s);
    asking_ = true;
    cv_.notify_all();
    cv_.wait(lk, [&] { return fetched_ > acquired_ || error_; });
    asking_ = false;
    if (fetched_ <= acquired_) std::rethrow_exception(error_);
    ++acquired_;
  }
  cv_.notify_all();
  files_[size_t(s)]->attach();
}

void ShardFiles::release(int s) {
  files_[size_t(s)]->detach();
  {
    std::lock_guard lk(mu_);
    ++released_;
  }
  cv_.notify_all();
  if (!delete_released_) return;
  std::error_code ec;
  fs::remove(fs::path(dir_) / shards_[size_t(s)].name, ec);
  if (ec) fail("cannot delete '{}' after converting it: {}", (fs::path(dir_) / shards_[size_t(s)].name).string(), ec.message());
}

}  // namespace swiftlet
