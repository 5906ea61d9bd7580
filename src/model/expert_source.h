// Where routed experts come from. The model asks for the experts its router chose; a source
// answers with weight views that stay valid until release(). Implementations: all experts in a
// mapped checkpoint (experts/tensor_experts.h), or streamed from a .qpack through a cache.
#pragma once

#include "core/qmatrix.h"

#include <cstdint>
#include <span>

namespace swiftlet {

struct ExpertWeights {
  QMatrix gate;  // [moe_intermediate, hidden]
  QMatrix up;    // [moe_intermediate, hidden]
  QMatrix down;  // [hidden, moe_intermediate]
  // The whole blob the views point into, when the source has one (a .qpack slot): a GPU cache
  // copies it in one transfer and rebuilds the views at the same offsets. Null otherwise.
  const uint8_t* blob = nullptr;
  size_t blob_bytes = 0;
};

// Counters every source keeps (zeros where a notion does not apply, e.g. no cache).
struct ExpertStats {
  uint64_t hits = 0;          // experts served from memory
  uint64_t misses = 0;        // experts that had to be read
  uint64_t evictions = 0;
  uint64_t bytes_read = 0;    // from disk
  double read_seconds = 0;    // time spent reading (may overlap compute)
  double wait_seconds = 0;    // time the compute waited for reads
  double verify_seconds = 0;  // time spent checking checksums
  uint64_t predicted = 0;       // speculative reads started for a predicted expert
  uint64_t predicted_used = 0;  // ... of which the expert was then used
  uint64_t skipped = 0;         // routed experts left out instead of read (--on-miss skip:W; lossy)
  uint64_t low_bit = 0;         // misses read from their low-bit copies (--on-miss low-bit; lossy)
  size_t cache_bytes = 0;       // memory the cache holds now
  size_t cache_budget = 0;      // the most it may hold
  double hit_rate() const { return hits + misses ? double(hits) / double(hits + misses) : 0.0; }
};

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  // The most experts that can be held at once (acquire() is never asked for more).
  virtual int max_batch() const = 0;
  // A hint, given as soon as the router has chosen: these experts of `layer` will be acquired
  // soon. A streaming source starts reading them so the reads overlap other compute. Never
  // blocks on IO and never throws for IO errors (acquire() reports them).
  virtual void prefetch(int /*layer*/, std::span<const int32_t> /*experts*/) {}
  // The same for experts a predictor expects (they may not be used): read only into room the
  // cache can spare, and counted apart.
  virtual void predict(int /*layer*/, std::span<const int32_t> /*experts*/) {}
  // Whether predict() does anything (a streaming source): else the model skips predicting.
  virtual bool wants_predictions() const { return false; }
  // How many experts the source can hold in memory at once (0: no limit).
  virtual int capacity() const { return 0; }
  // Whether acquire() would find the expert in memory now (the compute takes those first).
  virtual bool ready(int /*layer*/, int /*expert*/) const { return true; }
  // Makes `experts` of `layer` available and fills `out` (same order). Views stay valid until
  // the next release(layer). Throws Error naming the layer and expert if one cannot be read.
  virtual void acquire(int layer, std::span<const int32_t> experts, std::span<ExpertWeights> out) = 0;
  virtual void release(int layer) = 0;
  // Whether the expert is in memory or being read as a whole (what --on-miss low-bit asks).
  virtual bool held(int layer, int expert) const { return ready(layer, expert); }
  // --on-miss low-bit: of the experts the next prefetch() and acquire() of `layer` ask for, these
  // are read from their low-bit copies unless held (lossy; the copy serves this step only, the
  // cache keeps whole experts). Replaces the previous call's set. Sources without copies refuse
  // at load (miss_copies option), so the model calls this only where they exist.
  virtual void read_low_bit(int /*layer*/, std::span<const int32_t> /*experts*/) {}
  // The model left out `count` routed experts of `layer` that were not in memory instead of
  // reading them (--on-miss skip:W): counted in ExpertStats::skipped.
  virtual void skipped(int /*layer*/, int /*count*/) {}
  virtual ExpertStats expert_stats() const { return {}; }
};

}  // namespace swiftlet
