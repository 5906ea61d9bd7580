#include "experts/qpack_experts.h"

#include "core/error.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

namespace swiftlet {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

PreadExpertReader::PreadExpertReader(const QpackContainer& qc) : stride_(qc.layout.expert_stride) {
  for (int l = 0; l < qc.layout.layer_count; ++l) {
    paths_.push_back(qc.layer_path(l));
    int fd = ::open(paths_.back().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int e = errno;
      for (int f : fds_) ::close(f);
      fds_.clear();
      fail("cannot open layer {:02d} expert file '{}': {}", l, paths_.back(), std::strerror(e));
    }
    // Expert reads are random; readahead would only waste bandwidth.
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    fds_.push_back(fd);
  }
}

PreadExpertReader::~PreadExpertReader() {
  for (int fd : fds_) ::close(fd);
}

void PreadExpertReader::read(int layer, int expert, void* dst, size_t bytes) {
  const int fd = fds_.at(size_t(layer));
  const uint64_t off = uint64_t(expert) * stride_;
  size_t done = 0;
  while (done < bytes) {
    ssize_t r = ::pread(fd, static_cast<uint8_t*>(dst) + done, bytes - done, off_t(off + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      fail("corrupt or unreadable container: layer {:02d} expert {}: cannot read '{}' at offset {}: {}",
           layer, expert, paths_[size_t(layer)], off, std::strerror(errno));
    }
    if (r == 0)
      fail("corrupt container: layer {:02d} expert {}: short read of '{}' ({} of {} bytes at offset "
           "{}; file truncated?) — re-run swiftlet-repack", layer, expert, paths_[size_t(layer)],
           done, bytes, off);
    done += size_t(r);
  }
}

QpackExperts::QpackExperts(const QpackContainer& qc, bool verify, int max_batch,
                           std::unique_ptr<ExpertReader> reader)
    : dir_(qc.dir), config_(qc.config), layout_(qc.layout),
      verify_(verify && qc.checksums.has_value()),
      max_batch_(max_batch > 0 ? max_batch : 4 * std::max(1, qc.config.num_experts_per_tok)),
      reader_(reader ? std::move(reader) : std::make_unique<PreadExpertReader>(qc)) {
  if (verify_) sums_ = qc.checksums->experts;
  const size_t bytes = size_t(max_batch_) * size_t(layout_.expert_stride);
  slots_ = static_cast<uint8_t*>(std::aligned_alloc(4096, bytes));
  if (!slots_) fail("cannot allocate {} bytes of expert buffers", bytes);
}

QpackExperts::~QpackExperts() { std::free(slots_); }

void QpackExperts::acquire(int layer, std::span<const int32_t> experts, std::span<ExpertWeights> out) {
  SWIFTLET_CHECK(int(experts.size()) <= max_batch_, "acquire of {} experts > max_batch {}",
                 experts.size(), max_batch_);
  SWIFTLET_CHECK(layer >= 0 && layer < layout_.layer_count, "layer {} out of range", layer);
  const uint64_t stride = layout_.expert_stride, payload = layout_.payload();
  for (size_t i = 0; i < experts.size(); ++i) {
    const int e = experts[i];
    SWIFTLET_CHECK(e >= 0 && e < layout_.expert_count, "expert {} out of range", e);
    uint8_t* blob = slots_ + i * stride;
    auto t0 = Clock::now();
    reader_->read(layer, e, blob, stride);
    stats_.read_seconds += since(t0);
    stats_.experts++;
    stats_.bytes += stride;
    if (verify_) {
      auto t1 = Clock::now();
      const uint64_t h = xxh3_64(blob, payload);
      stats_.verify_seconds += since(t1);
      const uint64_t want = sums_[size_t(layer)][size_t(e)];
      if (h != want)
        fail("corrupt container '{}': layer {:02d} expert {} checksum mismatch (stored {}, read {}) "
             "— re-run swiftlet-repack or download the container again", dir_, layer, e,
             hash_hex(want), hash_hex(h));
    }
    out[i].gate = layout_.view(0, config_, blob);
    out[i].up = layout_.view(1, config_, blob);
    out[i].down = layout_.view(2, config_, blob);
  }
}

}  // namespace swiftlet
