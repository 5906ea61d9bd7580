// The decode forward pass on an NVIDIA GPU (issue 8): the same math as model/qwen3_hybrid.cpp, with
// every dense weight resident in VRAM and the routed experts served from a VRAM expert cache fed by
// the host ExpertSource. GpuModel is shared by all sessions of a loaded model; each Session gets
// its own GpuForward (device KV cache, DeltaNet states, activations). Built only with CUDA
// (SWIFTLET_HAVE_CUDA); without it make_gpu_model says so and the caller runs on the CPU.
#pragma once

#include "model/expert_slots.h"
#include "model/forward_pass.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace swiftlet {

struct GpuOptions {
  // VRAM for routed experts, in bytes. 0: what is free after the dense weights, less 2 GiB for the
  // KV caches and activations.
  size_t cache_bytes = 0;
  // Upload every expert at start when the cache holds them all (then decode never waits for the
  // host: the routing stays on the GPU).
  bool preload = true;
  // Tokens per batched prefill chunk (the prompt's activations take ~340 KB a token on the 80B);
  // when VRAM is short the chunk halves, down to 16 tokens, and below that prompts go token by
  // token.
  int prefill_chunk = 1024;
  // The VRAM expert cache's bookkeeping, under the host cache's policy (experts/expert_slots.h:
  // make_expert_slots). Required when the model has routed experts.
  MakeExpertSlots make_slots;
};

// The VRAM expert cache's counters, and where the memory went.
struct GpuStats {
  uint64_t hits = 0, misses = 0, evictions = 0;
  uint64_t bytes_uploaded = 0;
  double upload_seconds = 0;  // host time spent issuing and waiting for expert uploads
  // The start-up upload of every expert (preload), when they all fit.
  uint64_t preload_bytes = 0;
  double preload_seconds = 0;         // acquire (host reads) + upload
  double preload_upload_seconds = 0;  // the upload part as the host saw it
  size_t dense_bytes = 0;             // dense weights in VRAM
  size_t cache_bytes = 0;             // the expert arena
  size_t slot_bytes = 0;
  int64_t slots = 0;
  bool all_resident = false;  // every expert in VRAM: decode runs without host round trips
  double hit_rate() const { return hits + misses ? double(hits) / double(hits + misses) : 0.0; }
  double upload_gb_s() const { return upload_seconds > 0 ? double(bytes_uploaded) / 1e9 / upload_seconds : 0.0; }
};

class GpuModel;

// True when this binary has CUDA and a usable GPU; otherwise false with *reason saying why.
bool gpu_usable(std::string* reason);
// Page-locked host memory (cudaHostAlloc), e.g. for the host expert cache's slots so uploads from
// them run at DMA speed; null without CUDA or when it cannot be had.
void* gpu_host_alloc(size_t bytes);
void gpu_host_free(void* p);

// Uploads the dense weights of `m` (which must outlive the result). Returns null, with *reason
// saying why, when the binary has no CUDA or no usable GPU is present; the weights' formats are all
// supported, so other problems throw Error.
std::shared_ptr<GpuModel> make_gpu_model(const Model& m, const GpuOptions& opts, std::string* reason);
// A forward pass for one session over a shared GpuModel. With `profile`, decode launches kernel by
// kernel (no CUDA graph) with a timing event after each part of each layer (gpu_decode_profile).
std::unique_ptr<ForwardPass> make_gpu_forward(std::shared_ptr<GpuModel> g, bool profile = false);
// One token for each of several sessions together (issue 26): passes[i] (make_gpu_forward, all over
// runner's GpuModel) holds states[i] on the device and takes tokens[i]; logits: [N][vocab], row i
// states[i]'s. With every expert in VRAM the N tokens go through the layers together on the
// one-token kernels, a grid row each (each row's logits those of stepping alone); with a VRAM cache that holds a layer's experts
// but not the model's, the N tokens go through the layers together, each product reading its
// weights once for the N rows and each layer uploading the union of their experts once (results
// within the GPU's tolerance of stepping alone: the sums run in another order); otherwise one after
// another. `runner` is a pass of the same model kept for the batch (its buffers), not one of the
// sessions'. Throws Error for a pass of another model or one listed twice.
void gpu_decode_batch(ForwardPass& runner, std::span<ForwardPass* const> passes,
                      std::span<SessionState* const> states, std::span<const int32_t> tokens,
                      std::vector<float>& logits);
GpuStats gpu_stats(const GpuModel& g);
// Where the GPU time of decode steps and batched prompts goes, part by part in forward order, for a
// pass made with `profile`: lines "part us/token share", a table each. Empty otherwise.
std::string gpu_decode_profile(const ForwardPass& f);
// The host's share of one-token runs (decode steps), averaged: enqueueing a step, waiting for the
// GPU and the logits, and the time between runs. Empty before two such runs.
std::string gpu_host_timing(const ForwardPass& f);
// "NVIDIA H200 (sm_90, ...): dense 1.23 GB, expert cache 8.00 GB (4520 slots of 1.77 MB)"
std::string gpu_summary(const GpuModel& g);

}  // namespace swiftlet
