#include "io/mapped_file.h"

#include "core/error.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <signal.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
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

// The file mappings of this process, for the SIGBUS handler. A file truncated (or rewritten
// shorter) while mapped turns a read of its lost pages into SIGBUS, which would otherwise end
// the process with a bare "Bus error" that names no file.
struct MappingSlot {
  std::atomic<uintptr_t> begin{0};
  std::atomic<size_t> size{0};
  char path[480];
};
constexpr int kMappingSlots = 512;
MappingSlot g_mappings[kMappingSlots];
struct sigaction g_previous_sigbus;

void write_str(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= size_t(w);
  }
}

void on_sigbus(int sig, siginfo_t* info, void* ctx) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(info->si_addr);
  for (const MappingSlot& m : g_mappings) {
    const uintptr_t b = m.begin.load();
    if (b == 0 || a < b || a >= b + m.size.load()) continue;
    char offset[24];
    int i = sizeof offset - 1;
    offset[i] = '\0';
    uintptr_t off = a - b;
    do {
      offset[--i] = char('0' + off % 10);
      off /= 10;
    } while (off > 0 && i > 0);
    write_str("swiftlet: '");
    write_str(m.path);
    write_str("' was truncated or rewritten while this process had it mapped (nothing to read at offset ");
    write_str(offset + i);
    write_str("); the process cannot go on. Replace a container in use with `swiftlet-repack --force` (it "
              "swaps in a new one atomically), never in place; `swiftlet verify` checks one.\n");
    ::signal(SIGBUS, SIG_DFL);
    ::raise(SIGBUS);
    return;
  }
  // Not one of ours: whoever handled SIGBUS before, else the default action.
  if ((g_previous_sigbus.sa_flags & SA_SIGINFO) && g_previous_sigbus.sa_sigaction) {
    g_previous_sigbus.sa_sigaction(sig, info, ctx);
  } else if (g_previous_sigbus.sa_handler != SIG_DFL && g_previous_sigbus.sa_handler != SIG_IGN) {
    g_previous_sigbus.sa_handler(sig);
  } else {
    ::signal(SIGBUS, SIG_DFL);
    ::raise(SIGBUS);
  }
}

void register_mapping(const void* p, size_t n, const std::string& path) {
  static std::once_flag installed;
  std::call_once(installed, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_previous_sigbus);
  });
  for (MappingSlot& m : g_mappings) {
    uintptr_t expected = 0;
    // Claim a free slot with a placeholder, fill it, then publish the real address.
    if (!m.begin.compare_exchange_strong(expected, 1)) continue;
    std::snprintf(m.path, sizeof m.path, "%s", path.c_str());
    m.size.store(n);
    m.begin.store(reinterpret_cast<uintptr_t>(p));
    return;
  }
  // More mappings than slots: this one's SIGBUS stays anonymous.
}

void unregister_mapping(const void* p) {
  for (MappingSlot& m : g_mappings) {
    uintptr_t expected = reinterpret_cast<uintptr_t>(p);
    if (m.begin.compare_exchange_strong(expected, 0)) return;
  }
}

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
    register_mapping(p, size_, path);
  }
  ::close(fd);
  attached_ = true;
}

MappedFile MappedFile::reserve(const std::string& path, size_t size) {
  MappedFile m;
  m.path_ = path;
  m.size_ = size;
  if (size == 0) fail("cannot reserve an empty range for '{}'", path);
  void* p = ::mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) fail("cannot reserve {} bytes of address space for '{}': {}", size, path, std::strerror(errno));
  m.data_ = static_cast<const uint8_t*>(p);
  return m;
}

void MappedFile::attach() {
  if (attached_) return;
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open '{}': {}", path_, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || uint64_t(st.st_size) != size_) {
    ::close(fd);
    fail("'{}' has {} bytes, expected {} (changed or truncated?)", path_, uint64_t(st.st_size), size_);
  }
  void* p = ::mmap(const_cast<uint8_t*>(data_), size_, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
  const int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) fail("cannot map '{}': {}", path_, std::strerror(e));
  register_mapping(data_, size_, path_);
  attached_ = true;
}

void MappedFile::detach() {
  if (!attached_ || anonymous_) return;
  unregister_mapping(data_);
  void* p = ::mmap(const_cast<uint8_t*>(data_), size_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                   -1, 0);
  if (p == MAP_FAILED) fail("cannot unmap '{}': {}", path_, std::strerror(errno));
  attached_ = false;
}

MappedFile::~MappedFile() { reset(); }

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)), data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)), anonymous_(o.anonymous_), attached_(std::exchange(o.attached_, false)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    reset();
    path_ = std::move(o.path_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    anonymous_ = o.anonymous_;
    attached_ = std::exchange(o.attached_, false);
  }
  return *this;
}

void MappedFile::reset() {
  if (data_ && !anonymous_ && attached_) unregister_mapping(data_);
  if (data_) ::munmap(const_cast<uint8_t*>(data_), anonymous_ ? (size_ + 4095) & ~size_t(4095) : size_);
  data_ = nullptr;
  size_ = 0;
  attached_ = false;
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
