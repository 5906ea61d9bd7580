// The CUDA forward pass (issue 8). Layout of this file, in forward order as qwen3_hybrid.cpp:
// GpuModel (dense weights in VRAM + the VRAM expert cache), then GpuForward: embed, per layer
// gated_attention / gated_delta_net, sparse_moe, then the final norm and lm_head. Decode runs one
// token at a time (with every expert resident, as one CUDA graph); a prompt runs batched, layer by
// layer over chunks of its tokens (prefill_*).
//
// Expert cache: an arena of equal slots, one expert blob each; a device table [layer][expert] holds
// each resident expert's slot address, so the grouped expert kernels read the router's top-k ids on
// the device and find their weights without the host. When every expert fits (all_resident), a
// token runs without a single host round trip. Otherwise, per MoE layer the top-k ids come back to
// the host (k int32, while the shared expert runs), misses are acquired from the ExpertSource and
// copied into slots on a copy stream, evicting the slot with the lowest (use count, last use):
// counts are remembered across evictions (LFU with history).
#include "model/gpu_forward.h"

#if SWIFTLET_HAVE_CUDA

#include "core/error.h"
#include "kernels/cuda/cuda_kernels.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>
#include <tuple>

namespace swiftlet {

namespace cu = swiftlet::cuda;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
size_t align256(size_t n) { return (n + 255) & ~size_t(255); }
// The smallest prefill chunk worth batching (GpuOptions::prefill_chunk is the largest).
constexpr int64_t kMinPrefillChunk = 16;

// Offsets, in a slot, of one matrix uploaded by upload_matrix_to at the slot's start + `at`.
cu::GpuMatrix layout_at(const QMatrix& w, size_t at) { return cu::matrix_layout(w, reinterpret_cast<const void*>(at)); }

// The same matrix with offsets taken from where a blob's views point.
cu::GpuMatrix layout_in_blob(const QMatrix& w, const uint8_t* blob) {
  auto off = [&](const void* p) { return reinterpret_cast<const void*>(static_cast<const uint8_t*>(p) - blob); };
  cu::GpuMatrix g = layout_at(w, 0);
  g.data = off(w.data);
  if (w.format == WeightFormat::Affine) {
    g.scales = off(w.scales);
    g.biases = off(w.biases);
  }
  return g;
}

cu::GpuMatrix at_base(cu::GpuMatrix m, const void* base) {
  auto add = [&](const void* off) {
    return static_cast<const void*>(static_cast<const uint8_t*>(base) + reinterpret_cast<size_t>(off));
  };
  m.data = add(m.data);
  if (m.format == WeightFormat::Affine) {
    m.scales = add(m.scales);
    m.biases = add(m.biases);
  }
  return m;
}

bool aligned16(const cu::GpuMatrix& m) {
  auto a = [](const void* p) { return reinterpret_cast<size_t>(p) % 16 == 0; };
  return a(m.data) && (m.format != WeightFormat::Affine || (a(m.scales) && a(m.biases)));
}

bool groupable(const cu::GpuMatrix& m) {
  return m.format == WeightFormat::Affine && (m.bits == 4 || m.bits == 8) && m.group_size > 0 &&
         m.group_size % (128 / m.bits) == 0 && m.cols % m.group_size == 0;
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// GpuModel: dense weights and the expert cache.

class GpuModel {
 public:
  GpuModel(const Model& m, const GpuOptions& o);
  ~GpuModel();
  GpuModel(const GpuModel&) = delete;
  GpuModel& operator=(const GpuModel&) = delete;

  struct Attn {
    cu::GpuMatrix q, k, v, o;
    float *q_norm = nullptr, *k_norm = nullptr;
  };
  struct Gdn {
    cu::GpuMatrix qkvz, ba, qkv, z, b, a, out;
    float *conv = nullptr, *A_log = nullptr, *dt_bias = nullptr, *norm = nullptr;
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
  const void** d_table_ = nullptr;                             // [layer][expert] slot address (device)
  std::vector<const void*> h_table_;                           // the same on the host; null: not resident
  std::vector<int64_t> slot_key_;                              // [slot] layer * E + expert, -1 free
  std::vector<uint32_t> uses_;                                 // [layer * E + expert], kept across evictions
  std::vector<uint64_t> last_use_;                             // [slot]
  std::set<std::tuple<uint32_t, uint64_t, int64_t>> victims_;  // (uses, last use, slot), evictable
  std::vector<int64_t> free_;
  uint64_t tick_ = 0;
  cu::GpuStream copy_ = nullptr;
  cu::GpuEvent copied_ = nullptr;
  std::vector<ExpertWeights> host_;  // acquire() output
  GpuStats stats_;
};

cu::GpuMatrix GpuModel::up(const QMatrix& w) {
  if (w.empty() || w.rows == 0) return {};
  void* owner = nullptr;
  cu::GpuMatrix g = cu::upload_matrix(w, &owner, nullptr);
  owned_.push_back(owner);
  dense_bytes_ += cu::matrix_device_bytes(w);
  return g;
}

float* GpuModel::up(const std::vector<float>& v) {
  if (v.empty()) return nullptr;
  auto* d = static_cast<float*>(cu::gpu_alloc(v.size() * 4));
  cu::gpu_upload(d, v.data(), v.size() * 4);
  owned_.push_back(d);
  dense_bytes_ += v.size() * 4;
  return d;
}

GpuModel::GpuModel(const Model& model, const GpuOptions& o) : m(model), c(model.config), opts(o) {
  const ModelWeights& w = m.weights;
  embed = up(w.embed_tokens);
  lm_head = c.tie_word_embeddings ? embed : up(w.lm_head);
  final_norm = up(w.norm);
  layers.resize(size_t(c.num_layers));
  for (int i = 0; i < c.num_layers; ++i) {
    const LayerWeights& lw = w.layers[size_t(i)];
    Layer& l = layers[size_t(i)];
    l.linear = lw.linear;
    l.in_norm = up(lw.input_layernorm);
    l.post_norm = up(lw.post_attention_layernorm);
    if (lw.linear) {
      const DeltaNetWeights& g = lw.gdn;
      l.gdn = {up(g.in_proj_qkvz), up(g.in_proj_ba), up(g.in_proj_qkv), up(g.in_proj_z),
               up(g.in_proj_b),    up(g.in_proj_a),  up(g.out_proj),    up(g.conv1d),
               up(g.A_log),        up(g.dt_bias),    up(g.norm)};
    } else {
      const AttentionWeights& a = lw.attn;
      l.attn = {up(a.q_proj), up(a.k_proj), up(a.v_proj), up(a.o_proj), up(a.q_norm), up(a.k_norm)};
    }
    l.router = up(lw.moe.router);
    l.sh_gate = up(lw.moe.shared_gate_proj);
    l.sh_up = up(lw.moe.shared_up_proj);
    l.sh_down = up(lw.moe.shared_down_proj);
    l.sh_expert_gate = up(lw.moe.shared_expert_gate);
  }
  const size_t n_keys = size_t(c.num_layers) * size_t(c.num_experts);
  d_table_ = static_cast<const void**>(cu::gpu_alloc(std::max<size_t>(n_keys, 1) * sizeof(void*)));
  owned_.push_back(d_table_);
  cu::gpu_memset(d_table_, 0, n_keys * sizeof(void*));
  h_table_.assign(n_keys, nullptr);
  uses_.assign(n_keys, 0);
  copy_ = cu::stream_create();
  copied_ = cu::event_create();
  cu::gpu_sync();
  if (c.num_experts > 0 && m.experts) {
    // The slot layout comes from one expert, so the cache is sized before the first token.
    const int32_t first = 0;
    host_.resize(1);
    m.experts->acquire(0, std::span(&first, 1), std::span(host_).first(1));
    learn_layout(host_[0]);
    m.experts->release(0);
    if (opts.preload && slots_ == int64_t(n_keys)) preload();
  }
}

GpuModel::~GpuModel() {
  cu::gpu_sync();
  for (void* p : owned_) cu::gpu_free(p);
  cu::gpu_free(arena_);
  cu::event_destroy(copied_);
  cu::stream_destroy(copy_);
}

void GpuModel::learn_layout(const ExpertWeights& w) {
  // One slot per expert: the source's blob as it is (one copy per expert), or the three matrices
  // uploaded one after the other.
  use_blob_ = w.blob != nullptr;
  if (use_blob_) {
    layout_ = {layout_in_blob(w.gate, w.blob), layout_in_blob(w.up, w.blob), layout_in_blob(w.down, w.blob)};
    use_blob_ = aligned16(layout_.gate) && aligned16(layout_.up) && aligned16(layout_.down);
    slot_bytes_ = align256(w.blob_bytes);
  }
  if (!use_blob_) {
    const size_t g = cu::matrix_device_bytes(w.gate), u = cu::matrix_device_bytes(w.up);
    layout_ = {layout_at(w.gate, 0), layout_at(w.up, g), layout_at(w.down, g + u)};
    slot_bytes_ = g + u + cu::matrix_device_bytes(w.down);
  }
  grouped_ = groupable(layout_.gate) && groupable(layout_.up) && groupable(layout_.down) &&
             layout_.gate.bits == layout_.up.bits && layout_.gate.group_size == layout_.up.group_size &&
             layout_.gate.scale_dtype == layout_.up.scale_dtype;

  const int64_t n_keys = int64_t(c.num_layers) * c.num_experts;
  size_t budget = opts.cache_bytes;
  if (budget == 0) {
    size_t free_b = 0, total_b = 0;
    cu::device_memory(&free_b, &total_b);
    const size_t reserve = size_t(2) << 30;
    budget = free_b > reserve ? free_b - reserve : 0;
  }
  // Fewer slots than top-k work too (the experts then run in groups of `slots`).
  slots_ = std::clamp<int64_t>(int64_t(budget / slot_bytes_), 1, n_keys);
  arena_ = static_cast<uint8_t*>(cu::gpu_alloc(size_t(slots_) * slot_bytes_));
  slot_key_.assign(size_t(slots_), -1);
  last_use_.assign(size_t(slots_), 0);
  free_.clear();
  for (int64_t s = slots_ - 1; s >= 0; --s) free_.push_back(s);
  layout_known_ = true;
}

void GpuModel::upload_expert(const ExpertWeights& w, void* slot) {
  uint8_t* p = static_cast<uint8_t*>(slot);
  if (use_blob_) {
    cu::gpu_upload(p, w.blob, w.blob_bytes, copy_);
    stats_.bytes_uploaded += w.blob_bytes;
    return;
  }
  cu::upload_matrix_to(w.gate, p + reinterpret_cast<size_t>(layout_.gate.data), copy_);
  cu::upload_matrix_to(w.up, p + reinterpret_cast<size_t>(layout_.up.data), copy_);
  cu::upload_matrix_to(w.down, p + reinterpret_cast<size_t>(layout_.down.data), copy_);
  stats_.bytes_uploaded += w.gate.total_bytes() + w.up.total_bytes() + w.down.total_bytes();
}

void GpuModel::ensure(int layer, const int32_t* ids, int n, cu::GpuStream compute, cu::GpuEvent after_group) {
  const int E = c.num_experts;
  std::vector<int32_t> missing;
  std::vector<int64_t> group_slots;
  ++tick_;
  for (int i = 0; i < n; ++i) {
    const int64_t key = int64_t(layer) * E + ids[i];
    ++uses_[size_t(key)];
    if (const void* p = h_table_[size_t(key)]) {
      ++stats_.hits;
      const int64_t s = (static_cast<const uint8_t*>(p) - arena_) / int64_t(slot_bytes_);
      victims_.erase({uses_[size_t(key)] - 1, last_use_[size_t(s)], s});
      last_use_[size_t(s)] = tick_;
      group_slots.push_back(s);
    } else {
      ++stats_.misses;
      missing.push_back(ids[i]);
    }
  }
  if (!missing.empty()) {
    const auto t0 = Clock::now();
    m.experts->prefetch(layer, missing);  // a streaming source reads them all in parallel
    if (after_group) cu::stream_wait(copy_, after_group);
    const size_t batch = size_t(std::max(1, m.experts->max_batch()));
    for (size_t first = 0; first < missing.size(); first += batch) {
      const size_t nb = std::min(batch, missing.size() - first);
      host_.resize(std::max(host_.size(), nb));
      const std::span<const int32_t> part(missing.data() + first, nb);
      m.experts->acquire(layer, part, std::span(host_).first(nb));
      if (!layout_known_) learn_layout(host_[0]);
      for (size_t i = 0; i < nb; ++i) {
        int64_t s;
        if (!free_.empty()) {
          s = free_.back();
          free_.pop_back();
        } else {
          SWIFTLET_CHECK(!victims_.empty(), "VRAM expert cache: all {} slots in use", slots_);
          s = std::get<2>(*victims_.begin());
          victims_.erase(victims_.begin());
          const int64_t old = slot_key_[size_t(s)];
          h_table_[size_t(old)] = nullptr;
          ++stats_.evictions;
        }
        const int64_t key = int64_t(layer) * E + part[i];
        void* slot = arena_ + size_t(s) * slot_bytes_;
        upload_expert(host_[i], slot);
        slot_key_[size_t(s)] = key;
        last_use_[size_t(s)] = tick_;
        h_table_[size_t(key)] = slot;
        // The table entry travels on the copy stream after the data (pageable: staged at once).
        cu::gpu_upload(d_table_ + key, &h_table_[size_t(key)], sizeof(void*), copy_);
        group_slots.push_back(s);
      }
      cu::event_record(copied_, copy_);
      // The source's buffers may be pinned (then the copy reads them later): wait before release.
      cu::event_sync(copied_);
      m.experts->release(layer);
    }
    cu::stream_wait(compute, copied_);
    stats_.upload_seconds += since(t0);
  }
  for (int64_t s : group_slots) victims_.insert({uses_[size_t(slot_key_[size_t(s)])], last_use_[size_t(s)], s});
}

void GpuModel::preload() {
  const int E = c.num_experts;
  const auto t0 = Clock::now();
  const int batch = std::max(1, std::min(E, m.experts->max_batch()));
  std::vector<int32_t> ids;
  for (int l = 0; l < c.num_layers; ++l)
    for (int e0 = 0; e0 < E; e0 += batch) {
      ids.clear();
      for (int e = e0; e < std::min(E, e0 + batch); ++e) ids.push_back(e);
      ensure(l, ids.data(), int(ids.size()), nullptr, nullptr);
    }
  cu::gpu_sync(copy_);
  const uint64_t bytes = stats_.bytes_uploaded;
  const double upload = stats_.upload_seconds;
  stats_ = {};
  stats_.preload_bytes = bytes;
  stats_.preload_seconds = since(t0);
  stats_.preload_upload_seconds = upload;
  all_resident_ = grouped_;
}

// ------------------------------------------------------------------------------------------------
// GpuForward: one session's device state and activations.

namespace {

class GpuForward final : public ForwardPass {
 public:
  explicit GpuForward(std::shared_ptr<GpuModel> g);
  ~GpuForward() override;

  void run(SessionState& st, std::span<const int32_t> tokens, LogitsMode mode, std::vector<float>& logits,
           int64_t from = 0) override;
  StateSnapshot snapshot(const SessionState& st) override;
  void restore(SessionState& st, const StateSnapshot& snap) override;
  void reset(SessionState& st) override;
  std::string profile_report() const;
  std::string host_timing_report() const;
  size_t buffer_bytes() const override { return batch_.bytes; }
  void release_buffers() override {
    cu::gpu_sync(s_);
    free_batch();
  }

 private:
  void step(int32_t token, int64_t pos);
  void layers();  // one token through every layer: reads d_tok_ and d_pos_ (graph-capturable)
  // A prompt of T >= 2 tokens, in chunks of up to GpuOptions::prefill_chunk tokens, each chunk layer
  // by layer with every product batched over its tokens: dense projections as 8-token tiles of one launch,
  // the routed experts grouped per expert (a layer's experts are streamed once per 8 of the tokens
  // routed to them), the DeltaNet conv / delta rule and attention over the chunk's tokens in
  // order. With a VRAM cache smaller than the model, each layer uploads the union of the chunk's
  // experts once. False (nothing done) where it does not apply: the unfused expert kernels (float
  // experts), no shared expert, or a cache that cannot hold one layer's experts.
  bool prefill(std::span<const int32_t> tokens, LogitsMode mode, int64_t from, std::vector<float>& logits);
  void prefill_chunk(const int32_t* d_tokens, int64_t T, int64_t pos0);
  void prefill_delta_net(int l, int64_t T);
  void prefill_attention(int l, int64_t T, int64_t pos0);
  void prefill_moe(int l, int64_t T);
  void logits_of(const float* d_h_row, float* host_row);
  void gated_attention(int l);
  void gated_delta_net(int l);
  void sparse_moe(int l);
  void logits_to(float* host_row);
  void reserve_kv(int64_t positions);
  // y_i (+)= W_i x for the segments in one launch; with norm_w, x is RMSNorm'd first and the normed
  // x is left in x_.
  void project(std::initializer_list<cu::MatvecSegment> segs, const float* x, const float* norm_w) {
    cu::fused_matvec(segs.begin(), int(segs.size()), x, norm_w, c_.rms_norm_eps, x_, s_);
  }
  float* buf(size_t n) {
    auto* p = static_cast<float*>(cu::gpu_alloc(std::max<size_t>(n, 1) * 4));
    bufs_.push_back(p);
    return p;
  }

  std::shared_ptr<GpuModel> g_;
  const ModelConfig& c_;
  cu::GpuStream s_ = nullptr;
  cu::GpuEvent ids_ready_ = nullptr, group_done_ = nullptr;
  int64_t pos_ = 0;  // positions the device state holds

  // Device state, per layer (empty for the other kind).
  struct LayerDev {
    float *k = nullptr, *v = nullptr;  // [kv_cap][kv_dim]
    float *conv = nullptr, *ssm = nullptr;
  };
  std::vector<LayerDev> dev_;
  int64_t kv_cap_ = 0;

  // Activations (device), one token. Shapes in comments.
  std::vector<void*> bufs_;
  float* h_;                     // [H] residual stream
  float* x_;                     // [H] normed block input
  float* p1_;                    // [max(q_proj_rows, qkvz rows, conv_dim)]
  float* p2_;                    // [max(kv_dim, 2 hv)]
  float* p3_;                    // [kv_dim]
  float* mixed_;                 // [conv_dim]
  float* u_;                     // [conv_dim]
  float* z_;                     // [value_dim]
  float* ba_;                    // [2 hv]: b then a
  float* core_;                  // [max(attn_out_dim, value_dim)]
  float* q_;                     // [attn_out_dim]
  float* gate_;                  // [attn_out_dim]
  float* router_;                // [E]
  int32_t* ids_;                 // [k]
  float* w_;                     // [k]
  float *eg_, *eu_, *ey_;        // [k][I], [k][I], [k][H]
  float *sh_, *su_, *sg_, *sy_;  // [SI], [SI], [1], [H]
  float* act_;                   // [k + 1][I]: SiLU(gate x) * up x of the chosen experts, then the shared one
  // The fused expert kernels (expert_act / expert_down_add) take this model's experts, and the
  // shared expert (shared_[l]) rides along as one more expert.
  bool experts_fused_ = false, shared_fused_ = false;
  // Decode with every expert resident takes the top-k inside expert_act (expert_act_routed), one
  // launch fewer per layer; SWIFTLET_GPU_ROUTE_IN_ACT=0 keeps router_topk (for comparison).
  bool route_in_act_ = false;
  // Each token mixer's prep inside its main kernel: the DeltaNet step (conv, norms, delta rule,
  // gated norm) in one launch where the device allows (cu::deltanet_step), attention with its q/k
  // norms, RoPE and cache write (cu::attention_step, head_dim <= 256). SWIFTLET_GPU_MIXER_STEP=0
  // keeps the separate prep kernels (for comparison).
  bool mixer_step_ = true;
  std::vector<cu::SharedExpert> shared_;
  float* logits_;                // [vocab]
  int32_t* h_ids_ = nullptr;     // pinned [k]
  float* h_logits_ = nullptr;    // pinned [vocab]: the logits' download (pageable copies are slower)
  // Host time of one-token runs (decode steps), for host_timing_report: enqueueing the step (the
  // graph launch), waiting for the GPU and the logits, and the time between runs (the caller's).
  struct HostTiming {
    double enqueue_s = 0, wait_s = 0, between_s = 0;
    int64_t steps = 0;
    std::chrono::steady_clock::time_point last_return{};
  } host_;
  // prefill's activations for up to `cap` tokens, rows per token (shapes as the one-token buffers
  // above); the experts' rows are per (token, choice) pair. Host side (pinned): the chosen ids, the
  // per-expert work list (group experts [E], group starts [E + 1], pairs [cap k]; uploaded to
  // d_groups in one copy) and the chunk's tokens.
  struct Batch {
    void* arena = nullptr;
    float *h, *x, *p1, *p2, *p3, *mixed, *u, *z, *b, *a, *q, *gate, *core, *router, *w, *sg;
    float *eg, *eu, *ey, *shg, *shu, *shy;
    int32_t *tok, *ids, *d_groups;
    int32_t *h_ids = nullptr, *h_groups = nullptr, *h_tok = nullptr;
    int64_t cap = 0;
    size_t bytes = 0;  // device bytes of the arena
  } batch_;
  // Buffers for a chunk of up to T tokens, or fewer when VRAM is short (halving down to
  // kMinPrefillChunk); false when not even that fits.
  bool grow_batch(int64_t T);
  void free_batch();
  int32_t* d_tok_ = nullptr;     // [1] this step's token
  int64_t* d_pos_ = nullptr;     // [1] this step's position
  // With every expert resident a token needs no host round trip: its whole forward is one CUDA
  // graph, captured at the first step and again whenever the KV caches move (grow).
  cu::GpuGraph graph_ = nullptr;
  int64_t graph_kv_cap_ = -1;
  bool use_graphs_ = true;

  // SWIFTLET_GPU_PROFILE=1: a timing event after each part of a decode step (mark), summed per
  // part name over the steps.
  bool profile_ = false;
  std::vector<cu::GpuEvent> marks_;
  std::vector<const char*> mark_names_;
  size_t n_marks_ = 0;
  struct Profile {
    std::vector<std::pair<std::string, double>> us;  // per part, forward order
    int64_t tokens = 0;
  } decode_prof_, prefill_prof_;
  bool in_step_ = false;  // marks count only inside a decode step or a batched prefill
  void mark(const char* part) {
    if (!profile_ || !in_step_) return;
    if (n_marks_ == marks_.size()) {
      marks_.push_back(cu::event_create_timed());
      mark_names_.push_back(nullptr);
    }
    mark_names_[n_marks_] = part;
    cu::event_record(marks_[n_marks_++], s_);
  }
  void profile_end(Profile& p, int64_t tokens);
  void profile_step_end() { profile_end(decode_prof_, 1); }
};

GpuForward::GpuForward(std::shared_ptr<GpuModel> g) : g_(std::move(g)), c_(g_->c) {
  const ModelConfig& c = c_;
  const int64_t H = c.hidden_size, kvd = c.kv_dim(), C = c.conv_dim(), vd = c.linear_value_dim();
  const int64_t hv = c.linear_num_value_heads, I = c.moe_intermediate_size, SI = c.shared_expert_intermediate_size;
  const int k = c.num_experts_per_tok;
  cu::prepare_fused_kernels();
  s_ = cu::stream_create();
  ids_ready_ = cu::event_create();
  group_done_ = cu::event_create();
  h_ = buf(size_t(H));
  x_ = buf(size_t(H));
  p1_ = buf(size_t(std::max({c.q_proj_rows(), 2 * c.linear_key_dim() + 2 * vd, C})));
  p2_ = buf(size_t(std::max(kvd, 2 * hv)));
  p3_ = buf(size_t(kvd));
  mixed_ = buf(size_t(C));
  u_ = buf(size_t(C));
  z_ = buf(size_t(vd));
  ba_ = buf(size_t(2 * hv));
  core_ = buf(size_t(std::max(c.attn_out_dim(), vd)));
  q_ = buf(size_t(c.attn_out_dim()));
  gate_ = buf(size_t(c.attn_out_dim()));
  router_ = buf(size_t(c.num_experts));
  ids_ = reinterpret_cast<int32_t*>(buf(size_t(k)));
  w_ = buf(size_t(k));
  eg_ = buf(size_t(k * I));
  eu_ = buf(size_t(k * I));
  ey_ = buf(size_t(k * H));
  sh_ = buf(size_t(SI));
  su_ = buf(size_t(SI));
  sg_ = buf(1);
  sy_ = buf(size_t(H));
  act_ = buf(size_t((k + 1) * I));
  logits_ = buf(size_t(c.vocab_size));
  h_ids_ = static_cast<int32_t*>(cu::gpu_alloc_pinned(size_t(std::max(k, 1)) * sizeof(int32_t)));
  h_logits_ = static_cast<float*>(cu::gpu_alloc_pinned(size_t(c.vocab_size) * sizeof(float)));
  d_tok_ = reinterpret_cast<int32_t*>(buf(1));
  d_pos_ = reinterpret_cast<int64_t*>(buf(2));
  const char* env = std::getenv("SWIFTLET_GPU_GRAPHS");  // 0: launch kernel by kernel (for comparison)
  use_graphs_ = !(env && std::string(env) == "0");
  const char* rt = std::getenv("SWIFTLET_GPU_ROUTE_IN_ACT");
  route_in_act_ = cu::expert_act_routes(c.num_experts, k) && !(rt && std::string(rt) == "0");
  const char* ms = std::getenv("SWIFTLET_GPU_MIXER_STEP");
  mixer_step_ = !(ms && std::string(ms) == "0");
  const char* prof = std::getenv("SWIFTLET_GPU_PROFILE");
  profile_ = prof && std::string(prof) == "1";
  if (profile_) use_graphs_ = false;
  if (c.num_experts > 0 && g_->grouped()) {
    experts_fused_ = cu::experts_fusable(g_->layout(), k, nullptr);
    shared_fused_ = experts_fused_;
    for (const GpuModel::Layer& lw : g_->layers) {
      shared_.push_back({lw.sh_gate, lw.sh_up, lw.sh_down, sg_});
      shared_fused_ = shared_fused_ && lw.sh_expert_gate.rows == 1 &&
                      cu::experts_fusable(g_->layout(), k, &shared_.back());
    }
  }
  dev_.resize(size_t(c.num_layers));
  for (int l = 0; l < c.num_layers; ++l) {
    if (!c.is_linear_layer(l)) continue;
    const size_t conv = size_t((c.linear_conv_kernel_dim - 1) * C);
    const size_t ssm = size_t(hv) * c.linear_key_head_dim * c.linear_value_head_dim;
    dev_[size_t(l)].conv = buf(conv);
    dev_[size_t(l)].ssm = buf(ssm);
    cu::gpu_memset(dev_[size_t(l)].conv, 0, conv * 4, s_);
    cu::gpu_memset(dev_[size_t(l)].ssm, 0, ssm * 4, s_);
  }
  cu::gpu_sync(s_);
}

GpuForward::~GpuForward() {
  cu::gpu_sync(s_);
  free_batch();
  cu::graph_destroy(graph_);
  for (void* p : bufs_) cu::gpu_free(p);
  for (auto& d : dev_) {
    cu::gpu_free(d.k);
    cu::gpu_free(d.v);
  }
  cu::gpu_free_pinned(h_ids_);
  cu::gpu_free_pinned(h_logits_);
  for (cu::GpuEvent e : marks_) cu::event_destroy(e);
  cu::event_destroy(ids_ready_);
  cu::event_destroy(group_done_);
  cu::stream_destroy(s_);
}

void GpuForward::reserve_kv(int64_t positions) {
  if (positions <= kv_cap_) return;
  const int64_t cap = std::max<int64_t>({positions, 2 * kv_cap_, 256});
  const size_t row = size_t(c_.kv_dim()) * 4;
  for (int l = 0; l < c_.num_layers; ++l) {
    if (c_.is_linear_layer(l)) continue;
    LayerDev& d = dev_[size_t(l)];
    for (float** p : {&d.k, &d.v}) {
      auto* n = static_cast<float*>(cu::gpu_alloc(size_t(cap) * row));
      if (*p) cu::gpu_copy(n, *p, size_t(pos_) * row, s_);
      cu::gpu_sync(s_);
      cu::gpu_free(*p);
      *p = n;
    }
  }
  kv_cap_ = cap;
}

void GpuForward::run(SessionState& st, std::span<const int32_t> tokens, LogitsMode mode, std::vector<float>& logits,
                     int64_t from) {
  SWIFTLET_CHECK(st.layers.size() == size_t(c_.num_layers), "session state of another model");
  SWIFTLET_CHECK(st.pos == pos_ || st.pos == 0, "GPU state at {} but the session at {}", pos_, st.pos);
  if (st.pos == 0 && pos_ != 0) reset(st);
  logits.clear();
  const int64_t T = int64_t(tokens.size());
  if (T == 0) return;
  for (int32_t id : tokens)
    if (id < 0 || id >= c_.vocab_size) fail("token id {} is outside the vocabulary (0..{})", id, c_.vocab_size - 1);
  reserve_kv(pos_ + T);
  from = std::clamp<int64_t>(from, 0, T);
  if (prefill(tokens, mode, from, logits)) {
    pos_ += T;
    cu::gpu_sync(s_);
    st.pos += T;
    st.tokens.insert(st.tokens.end(), tokens.begin(), tokens.end());
    return;
  }
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  const bool timed = T == 1 && host_.last_return != Clock::time_point{};
  if (timed) host_.between_s += std::chrono::duration<double>(t0 - host_.last_return).count();
  if (mode == LogitsMode::All) logits.resize(size_t((T - from) * c_.vocab_size));
  for (int64_t t = 0; t < T; ++t) {
    step(tokens[size_t(t)], pos_);
    ++pos_;
    if (mode == LogitsMode::All && t >= from) logits_to(logits.data() + (t - from) * c_.vocab_size);
  }
  const Clock::time_point t1 = Clock::now();
  if (mode == LogitsMode::Last) {
    logits.resize(size_t(c_.vocab_size));
    logits_to(logits.data());
  }
  profile_step_end();
  cu::gpu_sync(s_);
  host_.last_return = Clock::now();
  if (timed) {
    host_.enqueue_s += std::chrono::duration<double>(t1 - t0).count();
    host_.wait_s += std::chrono::duration<double>(host_.last_return - t1).count();
    ++host_.steps;
  }
  st.pos += T;
  st.tokens.insert(st.tokens.end(), tokens.begin(), tokens.end());
}

void GpuForward::logits_to(float* host_row) { logits_of(h_, host_row); }

void GpuForward::logits_of(const float* d_h_row, float* host_row) {
  project({{g_->lm_head, logits_}}, d_h_row, g_->final_norm);
  mark("final norm + lm_head");
  const size_t bytes = size_t(c_.vocab_size) * sizeof(float);
  cu::gpu_download(h_logits_, logits_, bytes, s_);
  std::memcpy(host_row, h_logits_, bytes);
}

std::string GpuForward::host_timing_report() const {
  if (host_.steps == 0) return "";
  const double n = double(host_.steps);
  return fmt::format(
      "host per decode step ({} steps): enqueue {:.1f} us (the graph launch; without every expert resident the "
      "layers with their uploads), wait for the GPU + logits {:.1f} us, between steps (the caller) {:.1f} us\n",
      host_.steps, 1e6 * host_.enqueue_s / n, 1e6 * host_.wait_s / n, 1e6 * host_.between_s / n);
}

void GpuForward::free_batch() {
  if (batch_.arena) cu::gpu_free(batch_.arena);
  if (batch_.h_ids) cu::gpu_free_pinned(batch_.h_ids);
  batch_ = {};
}

bool GpuForward::grow_batch(int64_t T) {
  if (T <= batch_.cap) return true;
  cu::gpu_sync(s_);
  free_batch();
  const ModelConfig& c = c_;
  const size_t n = size_t(T), H = size_t(c.hidden_size), E = size_t(c.num_experts);
  const size_t k = size_t(c.num_experts_per_tok), I = size_t(c.moe_intermediate_size);
  const size_t SI = size_t(c.shared_expert_intermediate_size), C = size_t(c.conv_dim());
  const size_t vd = size_t(c.linear_value_dim()), hv = size_t(c.linear_num_value_heads), kvd = size_t(c.kv_dim());
  const size_t ao = size_t(c.attn_out_dim());
  const size_t p1 = size_t(std::max({c.q_proj_rows(), 2 * c.linear_key_dim() + 2 * c.linear_value_dim(), c.conv_dim()}));
  // Carve one allocation: (pointer, floats per token) in order, each part 256-byte aligned.
  std::vector<std::pair<float**, size_t>> parts = {
      {&batch_.h, H},   {&batch_.x, H},      {&batch_.p1, p1},   {&batch_.p2, std::max(kvd, 2 * hv)},
      {&batch_.p3, kvd}, {&batch_.mixed, C}, {&batch_.u, C},     {&batch_.z, vd},
      {&batch_.b, hv},  {&batch_.a, hv},     {&batch_.q, ao},    {&batch_.gate, ao},
      {&batch_.core, std::max(ao, vd)},      {&batch_.router, E}, {&batch_.w, k},
      {&batch_.sg, 1},  {&batch_.eg, k * I}, {&batch_.eu, k * I}, {&batch_.ey, k * H},
      {&batch_.shg, SI}, {&batch_.shu, SI},  {&batch_.shy, H}};
  float *tok = nullptr, *ids = nullptr, *groups = nullptr;
  parts.push_back({&tok, 1});
  parts.push_back({&ids, k});
  const size_t group_ints = E + (E + 1) + n * k;
  size_t bytes = 0;
  for (auto& [ptr, per] : parts) bytes += align256(std::max<size_t>(per * n, 1) * 4);
  bytes += align256(group_ints * 4);
  auto* base = static_cast<uint8_t*>(cu::gpu_try_alloc(bytes));
  if (!base) {
    if (T / 2 < kMinPrefillChunk) return false;
    return grow_batch(T / 2);
  }
  batch_.arena = base;
  batch_.bytes = bytes;
  size_t at = 0;
  for (auto& [ptr, per] : parts) {
    *ptr = reinterpret_cast<float*>(base + at);
    at += align256(std::max<size_t>(per * n, 1) * 4);
  }
  groups = reinterpret_cast<float*>(base + at);
  batch_.tok = reinterpret_cast<int32_t*>(tok);
  batch_.ids = reinterpret_cast<int32_t*>(ids);
  batch_.d_groups = reinterpret_cast<int32_t*>(groups);
  // Pinned: the ids, the work list, the chunk's tokens (gpu_alloc_pinned aborts when it cannot).
  batch_.h_ids = static_cast<int32_t*>(cu::gpu_alloc_pinned((n * k + group_ints + n) * sizeof(int32_t)));
  batch_.h_groups = batch_.h_ids + n * k;
  batch_.h_tok = batch_.h_groups + group_ints;
  batch_.cap = T;
  return true;
}

bool GpuForward::prefill(std::span<const int32_t> tokens, LogitsMode mode, int64_t from, std::vector<float>& logits) {
  const int64_t T = int64_t(tokens.size());
  const int E = c_.num_experts;
  if (T < 2 || E == 0 || !experts_fused_ || !shared_fused_ || !(g_->all_resident() || g_->group_limit() >= E))
    return false;
  const int64_t V = c_.vocab_size;
  const int64_t first = mode == LogitsMode::All ? from : mode == LogitsMode::Last ? T - 1 : T;
  if (!grow_batch(std::min<int64_t>(T, std::max<int64_t>(g_->opts.prefill_chunk, kMinPrefillChunk)))) return false;
  logits.resize(size_t((T - first) * V));
  n_marks_ = 0;
  in_step_ = true;
  mark("start");
  for (int64_t t0 = 0; t0 < T; t0 += batch_.cap) {
    const int64_t n = std::min(batch_.cap, T - t0);
    cu::gpu_sync(s_);  // h_tok may still be in an earlier chunk's upload
    std::copy_n(tokens.begin() + t0, n, batch_.h_tok);
    cu::gpu_upload(batch_.tok, batch_.h_tok, size_t(n) * sizeof(int32_t), s_);
    prefill_chunk(batch_.tok, n, pos_ + t0);
    for (int64_t t = std::max(first, t0); t < t0 + n; ++t)
      logits_of(batch_.h + (t - t0) * c_.hidden_size, logits.data() + (t - first) * V);
  }
  profile_end(prefill_prof_, T);
  return true;
}

void GpuForward::prefill_chunk(const int32_t* d_tokens, int64_t T, int64_t pos0) {
  cu::dequant_rows(g_->embed, d_tokens, T, batch_.h, s_);
  mark("prompt: tokens up + embedding");
  for (int l = 0; l < c_.num_layers; ++l) {
    if (g_->layers[size_t(l)].linear)
      prefill_delta_net(l, T);
    else
      prefill_attention(l, T, pos0);
    prefill_moe(l, T);
  }
}

void GpuForward::prefill_delta_net(int l, int64_t T) {
  const GpuModel::Layer& lw = g_->layers[size_t(l)];
  const GpuModel::Gdn& w = lw.gdn;
  const int hk = c_.linear_num_key_heads, hv = c_.linear_num_value_heads;
  const int dk = c_.linear_key_head_dim, dv = c_.linear_value_head_dim, K = c_.linear_conv_kernel_dim;
  const int64_t H = c_.hidden_size, C = c_.conv_dim(), kd = c_.linear_key_dim();
  LayerDev& d = dev_[size_t(l)];
  const float q_scale = 1.0f / std::sqrt(float(dk));
  Batch& B = batch_;
  cu::rms_norm(B.h, lw.in_norm, T, H, c_.rms_norm_eps, B.x, s_);
  if (c_.family == Family::Qwen3Next) {
    // matmul writes rows of its matrix's width: token t's qkvz at p1 + t qkvz.rows, and so on.
    cu::matmul(w.qkvz, B.x, T, B.p1, s_);
    cu::matmul(w.ba, B.x, T, B.p2, s_);
    mark("prompt gdn: norm + qkvz, ba");
    cu::deltanet_prep_grouped_rows(B.p1, w.qkvz.rows, B.p2, w.ba.rows, w.conv, d.conv, hk, hv / hk, dk, dv, K, 1e-6f,
                                   q_scale, T, B.mixed, B.u, B.z, B.b, B.a, s_);
  } else {
    cu::matmul(w.qkv, B.x, T, B.mixed, s_);
    cu::matmul(w.z, B.x, T, B.z, s_);
    cu::matmul(w.b, B.x, T, B.b, s_);
    cu::matmul(w.a, B.x, T, B.a, s_);
    cu::conv1d_silu_scan(B.mixed, C, w.conv, d.conv, C, K, T, B.u, C, s_);
    cu::l2_norm_qk_rows(B.u, T, C, hk, dk, 1e-6f, q_scale, s_);  // q then k: the front of each row
  }
  mark("prompt gdn: unpack, conv, l2");
  // The delta rule over the tokens in order, the state held on chip; then the gated norm.
  cu::delta_rule_norm_scan(B.u, B.u + kd, B.u + 2 * kd, C, B.b, B.a, hv, w.A_log, w.dt_bias, d.ssm, B.z, w.norm,
                           c_.rms_norm_eps, hk, hv, dk, dv, T, B.core, s_);
  mark("prompt gdn: delta rule scan + norm");
  cu::matmul_add_rows(w.out, B.core, T, B.h, s_);  // h += out_proj(core)
  mark("prompt gdn: h += out_proj");
}

void GpuForward::prefill_attention(int l, int64_t T, int64_t pos0) {
  const GpuModel::Layer& lw = g_->layers[size_t(l)];
  const GpuModel::Attn& w = lw.attn;
  const int nh = c_.num_heads, nkv = c_.num_kv_heads, hd = c_.head_dim;
  const int64_t H = c_.hidden_size;
  LayerDev& d = dev_[size_t(l)];
  Batch& B = batch_;
  cu::rms_norm(B.h, lw.in_norm, T, H, c_.rms_norm_eps, B.x, s_);
  cu::matmul(w.q, B.x, T, B.p1, s_);
  cu::matmul(w.k, B.x, T, B.p2, s_);
  cu::matmul(w.v, B.x, T, B.p3, s_);
  mark("prompt attn: norm + q, k, v");
  cu::attn_prep_rows(B.p1, w.q.rows, B.p2, w.k.rows, B.p3, w.v.rows, w.q_norm, w.k_norm, nh, nkv, hd,
                     c_.attn_output_gate, c_.rotary_dim(), pos0, T, c_.rope_theta, c_.rms_norm_eps, B.q, B.gate, d.k,
                     d.v, s_);
  cu::attention_prefill(B.q, d.k, d.v, pos0, T, nh, nkv, hd, 1.0f / std::sqrt(float(hd)),
                        c_.attn_output_gate ? B.gate : nullptr, B.core, s_);
  mark("prompt attn: prep + causal attention");
  cu::matmul_add_rows(w.o, B.core, T, B.h, s_);  // h += o_proj(attention)
  mark("prompt attn: h += o_proj");
}

void GpuForward::prefill_moe(int l, int64_t T) {
  const GpuModel::Layer& lw = g_->layers[size_t(l)];
  const int64_t H = c_.hidden_size, I = c_.moe_intermediate_size, SI = c_.shared_expert_intermediate_size;
  const int E = c_.num_experts, k = c_.num_experts_per_tok;
  Batch& B = batch_;
  cu::rms_norm(B.h, lw.post_norm, T, H, c_.rms_norm_eps, B.x, s_);
  cu::matmul(lw.router, B.x, T, B.router, s_);
  cu::matmul(lw.sh_expert_gate, B.x, T, B.sg, s_);
  cu::router_topk(B.router, T, E, k, c_.norm_topk_prob, B.ids, B.w, s_);
  mark("prompt moe: norm + router, gate, top-k");
  cu::gpu_download_async(B.h_ids, B.ids, size_t(T * k) * sizeof(int32_t), s_);
  cu::event_record(ids_ready_, s_);
  // The shared expert while the ids travel.
  cu::matmul(lw.sh_gate, B.x, T, B.shg, s_);
  cu::matmul(lw.sh_up, B.x, T, B.shu, s_);
  cu::silu_mul(B.shg, B.shu, T * SI, B.shg, s_);
  cu::matmul(lw.sh_down, B.shg, T, B.shy, s_);
  mark("prompt moe: shared expert");
  cu::event_sync(ids_ready_);

  // The work list: the pairs p = t k + j grouped by expert, in p order within a group.
  int32_t* gexp = B.h_groups;
  int32_t* gstart = gexp + E;
  int32_t* pairs = gstart + (E + 1);
  std::vector<int32_t> count(size_t(E), 0);
  for (int64_t p = 0; p < T * k; ++p) ++count[size_t(B.h_ids[p])];
  std::vector<int32_t> at(size_t(E), 0);
  int groups = 0, n_pairs = 0;
  for (int e = 0; e < E; ++e) {
    if (count[size_t(e)] == 0) continue;
    gexp[groups] = e;
    gstart[groups] = n_pairs;
    at[size_t(e)] = n_pairs;
    n_pairs += count[size_t(e)];
    ++groups;
  }
  gstart[groups] = n_pairs;
  for (int64_t p = 0; p < T * k; ++p) pairs[at[size_t(B.h_ids[p])]++] = int32_t(p);
  // One upload: the layout on the device matches (experts, starts, pairs at the same offsets).
  cu::gpu_upload(B.d_groups, B.h_groups, (size_t(E) + size_t(E + 1) + size_t(n_pairs)) * sizeof(int32_t), s_);
  if (g_->all_resident())
    g_->count_resident_hits(int(T * k));
  else
    g_->ensure(l, gexp, groups, s_, nullptr);
  cu::ExpertBatch eb;
  eb.d_expert = B.d_groups;
  eb.d_start = B.d_groups + E;
  eb.d_pairs = B.d_groups + E + (E + 1);
  eb.groups = groups;
  eb.pairs = n_pairs;
  eb.k = k;
  const cu::ExpertLayout& lay = g_->layout();
  const void* const* table = g_->table(l);
  mark("prompt moe: work list (host) + uploads");
  cu::expert_gate_up_pairs(lay, table, eb, B.x, B.eg, B.eu, s_);
  cu::silu_mul(B.eg, B.eu, T * k * I, B.eg, s_);
  mark("prompt moe: experts gate, up, SiLU");
  cu::expert_down_pairs(lay, table, eb, B.eg, B.ey, s_);
  cu::moe_finish_rows(B.h, B.shy, B.sg, B.ey, B.w, T, k, H, s_);
  mark("prompt moe: experts down + finish");
}

void GpuForward::profile_end(Profile& p, int64_t tokens) {
  const bool was = in_step_;
  in_step_ = false;
  if (!profile_ || !was || n_marks_ < 2) return;
  cu::event_sync(marks_[n_marks_ - 1]);
  for (size_t i = 1; i < n_marks_; ++i) {
    const double us = 1e3 * cu::event_elapsed_ms(marks_[i - 1], marks_[i]);
    auto it = std::find_if(p.us.begin(), p.us.end(), [&](auto& e) { return e.first == mark_names_[i]; });
    if (it == p.us.end())
      p.us.emplace_back(mark_names_[i], us);
    else
      it->second += us;
  }
  p.tokens += tokens;
  n_marks_ = 0;
}

std::string GpuForward::profile_report() const {
  std::string out;
  for (const Profile* p : {&decode_prof_, &prefill_prof_}) {
    if (p->tokens == 0) continue;
    double total = 0;
    for (auto& [name, us] : p->us) total += us;
    out += p == &decode_prof_ ? "decode steps:\n" : "batched prompts (per prompt token):\n";
    for (auto& [name, us] : p->us)
      out += fmt::format("  {:<40} {:9.2f} us/token {:5.1f}%\n", name, us / double(p->tokens), 100.0 * us / total);
    out += fmt::format("  {:<40} {:9.2f} us/token over {} tokens\n", "total", total / double(p->tokens), p->tokens);
  }
  return out;
}

void GpuForward::step(int32_t token, int64_t pos) {
  n_marks_ = 0;
  in_step_ = true;
  mark("start");
  cu::set_step(d_tok_, token, d_pos_, pos, s_);
  if (!(g_->all_resident() && use_graphs_)) {
    layers();
    return;
  }
  if (!graph_ || graph_kv_cap_ != kv_cap_) {
    cu::graph_destroy(graph_);
    cu::graph_capture_begin(s_);
    layers();
    graph_ = cu::graph_capture_end(s_);
    graph_kv_cap_ = kv_cap_;
  }
  cu::graph_launch(graph_, s_);
  g_->count_resident_hits(c_.num_layers * c_.num_experts_per_tok);
}

// Each block reads the residual stream h_ (its first product RMSNorms it on the fly) and adds its
// output back into h_ (the last product of the block accumulates into it).
void GpuForward::layers() {
  cu::dequant_row_at(g_->embed, d_tok_, h_, s_);
  mark("embedding");
  for (int l = 0; l < c_.num_layers; ++l) {
    if (g_->layers[size_t(l)].linear)
      gated_delta_net(l);
    else
      gated_attention(l);
    sparse_moe(l);
  }
}

void GpuForward::gated_attention(int l) {
  const GpuModel::Attn& w = g_->layers[size_t(l)].attn;
  const int nh = c_.num_heads, nkv = c_.num_kv_heads, hd = c_.head_dim;
  LayerDev& d = dev_[size_t(l)];
  project({{w.q, p1_}, {w.k, p2_}, {w.v, p3_}}, h_, g_->layers[size_t(l)].in_norm);
  mark("attn: norm + q, k, v");
  const float scale = 1.0f / std::sqrt(float(hd));
  if (mixer_step_ && hd <= 256) {  // the prep inside the attention kernel
    cu::attention_step(p1_, p2_, p3_, w.q_norm, w.k_norm, nh, nkv, hd, c_.attn_output_gate, c_.rotary_dim(), 0,
                       d_pos_, c_.rope_theta, c_.rms_norm_eps, scale, d.k, d.v, core_, s_);
    mark("attn: q/k norm, rope, kv write, attention");
  } else {
    cu::attn_prep(p1_, p2_, p3_, w.q_norm, w.k_norm, nh, nkv, hd, c_.attn_output_gate, c_.rotary_dim(), 0, d_pos_,
                  c_.rope_theta, c_.rms_norm_eps, q_, gate_, d.k, d.v, s_);
    mark("attn: q/k norm, rope, kv write");
    cu::attention_decode_at(q_, d.k, d.v, 0, d_pos_, nh, nkv, hd, scale, c_.attn_output_gate ? gate_ : nullptr,
                            core_, s_);
    mark("attn: attention");
  }
  project({{w.o, h_, true}}, core_, nullptr);  // h += o_proj(attention)
  mark("attn: h += o_proj");
}

void GpuForward::gated_delta_net(int l) {
  const GpuModel::Gdn& w = g_->layers[size_t(l)].gdn;
  const int hk = c_.linear_num_key_heads, hv = c_.linear_num_value_heads;
  const int dk = c_.linear_key_head_dim, dv = c_.linear_value_head_dim;
  const int64_t C = c_.conv_dim(), kd = c_.linear_key_dim();
  LayerDev& d = dev_[size_t(l)];
  float* b = ba_;
  float* a = ba_ + hv;
  const float* in_norm = g_->layers[size_t(l)].in_norm;
  const float q_scale = 1.0f / std::sqrt(float(dk));
  const bool grouped = c_.family == Family::Qwen3Next;
  if (grouped)
    project({{w.qkvz, p1_}, {w.ba, p2_}}, h_, in_norm);
  else
    project({{w.qkv, mixed_}, {w.z, z_}, {w.b, b}, {w.a, a}}, h_, in_norm);
  mark("gdn: norm + projections");
  // The conv, the norms and the delta rule in one launch where the device allows.
  const cu::DeltaNetIn in = grouped ? cu::DeltaNetIn{true, p1_, nullptr, p2_, nullptr}
                                    : cu::DeltaNetIn{false, mixed_, z_, b, a};
  if (mixer_step_ && cu::deltanet_step(in, w.conv, d.conv, w.A_log, w.dt_bias, d.ssm, w.norm, 1e-6f, q_scale,
                                     c_.rms_norm_eps, hk, hv, dk, dv, c_.linear_conv_kernel_dim, core_, s_,
                                     /*state_early=*/true)) {  // the predecessor: the projections above
    mark("gdn: conv, l2, delta rule + gated norm");
  } else {
    if (grouped) {
      cu::deltanet_prep_grouped(p1_, p2_, w.conv, d.conv, hk, hv / hk, dk, dv, c_.linear_conv_kernel_dim, 1e-6f,
                                q_scale, mixed_, u_, z_, b, a, s_);
    } else {
      cu::conv1d_silu_step(mixed_, w.conv, d.conv, C, c_.linear_conv_kernel_dim, u_, s_);
      cu::l2_norm_qk(u_, hk, dk, 1e-6f, q_scale, s_);  // q then k: contiguous in u_
    }
    mark("gdn: unpack, conv, l2");
    cu::delta_rule_norm_step(u_, u_ + kd, u_ + 2 * kd, b, a, w.A_log, w.dt_bias, d.ssm, z_, w.norm, c_.rms_norm_eps,
                             hk, hv, dk, dv, core_, s_);
    mark("gdn: delta rule + gated norm");
  }
  project({{w.out, h_, true}}, core_, nullptr);  // h += out_proj(core)
  mark("gdn: h += out_proj");
}

void GpuForward::sparse_moe(int l) {
  const GpuModel::Layer& w = g_->layers[size_t(l)];
  const int64_t H = c_.hidden_size, I = c_.moe_intermediate_size, SI = c_.shared_expert_intermediate_size;
  const int E = c_.num_experts, k = c_.num_experts_per_tok;
  // x = norm(h); router logits and the shared expert's gate logit in one launch. Router: softmax,
  // top-k, renormalise (3.10); the ids go to the host while the shared expert runs.
  const bool on_device = g_->all_resident();
  const cu::ExpertLayout& lay = g_->layout();
  const void* const* table = g_->table(l);
  const cu::SharedExpert* sh = shared_fused_ ? &shared_[size_t(l)] : nullptr;
  project({{w.router, router_}, {w.sh_expert_gate, sg_}}, h_, w.post_norm);
  mark("moe: norm + router, shared gate");
  if (on_device && experts_fused_ && sh && route_in_act_) {  // the top-k inside the experts' first kernel
    cu::expert_act_routed(lay, table, router_, E, k, c_.norm_topk_prob, sh, x_, ids_, w_, act_, s_);
    mark("moe: top-k + experts gate, up, SiLU");
    cu::expert_down_add(lay, table, ids_, w_, k, sh, act_, h_, s_, /*ids_early=*/false);
    mark("moe: h += experts down");
    return;
  }
  cu::router_topk(router_, 1, E, k, c_.norm_topk_prob, ids_, w_, s_);
  mark("moe: top-k");
  if (!on_device) {
    cu::gpu_download_async(h_ids_, ids_, size_t(k) * sizeof(int32_t), s_);
    cu::event_record(ids_ready_, s_);
  }
  // The shared expert with its sigmoid gate: h += sigmoid(g x) * down(SiLU(gate x) * up x); fused
  // into the routed experts' kernels where it can be (sh).
  if (!sh) {
    project({{w.sh_gate, sh_}, {w.sh_up, su_}}, x_, nullptr);
    cu::silu_mul(sh_, su_, SI, sh_, s_);
    project({{w.sh_down, sy_}}, sh_, nullptr);
    cu::add_sigmoid_scaled(h_, sy_, sg_, H, s_);
  }
  if (on_device) {  // everything in one go: hits are counted per step (this may be a graph capture)
    if (experts_fused_) {
      cu::expert_act(lay, table, ids_, k, sh, x_, act_, s_);
      mark("moe: experts gate, up, SiLU");
      cu::expert_down_add(lay, table, ids_, w_, k, sh, act_, h_, s_);
      mark("moe: h += experts down");
      return;
    }
    cu::expert_gate_up(lay, table, ids_, k, x_, eg_, eu_, s_);
    cu::silu_mul(eg_, eu_, int64_t(k) * I, eg_, s_);
    cu::expert_down(lay, table, ids_, k, eg_, ey_, s_);
    cu::moe_combine(h_, ey_, w_, k, H, s_);
    return;
  }
  if (sh) {  // the shared expert alone while the ids travel
    cu::expert_act(lay, table, ids_, 0, sh, x_, act_, s_);
    cu::expert_down_add(lay, table, ids_, w_, 0, sh, act_, h_, s_);
  }

  // Routed experts: h += sum_i w_i down_i(SiLU(gate_i x) * up_i x).
  auto compute = [&](int g0, int n) {
    if (experts_fused_) {
      cu::expert_act(lay, table, ids_ + g0, n, nullptr, x_, act_, s_);
      cu::expert_down_add(lay, table, ids_ + g0, w_ + g0, n, nullptr, act_, h_, s_);
      return;
    }
    if (g_->grouped()) {
      cu::expert_gate_up(lay, table, ids_ + g0, n, x_, eg_, eu_, s_);
      cu::silu_mul(eg_, eu_, int64_t(n) * I, eg_, s_);
      cu::expert_down(lay, table, ids_ + g0, n, eg_, ey_, s_);
      cu::moe_combine(h_, ey_, w_ + g0, n, H, s_);
      return;
    }
    for (int i = 0; i < n; ++i) {
      const void* base = g_->slot_of(l, h_ids_[g0 + i]);
      cu::matmul(at_base(lay.gate, base), x_, 1, eg_, s_);
      cu::matmul(at_base(lay.up, base), x_, 1, eu_, s_);
      cu::silu_mul(eg_, eu_, I, eg_, s_);
      cu::matmul(at_base(lay.down, base), eg_, 1, ey_, s_);
      cu::axpy(h_, ey_, H, 0.0f, w_ + g0 + i, s_);
    }
  };
  cu::event_sync(ids_ready_);
  const int group = int(std::min<int64_t>(k, g_->group_limit() > 0 ? g_->group_limit() : k));
  for (int g0 = 0; g0 < k; g0 += group) {
    const int n = std::min(group, k - g0);
    g_->ensure(l, h_ids_ + g0, n, s_, g0 > 0 ? group_done_ : nullptr);
    compute(g0, n);
    cu::event_record(group_done_, s_);
  }
}

StateSnapshot GpuForward::snapshot(const SessionState& st) {
  SWIFTLET_CHECK(st.pos == pos_, "GPU state at {} but the session at {}", pos_, st.pos);
  StateSnapshot s;
  s.pos = st.pos;
  s.conv.resize(size_t(c_.num_layers));
  s.ssm.resize(size_t(c_.num_layers));
  for (int l = 0; l < c_.num_layers; ++l) {
    const LayerDev& d = dev_[size_t(l)];
    if (!d.conv) continue;
    s.conv[size_t(l)].resize(st.layers[size_t(l)].conv.size());
    s.ssm[size_t(l)].resize(st.layers[size_t(l)].ssm.size());
    cu::gpu_download(s.conv[size_t(l)].data(), d.conv, s.conv[size_t(l)].size() * 4, s_);
    cu::gpu_download(s.ssm[size_t(l)].data(), d.ssm, s.ssm[size_t(l)].size() * 4, s_);
  }
  return s;
}

void GpuForward::restore(SessionState& st, const StateSnapshot& snap) {
  SWIFTLET_CHECK(snap.pos <= pos_, "snapshot at {} is past the GPU state at {}", snap.pos, pos_);
  st.restore(snap);  // pos, tokens and the host copy of the recurrent states
  for (int l = 0; l < c_.num_layers; ++l) {
    const LayerDev& d = dev_[size_t(l)];
    if (!d.conv) continue;
    cu::gpu_upload(d.conv, snap.conv[size_t(l)].data(), snap.conv[size_t(l)].size() * 4, s_);
    cu::gpu_upload(d.ssm, snap.ssm[size_t(l)].data(), snap.ssm[size_t(l)].size() * 4, s_);
  }
  cu::gpu_sync(s_);
  pos_ = snap.pos;  // the KV cache rows before it are unchanged
}

void GpuForward::reset(SessionState& st) {
  st.reset();
  for (auto& d : dev_) {
    if (!d.conv) continue;
    cu::gpu_memset(d.conv, 0, size_t((c_.linear_conv_kernel_dim - 1) * c_.conv_dim()) * 4, s_);
    cu::gpu_memset(d.ssm, 0, size_t(c_.linear_num_value_heads) * c_.linear_key_head_dim * c_.linear_value_head_dim * 4,
                   s_);
  }
  cu::gpu_sync(s_);
  pos_ = 0;
}

}  // namespace

bool gpu_usable(std::string* reason) { return cu::cuda_available(reason); }
void* gpu_host_alloc(size_t bytes) { return cu::gpu_alloc_pinned(bytes); }
void gpu_host_free(void* p) { cu::gpu_free_pinned(p); }

std::shared_ptr<GpuModel> make_gpu_model(const Model& m, const GpuOptions& opts, std::string* reason) {
  std::string why;
  if (!cu::cuda_available(&why)) {
    if (reason) *reason = why;
    return nullptr;
  }
  return std::make_shared<GpuModel>(m, opts);
}

std::unique_ptr<ForwardPass> make_gpu_forward(std::shared_ptr<GpuModel> g) {
  return std::make_unique<GpuForward>(std::move(g));
}

GpuStats gpu_stats(const GpuModel& g) { return g.stats(); }

std::string gpu_decode_profile(const ForwardPass& f) {
  const auto* g = dynamic_cast<const GpuForward*>(&f);
  return g ? g->profile_report() : "";
}

std::string gpu_host_timing(const ForwardPass& f) {
  const auto* g = dynamic_cast<const GpuForward*>(&f);
  return g ? g->host_timing_report() : "";
}

std::string gpu_summary(const GpuModel& g) {
  const GpuStats s = g.stats();
  return fmt::format(
      "{}: dense weights {:.2f} GB, expert cache {:.2f} GB ({} "
      "slots of {:.2f} MB{})",
      cu::device_description(), double(s.dense_bytes) / 1e9, double(s.cache_bytes) / 1e9, s.slots,
      double(s.slot_bytes) / 1e6, s.all_resident ? ", every expert resident" : "");
}

}  // namespace swiftlet

#else  // no CUDA in this build

namespace swiftlet {

class GpuModel {};

bool gpu_usable(std::string* reason) {
  if (reason)
    *reason =
        "this swiftlet was built without CUDA (configure with "
        "-DSWIFTLET_CUDA=ON and nvcc)";
  return false;
}
void* gpu_host_alloc(size_t) { return nullptr; }
void gpu_host_free(void*) {}

std::shared_ptr<GpuModel> make_gpu_model(const Model&, const GpuOptions&, std::string* reason) {
  gpu_usable(reason);
  return nullptr;
}
std::unique_ptr<ForwardPass> make_gpu_forward(std::shared_ptr<GpuModel>) { return nullptr; }
GpuStats gpu_stats(const GpuModel&) { return {}; }
std::string gpu_decode_profile(const ForwardPass&) { return ""; }
std::string gpu_host_timing(const ForwardPass&) { return ""; }
std::string gpu_summary(const GpuModel&) { return ""; }

}  // namespace swiftlet

#endif
