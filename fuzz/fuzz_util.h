// Shared by the libFuzzer targets: the input as a file (the parsers that map files), and the one
// rule every target checks: bad input throws swiftlet::Error (or the server's ApiError), nothing
// else escapes, nothing crashes.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace swiftlet::fuzz {

// The bytes as an in-memory file; path() names it for code that opens files by name.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t n) : fd_(::memfd_create("swiftlet-fuzz", MFD_CLOEXEC)) {
    if (fd_ < 0) std::abort();
    size_t done = 0;
    while (done < n) {
      const ssize_t w = ::write(fd_, data + done, n - done);
      if (w <= 0) std::abort();
      done += size_t(w);
    }
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

// The path of a file in the source tree (fixtures, the Qwen3 tokenizer).
inline std::string source_path(const std::string& rel) { return std::string(SWIFTLET_SOURCE_DIR) + "/" + rel; }

}  // namespace swiftlet::fuzz
