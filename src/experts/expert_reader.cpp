#include "experts/expert_reader.h"

#include "core/data_error.h"
#include "core/error.h"
#include "format/miss_copy.h"
#include "format/qpack.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace swiftlet {

void ExpertReader::read(int layer, int expert, void* dst, size_t bytes) {
  submit(layer, expert, dst, bytes, 0, -1);
  std::vector<ReadDone> done;
  while (done.empty()) reap(true, done);
  if (!done.front().error.empty()) fail_data("{}", done.front().error);
}

LayerFiles::LayerFiles(const QpackContainer& qc, bool direct, const MissCopyLayout* copies) {
  const int layers = qc.layout.layer_count;
  for (int i = 0; i < (copies ? 2 : 1) * layers; ++i) {
    const int l = i % layers;
    const bool copy = i >= layers;
    paths_.push_back(qc.path(copy ? miss_copy_layer_file(l) : qpack_layer_file(l)));
    names_.push_back(fmt::format("layer {:02d}{}", l, copy ? " low-bit copy" : ""));
    strides_.push_back(copy ? copies->stride : qc.layout.expert_stride);
    const char* p = paths_.back().c_str();
    int fd = direct && !buffered_ ? ::open(p, O_RDONLY | O_CLOEXEC | O_DIRECT) : -1;
    if (fd < 0 && direct && !buffered_ && errno == EINVAL) {
      std::fprintf(stderr, "swiftlet: warning: the file system of '%s' refuses O_DIRECT; expert reads go "
                   "through the page cache (it may hold a second copy of what is read)\n", p);
      buffered_ = true;
    }
    if (fd < 0) {
      if (!direct) buffered_ = true;
      fd = ::open(p, O_RDONLY | O_CLOEXEC);
    }
    if (fd < 0) {
      const int e = errno;
      for (int f : fds_) ::close(f);
      fds_.clear();
      fail("cannot open {} expert file '{}': {}", names_.back(), paths_.back(), std::strerror(e));
    }
    if (buffered_) ::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);  // readahead would be wasted
    fds_.push_back(fd);
  }
}

LayerFiles::~LayerFiles() {
  for (int fd : fds_) ::close(fd);
}

std::string LayerFiles::read_error(int layer, int expert, size_t got, size_t want, int err) const {
  const uint64_t off = uint64_t(expert) * stride(layer);
  if (err != 0)
    return fmt::format("cannot read {} expert {} from '{}' at offset {}: {}", names_[size_t(layer)], expert,
                       paths_[size_t(layer)], off, std::strerror(err));
  return fmt::format("corrupt container: {} expert {}: short read of '{}' ({} of {} bytes at "
                     "offset {}; file truncated?) — re-run swiftlet-repack", names_[size_t(layer)], expert,
                     paths_[size_t(layer)], got, want, off);
}

// ---- pread -----------------------------------------------------------------------------------

PreadExpertReader::PreadExpertReader(const QpackContainer& qc, bool direct, const MissCopyLayout* copies)
    : files_(qc, direct, copies) {}

void PreadExpertReader::submit(int layer, int expert, void* dst, size_t bytes, uint64_t tag, int) {
  const int fd = files_.fd(layer);
  const uint64_t off = uint64_t(expert) * files_.stride(layer);
  size_t got = 0;
  int err = 0;
  while (got < bytes) {
    const ssize_t r = ::pread(fd, static_cast<uint8_t*>(dst) + got, bytes - got, off_t(off + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) err = errno;
    if (r <= 0) break;
    got += size_t(r);
  }
  ReadDone d{tag, {}};
  if (got < bytes) d.error = files_.read_error(layer, expert, got, bytes, err);
  done_.push_back(std::move(d));
}

void PreadExpertReader::reap(bool, std::vector<ReadDone>& done) {
  for (ReadDone& d : done_) done.push_back(std::move(d));
  done_.clear();
}

// ---- io_uring --------------------------------------------------------------------------------

UringExpertReader::UringExpertReader(const QpackContainer& qc, int depth, int buffers, bool direct,
                                     const MissCopyLayout* copies)
    : files_(qc, direct, copies), ring_(std::make_unique<io_uring>()), depth_(depth) {
  const int r = io_uring_queue_init(unsigned(depth), ring_.get(), 0);
  if (r < 0) {
    ring_.reset();
    fail("io_uring is not available: {}", std::strerror(-r));
  }
  // Registered buffers spare the kernel pinning a buffer's pages on every read (measured here:
  // ~93 us of the compute thread's time per 1.77 MB read, ~14 us with a registered buffer).
  // The kernel allows at most 16384; slots beyond that read without.
  buffers = std::min(buffers, 16384);
  if (buffers > 0 && io_uring_register_buffers_sparse(ring_.get(), unsigned(buffers)) == 0)
    registered_.assign(size_t(buffers), 0);
}

bool UringExpertReader::register_buffer(int index, void* p, size_t bytes) {
  if (index < 0 || size_t(index) >= registered_.size()) return false;
  iovec iov{p, bytes};
  __u64 tag = 0;
  // Fails e.g. over the memlock limit: then that buffer is read into without registration.
  registered_[size_t(index)] = io_uring_register_buffers_update_tag(ring_.get(), unsigned(index), &iov, &tag, 1) == 1;
  return registered_[size_t(index)];
}

UringExpertReader::~UringExpertReader() {
  if (!ring_) return;
  // Reads still in flight write into buffers their owner is about to free: wait for them.
  while (active_ > 0) {
    io_uring_cqe* cqe = nullptr;
    if (io_uring_wait_cqe(ring_.get(), &cqe) < 0) break;
    io_uring_cqe_seen(ring_.get(), cqe);
    active_--;
  }
  io_uring_queue_exit(ring_.get());
}

void UringExpertReader::submit(int layer, int expert, void* dst, size_t bytes, uint64_t tag, int buffer) {
  size_t index;
  if (!unused_.empty()) {
    index = unused_.back();
    unused_.pop_back();
  } else {
    index = reads_.size();
    reads_.emplace_back();
  }
  const bool fixed = buffer >= 0 && size_t(buffer) < registered_.size() && registered_[size_t(buffer)];
  reads_[index] = Read{layer, expert, static_cast<uint8_t*>(dst), bytes, 0, tag, fixed ? buffer : -1};
  start(index);
}

void UringExpertReader::start(size_t index) {
  if (active_ >= depth_) {
    queued_.push_back(index);
    return;
  }
  push_sqe(index);
  io_uring_submit(ring_.get());
}

void UringExpertReader::push_sqe(size_t index) {
  const Read& r = reads_[index];
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  SWIFTLET_CHECK(sqe != nullptr, "io_uring submission queue full with {} reads active", active_);
  const uint64_t off = uint64_t(r.expert) * files_.stride(r.layer) + r.got;
  if (r.buffer >= 0)
    io_uring_prep_read_fixed(sqe, files_.fd(r.layer), r.dst + r.got, unsigned(r.bytes - r.got), off, r.buffer);
  else
    io_uring_prep_read(sqe, files_.fd(r.layer), r.dst + r.got, unsigned(r.bytes - r.got), off);
  io_uring_sqe_set_data64(sqe, index);
  active_++;
}

void UringExpertReader::reap(bool wait, std::vector<ReadDone>& done) {
  const size_t before = done.size();
  for (;;) {
    io_uring_cqe* cqe = nullptr;
    int r = io_uring_peek_cqe(ring_.get(), &cqe);
    if (r == -EAGAIN) {
      if (!wait || done.size() > before || active_ == 0) break;
      r = io_uring_wait_cqe(ring_.get(), &cqe);
      if (r == -EINTR) continue;
    }
    if (r < 0) fail_data("io_uring wait failed: {}", std::strerror(-r));
    const size_t index = size_t(io_uring_cqe_get_data64(cqe));
    const int res = cqe->res;
    io_uring_cqe_seen(ring_.get(), cqe);
    active_--;
    Read& rd = reads_[index];
    bool finished = true;
    std::string error;
    if (res == -EINTR || res == -EAGAIN) {
      finished = false;  // try again
    } else if (res < 0) {
      error = files_.read_error(rd.layer, rd.expert, rd.got, rd.bytes, -res);
    } else if (res == 0) {
      error = files_.read_error(rd.layer, rd.expert, rd.got, rd.bytes, 0);
    } else {
      rd.got += size_t(res);
      finished = rd.got >= rd.bytes;  // a short read continues where it stopped
    }
    if (!finished) {
      push_sqe(index);
      io_uring_submit(ring_.get());
      continue;
    }
    done.push_back(ReadDone{rd.tag, std::move(error)});
    unused_.push_back(index);
    if (!queued_.empty()) {
      const size_t next = queued_.front();
      queued_.erase(queued_.begin());
      push_sqe(next);
      io_uring_submit(ring_.get());
    }
  }
}

IoMode parse_io_mode(const std::string& s) {
  if (s == "uring" || s == "io_uring") return IoMode::Uring;
  if (s == "serial") return IoMode::Serial;
  fail("unknown --io mode '{}': use uring (parallel reads overlapping compute) or serial "
       "(one synchronous read at a time)", s);
}

std::unique_ptr<ExpertReader> make_expert_reader(const QpackContainer& qc, IoMode mode, int buffers,
                                                 const MissCopyLayout* copies) {
  if (mode == IoMode::Uring) {
    try {
      return std::make_unique<UringExpertReader>(qc, 64, buffers, true, copies);
    } catch (const Error& e) {
      std::fprintf(stderr, "swiftlet: warning: %s; reading experts one at a time instead\n", e.what());
    }
  }
  return std::make_unique<PreadExpertReader>(qc, true, copies);
}

}  // namespace swiftlet
