// Where routed experts come from. The model asks for the experts its router chose; a source
// answers with weight views that stay valid until release(). Implementations: all experts in a
// mapped checkpoint (experts/tensor_experts.h), or streamed from a .qpack through a cache.
#pragma once

#include "kernels/cpu/qmatrix.h"

#include <cstdint>
#include <span>

namespace swiftlet {

struct ExpertWeights {
  QMatrix gate;  // [moe_intermediate, hidden]
  QMatrix up;    // [moe_intermediate, hidden]
  QMatrix down;  // [hidden, moe_intermediate]
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
  double hit_rate() const { return hits + misses ? double(hits) / double(hits + misses) : 0.0; }
};

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  // The most experts that can be held at once (acquire() is never asked for more).
  virtual int max_batch() const = 0;
  // Makes `experts` of `layer` available and fills `out` (same order). Views stay valid until
  // the next release(layer). Throws Error naming the layer and expert if one cannot be read.
  virtual void acquire(int layer, std::span<const int32_t> experts, std::span<ExpertWeights> out) = 0;
  virtual void release(int layer) = 0;
  virtual ExpertStats expert_stats() const { return {}; }
};

}  // namespace swiftlet
