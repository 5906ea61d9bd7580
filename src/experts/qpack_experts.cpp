#include "experts/qpack_experts.h"

#include "core/data_error.h"
#include "core/error.h"

#include <algorithm>
#include <cstdlib>

namespace swiftlet {

namespace {
double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The most experts acquire() is asked for at once: opts.max_batch, else 4 x top-k, within the cache.
int batch_limit(const QpackExpertsOptions& opts, const ModelConfig& c, int capacity) {
  const int want = opts.max_batch > 0 ? opts.max_batch : 4 * std::max(1, c.num_experts_per_tok);
  return std::max(1, std::min(want, capacity));
}
}  // namespace

QpackExperts::QpackExperts(const QpackContainer& qc, QpackExpertsOptions opts)
    : dir_(qc.dir), config_(qc.config), layout_(qc.layout),
      verify_(opts.verify && qc.checksums.has_value()), io_(opts.io),
      cache_(qc.layout.layer_count, qc.layout.expert_count, size_t(qc.layout.expert_stride),
             opts.cache_bytes, std::move(opts.alloc), std::move(opts.free), opts.prepared_slots,
             qc.config.num_experts_per_tok * qc.layout.layer_count),
      copies_(opts.miss_copies ? MissCopies::open(qc) : std::nullopt),
      reader_(opts.reader ? std::move(opts.reader)
                          : make_expert_reader(qc, opts.io,
                                               cache_.capacity() + (copies_ ? 2 * batch_limit(opts, qc.config,
                                                                                              cache_.capacity()) : 0),
                                               copies_ ? &copies_->layout : nullptr)) {
  if (opts.miss_copies && !copies_)
    fail("--on-miss low-bit: container '{}' has no low-bit copies; add them with swiftlet-repack --add-miss-copy {} "
         "--miss-copy-bits 2 (or 3)", qc.dir, qc.dir);
  if (verify_) sums_ = qc.checksums->experts;
  if (copies_ && !opts.verify) copies_->sums.clear();  // --no-verify
  low_wanted_.assign(size_t(layout_.expert_count), 0);
  for (int p = 0; p < 3; ++p) views_[size_t(p)] = layout_.projection_view(p, config_);
  max_batch_ = batch_limit(opts, qc.config, cache_.capacity());
  // A step holds at most max_batch experts at once; as many again may be read ahead. Each buffer
  // is offered to the reader once, as buffer capacity() + its index.
  if (copies_) copy_bufs_.resize(size_t(2 * max_batch_));
  const size_t slots = size_t(cache_.capacity());
  fresh_.assign(slots, 0);
  speculative_.assign(slots, 0);
  wanted_.assign(slots, 0);
  used_in_.assign(slots, 0);
  steps_.assign(size_t(layout_.layer_count), 0);
  errors_.assign(slots, {});
  stats_.cache_budget = slots * size_t(layout_.expert_stride);
}

QpackExperts::~QpackExperts() {
  // Reads in flight target cache slots: let them land before the cache frees its memory.
  try {
    while (in_flight_ > 0) collect(true);
  } catch (...) {
  }
  reader_.reset();
  for (CopyBuffer& b : copy_bufs_) std::free(b.data);
}

int QpackExperts::start_read(int layer, int expert, Read why) {
  bool evicted = false;
  // Experts read ahead and not used yet are kept while anything else can go; a prediction
  // never pushes them out. The experts the current step found cached are kept while anything
  // else can go: evicting one to read another of the same step would only read it again. Nor
  // does a prediction push out an expert its layer's latest step used: the next token reuses
  // about a fifth of them, and a guess is right about half the time (docs/routing-trace.md).
  const bool speculative = why == Read::Speculative;
  auto latest = [this](int s) {
    const uint32_t step = used_in_[size_t(s)];
    return step != 0 && step == steps_[size_t(cache_.layer_of(s))];
  };
  int slot = cache_.claim(layer, expert, &evicted, [&](int s) {
    return !fresh_[size_t(s)] && !wanted_[size_t(s)] && !(speculative && latest(s));
  });
  if (slot < 0 && why != Read::Speculative)
    slot = cache_.claim(layer, expert, &evicted, [this](int s) { return !wanted_[size_t(s)]; });
  if (slot < 0 && why == Read::Demand) slot = cache_.claim(layer, expert, &evicted);
  if (slot < 0) return -1;
  if (evicted) stats_.evictions++;
  used_in_[size_t(slot)] = 0;
  fresh_[size_t(slot)] = 1;
  speculative_[size_t(slot)] = speculative ? 1 : 0;
  if (speculative) stats_.predicted++;
  if (slot >= registered_) {  // a slot allocated just now: offer it to the reader once
    reader_->register_buffer(slot, cache_.data(slot), size_t(layout_.expert_stride));
    registered_ = slot + 1;
  }
  if (in_flight_++ == 0) busy_since_ = Clock::now();
  reader_->submit(layer, expert, cache_.data(slot), size_t(layout_.expert_stride), uint64_t(slot), slot);
  return slot;
}

bool QpackExperts::wants_copy(int layer, int expert) const {
  return copies_ && layer == low_layer_ && low_wanted_[size_t(expert)] && cache_.find(layer, expert) < 0;
}

int QpackExperts::find_copy(int layer, int expert) const {
  for (size_t i = 0; i < copy_bufs_.size(); ++i)
    if (copy_bufs_[i].layer == layer && copy_bufs_[i].expert == expert) return cache_.capacity() + int(i);
  return -1;
}

int QpackExperts::start_copy_read(int layer, int expert) {
  // A free buffer, else one whose copy landed and is not in use (it is read again if asked for).
  int pick = -1;
  for (size_t i = 0; i < copy_bufs_.size() && pick < 0; ++i)
    if (copy_bufs_[i].layer < 0) pick = int(i);
  for (size_t i = 0; i < copy_bufs_.size() && pick < 0; ++i)
    if (copy_bufs_[i].pins == 0 && !copy_bufs_[i].loading) pick = int(i);
  if (pick < 0) return -1;
  CopyBuffer& b = copy_bufs_[size_t(pick)];
  if (!b.data) {
    b.data = static_cast<uint8_t*>(std::aligned_alloc(4096, size_t(layout_.expert_stride)));
    if (!b.data) fail("cannot allocate {} bytes for a low-bit copy", layout_.expert_stride);
    reader_->register_buffer(cache_.capacity() + pick, b.data, size_t(layout_.expert_stride));
  }
  b.layer = layer;
  b.expert = expert;
  b.loading = true;
  b.error.clear();
  if (in_flight_++ == 0) busy_since_ = Clock::now();
  const uint64_t cs = copies_->layout.stride;  // into the tail, where it expands in place (miss_copy.h)
  reader_->submit(layout_.layer_count + layer, expert, b.data + (layout_.expert_stride - cs), size_t(cs),
                  uint64_t(cache_.capacity() + pick), cache_.capacity() + pick);
  return cache_.capacity() + pick;
}

void QpackExperts::finish_copy(int index, std::string error) {
  CopyBuffer& b = copy_bufs_[size_t(index)];
  const MissCopyLayout& cl = copies_->layout;
  stats_.bytes_read += cl.stride;
  if (error.empty() && !copies_->sums.empty()) {
    const auto t = Clock::now();
    const uint64_t h = xxh3_64(b.data + (layout_.expert_stride - cl.payload()), size_t(cl.payload()));
    stats_.verify_seconds += seconds(Clock::now() - t);
    const uint64_t want = copies_->sums[size_t(b.layer)][size_t(b.expert)];
    if (h != want)
      error = fmt::format("corrupt container '{}': layer {:02d} expert {} low-bit copy checksum mismatch (stored "
                          "{}, read {}) — add the copies again (swiftlet-repack --add-miss-copy)",
                          dir_, b.layer, b.expert, hash_hex(want), hash_hex(h));
  }
  if (error.empty()) expand_miss_copy(layout_, cl, config_, b.data);
  b.loading = false;
  if (error.empty()) return;
  if (b.pins > 0) b.error = std::move(error);  // acquire() is waiting for it: it reports
  else b.layer = b.expert = -1;                // a prefetch; acquire() reads it again and reports
}

void QpackExperts::collect(bool wait) {
  done_.clear();
  reader_->reap(wait, done_);
  for (const ReadDone& d : done_) finish(d);
}

void QpackExperts::finish(const ReadDone& d) {
  if (int(d.tag) >= cache_.capacity()) {
    if (--in_flight_ == 0) stats_.read_seconds += seconds(Clock::now() - busy_since_);
    finish_copy(int(d.tag) - cache_.capacity(), d.error);
    return;
  }
  const int slot = int(d.tag);
  const int layer = cache_.layer_of(slot), expert = cache_.expert_of(slot);
  if (--in_flight_ == 0) stats_.read_seconds += seconds(Clock::now() - busy_since_);
  stats_.bytes_read += layout_.expert_stride;
  std::string error = d.error;
  if (error.empty() && verify_) {
    const auto t = Clock::now();
    const uint64_t h = xxh3_64(cache_.data(slot), layout_.payload());
    stats_.verify_seconds += seconds(Clock::now() - t);
    const uint64_t want = sums_[size_t(layer)][size_t(expert)];
    if (h != want)
      error = fmt::format("corrupt container '{}': layer {:02d} expert {} checksum mismatch (stored {}, "
                          "read {}) — re-run swiftlet-repack or download the container again",
                          dir_, layer, expert, hash_hex(want), hash_hex(h));
  }
  if (error.empty()) {
    cache_.loaded(slot);
  } else if (cache_.pins(slot) > 0) {
    errors_[size_t(slot)] = std::move(error);  // acquire() is waiting for it: it reports
  } else {
    cache_.drop(slot);  // a prefetch; acquire() will read it again and report
    fresh_[size_t(slot)] = speculative_[size_t(slot)] = 0;
  }
}

void QpackExperts::prefetch(int layer, std::span<const int32_t> experts) {
  if (io_ == IoMode::Serial) return;
  SWIFTLET_CHECK(layer >= 0 && layer < layout_.layer_count, "layer {} out of range", layer);
  ++steps_[size_t(layer)];
  if (in_flight_ > 0) collect(false);
  for (int s : wanted_slots_) wanted_[size_t(s)] = 0;
  wanted_slots_.clear();
  for (int32_t e : experts) {
    SWIFTLET_CHECK(e >= 0 && e < layout_.expert_count, "expert {} out of range", e);
    const int s = cache_.find(layer, e);
    if (s < 0) continue;
    wanted_[size_t(s)] = 1;
    wanted_slots_.push_back(s);
  }
  for (int32_t e : experts) {
    if (cache_.find(layer, e) >= 0) continue;
    if (wants_copy(layer, e)) {
      if (find_copy(layer, e) < 0) start_copy_read(layer, e);  // no buffer now: acquire() reads it
      continue;
    }
    if (start_read(layer, e, Read::Prefetch) < 0) break;  // no room now
  }
}

void QpackExperts::read_low_bit(int layer, std::span<const int32_t> experts) {
  if (!copies_) return;
  std::fill(low_wanted_.begin(), low_wanted_.end(), 0);
  low_layer_ = layer;
  for (int32_t e : experts) {
    SWIFTLET_CHECK(e >= 0 && e < layout_.expert_count, "expert {} out of range", e);
    low_wanted_[size_t(e)] = 1;
  }
}

bool QpackExperts::held(int layer, int expert) const { return cache_.find(layer, expert) >= 0; }

void QpackExperts::predict(int layer, std::span<const int32_t> experts) {
  if (io_ == IoMode::Serial || layer < 0 || layer >= layout_.layer_count) return;
  if (in_flight_ > 0) collect(false);
  for (int32_t e : experts)
    if (cache_.find(layer, e) < 0 && start_read(layer, e, Read::Speculative) < 0) break;
}

bool QpackExperts::ready(int layer, int expert) const {
  const int slot = cache_.find(layer, expert);
  if (slot >= 0) return cache_.state(slot) == ExpertCache::State::Ready;
  const int c = wants_copy(layer, expert) ? find_copy(layer, expert) : -1;
  return c >= 0 && !copy_bufs_[size_t(c - cache_.capacity())].loading;
}

void QpackExperts::acquire(int layer, std::span<const int32_t> experts, std::span<ExpertWeights> out) {
  SWIFTLET_CHECK(layer >= 0 && layer < layout_.layer_count, "layer {} out of range", layer);
  SWIFTLET_CHECK(out.size() >= experts.size(), "acquire: output too small");
  SWIFTLET_CHECK(int(experts.size()) <= max_batch_, "acquire of {} experts > max_batch {}", experts.size(),
                 max_batch_);
  const auto t0 = Clock::now();
  bool waited = false;
  // Land what has finished so the reader starts the reads queued behind its depth: a prefill
  // prefetches a whole layer's experts, and the disk would idle while the ready ones are
  // computed if completions were only looked at when acquire has to wait.
  if (in_flight_ > 0) collect(false);
  std::vector<int>& slots = acquiring_;
  slots.assign(experts.size(), -1);
  // Unpins what this call pinned and drops slots whose read failed, so an error leaves the cache
  // as it was.
  auto give_up = [&](size_t n) {
    for (size_t i = 0; i < n; ++i) {
      const int s = slots[i];
      if (is_copy(s)) {
        CopyBuffer& b = copy_buf(s);
        if (--b.pins == 0 && !b.loading) b.layer = b.expert = -1;
        b.error.clear();
        continue;
      }
      cache_.unpin(s);
      if (cache_.state(s) == ExpertCache::State::Loading && !errors_[size_t(s)].empty()) {
        errors_[size_t(s)].clear();
        cache_.drop(s);
        fresh_[size_t(s)] = speculative_[size_t(s)] = 0;
      }
    }
  };
  for (size_t i = 0; i < experts.size(); ++i) {
    const int e = experts[i];
    SWIFTLET_CHECK(e >= 0 && e < layout_.expert_count, "expert {} out of range", e);
    if (wants_copy(layer, e)) {
      int id = find_copy(layer, e);
      while (id < 0) {
        id = start_copy_read(layer, e);
        if (id >= 0) break;
        SWIFTLET_CHECK(in_flight_ > 0, "{} low-bit copy buffers are all in use for layer {}", copy_bufs_.size(), layer);
        waited = true;
        collect(true);
        id = find_copy(layer, e);
      }
      copy_buf(id).pins++;
      slots[i] = id;
      continue;
    }
    int slot = cache_.find(layer, e);
    while (slot < 0) {
      slot = start_read(layer, e, Read::Demand);
      if (slot >= 0) break;
      // Every slot is pinned or being read: wait for a read to land, then try again.
      SWIFTLET_CHECK(in_flight_ > 0, "expert cache of {} slots has none free for layer {}", cache_.capacity(), layer);
      waited = true;
      collect(true);
      slot = cache_.find(layer, e);
    }
    cache_.pin(slot);
    slots[i] = slot;
  }
  // Wait for what is still being read.
  auto loading = [&](int s) {
    if (is_copy(s)) return copy_buf(s).loading;
    return cache_.state(s) == ExpertCache::State::Loading && errors_[size_t(s)].empty();
  };
  for (size_t i = 0; i < slots.size(); ++i) {
    const int s = slots[i];
    while (loading(s)) {
      waited = true;
      collect(true);
    }
    const std::string& error = is_copy(s) ? copy_buf(s).error : errors_[size_t(s)];
    if (!error.empty()) {
      const std::string msg = error;
      give_up(slots.size());
      fail_data("{}", msg);
    }
  }
  if (waited || io_ == IoMode::Serial) stats_.wait_seconds += seconds(Clock::now() - t0);
  for (size_t i = 0; i < slots.size(); ++i) {
    const int s = slots[i];
    pinned_.push_back(s);
    if (is_copy(s)) {  // read for this step: a miss, lossy
      stats_.misses++;
      stats_.low_bit++;
      set_views(out[i], copy_buf(s).data);
      continue;
    }
    cache_.use(s);
    used_in_[size_t(s)] = steps_[size_t(layer)];
    if (fresh_[size_t(s)]) {
      stats_.misses++;
      if (speculative_[size_t(s)]) stats_.predicted_used++;
      fresh_[size_t(s)] = speculative_[size_t(s)] = 0;
    } else {
      stats_.hits++;
    }
    set_views(out[i], cache_.data(s));
  }
}

void QpackExperts::set_views(ExpertWeights& w, const uint8_t* blob) const {
  w.gate = views_[0].at(blob);
  w.up = views_[1].at(blob);
  w.down = views_[2].at(blob);
  w.blob = blob;
  w.blob_bytes = size_t(layout_.expert_stride);
}

void QpackExperts::release(int layer) {
  std::erase_if(pinned_, [&](int s) {
    if (is_copy(s)) {
      CopyBuffer& b = copy_buf(s);
      if (b.layer != layer) return false;
      if (--b.pins == 0) b.layer = b.expert = -1;  // a copy serves its step only
      return true;
    }
    if (cache_.layer_of(s) != layer) return false;
    cache_.unpin(s);
    return true;
  });
}

ExpertStats QpackExperts::expert_stats() const {
  ExpertStats s = stats_;
  s.cache_bytes = cache_.allocated_bytes();
  return s;
}

}  // namespace swiftlet
