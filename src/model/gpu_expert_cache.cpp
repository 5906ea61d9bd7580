// GpuModel's VRAM expert cache: the slot layout learnt from the first expert, uploads of misses on
// a copy stream, eviction, and the start-up preload when every expert fits (gpu_model.h).
#include "model/gpu_model.h"

#if SWIFTLET_HAVE_CUDA

#include "core/error.h"

#include <algorithm>
#include <span>

namespace swiftlet {

namespace {

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

bool aligned16(const cu::GpuMatrix& m) {
  auto a = [](const void* p) { return reinterpret_cast<size_t>(p) % 16 == 0; };
  return a(m.data) && (m.format != WeightFormat::Affine || (a(m.scales) && a(m.biases)));
}

bool groupable(const cu::GpuMatrix& m) {
  return m.format == WeightFormat::Affine && (m.bits == 4 || m.bits == 8) && m.group_size > 0 &&
         m.group_size % (128 / m.bits) == 0 && m.cols % m.group_size == 0;
}

}  // namespace

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
  SWIFTLET_CHECK(opts.make_slots, "GpuOptions::make_slots is required for a model with routed experts");
  placement_ = opts.make_slots(c.num_layers, c.num_experts, int(slots_));
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
  std::vector<int> group_slots;  // pinned (never evicted) until the group is in
  for (int i = 0; i < n; ++i) {
    const int s = placement_->use(layer, ids[i]);
    if (s >= 0) {
      ++stats_.hits;
      group_slots.push_back(s);
    } else {
      ++stats_.misses;
      missing.push_back(ids[i]);
    }
  }
  if (!missing.empty()) {
    const auto t0 = GpuClock::now();
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
        int old_layer = -1, old_expert = -1;
        const int s = placement_->place(layer, part[i], &old_layer, &old_expert);
        SWIFTLET_CHECK(s >= 0, "VRAM expert cache: all {} slots in use", slots_);
        if (old_layer >= 0) {
          h_table_[size_t(int64_t(old_layer) * E + old_expert)] = nullptr;
          ++stats_.evictions;
        }
        const int64_t key = int64_t(layer) * E + part[i];
        void* slot = arena_ + size_t(s) * slot_bytes_;
        upload_expert(host_[i], slot);
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
  for (int s : group_slots) placement_->unpin(s);
}

void GpuModel::preload() {
  const int E = c.num_experts;
  const auto t0 = GpuClock::now();
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

}  // namespace swiftlet

#endif
