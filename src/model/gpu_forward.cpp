// The CUDA forward pass (issue 8): one session's device state over a shared GpuModel, and the
// public entry points of gpu_forward.h. The math runs in forward order as qwen3_hybrid.cpp:
// gpu_decode.cpp takes one token, gpu_prefill.cpp a prompt; gpu_weights.cpp and
// gpu_expert_cache.cpp hold the model's side (gpu_model.h).
#include "model/gpu_forward.h"

#if SWIFTLET_HAVE_CUDA

#include "core/error.h"
#include "model/gpu_forward_pass.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

namespace swiftlet {

GpuForward::GpuForward(std::shared_ptr<GpuModel> g, bool profile) : g_(std::move(g)), c_(g_->c), prof_(profile) {
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
  p1_ = buf(size_t(c.q_proj_rows()));
  p2_ = buf(size_t(kvd));
  p3_ = buf(size_t(kvd));
  mixed_ = buf(size_t(C));
  u_ = buf(size_t(C));
  z_ = buf(size_t(vd));
  ba_ = buf(size_t(2 * hv));
  core_ = buf(size_t(std::max(c.attn_out_dim(), vd)));
  router_ = buf(size_t(c.num_experts));
  ids_ = reinterpret_cast<int32_t*>(buf(size_t(k)));
  w_ = buf(size_t(k));
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
  if (c.num_experts > 0 && g_->grouped()) {
    // Prompt rows are quantised for the experts' group size (most of a prompt's products).
    if (g_->layout().gate.format == WeightFormat::Affine) q_group_ = g_->layout().gate.group_size;
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
  d_own_states_ = static_cast<float**>(cu::gpu_alloc(size_t(2 * c.num_layers) * sizeof(float*)));
  h_own_states_.assign(size_t(2 * c.num_layers), nullptr);
  publish_states();
  one_.step = {1, d_pos_, d_own_states_, h_own_states_.data()};
  one_.states_stride = 2;
  one_.tok = d_tok_;
  one_.h = h_;
  one_.x = x_;
  one_.p1 = p1_;
  one_.p2 = p2_;
  one_.p3 = p3_;
  one_.mixed = mixed_;
  one_.u = u_;
  one_.z = z_;
  one_.b = ba_;
  one_.a = ba_ + hv;
  one_.core = core_;
  one_.router = router_;
  one_.sg = sg_;
  one_.w = w_;
  one_.act = act_;
  one_.eu = eu_;
  one_.ey = ey_;
  one_.ids = ids_;
  cu::gpu_sync(s_);
}

void GpuForward::publish_states() {
  for (int l = 0; l < c_.num_layers; ++l) {
    const LayerDev& d = dev_[size_t(l)];
    h_own_states_[size_t(2 * l)] = d.conv ? d.conv : d.k;
    h_own_states_[size_t(2 * l + 1)] = d.conv ? d.ssm : d.v;
  }
  cu::gpu_upload(d_own_states_, h_own_states_.data(), h_own_states_.size() * sizeof(float*), s_);
}

GpuForward::~GpuForward() {
  cu::gpu_sync(s_);
  free_batch();
  cu::graph_destroy(graph_);
  free_rows();
  cu::gpu_free(d_own_states_);
  for (void* p : bufs_) cu::gpu_free(p);
  for (auto& d : dev_) {
    cu::gpu_free(d.k);
    cu::gpu_free(d.v);
  }
  cu::gpu_free_pinned(h_ids_);
  cu::gpu_free_pinned(h_logits_);
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
  publish_states();
}

void GpuForward::run(SessionState& st, std::span<const int32_t> tokens, LogitsMode mode, std::vector<float>& logits,
                     int64_t from) {
  check_state(st);
  if (st.pos == 0 && pos_ != 0) reset(st);
  logits.clear();
  const int64_t T = int64_t(tokens.size());
  if (T == 0) return;
  for (int32_t id : tokens) check_token(id);
  reserve_kv(pos_ + T);
  from = std::clamp<int64_t>(from, 0, T);
  if (prefill(tokens, mode, from, logits)) {
    cu::gpu_sync(s_);
    advance(st, tokens);
    return;
  }
  using Clock = HostTiming::Clock;
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
  prof_.end(prof_.decode(), 1);
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

void GpuForward::check_state(const SessionState& st) const {
  SWIFTLET_CHECK(st.layers.size() == size_t(c_.num_layers), "session state of another model");
  SWIFTLET_CHECK(st.pos == pos_ || st.pos == 0, "GPU state at {} but the session at {}", pos_, st.pos);
}

void GpuForward::check_token(int32_t id) const {
  if (id < 0 || id >= c_.vocab_size) fail("token id {} is outside the vocabulary (0..{})", id, c_.vocab_size - 1);
}

void GpuForward::advance(SessionState& st, std::span<const int32_t> tokens) {
  pos_ += int64_t(tokens.size());
  st.pos += int64_t(tokens.size());
  st.tokens.insert(st.tokens.end(), tokens.begin(), tokens.end());
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

const SessionState& GpuForward::whole_state(const SessionState& st, SessionState& scratch) {
  SWIFTLET_CHECK(st.pos == pos_, "GPU state at {} but the session at {}", pos_, st.pos);
  scratch.pos = st.pos;
  scratch.tokens = st.tokens;
  scratch.layers.resize(size_t(c_.num_layers));
  const size_t kv = size_t(pos_) * size_t(c_.kv_dim());
  for (int l = 0; l < c_.num_layers; ++l) {
    const LayerDev& d = dev_[size_t(l)];
    LayerState& h = scratch.layers[size_t(l)];
    if (d.conv) {
      h.k.clear();
      h.v.clear();
      h.conv.resize(st.layers[size_t(l)].conv.size());
      h.ssm.resize(st.layers[size_t(l)].ssm.size());
      cu::gpu_download(h.conv.data(), d.conv, h.conv.size() * 4, s_);
      cu::gpu_download(h.ssm.data(), d.ssm, h.ssm.size() * 4, s_);
    } else {
      h.conv.clear();
      h.ssm.clear();
      h.k.resize(kv);
      h.v.resize(kv);
      if (kv > 0) {
        cu::gpu_download(h.k.data(), d.k, kv * 4, s_);
        cu::gpu_download(h.v.data(), d.v, kv * 4, s_);
      }
    }
  }
  cu::gpu_sync(s_);
  return scratch;
}

void GpuForward::load_state(SessionState& st, const SessionState& whole) {
  SWIFTLET_CHECK(whole.layers.size() == size_t(c_.num_layers) && whole.tokens.size() == size_t(whole.pos),
                 "a whole state of another model's shape");
  reserve_kv(whole.pos);
  const size_t kv = size_t(whole.pos) * size_t(c_.kv_dim());
  st.pos = whole.pos;
  st.tokens = whole.tokens;
  for (int l = 0; l < c_.num_layers; ++l) {
    const LayerDev& d = dev_[size_t(l)];
    const LayerState& w = whole.layers[size_t(l)];
    LayerState& h = st.layers[size_t(l)];
    if (d.conv) {
      SWIFTLET_CHECK(w.conv.size() == h.conv.size() && w.ssm.size() == h.ssm.size(), "DeltaNet state of another shape");
      h.conv = w.conv;  // the host copy of the recurrent states, as restore() keeps it
      h.ssm = w.ssm;
      cu::gpu_upload(d.conv, w.conv.data(), w.conv.size() * 4, s_);
      cu::gpu_upload(d.ssm, w.ssm.data(), w.ssm.size() * 4, s_);
    } else {
      SWIFTLET_CHECK(w.k.size() == kv && w.v.size() == kv, "KV cache of {} values, want {}", w.k.size(), kv);
      if (kv > 0) {
        cu::gpu_upload(d.k, w.k.data(), kv * 4, s_);
        cu::gpu_upload(d.v, w.v.data(), kv * 4, s_);
      }
    }
  }
  cu::gpu_sync(s_);
  pos_ = whole.pos;
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

std::unique_ptr<ForwardPass> make_gpu_forward(std::shared_ptr<GpuModel> g, bool profile) {
  return std::make_unique<GpuForward>(std::move(g), profile);
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
std::unique_ptr<ForwardPass> make_gpu_forward(std::shared_ptr<GpuModel>, bool) { return nullptr; }
GpuStats gpu_stats(const GpuModel&) { return {}; }
std::string gpu_decode_profile(const ForwardPass&) { return ""; }
std::string gpu_host_timing(const ForwardPass&) { return ""; }
std::string gpu_summary(const GpuModel&) { return ""; }

}  // namespace swiftlet

#endif
