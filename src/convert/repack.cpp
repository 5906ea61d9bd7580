#include "convert/repack.h"

#include "convert/out_file.h"
#include "convert/parallel_for.h"
#include "convert/shard_feed.h"

#include "core/error.h"
#include "core/zstd_frame.h"
#include "io/mapped_file.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <numeric>
#include <optional>
#include <thread>

namespace swiftlet {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

std::atomic<bool> g_interrupted{false};

void check_interrupt() {
  if (g_interrupted.load(std::memory_order_relaxed))
    fail("interrupted");
}

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string gb(uint64_t b) { return fmt::format("{:.2f} GB", double(b) / 1e9); }

// The container's absolute path, without a trailing slash.
fs::path output_path(const std::string& output) {
  fs::path out = fs::absolute(fs::path(output)).lexically_normal();
  return out.filename().empty() ? out.parent_path() : out;
}

bool process_alive(const std::string& pid) {
  return fs::exists("/proc/" + pid);
}

// The temporary directory a container is built in, and the final atomic rename. A resumable one
// is OUT.partial, kept when the run fails or is killed, and locked while a run works in it.
class ContainerWriter {
 public:
  ContainerWriter(const std::string& output, bool force, bool resumable,
                  const std::function<void(const std::string&)>& log)
      : out_(output_path(output)), log_(log), resumable_(resumable) {
    tmp_ = out_.string() + (resumable ? std::string(".partial") : fmt::format(".tmp-{}", ::getpid()));
    if (fs::exists(out_)) {
      if (!force) fail("'{}' already exists; pass --force to replace it", out_.string());
      if (!fs::is_directory(out_) || !looks_like_qpack(out_.string()))
        fail("'{}' exists and is not a .qpack container; refusing to replace it even with --force",
             out_.string());
    }
    remove_stale_temporaries();
    fs::create_directories(tmp_ / "packed_experts");
    if (resumable) {
      lock_fd_ = ::open((tmp_ / kLockFile).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (lock_fd_ < 0 || ::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0)
        fail("'{}' is in use by another swiftlet-repack; wait for it or stop it", tmp_.string());
    }
  }
  ~ContainerWriter() {
    if (lock_fd_ >= 0) ::close(lock_fd_);
    if (!committed_ && !resumable_) {
      std::error_code ec;
      fs::remove_all(tmp_, ec);
    }
  }

  static constexpr const char* kLockFile = ".lock";

  std::string path(const std::string& rel) const { return (tmp_ / rel).string(); }
  const fs::path& tmp() const { return tmp_; }
  const fs::path& out() const { return out_; }

  void record(const std::string& rel, uint64_t bytes, uint64_t hash) {
    sizes_[rel] = bytes;
    hashes_[rel] = hash;
  }
  const std::map<std::string, uint64_t>& sizes() const { return sizes_; }
  const std::map<std::string, uint64_t>& hashes() const { return hashes_; }

  void write_text(const std::string& rel, const std::string& text) {
    OutFile f(path(rel));
    f.write(text.data(), text.size());
    f.close();
    record(rel, f.bytes(), f.hash());
  }

  void copy_file(const std::string& rel, const std::string& src) {
    const std::string bytes = read_text_file(src);
    write_text(rel, bytes);
  }

  // Writes manifest.json last, makes everything durable, then moves the container into place.
  // `scratch`: files of a resumable build that are not part of the container, removed after the
  // manifest is written (a run killed in between leaves a complete container in OUT.partial,
  // which finish_interrupted_build moves into place).
  void commit(QpackManifest manifest, const std::vector<std::string>& scratch = {}) {
    check_interrupt();
    manifest.files = sizes_;
    fsync_dir((tmp_ / "packed_experts").string());
    const std::string text = manifest.to_json().dump(2) + "\n";
    OutFile f(path("manifest.json"));
    f.write(text.data(), text.size());
    f.close();
    finish(scratch);
  }
  void finish(const std::vector<std::string>& scratch) {
    std::error_code ec;
    for (const auto& rel : scratch) fs::remove_all(tmp_ / rel, ec);
    if (lock_fd_ >= 0) fs::remove(tmp_ / kLockFile, ec);
    fsync_dir(tmp_.string());
    move_into_place(tmp_.string(), out_.string());
    committed_ = true;
  }

 private:
  // Temporaries of earlier runs that were killed (their process is gone) only waste space.
  void remove_stale_temporaries() {
    const fs::path parent = out_.parent_path();
    const std::string prefix = out_.filename().string() + ".tmp-";
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(parent, ec)) {
      const std::string name = e.path().filename().string();
      if (!name.starts_with(prefix)) continue;
      const std::string pid = name.substr(prefix.size());
      if (pid.empty() || !std::all_of(pid.begin(), pid.end(), ::isdigit) || process_alive(pid)) continue;
      if (log_) log_(fmt::format("removing '{}' left by an interrupted run", e.path().string()));
      fs::remove_all(e.path(), ec);
    }
  }

  fs::path out_, tmp_;
  std::function<void(const std::string&)> log_;
  std::map<std::string, uint64_t> sizes_, hashes_;
  bool resumable_ = false;
  int lock_fd_ = -1;
  bool committed_ = false;
};

void check_free_space(const fs::path& out, uint64_t need, bool replacing) {
  require_free_space(out.parent_path().string(), need, "the container",
                     replacing ? "the container being replaced is deleted only after the new one is complete" : "");
}

// ------------------------------------------------------------------------------- the writer

struct ResidentPlan {
  std::vector<ResidentItem> items;
  std::vector<TensorToWrite> tensors;           // all, in file (= name) order
  std::vector<std::pair<size_t, size_t>> slot;  // tensors[i] is items[first].tensors[second]
  std::vector<uint64_t> offset;                 // tensors[i] starts at this byte of the file
  std::vector<std::vector<size_t>> of_item;     // items[i]'s tensors: indices into `tensors`
  std::string header;
  uint64_t bytes = 0;
};

size_t tensor_bytes(const TensorToWrite& t) {
  size_t n = dtype_size(t.dtype);
  for (int64_t d : t.shape) n *= size_t(d);
  return n;
}

ResidentPlan plan_resident(RepackSource& src) {
  ResidentPlan p;
  p.items = src.resident();
  std::vector<std::tuple<std::string, size_t, size_t>> order;
  for (size_t i = 0; i < p.items.size(); ++i)
    for (size_t j = 0; j < p.items[i].tensors.size(); ++j) order.emplace_back(p.items[i].tensors[j].name, i, j);
  std::sort(order.begin(), order.end());
  for (size_t k = 1; k < order.size(); ++k)
    SWIFTLET_CHECK(std::get<0>(order[k]) != std::get<0>(order[k - 1]), "tensor '{}' planned twice",
                   std::get<0>(order[k]));
  p.of_item.resize(p.items.size());
  for (const auto& [name, i, j] : order) {
    p.of_item[i].push_back(p.tensors.size());
    p.tensors.push_back(p.items[i].tensors[j]);
    p.slot.emplace_back(i, j);
  }
  p.header = safetensors_header(p.tensors, {{"format", "mlx"}});
  p.bytes = p.header.size();
  for (const auto& t : p.tensors) {
    p.offset.push_back(p.bytes);
    p.bytes += tensor_bytes(t);
  }
  return p;
}

void pwrite_all(int fd, const uint8_t* p, size_t n, uint64_t at, const std::string& path) {
  while (n > 0) {
    const ssize_t r = ::pwrite(fd, p, n, off_t(at));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      fail("cannot write '{}': {}{}", path, std::strerror(errno),
           errno == ENOSPC ? " (the disk filled up during the repack)" : "");
    p += r;
    n -= size_t(r);
    at += uint64_t(r);
  }
}

// model.safetensors, filled module by module in whatever order their inputs come: every tensor
// has its place from the plan, so the bytes are those of writing it front to back.
class ResidentFile {
 public:
  ResidentFile(std::string path, const ResidentPlan& plan, bool keep) : path_(std::move(path)), plan_(plan) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | (keep ? 0 : O_TRUNC), 0644);
    if (fd_ < 0) fail("cannot create '{}': {}", path_, std::strerror(errno));
    if (::ftruncate(fd_, off_t(plan.bytes)) != 0) fail("cannot size '{}': {}", path_, std::strerror(errno));
    pwrite_all(fd_, reinterpret_cast<const uint8_t*>(plan.header.data()), plan.header.size(), 0, path_);
  }
  ~ResidentFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  ResidentFile(const ResidentFile&) = delete;
  ResidentFile& operator=(const ResidentFile&) = delete;

  void write_item(size_t i) {
    const ResidentItem& item = plan_.items[i];
    std::vector<TensorBytes> bytes = item.produce();
    SWIFTLET_CHECK(bytes.size() == item.tensors.size(), "item produced {} tensors", bytes.size());
    for (size_t k : plan_.of_item[i]) {
      const TensorBytes& b = bytes[plan_.slot[k].second];
      SWIFTLET_CHECK(b.nbytes() == tensor_bytes(plan_.tensors[k]), "tensor '{}': {} bytes produced, {} planned",
                     plan_.tensors[k].name, b.nbytes(), tensor_bytes(plan_.tensors[k]));
      pwrite_all(fd_, b.data(), b.nbytes(), plan_.offset[k], path_);
      if (b.ptr) release_source_pages(b.ptr, b.size);
    }
  }
  void sync() {
    if (::fdatasync(fd_) != 0) fail("cannot flush '{}': {}", path_, std::strerror(errno));
  }
  // Flushes, then reads the file back for its checksum (8 MiB at a time, so that the repack's
  // memory stays small); drops its pages from the cache.
  uint64_t finish() {
    sync();
    std::vector<uint8_t> buf(8u << 20);
    XXH3_state_t* state = XXH3_createState();
    XXH3_64bits_reset(state);
    try {
      for (uint64_t at = 0; at < plan_.bytes;) {
        const ssize_t r = ::pread(fd_, buf.data(), size_t(std::min<uint64_t>(buf.size(), plan_.bytes - at)), off_t(at));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) fail("cannot read back '{}': {}", path_, r < 0 ? std::strerror(errno) : "unexpected end of file");
        XXH3_64bits_update(state, buf.data(), size_t(r));
        at += uint64_t(r);
      }
    } catch (...) {
      XXH3_freeState(state);
      throw;
    }
    const uint64_t h = XXH3_64bits_digest(state);
    XXH3_freeState(state);
    ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
    return h;
  }

 private:
  std::string path_;
  const ResidentPlan& plan_;
  int fd_ = -1;
};

// Two chunks of whole expert blobs, 4096-aligned for O_DIRECT: one is filled while the other is
// written. The only large allocation of a repack besides one resident tensor.
struct ChunkBuffers {
  ChunkBuffers(uint64_t stride, int experts)
      : per_chunk(int(std::clamp<uint64_t>((32ull << 20) / stride, 1, uint64_t(experts)))),
        bytes(size_t(stride) * size_t(per_chunk)) {
    for (auto& b : buf) {
      b = static_cast<uint8_t*>(std::aligned_alloc(4096, bytes));
      if (!b) fail("cannot allocate {} bytes for expert chunks", bytes);
    }
  }
  ~ChunkBuffers() {
    for (auto* b : buf) std::free(b);
  }
  int per_chunk;
  size_t bytes;
  uint8_t* buf[2] = {nullptr, nullptr};
};

// Fills and writes one layer file, overlapping the write of one chunk with the filling of the
// next. Returns the per-expert checksums.
std::vector<uint64_t> write_layer(RepackSource& src, const QpackLayout& layout, int layer,
                                  ContainerWriter& cw, int threads, ChunkBuffers& bufs) {
  const uint64_t stride = layout.expert_stride, payload = layout.payload();
  const int E = layout.expert_count;
  const int per_chunk = bufs.per_chunk;
  std::vector<uint64_t> sums(static_cast<size_t>(E));
  const std::string rel = qpack_layer_file(layer);
  OutFile f(cw.path(rel), /*direct=*/true);
  std::future<void> pending;
  int which = 0;
  try {
    for (int e0 = 0; e0 < E; e0 += per_chunk) {
      check_interrupt();
      const int n = std::min(per_chunk, E - e0);
      uint8_t* base = bufs.buf[which];
      parallel_for(n, threads, [&](int i) {
        uint8_t* blob = base + size_t(i) * stride;
        src.expert(layer, e0 + i, layout, blob);
        std::memset(blob + payload, 0, size_t(stride - payload));
        sums[size_t(e0 + i)] = xxh3_64(blob, payload);
      });
      if (pending.valid()) pending.get();
      pending = std::async(std::launch::async, [&f, base, bytes = size_t(n) * stride] {
        f.write(base, bytes, /*hash=*/false);
      });
      which ^= 1;
    }
    if (pending.valid()) pending.get();
  } catch (...) {
    if (pending.valid()) pending.wait();
    throw;
  }
  f.close();
  src.layer_done(layer);
  return sums;
}

}  // namespace

void check_repack_interrupt() { check_interrupt(); }

void request_repack_interrupt(bool on) { g_interrupted.store(on); }

void release_source_pages(const void* p, size_t n) {
  if (!p || n == 0) return;
  static const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t a = uintptr_t(p) & ~(page - 1);
  const uintptr_t e = (uintptr_t(p) + n + page - 1) & ~(page - 1);
  ::madvise(reinterpret_cast<void*>(a), e - a, MADV_DONTNEED);
}

void require_free_space(const std::string& dir, uint64_t need, const std::string& what,
                        const std::string& note) {
  struct statvfs sv {};
  if (::statvfs(dir.c_str(), &sv) != 0) fail("cannot query free space of '{}': {}", dir, std::strerror(errno));
  const uint64_t avail = uint64_t(sv.f_bavail) * uint64_t(sv.f_frsize);
  // 1% of the need, and 64 MiB for the file system's own use (a 32nd of a smaller one).
  const uint64_t fs_bytes = uint64_t(sv.f_blocks) * uint64_t(sv.f_frsize);
  const uint64_t margin = std::max<uint64_t>(std::min<uint64_t>(64ull << 20, fs_bytes / 32), need / 100);
  if (avail < need + margin)
    fail("not enough disk space in '{}': {} needs {} ({} bytes, plus {} margin) but only {} ({} "
         "bytes) are free{}{}", dir, what, gb(need), need, gb(margin), gb(avail), avail,
         note.empty() ? "" : "; ", note);
}

void move_into_place(const std::string& tmp, const std::string& out) {
  if (fs::exists(out)) {
    // Swap the complete new directory with the old one in one step, then delete the old.
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, out.c_str(), RENAME_EXCHANGE) != 0)
      fail("cannot replace '{}' with '{}': {}", out, tmp, std::strerror(errno));
    std::error_code ec;
    fs::remove_all(tmp, ec);  // now the old container
  } else if (::rename(tmp.c_str(), out.c_str()) != 0) {
    fail("cannot rename '{}' to '{}': {}", tmp, out, std::strerror(errno));
  }
  fsync_dir(fs::path(out).parent_path().string());
}

namespace {

// A part of the container made in one go: a resident module (item >= 0) or a layer's experts.
struct Unit {
  int item = -1, layer = -1;
  size_t step = 0;  // made once order[step] of the ShardSchedule is acquired
};

uint64_t dir_bytes(const fs::path& dir) {
  uint64_t n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
    if (it->is_regular_file(ec)) n += it->file_size(ec);
  return n;
}

}  // namespace

std::optional<RepackStats> finish_interrupted_build(const RepackOptions& o) {
  if (!fs::exists(fs::path(partial_dir(o.output)) / "manifest.json")) return std::nullopt;
  ContainerWriter cw(o.output, o.force, /*resumable=*/true, o.log);
  if (o.log)
    o.log(fmt::format("'{}' holds a complete container (a run was stopped while moving it into place): "
                      "moving it to '{}'", cw.tmp().string(), cw.out().string()));
  cw.finish({BuildJournal::kFile, kShardHeadsDir});
  RepackStats st;
  st.output = cw.out().string();
  st.total_bytes = dir_bytes(cw.out());
  return st;
}

std::string partial_dir(const std::string& output) { return output_path(output).string() + ".partial"; }

namespace {
RepackStats build_container(RepackSource& src, const RepackOptions& o, ShardFeed* feed);
}

RepackStats write_container(RepackSource& src, const RepackOptions& o, ShardFeed* feed) {
  if (!feed) return build_container(src, o, nullptr);
  try {
    return build_container(src, o, feed);
  } catch (const Error& e) {
    if (!fs::exists(partial_dir(o.output))) throw;
    fail("{} (what is done is kept in '{}': run the same command again to resume)", e.what(), partial_dir(o.output));
  }
}

namespace {

RepackStats build_container(RepackSource& src, const RepackOptions& o, ShardFeed* feed) {
  const auto t0 = Clock::now();
  auto log = [&](const std::string& s) {
    if (o.log) o.log(s);
  };
  if (o.output.empty()) fail("no output given (--output OUT.qpack)");
  const ModelConfig& c = src.config();
  const auto formats = src.expert_formats();
  const QpackLayout layout = QpackLayout::plan(c, formats.data());
  layout.validate(c, "planned layout");
  ResidentPlan plan = plan_resident(src);
  const std::string config_text = src.config_json();
  const auto files = src.files();

  // Everything that will be written, each file in whole 4 KiB blocks, to check the disk before
  // starting (checksums.json: at most 21 bytes an expert, 64 a file; manifest.json: a block).
  const uint64_t layer_bytes = uint64_t(c.num_experts) * layout.expert_stride;
  const uint64_t expert_bytes = uint64_t(c.num_layers) * layer_bytes;
  auto blocks = [](uint64_t n) { return (n + 4095) / 4096 * 4096; };
  const std::string layout_text = layout.to_json().dump(2) + "\n";
  uint64_t need = blocks(plan.bytes) + uint64_t(c.num_layers) * blocks(layer_bytes) + blocks(config_text.size()) +
                  blocks(layout_text.size()) + 4096 +
                  blocks(uint64_t(c.num_layers) * uint64_t(c.num_experts) * 21 + 64 * (files.size() + 8));
  for (const auto& [rel, path] : files) need += blocks(fs::file_size(path));
  uint64_t container_bytes = need;

  log(fmt::format("{}: {} layers x {} experts ({}), expert stride {} bytes, resident {}, experts {}",
                  src.describe(), c.num_layers, c.num_experts,
                  formats[0].describe(), layout.expert_stride, gb(plan.bytes), gb(expert_bytes)));
  ContainerWriter cw(o.output, o.force, feed != nullptr, o.log);

  // The parts, and what a resumed build has made of them already.
  std::vector<Unit> units;
  for (size_t i = 0; i < plan.items.size(); ++i) units.push_back({int(i), -1, 0});
  for (int l = 0; l < c.num_layers; ++l) units.push_back({-1, l, 0});
  std::unique_ptr<BuildJournal> journal;
  if (feed) {
    const std::string material = layout_text + plan.header + config_text + src.describe() + "|" +
                                 o.source_name + fmt::format("|{}|{}", src.quant_bits(), src.quant_group_size());
    journal = std::make_unique<BuildJournal>(cw.tmp(), fmt::format("{:016x}", xxh3_64(material.data(), material.size())));
    std::error_code ec;
    if (journal->fresh()) {
      fs::remove_all(cw.tmp() / "packed_experts", ec);
      fs::create_directories(cw.tmp() / "packed_experts");
    }
    if (fs::file_size(cw.tmp() / "model.safetensors", ec) != plan.bytes) journal->items().clear();
    for (auto it = journal->layers().begin(); it != journal->layers().end();) {
      const bool whole = fs::file_size(cw.path(qpack_layer_file(it->first)), ec) == layer_bytes && !ec &&
                         it->second.size() == size_t(c.num_experts);
      it = whole ? std::next(it) : journal->layers().erase(it);
    }
  }
  std::vector<Unit> todo;
  for (const Unit& u : units)
    if (!journal || !(u.item >= 0 ? journal->items().contains(size_t(u.item)) : journal->layers().contains(u.layer)))
      todo.push_back(u);

  ShardSchedule sched;
  if (feed) {
    std::vector<std::vector<int>> reads;
    for (const Unit& u : todo) {
      const std::vector<std::string> inputs = u.item >= 0 ? plan.items[size_t(u.item)].inputs : src.layer_inputs(u.layer);
      SWIFTLET_CHECK(!inputs.empty(), "a part of the container names no source tensors");
      reads.emplace_back();
      for (const auto& name : inputs) {
        const int s = feed->shard_of(name);
        if (s < 0) fail("tensor '{}' is in none of the checkpoint's shards", name);
        reads.back().push_back(s);
      }
    }
    std::vector<uint64_t> sizes;
    for (int s = 0; s < feed->shards(); ++s) sizes.push_back(feed->shard_bytes(s));
    sched = schedule_shards(reads, sizes, feed->deletes());
    for (size_t i = 0; i < todo.size(); ++i) todo[i].step = sched.step[i];
    // What an earlier run made of the container is on disk already; the journal grows by a line a part.
    std::error_code ec;
    const uint64_t have = dir_bytes(cw.tmp() / "packed_experts") + fs::file_size(cw.tmp() / "model.safetensors", ec) * !ec;
    container_bytes += blocks(uint64_t(c.num_layers) * uint64_t(c.num_experts) * 21 + 16 * plan.items.size());
    if (units.size() != todo.size())
      log(fmt::format("resuming '{}': {} of {} parts made earlier", cw.tmp().string(), units.size() - todo.size(),
                      units.size()));
    log(fmt::format("plan: {} of {} shards to read ({}){}; the container takes {}; peak disk use {} (the "
                    "container and {} shards at once)", sched.order.size(), feed->shards(), gb(sched.total),
                    feed->deletes() ? ", each deleted once its parts are written" : "", gb(container_bytes),
                    gb(container_bytes + sched.peak), sched.most_shards));
    struct stat a {}, b {};
    const bool one_disk = ::stat(cw.tmp().c_str(), &a) == 0 && ::stat(feed->dir().c_str(), &b) == 0 && a.st_dev == b.st_dev;
    const std::string why = feed->deletes() ? "the shards are fetched one after another and deleted once converted" : "";
    const uint64_t peak = sched.peak;
    if (one_disk) {
      require_free_space(cw.tmp().string(), container_bytes + peak - std::min(container_bytes + peak, have),
                         "the container and the shards held while converting", why);
    } else {
      require_free_space(cw.tmp().string(), container_bytes - std::min(container_bytes, have), "the container");
      require_free_space(feed->dir(), peak, "the shards held while converting", why);
    }
  } else {
    check_free_space(cw.out(), need, fs::exists(cw.out()));
  }
  std::stable_sort(todo.begin(), todo.end(), [](const Unit& a, const Unit& b) { return a.step < b.step; });

  ResidentFile resident(cw.path("model.safetensors"), plan, journal && !journal->items().empty());
  QpackChecksums sums;
  sums.experts.resize(size_t(c.num_layers));
  if (journal)
    for (auto& [l, v] : journal->layers()) sums.experts[size_t(l)] = v;
  const auto t1 = Clock::now();
  ChunkBuffers bufs(layout.expert_stride, layout.expert_count);
  const std::vector<int>& order = sched.order;
  if (feed) feed->plan(order);
  const size_t steps = std::max<size_t>(order.size(), 1);
  size_t next = 0;
  for (size_t j = 0; j < steps; ++j) {
    if (j < order.size()) feed->acquire(order[j]);
    std::vector<size_t> items;
    for (; next < todo.size() && todo[next].step == j; ++next) {
      check_interrupt();
      const Unit& u = todo[next];
      if (u.item >= 0) {
        resident.write_item(size_t(u.item));
        items.push_back(size_t(u.item));
        continue;
      }
      const auto tl = Clock::now();
      sums.experts[size_t(u.layer)] = write_layer(src, layout, u.layer, cw, std::max(1, o.threads), bufs);
      if (journal) journal->add_layer(u.layer, sums.experts[size_t(u.layer)]);
      const double s = since(tl);
      log(fmt::format("layer {:02d}/{}: {} experts, {} in {:.1f} s ({:.2f} GB/s)", u.layer + 1, c.num_layers,
                      c.num_experts, gb(layer_bytes), s, double(layer_bytes) / 1e9 / std::max(s, 1e-9)));
    }
    if (journal && !items.empty()) {
      resident.sync();
      journal->add_items(items);
    }
    for (size_t i = 0; i <= j && i < order.size(); ++i)
      if (sched.last_step[i] == j) feed->release(order[i]);
  }
  const double expert_s = since(t1);
  cw.record("model.safetensors", plan.bytes, resident.finish());
  // Every layer file, made now or by an earlier run (their checksums are the experts', in sums).
  for (int l = 0; l < c.num_layers; ++l) cw.record(qpack_layer_file(l), layer_bytes, 0);
  log(fmt::format("model.safetensors: {} tensors, {}", plan.tensors.size(), gb(plan.bytes)));
  plan.items.clear();  // release anything the producers captured

  cw.write_text("packed_experts/layout.json", layout_text);
  for (const auto& [rel, path] : files) {
    if (o.compress_tokenizer && rel == "tokenizer.json") {
      const std::string text = read_text_file(path);
      cw.write_text("tokenizer.json.zst", is_zstd_frame(text) ? text : zstd_compress(text));
    } else {
      cw.copy_file(rel, path);
    }
  }
  cw.write_text("config.json", config_text);
  for (const auto& [rel, h] : cw.hashes())
    if (!rel.starts_with("packed_experts/layer_")) sums.files[rel] = h;
  cw.write_text(kQpackChecksumsFile, sums.to_json().dump(1) + "\n");

  QpackManifest m;
  m.model_name = c.model_type;
  m.source_checkpoint = o.source_name.empty() ? src.describe() : o.source_name;
  m.quant_bits = src.quant_bits();
  m.quant_group_size = src.quant_group_size();
  journal.reset();
  cw.commit(m, {BuildJournal::kFile, kShardHeadsDir});

  RepackStats st;
  st.output = cw.out().string();
  st.resident_bytes = plan.bytes;
  st.expert_bytes = expert_bytes;
  for (const auto& [rel, n] : cw.sizes()) st.total_bytes += n;
  st.seconds = since(t0);
  log(fmt::format("wrote {}: {} in {:.1f} s (experts {:.2f} GB/s)", st.output, gb(st.total_bytes),
                  st.seconds, double(expert_bytes) / 1e9 / std::max(expert_s, 1e-9)));
  return st;
}

}  // namespace

std::string quantized_config_json(json config, int bits, int group_size,
                                  const std::map<std::string, QuantSpec>& overrides) {
  config.erase("quantization");
  config.erase("quantization_config");
  if (bits != 16) {
    json q = {{"group_size", group_size}, {"bits", bits}, {"mode", "affine"}};
    for (const auto& [path, spec] : overrides) q[path] = {{"group_size", spec.group_size}, {"bits", spec.bits}};
    config["quantization"] = q;
    config["quantization_config"] = q;
  }
  return config.dump(2) + "\n";
}

}  // namespace swiftlet
