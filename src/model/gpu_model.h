// The model's side of the CUDA forward pass, shared by every session of a loaded model: the dense
// weights uploaded once (gpu_weights.cpp) and the VRAM expert cache (gpu_expert_cache.cpp).
// Internal to model/ (CUDA builds only); the public API is gpu_forward.h.
//
// Expert cache: an arena of equal slots, one expert blob each; a device table [layer][expert] holds
// each resident expert's slot address, so the grouped expert kernels read the router's top-k ids on
// the device and find their weights without the host. When every expert fits (all_resident), a
// token runs without a single host round trip. Otherwise, per MoE layer the top-k ids come back to
// the host (k int32, while the shared expert runs), misses are acquired from the ExpertSource and
// copied into slots on a copy stream. Which slot a miss takes is the host cache's policy
// (GpuOptions::make_slots, experts/expert_slots.h): here the slots are only allocated and filled.
#pragma once

#include "kernels/cuda/cuda_kernels.h"
#include "model/gpu_forward.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

namespace swiftlet {

namespace cu = swiftlet::cuda;

using GpuClock = std::chrono::steady_clock;
inline double since(GpuClock::time_point t) {
  return std::chrono::duration<double>(GpuClock::now() - t).count();
}
inline size_t align256(size_t n) { return (n + 255) & ~size_t(255); }

// A matrix of an expert slot whose pointers are offsets from the slot's base, at a slot's base.
cu::GpuMatrix at_base(cu::GpuMatrix m, const void* base);

class GpuModel {
 public:
  GpuModel(const Model& m, const GpuOptions& o);
  ~GpuModel();
  GpuModel(const GpuModel&) = delete;
  GpuModel& operator=(const GpuModel&) = delete;

  struct Attn {
    cu::GpuMatrix q, k, v, o;
    cu::AttentionSpec mixer;  // the q/k norms and the shapes
  };
  struct Gdn {
    cu::GpuMatrix qkv, z, b, a, out;
    cu::DeltaNetSpec mixer;  // the conv, decay and norm weights and the shapes
  };
  struct Layer {
    bool linear = false;
    float *in_norm = nullptr, *post_norm = nullptr;
    Attn attn;
    Gdn gdn;
    cu::GpuMatrix router, sh_gate, sh_up, sh_down, sh_expert_gate;
  };

  const Model& m;
  const ModelConfig& c;
  GpuOptions opts;
  cu::GpuMatrix embed, lm_head;
  float* final_norm = nullptr;
  std::vector<Layer> layers;

  // Makes experts ids[g0, g1) of `layer` resident in slots (uploading misses on the copy stream,
  // which `compute` then waits for). `after_group`: an event recorded after the previous group of
  // this layer, whose slots this group may overwrite (null for the first group).
  void ensure(int layer, const int32_t* ids, int n, cu::GpuStream compute, cu::GpuEvent after_group);
  // Largest number of experts whose slots can be in use at once.
  int64_t group_limit() const { return slots_; }
  bool grouped() const { return grouped_; }
  bool all_resident() const { return all_resident_; }
  const cu::ExpertLayout& layout() const { return layout_; }
  const void* const* table(int layer) const { return d_table_ + int64_t(layer) * c.num_experts; }
  const void* slot_of(int layer, int32_t e) const { return h_table_[size_t(int64_t(layer) * c.num_experts + e)]; }
  void count_resident_hits(int n) { stats_.hits += uint64_t(n); }
  GpuStats stats() const {
    GpuStats s = stats_;
    s.dense_bytes = dense_bytes_;
    s.cache_bytes = size_t(slots_) * slot_bytes_;
    s.slot_bytes = slot_bytes_;
    s.slots = slots_;
    s.all_resident = all_resident_;
    return s;
  }

 private:
  cu::GpuMatrix up(const QMatrix& w);
  float* up(const std::vector<float>& v);
  void learn_layout(const ExpertWeights& w);
  void preload();
  void upload_expert(const ExpertWeights& w, void* slot);

  std::vector<void*> owned_;
  size_t dense_bytes_ = 0;

  // Expert cache.
  bool layout_known_ = false, grouped_ = false, use_blob_ = false, all_resident_ = false;
  cu::ExpertLayout layout_;  // offsets inside a slot
  size_t slot_bytes_ = 0;
  int64_t slots_ = 0;
  uint8_t* arena_ = nullptr;
  const void** d_table_ = nullptr;        // [layer][expert] slot address (device)
  std::vector<const void*> h_table_;      // the same on the host; null: not resident
  std::unique_ptr<ExpertSlots> placement_;  // which expert sits in which slot (the policy)
  cu::GpuStream copy_ = nullptr;
  cu::GpuEvent copied_ = nullptr;
  std::vector<ExpertWeights> host_;  // acquire() output
  GpuStats stats_;
};

}  // namespace swiftlet
