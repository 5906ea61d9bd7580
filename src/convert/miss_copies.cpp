// add_miss_copies (repack.h): the low-bit copies of a container's experts (format/miss_copy.h).
#include "convert/out_file.h"
#include "convert/parallel_for.h"
#include "convert/repack.h"
#include "format/miss_copy.h"

#include "core/error.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>

namespace swiftlet {

namespace fs = std::filesystem;

namespace {

struct Aligned {
  uint8_t* p = nullptr;
  explicit Aligned(size_t n) : p(static_cast<uint8_t*>(std::aligned_alloc(4096, n))) {
    if (!p) fail("cannot allocate {} bytes", n);
  }
  ~Aligned() { std::free(p); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
};

// Replaces manifest.json with `m` (written beside it, made durable, renamed over it).
void replace_manifest(const std::string& dir, const QpackManifest& m) {
  const std::string tmp = (fs::path(dir) / "manifest.json.tmp").string();
  const std::string text = m.to_json().dump(2) + "\n";
  OutFile f(tmp);
  f.write(text.data(), text.size());
  f.close();
  std::error_code ec;
  fs::rename(tmp, fs::path(dir) / "manifest.json", ec);
  if (ec) fail("cannot replace '{}/manifest.json': {}", dir, ec.message());
  fsync_dir(dir);
}

// Leftovers of runs that were killed: miss_copies.tmp-<pid> of processes that are gone.
void remove_stale(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const std::string prefix = std::string(kMissCopyDir) + ".tmp-";
    if (!name.starts_with(prefix)) continue;
    const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
    if (pid > 0 && ::kill(pid_t(pid), 0) == 0) continue;  // still being written
    fs::remove_all(entry.path(), ec);
  }
}

}  // namespace

uint64_t add_miss_copies(const std::string& container, const AddMissCopiesOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  const QpackContainer qc = QpackContainer::open(container);
  const MissCopyLayout copy = MissCopyLayout::plan(qc.layout, qc.config, opts.bits);
  const int L = qc.layout.layer_count, E = qc.layout.expert_count;
  const uint64_t layer_bytes = uint64_t(E) * copy.stride;
  remove_stale(qc.dir);
  require_free_space(qc.dir, layer_bytes * uint64_t(L), fmt::format("{}-bit copies of the experts", opts.bits));
  const fs::path tmp = fs::path(qc.dir) / fmt::format("{}.tmp-{}", kMissCopyDir, ::getpid());
  std::error_code ec;
  fs::create_directories(tmp, ec);
  if (ec) fail("cannot create '{}': {}", tmp.string(), ec.message());
  struct Cleanup {
    fs::path p;
    bool keep = false;
    ~Cleanup() {
      std::error_code ec;
      if (!keep) fs::remove_all(p, ec);
    }
  } cleanup{tmp};
  if (opts.log)
    opts.log(fmt::format("{}: adding {}-bit copies of {} x {} experts ({:.2f} GB, {:.1f}% of the experts' bytes)",
                         qc.dir, opts.bits, L, E, double(layer_bytes) * L / 1e9,
                         100.0 * double(copy.stride) / double(qc.layout.expert_stride)));

  // Per layer: the experts in chunks of 32 MiB of copies, each chunk's experts read and copied by
  // `threads` workers, then written (O_DIRECT) while nothing else is held.
  const int per_chunk = int(std::max<uint64_t>(1, (32u << 20) / copy.stride));
  Aligned in(size_t(qc.layout.expert_stride) * size_t(per_chunk)), out(size_t(copy.stride) * size_t(per_chunk));
  QpackChecksums sums;
  for (int l = 0; l < L; ++l) {
    check_repack_interrupt();
    const std::string src_path = qc.layer_path(l);
    const int fd = ::open(src_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("cannot open '{}': {}", src_path, std::strerror(errno));
    struct Close {
      int fd;
      ~Close() { ::close(fd); }
    } close_src{fd};
    OutFile f((tmp / fmt::format("layer_{:02d}.bin", l)).string(), true);
    std::vector<uint64_t> row(static_cast<size_t>(E));
    for (int e0 = 0; e0 < E; e0 += per_chunk) {
      const int n = std::min(per_chunk, E - e0);
      const size_t want = size_t(qc.layout.expert_stride) * size_t(n);
      size_t got = 0;
      while (got < want) {
        const ssize_t r = ::pread(fd, in.p + got, want - got, off_t(uint64_t(e0) * qc.layout.expert_stride + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) fail("cannot read '{}': {}", src_path, r < 0 ? std::strerror(errno) : "file truncated");
        got += size_t(r);
      }
      parallel_for(n, opts.threads, [&](int i) {
        uint8_t* c = out.p + size_t(i) * copy.stride;
        make_miss_copy(qc.layout, copy, qc.config, in.p + size_t(i) * qc.layout.expert_stride, c);
        row[size_t(e0 + i)] = xxh3_64(c + copy.payload_offset, size_t(copy.payload()));
      });
      f.write(out.p, size_t(copy.stride) * size_t(n), false);
    }
    f.close();
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    sums.experts.push_back(std::move(row));
    if (opts.log) opts.log(fmt::format("  layer {:02d} of {}", l, L));
  }
  auto write_text = [&](const char* name, const std::string& text) {
    OutFile f((tmp / name).string());
    f.write(text.data(), text.size());
    f.close();
  };
  write_text("layout.json", copy.to_json().dump(2) + "\n");
  write_text("checksums.json", sums.to_json().dump(1) + "\n");
  fsync_dir(tmp.string());
  check_repack_interrupt();

  // Into place: the manifest first stops listing copies it had (so that no moment lists files
  // that are not there), the copies move in, then the manifest lists them.
  QpackManifest m = qc.manifest;
  const std::string prefix = std::string(kMissCopyDir) + "/";
  std::erase_if(m.files, [&](const auto& kv) { return kv.first.starts_with(prefix); });
  if (m.files.size() != qc.manifest.files.size()) replace_manifest(qc.dir, m);
  const fs::path final_dir = fs::path(qc.dir) / kMissCopyDir;
  fs::remove_all(final_dir, ec);
  if (!ec) fs::rename(tmp, final_dir, ec);
  if (ec) fail("cannot move the copies into '{}': {}", final_dir.string(), ec.message());
  cleanup.keep = true;
  fsync_dir(qc.dir);
  uint64_t total = 0;
  for (const auto& entry : fs::directory_iterator(final_dir, ec)) {
    const uint64_t size = entry.file_size(ec);
    if (ec) break;
    m.files[prefix + entry.path().filename().string()] = size;
    total += size;
  }
  if (ec) fail("cannot list '{}': {}", final_dir.string(), ec.message());
  replace_manifest(qc.dir, m);
  if (opts.log)
    opts.log(fmt::format("{}: {}-bit copies added, {:.2f} GB in {:.1f} s", qc.dir, opts.bits, double(total) / 1e9,
                         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
  return total;
}

}  // namespace swiftlet
