#include "io/mapped_file.h"

#include "core/error.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

namespace swiftlet {

Residency parse_residency(const std::string& s) {
  if (s == "map") return Residency::Map;
  if (s == "populate") return Residency::Populate;
  if (s == "read") return Residency::Read;
  fail("unknown residency '{}': use map (lazy mapping), populate (mapped and read at start) or read "
       "(read into memory)", s);
}

namespace {
// Anonymous memory holding the whole file, read with O_DIRECT where the file system allows it.
void* read_whole(int fd, const std::string& path, size_t size) {
  const size_t rounded = (size + 4095) & ~size_t(4095);
  void* p = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) fail("cannot allocate {} bytes to read '{}' into: {}", size, path, std::strerror(errno));
  int dfd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  const int rfd = dfd >= 0 ? dfd : fd;
  size_t got = 0;
  while (got < size) {
    // O_DIRECT wants whole blocks: ask for the rounded length, the file's end stops it.
    const ssize_t r = ::pread(rfd, static_cast<uint8_t*>(p) + got, std::min<size_t>(rounded - got, 64 << 20), off_t(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int e = r < 0 ? errno : 0;
      if (dfd >= 0) ::close(dfd);
      ::munmap(p, rounded);
      fail("cannot read '{}' at offset {}: {}", path, got, e ? std::strerror(e) : "unexpected end of file");
    }
    got += size_t(r);
  }
  if (dfd >= 0) ::close(dfd);
  ::mprotect(p, rounded, PROT_READ);
  return p;
}
}  // namespace

MappedFile::MappedFile(const std::string& path, Residency mode) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open '{}': {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail("cannot stat '{}': {}", path, std::strerror(e));
  }
  size_ = size_t(st.st_size);
  if (size_ > 0 && mode == Residency::Read) {
    try {
      data_ = static_cast<const uint8_t*>(read_whole(fd, path, size_));
    } catch (...) {
      ::close(fd);
      throw;
    }
    anonymous_ = true;
  } else if (size_ > 0) {
    const int flags = MAP_PRIVATE | (mode == Residency::Populate ? MAP_POPULATE : 0);
    void* p = ::mmap(nullptr, size_, PROT_READ, flags, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      fail("cannot map '{}': {}", path, std::strerror(e));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() { reset(); }

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)), data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)), anonymous_(o.anonymous_) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    reset();
    path_ = std::move(o.path_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    anonymous_ = o.anonymous_;
  }
  return *this;
}

void MappedFile::reset() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), anonymous_ ? (size_ + 4095) & ~size_t(4095) : size_);
  data_ = nullptr;
  size_ = 0;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open '{}': {}", path, std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace swiftlet
