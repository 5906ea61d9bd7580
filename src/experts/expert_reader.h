// Reading expert blobs from a .qpack's packed_experts/layer_NN.bin files: one read of one
// stride per expert, at expert * stride.
//
// Readers are asynchronous in interface: submit() starts a read, reap() collects finished
// ones. UringExpertReader keeps many reads in flight with io_uring (all missing experts of a
// layer at once, while the compute goes on); PreadExpertReader does each read inside submit()
// (the serial, synchronous mode kept for comparison, and the fallback where io_uring is
// refused). Both open the files with O_DIRECT so the page cache neither hides the disk's cost
// nor holds a second copy of every expert; where O_DIRECT is refused they warn once and read
// through the page cache.
//
// Not thread-safe: one thread submits and reaps (the engine thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

struct io_uring;

namespace swiftlet {

struct QpackContainer;
struct MissCopyLayout;

struct ReadDone {
  uint64_t tag = 0;
  std::string error;  // empty: the read completed in full
};

class ExpertReader {
 public:
  virtual ~ExpertReader() = default;
  virtual const char* name() const = 0;
  // Starts reading `bytes` bytes of blob (layer, expert) into dst (layer: a LayerFiles index) (4096-aligned; bytes a
  // multiple of 4096). `tag` comes back in reap(). Problems are reported through reap().
  virtual void submit(int layer, int expert, void* dst, size_t bytes, uint64_t tag, int buffer = -1) = 0;
  // Offers `bytes` at p, which lives as long as the reader, as buffer `index` for submit()'s
  // `buffer`: a reader that can (io_uring) pins it once instead of on every read. False when
  // it did not take it (reads into it still work).
  virtual bool register_buffer(int /*index*/, void* /*p*/, size_t /*bytes*/) { return false; }
  // Appends the reads finished since the last call. With wait, first blocks until at least one
  // is finished (unless none is outstanding).
  virtual void reap(bool wait, std::vector<ReadDone>& done) = 0;
  virtual int outstanding() const = 0;
  // True when the files could not be opened with O_DIRECT (reads go through the page cache).
  virtual bool buffered() const = 0;

  // One synchronous read; throws Error with the reader's message on failure.
  void read(int layer, int expert, void* dst, size_t bytes);
};

// The packed expert files of a container, opened for reading (O_DIRECT unless refused or
// direct == false). Index l < layers: packed_experts/layer_l.bin; with `copies`, index layers + l:
// miss_copies/layer_l.bin (the low-bit copies, format/miss_copy.h) at their own stride.
class LayerFiles {
 public:
  LayerFiles(const QpackContainer& qc, bool direct, const MissCopyLayout* copies = nullptr);
  ~LayerFiles();
  LayerFiles(const LayerFiles&) = delete;
  LayerFiles& operator=(const LayerFiles&) = delete;
  int fd(int layer) const { return fds_[size_t(layer)]; }
  const std::string& path(int layer) const { return paths_[size_t(layer)]; }
  uint64_t stride(int layer) const { return strides_[size_t(layer)]; }
  bool buffered() const { return buffered_; }
  // The message for a failed or short read.
  std::string read_error(int layer, int expert, size_t got, size_t want, int err) const;

 private:
  std::vector<int> fds_;
  std::vector<std::string> paths_;
  std::vector<std::string> names_;  // "layer 07", "layer 07 low-bit copy"
  std::vector<uint64_t> strides_;
  bool buffered_ = false;
};

class PreadExpertReader : public ExpertReader {
 public:
  explicit PreadExpertReader(const QpackContainer& qc, bool direct = true, const MissCopyLayout* copies = nullptr);
  const char* name() const override { return "pread"; }
  void submit(int layer, int expert, void* dst, size_t bytes, uint64_t tag, int buffer = -1) override;
  void reap(bool wait, std::vector<ReadDone>& done) override;
  int outstanding() const override { return int(done_.size()); }
  bool buffered() const override { return files_.buffered(); }

 private:
  LayerFiles files_;
  std::vector<ReadDone> done_;
};

class UringExpertReader : public ExpertReader {
 public:
  // depth: reads in flight at most (more submissions queue up inside the reader). buffers: how
  // many registered buffers to allow (0: none).
  explicit UringExpertReader(const QpackContainer& qc, int depth = 64, int buffers = 0, bool direct = true,
                             const MissCopyLayout* copies = nullptr);
  ~UringExpertReader() override;
  const char* name() const override { return "io_uring"; }
  void submit(int layer, int expert, void* dst, size_t bytes, uint64_t tag, int buffer = -1) override;
  bool register_buffer(int index, void* p, size_t bytes) override;
  void reap(bool wait, std::vector<ReadDone>& done) override;
  int outstanding() const override { return int(active_ + queued_.size()); }
  bool buffered() const override { return files_.buffered(); }

 private:
  struct Read {
    int layer = 0, expert = 0;
    uint8_t* dst = nullptr;
    size_t bytes = 0, got = 0;
    uint64_t tag = 0;
    int buffer = -1;  // registered buffer index, or -1
  };
  void start(size_t index);
  void push_sqe(size_t index);

  LayerFiles files_;
  std::unique_ptr<io_uring> ring_;
  int depth_;
  std::vector<Read> reads_;      // indexed by the sqe user data
  std::vector<size_t> unused_;   // free indices of reads_
  std::vector<size_t> queued_;   // submitted while the ring was full
  int active_ = 0;               // reads in the ring
  std::vector<uint8_t> registered_;  // [buffer index] taken by the ring
};

enum class IoMode { Uring, Serial };
// "uring" or "serial"; throws Error otherwise.
IoMode parse_io_mode(const std::string& s);
// A reader for `mode`. Uring falls back to PreadExpertReader, with a warning on stderr, when
// the kernel refuses io_uring.
// buffers: how many buffers the reader may register (the cache's slots). copies: also read the
// low-bit copies (layer indices past the container's layers, see LayerFiles).
std::unique_ptr<ExpertReader> make_expert_reader(const QpackContainer& qc, IoMode mode, int buffers = 0,
                                                 const MissCopyLayout* copies = nullptr);

}  // namespace swiftlet
