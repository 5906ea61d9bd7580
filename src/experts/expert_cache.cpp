#include "experts/expert_cache.h"

#include "core/error.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

namespace swiftlet {

namespace {

// Makes every page of [p, p + n) resident and writable now: MADV_POPULATE_WRITE (Linux 5.14),
// else a write to each page (the slot holds nothing yet).
void populate(uint8_t* p, size_t n) {
#ifdef MADV_POPULATE_WRITE
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(4095);
  if (madvise(reinterpret_cast<void*>(a), n + (reinterpret_cast<uintptr_t>(p) - a), MADV_POPULATE_WRITE) == 0) return;
#endif
  for (size_t i = 0; i < n; i += 4096) static_cast<volatile uint8_t*>(p)[i] = 0;
}

}  // namespace

ExpertCache::ExpertCache(int layers, int experts, size_t slot_bytes, size_t budget_bytes, Alloc alloc,
                         Free free, int reserve, int floor)
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
  layer_evictable_.resize(size_t(layers));
  held_.assign(size_t(layers), 0);
  reserve_ = std::max(0, reserve);
  floor_ = std::max(0, floor);
  if (reserve_ > 0 && capacity_ > floor_) grower_ = std::thread([this] { grow(); });  // see the header
}

ExpertCache::~ExpertCache() {
  if (grower_.joinable()) {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    grower_.join();
  }
  for (uint8_t* s : slots_) free_(s);
  for (uint8_t* s : ready_) free_(s);
}

size_t ExpertCache::allocated_bytes() const {
  std::lock_guard lock(mu_);
  return (slots_.size() + ready_.size()) * slot_bytes_;
}

// The background thread: prepares slots while fewer than reserve_ wait and the budget allows,
// resting kRestFactor times as long as each slot took, so that it takes at most a quarter of a core
// from the computation beside it (a 6 GB cache's pages cost ~30 s of a core on the virtual machines
// measured, most of it while the first prompt runs). An allocation failure ends it quietly; the
// caller's thread then allocates and reports.
void ExpertCache::grow() {
  constexpr int kRestFactor = 3;
  for (;;) {
    {
      std::unique_lock lock(mu_);
      // The thread prepares only the slots past the floor: the caller's thread allocates the rest.
      cv_.wait(lock, [&] {
        return stop_ || (int(ready_.size()) < reserve_ && planned_ < capacity_ && grown_ < capacity_ - floor_);
      });
      if (stop_) return;
      planned_++;
      grown_++;
    }
    const auto start = std::chrono::steady_clock::now();
    void* p = alloc_(slot_bytes_);
    if (p) populate(static_cast<uint8_t*>(p), slot_bytes_);
    const auto spent = std::chrono::steady_clock::now() - start;
    {
      std::lock_guard lock(mu_);
      if (p) ready_.push_back(static_cast<uint8_t*>(p));
      else {
        planned_--;
        grown_--;
      }
    }
    cv_.notify_all();
    if (!p) return;
    std::unique_lock lock(mu_);
    if (cv_.wait_for(lock, kRestFactor * spent, [&] { return stop_; })) return;
  }
}

int ExpertCache::add_slot(uint8_t* p) {
  if (!p) return -1;
  slots_.push_back(p);
  meta_.emplace_back();
  return int(slots_.size()) - 1;
}

// A slot the background thread prepared, or null. With `wait`, when the rest of the budget is
// being prepared right now (so nothing could be allocated here), waits for it.
uint8_t* ExpertCache::take_ready(bool wait) {
  if (!grower_.joinable()) return nullptr;
  std::unique_lock lock(mu_);
  if (wait && ready_.empty() && planned_ >= capacity_ && int(slots_.size()) < planned_)
    cv_.wait(lock, [&] { return !ready_.empty() || int(slots_.size()) >= planned_; });
  if (ready_.empty()) return nullptr;
  uint8_t* p = ready_.back();
  ready_.pop_back();
  lock.unlock();
  cv_.notify_all();  // the thread may prepare another
  return p;
}

// A slot allocated on the caller's thread, or null when the budget is allocated already.
uint8_t* ExpertCache::allocate_now() {
  {
    std::lock_guard lock(mu_);
    if (planned_ >= capacity_) return nullptr;
    planned_++;
  }
  void* p = alloc_(slot_bytes_);
  if (!p) {
    std::lock_guard lock(mu_);
    planned_--;
    fail("cannot allocate {} bytes for an expert cache slot (out of memory?)", slot_bytes_);
  }
  return static_cast<uint8_t*>(p);
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
  std::set<Rank>& own = layer_evictable_[size_t(m.layer)];
  if (before) {
    evictable_.erase(rank(slot));
    own.erase(rank(slot));
  } else {
    evictable_.insert(rank(slot));
    own.insert(rank(slot));
  }
}

int ExpertCache::victim(int layer, const std::function<bool(int)>& may_evict) const {
  auto ok = [&](const Rank& r) { return !may_evict || may_evict(std::get<2>(r)); };
  if (shares_ && layers_ > 1) {
    if (held_[size_t(layer)] >= share(layer)) {
      for (const Rank& r : layer_evictable_[size_t(layer)])
        if (ok(r)) return std::get<2>(r);
    } else {
      for (const Rank& r : evictable_) {
        const int l = meta_[size_t(std::get<2>(r))].layer;
        if (held_[size_t(l)] > share(l) && ok(r)) return std::get<2>(r);
      }
    }
  }
  for (const Rank& r : evictable_)
    if (ok(r)) return std::get<2>(r);
  return -1;
}

int ExpertCache::claim(int layer, int expert, bool* evicted, const std::function<bool(int)>& may_evict) {
  SWIFTLET_CHECK(where_[key(layer, expert)] < 0, "layer {} expert {} is already cached", layer, expert);
  if (evicted) *evicted = false;
  int slot = -1;
  if (!free_list_.empty()) {
    slot = free_list_.back();
    free_list_.pop_back();
  }
  // Below the floor, or without a background thread, a fresh slot is allocated here while the
  // budget allows, and the reads fault it in (reads into the thread's prepared slots ran slower);
  // past the floor a prepared slot is taken, else an expert is evicted, and only then is memory
  // allocated here.
  const bool room = int(slots_.size()) < capacity_;
  if (slot < 0 && room && int(slots_.size()) < floor_) slot = add_slot(allocate_now());
  if (slot < 0 && room) slot = add_slot(take_ready(false));
  const bool holds_all = size_t(capacity_) == where_.size();  // evicting would only mean reading again
  if (slot < 0 && room && (!grower_.joinable() || holds_all)) slot = add_slot(allocate_now());
  if (slot < 0) {
    slot = victim(layer, may_evict);
    if (slot >= 0) {
      update_evictable(slot, true);
      const Meta& old = meta_[size_t(slot)];
      where_[key(old.layer, old.expert)] = -1;
      last_evicted_ = {old.layer, old.expert};
      held_[size_t(old.layer)]--;
      if (evicted) *evicted = true;
    }
  }
  if (slot < 0 && room && grower_.joinable()) slot = add_slot(allocate_now());
  if (slot < 0 && room && grower_.joinable()) slot = add_slot(take_ready(true));  // the last ones in preparation
  if (slot < 0) return -1;
  Meta& m = meta_[size_t(slot)];
  m = Meta{State::Loading, layer, expert, 0, ++tick_};  // newest: not the next victim
  where_[key(layer, expert)] = slot;
  held_[size_t(layer)]++;
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
  if (m.layer >= 0) {
    where_[key(m.layer, m.expert)] = -1;
    held_[size_t(m.layer)]--;
  }
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
