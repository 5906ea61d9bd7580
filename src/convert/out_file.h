// Writing a container's files durably (repack.cpp, miss_copies.cpp).
#pragma once

#include "core/error.h"

#include <xxhash.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace swiftlet {

// A file being written: full writes with clear errors, a running xxh3-64, fsync on close.
// With `direct`, data goes through O_DIRECT (bypassing the page cache: no copy into the kernel,
// no gigabytes of dirty pages to flush): 4096-aligned writes go straight out, anything else is
// staged in an aligned buffer; the unaligned tail is written after clearing O_DIRECT. Falls back
// to buffered IO where the file system refuses O_DIRECT.
class OutFile {
 public:
  explicit OutFile(std::string path, bool direct = false) : path_(std::move(path)) {
    const int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
    if (direct) fd_ = ::open(path_.c_str(), flags | O_DIRECT, 0644);
    direct_ = fd_ >= 0;
    if (fd_ < 0) fd_ = ::open(path_.c_str(), flags, 0644);
    if (fd_ < 0) fail("cannot create '{}': {}", path_, std::strerror(errno));
    state_ = XXH3_createState();
    XXH3_64bits_reset(state_);
  }
  ~OutFile() {
    if (fd_ >= 0) ::close(fd_);
    XXH3_freeState(state_);
    std::free(stage_);
  }
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;

  void write(const void* data, size_t n, bool hash = true) {
    const auto* p = static_cast<const uint8_t*>(data);
    if (hash) XXH3_64bits_update(state_, p, n);
    bytes_ += n;
    if (!direct_ || (staged_ == 0 && uintptr_t(p) % kAlign == 0 && n % kAlign == 0)) {
      raw_write(p, n);
      return;
    }
    if (!stage_) {
      stage_ = static_cast<uint8_t*>(std::aligned_alloc(kAlign, kStage));
      if (!stage_) fail("cannot allocate a write buffer");
    }
    while (n > 0) {
      const size_t k = std::min(n, kStage - staged_);
      std::memcpy(stage_ + staged_, p, k);
      staged_ += k;
      p += k;
      n -= k;
      if (staged_ == kStage) {
        raw_write(stage_, kStage);
        staged_ = 0;
      }
    }
  }
  // Flushes to disk and closes; drops the written pages from the page cache (they are not
  // read back by the repack).
  void close() {
    if (staged_ > 0) {
      const size_t aligned = staged_ / kAlign * kAlign;
      raw_write(stage_, aligned);
      buffered();
      raw_write(stage_ + aligned, staged_ - aligned);
      staged_ = 0;
    }
    if (::fdatasync(fd_) != 0) fail("cannot flush '{}': {}", path_, std::strerror(errno));
    ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) fail("cannot close '{}': {}", path_, std::strerror(errno));
  }
  uint64_t hash() const { return XXH3_64bits_digest(state_); }
  uint64_t bytes() const { return bytes_; }

 private:
  static constexpr size_t kAlign = 4096;
  static constexpr size_t kStage = 8u << 20;

  void buffered() {
    if (!direct_) return;
    const int fl = ::fcntl(fd_, F_GETFL);
    ::fcntl(fd_, F_SETFL, fl & ~O_DIRECT);
    direct_ = false;
  }
  void raw_write(const uint8_t* p, size_t n) {
    size_t done = 0;
    while (done < n) {
      ssize_t r = ::write(fd_, p + done, n - done);
      if (r < 0) {
        if (errno == EINTR) continue;
        if (errno == EINVAL && direct_) {  // O_DIRECT accepted at open but not for this write
          buffered();
          continue;
        }
        const int e = errno;
        fail("cannot write '{}': {}{}", path_, std::strerror(e),
             e == ENOSPC ? " (the disk filled up during the repack)" : "");
      }
      done += size_t(r);
    }
  }

  std::string path_;
  int fd_ = -1;
  bool direct_ = false;
  uint8_t* stage_ = nullptr;
  size_t staged_ = 0;
  XXH3_state_t* state_ = nullptr;
  uint64_t bytes_ = 0;
};

inline void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace swiftlet
