// What a model on disk is and what it costs to run: family, shapes, quantisation, resident and
// streamed bytes, and an estimate of peak RAM for a given expert cache (`swiftlet info`).
#pragma once

#include "format/hf_config.h"

#include <cstdint>
#include <string>

namespace swiftlet {

struct QpackContainer;

struct ModelSummary {
  std::string path;
  bool qpack = false;
  std::string source;          // .qpack: manifest sourceCheckpoint
  bool checksums = false;      // .qpack: has checksums.json
  ModelConfig config;
  std::string quantization;    // default format of the dense Linears
  int eight_bit_modules = 0;   // per-module overrides at 8 bits (router, shared_expert_gate)
  std::string expert_format;   // "4-bit g64 (BF16 scales)" / "BF16"
  uint64_t resident_bytes = 0;  // dense weights in memory: on disk, plus the copy of rows reordered at load
  uint64_t streamed_bytes = 0;  // routed experts on disk
  uint64_t expert_bytes = 0;    // one expert's weights
  uint64_t expert_stride = 0;   // bytes read per expert (.qpack: the 16 KiB-aligned stride)
};

// Reads a .qpack (checks its structure) or a checkpoint directory. Throws Error.
ModelSummary summarize_model(const std::string& path);
// The same for a container already open.
ModelSummary summarize_qpack(const QpackContainer& qc);

struct RamEstimate {
  uint64_t resident = 0;      // dense weights (mapped) + their fp32 copies
  uint64_t expert_cache = 0;  // cache_experts x stride (experts are read into its slots)
  uint64_t kv_cache = 0;      // full-attention layers, fp32 k and v, `context` tokens
  uint64_t linear_state = 0;  // DeltaNet recurrent + conv state
  uint64_t activations = 0;   // buffers of a `prompt`-token prefill, logits
  uint64_t total() const {
    return resident + expert_cache + kv_cache + linear_state + activations;
  }
};

RamEstimate estimate_peak_ram(const ModelSummary& s, int64_t cache_experts, int64_t context, int64_t prompt);

}  // namespace swiftlet
