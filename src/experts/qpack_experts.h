// Routed experts streamed from a .qpack container (packed_experts/layer_NN.bin) through a
// bounded cache (expert_cache.h).
//
// The engine tells the source which experts a layer needs as soon as its router has chosen
// (prefetch); the missing ones are read at once, all in parallel (io_uring, O_DIRECT), while
// the compute does the shared expert and the experts already cached. acquire() then waits only
// for what has not arrived yet. Each blob's xxh3-64 is checked against checksums.json as it
// arrives; a failed read or a wrong checksum is an Error naming the layer and the expert.
//
// In serial mode (IoMode::Serial) prefetches are ignored and acquire() reads each missing
// expert synchronously, one after the other: the simple scheme, kept to compare against.
//
// Not thread-safe: one engine thread calls it.
#pragma once

#include "experts/expert_cache.h"
#include "experts/expert_reader.h"
#include "format/miss_copy.h"
#include "format/qpack.h"
#include "model/expert_source.h"

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace swiftlet {

struct QpackExpertsOptions {
  bool verify = true;      // check each blob's checksum when checksums.json exists
  size_t cache_bytes = 0;  // budget of the cache; 0: room for every expert
  IoMode io = IoMode::Uring;
  int max_batch = 0;       // experts held at once; 0: 4 x top-k (at most the cache's slots)
  // Where slots come from (4096-aligned), e.g. pinned memory for GPU uploads. Default: the heap.
  ExpertCache::Alloc alloc;
  ExpertCache::Free free;
  // Slots a background thread prepares ahead of need (expert_cache.h), past one token's experts
  // (top-k x layers, allocated on demand); 0: everything allocated on demand.
  int prepared_slots = 64;
  std::unique_ptr<ExpertReader> reader;  // overrides `io` (tests inject failing readers)
  // Read the container's low-bit copies when asked (read_low_bit, --on-miss low-bit); the
  // container must have them (Error saying how to add them otherwise).
  bool miss_copies = false;
};

class QpackExperts : public ExpertSource {
 public:
  QpackExperts(const QpackContainer& qc, QpackExpertsOptions opts = {});
  ~QpackExperts() override;

  int max_batch() const override { return max_batch_; }
  void prefetch(int layer, std::span<const int32_t> experts) override;
  void predict(int layer, std::span<const int32_t> experts) override;
  bool ready(int layer, int expert) const override;
  bool wants_predictions() const override { return io_ != IoMode::Serial; }
  int capacity() const override { return cache_.capacity(); }
  void acquire(int layer, std::span<const int32_t> experts, std::span<ExpertWeights> out) override;
  void release(int layer) override;
  bool held(int layer, int expert) const override;
  void read_low_bit(int layer, std::span<const int32_t> experts) override;
  void skipped(int /*layer*/, int count) override { stats_.skipped += uint64_t(count); }
  ExpertStats expert_stats() const override;

  bool verifying() const { return verify_; }
  const ExpertCache& cache() const { return cache_; }
  const ExpertReader& reader() const { return *reader_; }
  IoMode io_mode() const { return io_; }

 private:
  using Clock = std::chrono::steady_clock;
  // Why a read starts: a prediction (never evicts read-ahead), a prefetch (may evict read-ahead
  // not used yet) or acquire() (evicts whatever it must).
  enum class Read { Speculative, Prefetch, Demand };
  // Starts reading (layer, expert) into a claimed slot; -1 when no slot can be had now.
  int start_read(int layer, int expert, Read why);
  // read_low_bit() asked for (layer, expert)'s copy, and the cache does not hold the expert.
  bool wants_copy(int layer, int expert) const;
  // The copy buffer holding or reading (layer, expert), or -1.
  int find_copy(int layer, int expert) const;
  // Starts reading (layer, expert)'s copy into a free copy buffer: its id, or -1 when none is free.
  int start_copy_read(int layer, int expert);
  void finish_copy(int index, std::string error);
  void set_views(ExpertWeights& w, const uint8_t* blob) const;
  // Collects finished reads (blocking for one when wait) and files them into the cache.
  void collect(bool wait);
  void finish(const ReadDone& d);

  std::string dir_;
  ModelConfig config_;
  QpackLayout layout_;
  std::array<QpackLayout::ProjectionView, 3> views_;  // gate, up, down
  std::vector<std::vector<uint64_t>> sums_;  // [layer][expert], empty when not verifying
  bool verify_ = false;
  IoMode io_;
  int max_batch_ = 0;
  ExpertCache cache_;
  std::optional<MissCopies> copies_;  // with the miss_copies option
  // Low-bit copies are read into buffers of their own, never into the cache (which keeps whole
  // experts): each serves the step that asked for it and is free again once released. Their ids
  // in reads, pins and pinned_ come after the cache's slots: capacity() + index.
  struct CopyBuffer {
    uint8_t* data = nullptr;  // a whole expert's stride: the copy is read into its tail
    int layer = -1, expert = -1;
    bool loading = false;
    int pins = 0;
    std::string error;  // why its read failed (while pinned)
  };
  std::vector<CopyBuffer> copy_bufs_;
  bool is_copy(int id) const { return id >= cache_.capacity(); }
  CopyBuffer& copy_buf(int id) { return copy_bufs_[size_t(id - cache_.capacity())]; }
  int low_layer_ = -1;               // the layer read_low_bit() last named
  std::vector<uint8_t> low_wanted_;  // [expert] of low_layer_: read the copy
  std::unique_ptr<ExpertReader> reader_;
  std::vector<uint8_t> fresh_;        // [slot] read but not used yet (its first use is a miss)
  std::vector<uint8_t> speculative_;  // [slot] read for a prediction, not used yet
  std::vector<uint8_t> wanted_;       // [slot] cached and needed by the last prefetch()'s step
  std::vector<uint32_t> used_in_;     // [slot] the step of its layer that last used it (0: none)
  std::vector<uint32_t> steps_;       // [layer] steps begun so far (a prefetch() begins one)
  std::vector<int> wanted_slots_;     // the slots marked in wanted_
  std::vector<std::string> errors_;   // [slot] why its read failed (while pinned)
  std::vector<int> pinned_;           // slots acquired and not released
  std::vector<int> acquiring_;        // scratch: the slots of the acquire() under way
  std::vector<ReadDone> done_;        // scratch
  int in_flight_ = 0;
  int registered_ = 0;                // slots below this were offered to the reader
  Clock::time_point busy_since_;
  ExpertStats stats_;
};

}  // namespace swiftlet
