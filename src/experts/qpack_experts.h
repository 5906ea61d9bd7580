// Routed experts streamed from a .qpack container (packed_experts/layer_NN.bin). On acquire each
// expert's blob is read (one read of expertStride bytes) into its own buffer, its xxh3-64 is
// checked against checksums.json when the container has one, and views of its sections are
// handed to the model. No cache yet: every acquire reads from the file.
//
// The disk access sits behind ExpertReader so that a faster reader (O_DIRECT + io_uring) and a
// cache can replace it without touching the rest.
#pragma once

#include "format/qpack.h"
#include "model/expert_source.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace swiftlet {

// Reads whole expert blobs. One implementation per IO strategy.
class ExpertReader {
 public:
  virtual ~ExpertReader() = default;
  // Reads `bytes` bytes of blob (layer, expert) into `dst` (4096-aligned). Throws Error naming
  // the layer, the expert and the file on failure or a short read.
  virtual void read(int layer, int expert, void* dst, size_t bytes) = 0;
};

// Plain pread(2) on one descriptor per layer file.
class PreadExpertReader : public ExpertReader {
 public:
  explicit PreadExpertReader(const QpackContainer& qc);
  ~PreadExpertReader() override;
  void read(int layer, int expert, void* dst, size_t bytes) override;

 private:
  std::vector<int> fds_;
  std::vector<std::string> paths_;
  uint64_t stride_ = 0;
};

struct ExpertReadStats {
  uint64_t experts = 0;        // blobs read
  uint64_t bytes = 0;          // bytes read
  double read_seconds = 0;     // time in ExpertReader::read
  double verify_seconds = 0;   // time hashing
};

class QpackExperts : public ExpertSource {
 public:
  // verify: check each blob's checksum when checksums.json exists. max_batch 0: 4 x top-k.
  QpackExperts(const QpackContainer& qc, bool verify = true, int max_batch = 0,
               std::unique_ptr<ExpertReader> reader = nullptr);
  ~QpackExperts() override;

  int max_batch() const override { return max_batch_; }
  void acquire(int layer, std::span<const int32_t> experts, std::span<ExpertWeights> out) override;
  void release(int layer) override {}

  const ExpertReadStats& stats() const { return stats_; }
  // No cache yet: every expert asked for is a miss that was read from disk, and the compute
  // waits for every read.
  ExpertStats expert_stats() const override {
    ExpertStats e;
    e.misses = stats_.experts;
    e.bytes_read = stats_.bytes;
    e.read_seconds = stats_.read_seconds;
    e.wait_seconds = stats_.read_seconds;
    e.verify_seconds = stats_.verify_seconds;
    return e;
  }
  bool verifying() const { return verify_; }

 private:
  std::string dir_;
  ModelConfig config_;
  QpackLayout layout_;
  std::vector<std::vector<uint64_t>> sums_;  // [layer][expert], empty when not verifying
  bool verify_ = false;
  int max_batch_ = 0;
  std::unique_ptr<ExpertReader> reader_;
  uint8_t* slots_ = nullptr;  // max_batch_ x stride bytes, 4096-aligned
  ExpertReadStats stats_;
};

}  // namespace swiftlet
