#include "experts/expert_cache.h"

#include "core/error.h"

#include <algorithm>
#include <cstdlib>

namespace swiftlet {

ExpertCache::ExpertCache(int layers, int experts, size_t slot_bytes, size_t budget_bytes, Alloc alloc,
                         Free free)
    : layers_(layers), experts_(experts), slot_bytes_(slot_bytes), alloc_(std::move(alloc)),
      free_(std::move(free)) {
  SWIFTLET_CHECK(layers > 0 && experts > 0 && slot_bytes > 0, "empty expert cache");
  const size_t all = size_t(layers) * size_t(experts);
  const size_t fit = budget_bytes == 0 ? all : budget_bytes / slot_bytes;
  capacity_ = int(std::clamp<size_t>(fit, 1, all));
  if (!alloc_) alloc_ = [](size_t n) { return std::aligned_alloc(4096, n); };
  if (!free_) free_ = [](void* p) { std::free(p); };
  where_.assign(all, -1);
  freq_.assign(all, 0);
}

ExpertCache::~ExpertCache() {
  for (uint8_t* s : slots_) free_(s);
}

ExpertCache::Rank ExpertCache::rank(int slot) const {
  const Meta& m = meta_[size_t(slot)];
  return {freq_[key(m.layer, m.expert)], m.last, slot};
}

// Called around every change of a slot's state, pins or rank: `before` removes the slot's old
// rank from the evictable set, !before inserts the new one when the slot is evictable.
void ExpertCache::update_evictable(int slot, bool before) {
  const Meta& m = meta_[size_t(slot)];
  if (m.state != State::Ready || m.pins > 0) return;
  if (before) evictable_.erase(rank(slot));
  else evictable_.insert(rank(slot));
}

int ExpertCache::claim(int layer, int expert, bool* evicted, const std::function<bool(int)>& may_evict) {
  SWIFTLET_CHECK(where_[key(layer, expert)] < 0, "layer {} expert {} is already cached", layer, expert);
  if (evicted) *evicted = false;
  int slot = -1;
  if (!free_list_.empty()) {
    slot = free_list_.back();
    free_list_.pop_back();
  }
  if (slot < 0 && int(slots_.size()) < capacity_) {
    void* p = alloc_(slot_bytes_);
    if (!p) fail("cannot allocate {} bytes for an expert cache slot (out of memory?)", slot_bytes_);
    slots_.push_back(static_cast<uint8_t*>(p));
    meta_.emplace_back();
    slot = int(slots_.size()) - 1;
  }
  if (slot < 0) {
    auto it = evictable_.begin();
    if (may_evict)
      while (it != evictable_.end() && !may_evict(std::get<2>(*it))) ++it;
    if (it == evictable_.end()) return -1;
    slot = std::get<2>(*it);
    evictable_.erase(it);
    const Meta& old = meta_[size_t(slot)];
    where_[key(old.layer, old.expert)] = -1;
    if (evicted) *evicted = true;
  }
  Meta& m = meta_[size_t(slot)];
  m = Meta{State::Loading, layer, expert, 0, ++tick_};  // newest: not the next victim
  where_[key(layer, expert)] = slot;
  return slot;
}

void ExpertCache::loaded(int slot) {
  Meta& m = meta_[size_t(slot)];
  SWIFTLET_CHECK(m.state == State::Loading, "slot {} was not loading", slot);
  m.state = State::Ready;
  update_evictable(slot, false);
}

void ExpertCache::drop(int slot) {
  update_evictable(slot, true);
  Meta& m = meta_[size_t(slot)];
  SWIFTLET_CHECK(m.pins == 0, "slot {} is dropped while pinned", slot);
  if (m.layer >= 0) where_[key(m.layer, m.expert)] = -1;
  m = Meta{};
  free_list_.push_back(slot);
}

void ExpertCache::use(int slot) {
  update_evictable(slot, true);
  Meta& m = meta_[size_t(slot)];
  freq_[key(m.layer, m.expert)]++;
  m.last = ++tick_;
  update_evictable(slot, false);
}

void ExpertCache::pin(int slot) {
  update_evictable(slot, true);
  meta_[size_t(slot)].pins++;
}

void ExpertCache::unpin(int slot) {
  Meta& m = meta_[size_t(slot)];
  SWIFTLET_CHECK(m.pins > 0, "slot {} is not pinned", slot);
  m.pins--;
  update_evictable(slot, false);
}

std::vector<int> ExpertCache::eviction_order() const {
  std::vector<int> out;
  for (const Rank& r : evictable_) out.push_back(std::get<2>(r));
  return out;
}

}  // namespace swiftlet
