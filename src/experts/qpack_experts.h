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
#include "format/qpack.h"
#include "model/expert_source.h"

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
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
