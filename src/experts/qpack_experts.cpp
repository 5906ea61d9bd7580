#include "experts/qpack_experts.h"

#include "core/data_error.h"
#include "core/error.h"

#include <algorithm>

namespace swiftlet {

namespace {
double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

QpackExperts::QpackExperts(const QpackContainer& qc, QpackExpertsOptions opts)
    : dir_(qc.dir), config_(qc.config), layout_(qc.layout),
      verify_(opts.verify && qc.checksums.has_value()), io_(opts.io),
      cache_(qc.layout.layer_count, qc.layout.expert_count, size_t(qc.layout.expert_stride),
             opts.cache_bytes, std::move(opts.alloc), std::move(opts.free), opts.prepared_slots,
             qc.config.num_experts_per_tok * qc.layout.layer_count),
      reader_(opts.reader ? std::move(opts.reader) : make_expert_reader(qc, opts.io, cache_.capacity())) {
  if (verify_) sums_ = qc.checksums->experts;
  for (int p = 0; p < 3; ++p) views_[size_t(p)] = layout_.projection_view(p, config_);
  const int want = opts.max_batch > 0 ? opts.max_batch : 4 * std::max(1, qc.config.num_experts_per_tok);
  max_batch_ = std::max(1, std::min(want, cache_.capacity()));
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

void QpackExperts::collect(bool wait) {
  done_.clear();
  reader_->reap(wait, done_);
  for (const ReadDone& d : done_) finish(d);
}

void QpackExperts::finish(const ReadDone& d) {
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
  for (int32_t e : experts)
    if (cache_.find(layer, e) < 0 && start_read(layer, e, Read::Prefetch) < 0) break;  // no room now
}

void QpackExperts::predict(int layer, std::span<const int32_t> experts) {
  if (io_ == IoMode::Serial || layer < 0 || layer >= layout_.layer_count) return;
  if (in_flight_ > 0) collect(false);
  for (int32_t e : experts)
    if (cache_.find(layer, e) < 0 && start_read(layer, e, Read::Speculative) < 0) break;
}

bool QpackExperts::ready(int layer, int expert) const {
  const int slot = cache_.find(layer, expert);
  return slot >= 0 && cache_.state(slot) == ExpertCache::State::Ready;
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
  for (size_t i = 0; i < slots.size(); ++i) {
    const int s = slots[i];
    while (cache_.state(s) == ExpertCache::State::Loading && errors_[size_t(s)].empty()) {
      waited = true;
      collect(true);
    }
    if (!errors_[size_t(s)].empty()) {
      const std::string msg = errors_[size_t(s)];
      give_up(slots.size());
      fail_data("{}", msg);
    }
  }
  if (waited || io_ == IoMode::Serial) stats_.wait_seconds += seconds(Clock::now() - t0);
  for (size_t i = 0; i < slots.size(); ++i) {
    const int s = slots[i];
    cache_.use(s);
    used_in_[size_t(s)] = steps_[size_t(layer)];
    if (fresh_[size_t(s)]) {
      stats_.misses++;
      if (speculative_[size_t(s)]) stats_.predicted_used++;
      fresh_[size_t(s)] = speculative_[size_t(s)] = 0;
    } else {
      stats_.hits++;
    }
    pinned_.push_back(s);
    const uint8_t* blob = cache_.data(s);
    out[i].gate = views_[0].at(blob);
    out[i].up = views_[1].at(blob);
    out[i].down = views_[2].at(blob);
    out[i].blob = blob;
    out[i].blob_bytes = size_t(layout_.expert_stride);
  }
}

void QpackExperts::release(int layer) {
  std::erase_if(pinned_, [&](int s) {
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
