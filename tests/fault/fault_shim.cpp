// An LD_PRELOAD shim that injects IO faults into the files whose path contains
// SWIFTLET_FAULT_MATCH, for the fault tests (tests/fault/fault_test.cpp):
//   SWIFTLET_FAULT_MODE  eio:    reads fail with EIO
//                        short:  reads return half of what was asked, rounded down to whole
//                                512-byte blocks (so O_DIRECT reads stay aligned; a read of
//                                less than 1 KiB is whole)
//                        eof:    reads return 0 (the file seems truncated)
//                        enospc: writes fail with ENOSPC once SWIFTLET_FAULT_AFTER bytes went
//                                to matching files (default 0)
//   SWIFTLET_FAULT_FLAG  when set, faults happen only while this file exists (so a test can
//                        switch them on and off in a running process)
// Only plain read/pread/write/pwrite reach it: io_uring reads do not, so tests run the engine
// with --io serial. Processes built with ASan need ASAN_OPTIONS=verify_asan_link_order=0.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdlib>
#include <cstring>

namespace {

constexpr int kMaxFd = 65536;
std::atomic<bool> g_match[kMaxFd];
std::atomic<long long> g_written{0};

enum class Mode { None, Eio, Short, Eof, Enospc };

Mode mode() {
  static const Mode m = [] {
    const char* s = std::getenv("SWIFTLET_FAULT_MODE");
    if (!s) return Mode::None;
    if (!std::strcmp(s, "eio")) return Mode::Eio;
    if (!std::strcmp(s, "short")) return Mode::Short;
    if (!std::strcmp(s, "eof")) return Mode::Eof;
    if (!std::strcmp(s, "enospc")) return Mode::Enospc;
    return Mode::None;
  }();
  return m;
}

bool armed() {
  const char* flag = std::getenv("SWIFTLET_FAULT_FLAG");
  if (!flag) return true;
  struct stat st;
  return ::stat(flag, &st) == 0;
}

bool faulty(int fd) { return fd >= 0 && fd < kMaxFd && g_match[fd].load() && armed(); }

void track(int fd, const char* path) {
  if (fd < 0 || fd >= kMaxFd) return;
  const char* m = std::getenv("SWIFTLET_FAULT_MATCH");
  g_match[fd].store(m && *m && path && std::strstr(path, m));
}

template <typename F>
F next(const char* name) {
  return reinterpret_cast<F>(::dlsym(RTLD_NEXT, name));
}

// A read through `real` with the configured fault.
template <typename Real>
ssize_t faulty_read(int fd, size_t n, Real real) {
  if (!faulty(fd)) return real(n);
  switch (mode()) {
    case Mode::Eio: errno = EIO; return -1;
    case Mode::Eof: return 0;
    case Mode::Short: {
      const size_t half = n / 2 / 512 * 512;
      return real(half > 0 ? half : n);
    }
    default: return real(n);
  }
}

template <typename Real>
ssize_t faulty_write(int fd, size_t n, Real real) {
  if (faulty(fd) && mode() == Mode::Enospc) {
    const char* a = std::getenv("SWIFTLET_FAULT_AFTER");
    const long long after = a ? std::atoll(a) : 0;
    if (g_written.load() >= after) {
      errno = ENOSPC;
      return -1;
    }
    const ssize_t r = real(n);
    if (r > 0) g_written += r;
    return r;
  }
  return real(n);
}

mode_t mode_arg(int flags, va_list ap) {
  return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? mode_t(va_arg(ap, int)) : 0;
}

}  // namespace

extern "C" {

int open(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t m = mode_arg(flags, ap);
  va_end(ap);
  const int fd = next<int (*)(const char*, int, ...)>("open")(path, flags, m);
  track(fd, path);
  return fd;
}

int open64(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t m = mode_arg(flags, ap);
  va_end(ap);
  const int fd = next<int (*)(const char*, int, ...)>("open64")(path, flags, m);
  track(fd, path);
  return fd;
}

int openat(int dir, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t m = mode_arg(flags, ap);
  va_end(ap);
  const int fd = next<int (*)(int, const char*, int, ...)>("openat")(dir, path, flags, m);
  track(fd, path);
  return fd;
}

int close(int fd) {
  if (fd >= 0 && fd < kMaxFd) g_match[fd].store(false);
  return next<int (*)(int)>("close")(fd);
}

ssize_t read(int fd, void* buf, size_t n) {
  static auto real = next<ssize_t (*)(int, void*, size_t)>("read");
  return faulty_read(fd, n, [&](size_t k) { return real(fd, buf, k); });
}

ssize_t pread(int fd, void* buf, size_t n, off_t off) {
  static auto real = next<ssize_t (*)(int, void*, size_t, off_t)>("pread");
  return faulty_read(fd, n, [&](size_t k) { return real(fd, buf, k, off); });
}

ssize_t pread64(int fd, void* buf, size_t n, off_t off) {
  static auto real = next<ssize_t (*)(int, void*, size_t, off_t)>("pread64");
  return faulty_read(fd, n, [&](size_t k) { return real(fd, buf, k, off); });
}

ssize_t write(int fd, const void* buf, size_t n) {
  static auto real = next<ssize_t (*)(int, const void*, size_t)>("write");
  return faulty_write(fd, n, [&](size_t k) { return real(fd, buf, k); });
}

ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
  static auto real = next<ssize_t (*)(int, const void*, size_t, off_t)>("pwrite");
  return faulty_write(fd, n, [&](size_t k) { return real(fd, buf, k, off); });
}

ssize_t pwrite64(int fd, const void* buf, size_t n, off_t off) {
  static auto real = next<ssize_t (*)(int, const void*, size_t, off_t)>("pwrite64");
  return faulty_write(fd, n, [&](size_t k) { return real(fd, buf, k, off); });
}

}  // extern "C"
