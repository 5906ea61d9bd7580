#include "runtime/state_cache.h"

#include "core/error.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>

namespace swiftlet {

namespace fs = std::filesystem;

namespace {
constexpr const char* kSuffix = ".swst";

uint64_t mix(uint64_t seed, const void* p, size_t n) { return XXH3_64bits_withSeed(p, n, seed); }

std::string hex(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016" PRIx64, v);
  return b;
}

// "<model>-<tokens>-<key>.swst" -> (tokens, key); false for any other name.
bool parse_name(const std::string& name, const std::string& tag, int64_t& tokens, uint64_t& key) {
  if (!name.starts_with(tag + "-") || !name.ends_with(kSuffix)) return false;
  const std::string mid =
      name.substr(tag.size() + 1, name.size() - tag.size() - 1 - std::char_traits<char>::length(kSuffix));
  const size_t dash = mid.find('-');
  if (dash == std::string::npos || dash == 0 || mid.size() - dash - 1 != 16) return false;
  char* end = nullptr;
  tokens = std::strtoll(mid.c_str(), &end, 10);
  if (end != mid.c_str() + dash || tokens <= 0) return false;
  key = std::strtoull(mid.c_str() + dash + 1, &end, 16);
  return *end == '\0';
}
}  // namespace

StateCache::StateCache(const Model& model, StateCacheOptions opts)
    : cfg_(model.config), opts_(std::move(opts)), model_id_(model_identity(model)), model_tag_(hex(model_id_)) {
  if (opts_.block < 1 || opts_.interval < opts_.block || opts_.interval % opts_.block != 0)
    fail("state cache: the checkpoint interval ({}) must be a positive multiple of the block ({})", opts_.interval,
         opts_.block);
  if (!opts_.dir.empty()) {
    if (opts_.disk_bytes == 0) fail("--state-cache {} needs a disk budget: give --state-cache-gb N", opts_.dir);
    std::error_code ec;
    fs::create_directories(opts_.dir, ec);
    if (ec || !fs::is_directory(opts_.dir))
      fail("--state-cache {}: cannot create the directory ({}): give a writable directory", opts_.dir,
           ec ? ec.message() : "not a directory");
    scan_directory();
    writer_ = std::thread([this] { writer(); });
  }
}

StateCache::~StateCache() {
  if (!writer_.joinable()) return;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  writer_.join();
}

// ----------------------------------------------------------------------------------- keys

std::vector<uint64_t> StateCache::chain(std::span<const int32_t> tokens) const {
  const size_t B = size_t(opts_.block);
  std::vector<uint64_t> c;
  c.reserve(tokens.size() / B + 1);
  const uint64_t seed[2] = {model_id_, kStateFileVersion};
  c.push_back(XXH3_64bits(seed, sizeof seed));
  for (size_t b = 0; (b + 1) * B <= tokens.size(); ++b) c.push_back(mix(c.back(), tokens.data() + b * B, B * 4));
  return c;
}

uint64_t StateCache::key_from(const std::vector<uint64_t>& c, std::span<const int32_t> tokens, size_t n) const {
  const size_t whole = n / size_t(opts_.block) * size_t(opts_.block);
  const uint64_t tail = mix(c[n / size_t(opts_.block)], tokens.data() + whole, (n - whole) * 4);
  const uint64_t len = n;
  return mix(tail, &len, sizeof len);
}

uint64_t StateCache::key(std::span<const int32_t> tokens, size_t n) const {
  SWIFTLET_CHECK(n <= tokens.size(), "key of {} of {} tokens", n, tokens.size());
  return key_from(chain(tokens.first(n)), tokens, n);
}

std::vector<size_t> StateCache::checkpoints(size_t from, size_t size, size_t turn,
                                            std::span<const size_t> messages) const {
  if (size <= from) return {};
  const size_t I = size_t(opts_.interval), B = size_t(opts_.block);
  std::vector<std::pair<size_t, bool>> cand;  // (position, always kept)
  for (size_t p = (from / I + 1) * I; p < size; p += I) cand.push_back({p, false});
  for (size_t m : messages)
    if (m > from && m < size) cand.push_back({m, false});
  if (turn > from && turn < size) cand.push_back({turn, true});
  cand.push_back({size, true});
  std::sort(cand.begin(), cand.end());
  std::vector<size_t> at;
  size_t last = from;
  for (const auto& [p, always] : cand) {
    if (!at.empty() && at.back() == p) continue;
    if (always || p >= last + B) {
      at.push_back(p);
      last = p;
    }
  }
  return at;
}

std::string StateCache::file_name(int64_t tokens, uint64_t key) const {
  return model_tag_ + "-" + std::to_string(tokens) + "-" + hex(key) + kSuffix;
}

// -------------------------------------------------------------------------------- memory

void StateCache::insert(uint64_t key, std::shared_ptr<const SavedState> s) {
  lru_.push_front({key, std::move(s)});
  stats_.bytes_ram += lru_.front().state->bytes();
  ++stats_.stored;
  while (stats_.bytes_ram > opts_.ram_bytes && !lru_.empty()) {
    stats_.bytes_ram -= lru_.back().state->bytes();
    lru_.pop_back();
    ++stats_.evicted_ram;
  }
  stats_.entries_ram = lru_.size();
}

std::shared_ptr<const SavedState> StateCache::find(std::span<const int32_t> prompt, int64_t have) {
  const std::vector<uint64_t> c = chain(prompt);
  const int64_t P = int64_t(prompt.size());
  auto usable = [&](const SavedState& s) {
    const int64_t n = s.state.pos;
    return n > have && n <= P && (n < P || !s.logits.empty()) &&
           std::equal(s.state.tokens.begin(), s.state.tokens.end(), prompt.begin());
  };
  std::shared_ptr<const SavedState> best;
  {
    std::lock_guard lock(mu_);
    ++stats_.lookups;
    auto best_it = lru_.end();
    for (auto it = lru_.begin(); it != lru_.end(); ++it) {
      const int64_t n = it->state->state.pos;
      if (n <= have || n > P || (best_it != lru_.end() && n <= best_it->state->state.pos)) continue;
      if (it->key == key_from(c, prompt, size_t(n)) && usable(*it->state)) best_it = it;
    }
    if (best_it != lru_.end()) {
      lru_.splice(lru_.begin(), lru_, best_it);
      best = lru_.front().state;
    }
  }
  if (!opts_.dir.empty()) {
    if (auto d = find_on_disk(prompt, best ? best->state.pos : have, c)) {
      std::lock_guard lock(mu_);
      ++stats_.hits_disk;
      stats_.tokens_saved += uint64_t(d->state.pos - have);
      insert(key_from(c, prompt, size_t(d->state.pos)), d);
      return d;
    }
  }
  if (!best) return nullptr;
  {
    std::lock_guard lock(mu_);
    ++stats_.hits_ram;
    stats_.tokens_saved += uint64_t(best->state.pos - have);
  }
  if (!opts_.dir.empty()) touch(best->state.pos, key_from(c, prompt, size_t(best->state.pos)));
  return best;
}

void StateCache::put(const SessionState& state, const std::vector<float>* logits) {
  const std::span<const int32_t> tokens(state.tokens);
  if (tokens.empty()) return;
  const uint64_t k = key(tokens, tokens.size());
  const bool with_logits = logits && !logits->empty();
  {
    std::lock_guard lock(mu_);
    for (auto it = lru_.begin(); it != lru_.end(); ++it)
      if (it->key == k && it->state->state.tokens == state.tokens && (!with_logits || !it->state->logits.empty())) {
        lru_.splice(lru_.begin(), lru_, it);
        return;
      }
  }
  auto s = std::make_shared<SavedState>();
  s->state = state;
  if (with_logits) s->logits = *logits;
  std::shared_ptr<const SavedState> cs = std::move(s);
  std::lock_guard lock(mu_);
  std::erase_if(lru_, [&](const Entry& e) {
    if (e.key != k || e.state->state.tokens != state.tokens) return false;
    stats_.bytes_ram -= e.state->bytes();  // replaced by the one with logits
    return true;
  });
  if (!opts_.dir.empty()) {
    if (writes_.size() >= 4 || cs->bytes() > opts_.disk_bytes) {
      ++stats_.writes_dropped;  // the disk is behind: memory must not grow without bound
    } else {
      writes_.push_back({(fs::path(opts_.dir) / file_name(state.pos, k)).string(), k, cs});
      cv_.notify_all();
    }
  }
  insert(k, std::move(cs));
}

StateCacheStats StateCache::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

// ---------------------------------------------------------------------------------- disk

std::vector<StateCache::File> StateCache::list_files() {
  std::vector<File> out;
  uint64_t files = 0, bytes = 0;
  std::error_code ec;
  for (fs::directory_iterator it(opts_.dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.ends_with(kSuffix) || name.starts_with(".")) continue;
    std::error_code sec;
    const uint64_t size = it->file_size(sec);
    if (sec) continue;  // vanished meanwhile
    ++files;
    bytes += size;
    File f;
    f.name = name;
    if (parse_name(name, model_tag_, f.tokens, f.key)) out.push_back(std::move(f));
  }
  std::lock_guard lock(mu_);
  stats_.files_disk = files;
  stats_.bytes_disk = bytes;
  return out;
}

void StateCache::scan_directory() {
  std::error_code ec;
  uint64_t ignored = 0;
  for (fs::directory_iterator it(opts_.dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.ends_with(kSuffix) || name.starts_with(".")) continue;
    std::string why;
    std::optional<StateFileHeader> h = read_state_header(it->path().string(), &why);
    int64_t tokens = 0;
    uint64_t key = 0;
    const bool ours = parse_name(name, model_tag_, tokens, key);
    if (h && h->model_id == model_id_ && ours && h->tokens == tokens && h->key == key) continue;
    if (!h) std::fprintf(stderr, "swiftlet: state cache: ignoring %s: %s\n", name.c_str(), why.c_str());
    ignored_.insert(name);
    ++ignored;
  }
  stats_.files_ignored += ignored;
  list_files();
}

std::shared_ptr<const SavedState> StateCache::find_on_disk(std::span<const int32_t> prompt, int64_t have,
                                                           const std::vector<uint64_t>& c) {
  const int64_t P = int64_t(prompt.size());
  std::vector<File> files = list_files();
  std::erase_if(files, [&](const File& f) {
    return f.tokens <= have || f.tokens > P || f.key != key_from(c, prompt, size_t(f.tokens));
  });
  std::sort(files.begin(), files.end(), [](const File& a, const File& b) { return a.tokens > b.tokens; });
  for (const File& f : files) {
    {
      std::lock_guard lock(mu_);
      if (ignored_.count(f.name)) continue;
    }
    const std::string path = (fs::path(opts_.dir) / f.name).string();
    std::string why;
    std::optional<SavedState> s = read_state_file(path, cfg_, model_id_, f.key, &why);
    if (s && s->state.pos == f.tokens && std::equal(s->state.tokens.begin(), s->state.tokens.end(), prompt.begin()) &&
        (f.tokens < P || !s->logits.empty())) {
      touch(f.tokens, f.key);
      return std::make_shared<const SavedState>(std::move(*s));
    }
    if (!s && why.starts_with("cannot open")) continue;  // removed by another process meanwhile
    if (!s) {
      std::fprintf(stderr, "swiftlet: state cache: ignoring %s: %s\n", f.name.c_str(), why.c_str());
      std::lock_guard lock(mu_);
      ++stats_.files_ignored;
      ignored_.insert(f.name);
    }
    // A damaged file of this model can never serve: remove it (another model's stays).
    if (!s && why != "written by another model") {
      std::error_code ec;
      fs::remove(path, ec);
    }
  }
  return nullptr;
}

void StateCache::touch(int64_t tokens, uint64_t key) {
  // The file's modification time is its last use: the disk budget evicts the oldest.
  (void)::utimensat(AT_FDCWD, (fs::path(opts_.dir) / file_name(tokens, key)).c_str(), nullptr, 0);
}

void StateCache::flush() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return writes_.empty() && !writing_; });
}

void StateCache::writer() {
  for (;;) {
    Write w;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !writes_.empty(); });
      if (writes_.empty()) return;  // stopping, nothing left
      w = std::move(writes_.front());
      writes_.pop_front();
      writing_ = true;
    }
    bool ok = true;
    std::error_code ec;
    bool replace = false;  // a file of this name was found damaged: the new one takes its place
    {
      std::lock_guard lock(mu_);
      replace = ignored_.erase(fs::path(w.path).filename().string()) > 0;
    }
    if (replace || !fs::exists(w.path, ec)) {  // another process may have written this prefix already
      try {
        write_state_file(w.path, model_id_, w.key, *w.state);
      } catch (const Error& e) {
        ok = false;
        std::fprintf(stderr, "swiftlet: state cache: %s\n", e.what());
      }
    }
    enforce_disk_budget();
    {
      std::lock_guard lock(mu_);
      ok ? ++stats_.files_written : ++stats_.write_failures;
      writing_ = false;
    }
    cv_.notify_all();
  }
}

void StateCache::enforce_disk_budget() {
  struct Item {
    fs::path path;
    uint64_t bytes;
    fs::file_time_type used;
  };
  std::vector<Item> items;
  uint64_t total = 0;
  std::error_code ec;
  for (fs::directory_iterator it(opts_.dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.ends_with(kSuffix) || name.starts_with(".")) continue;
    std::error_code sec;
    Item i{it->path(), it->file_size(sec), {}};
    if (!sec) i.used = it->last_write_time(sec);
    if (sec) continue;  // vanished meanwhile
    total += i.bytes;
    items.push_back(std::move(i));
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.used < b.used; });
  uint64_t evicted = 0;
  for (const Item& i : items) {
    if (total <= opts_.disk_bytes) break;
    std::error_code rec;
    fs::remove(i.path, rec);  // gone already (another process evicted it): as good
    total -= i.bytes;
    ++evicted;
  }
  list_files();
  std::lock_guard lock(mu_);
  stats_.evicted_disk += evicted;
}

}  // namespace swiftlet
