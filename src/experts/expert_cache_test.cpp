// The expert cache's policy: what it evicts, what it never evicts, and what it allocates.
#include "experts/expert_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

namespace swiftlet {
namespace {

// Loads (layer, expert) into the cache and counts `uses` uses of it.
int put(ExpertCache& c, int layer, int expert, int uses = 1) {
  const int s = c.claim(layer, expert);
  EXPECT_GE(s, 0);
  if (s < 0) return s;
  c.loaded(s);
  for (int i = 0; i < uses; ++i) c.use(s);
  return s;
}

TEST(ExpertCache, EvictsTheLeastUsedThenTheLeastRecent) {
  ExpertCache c(2, 8, 4096, 3 * 4096);
  c.set_layer_shares(false);  // one ranking over both layers
  ASSERT_EQ(c.capacity(), 3);
  put(c, 0, 1, 3);  // used 3 times
  put(c, 0, 2, 1);  // used once, earlier
  put(c, 1, 3, 1);  // used once, later
  EXPECT_EQ(c.allocated(), 3);
  // Full: the next expert replaces the one with the fewest uses, the older one on a tie.
  bool evicted = false;
  const int s = c.claim(1, 4, &evicted);
  EXPECT_TRUE(evicted);
  EXPECT_EQ(c.find(0, 2), -1);
  EXPECT_EQ(c.find(1, 4), s);
  EXPECT_GE(c.find(0, 1), 0);
  EXPECT_GE(c.find(1, 3), 0);
  c.loaded(s);
  c.use(s);
  // Now (1,3) and (1,4) have one use each, (1,3) older: it goes next, then (1,4), then (0,1).
  std::vector<int> order = c.eviction_order();
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(c.expert_of(order[0]), 3);
  EXPECT_EQ(c.expert_of(order[1]), 4);
  EXPECT_EQ(c.expert_of(order[2]), 1);
}

TEST(ExpertCache, EachLayerKeepsItsShareOfTheSlots) {
  // Two layers, 4 slots: a share of 2 each.
  ExpertCache c(2, 8, 4096, 4 * 4096);
  put(c, 0, 0, 5);
  put(c, 0, 1, 5);
  put(c, 0, 2, 5);  // layer 0 holds 3, over its share
  put(c, 1, 0, 1);  // full
  // Layer 1 (1 slot, below its share) takes the lowest of an over-share layer: (0,0) (5 uses,
  // oldest), although (1,0) ranks lowest of all (1 use).
  bool evicted = false;
  int s = c.claim(1, 1, &evicted);
  ASSERT_GE(s, 0);
  EXPECT_TRUE(evicted);
  EXPECT_EQ(c.find(0, 0), -1);
  EXPECT_GE(c.find(1, 0), 0);
  c.loaded(s);
  c.use(s);
  // Now 2 and 2. Layer 0 at its share replaces its own lowest, (0,1) (5 uses, older than (0,2)),
  // not (1,0) or (1,1) (1 use each).
  s = c.claim(0, 3);
  ASSERT_GE(s, 0);
  EXPECT_EQ(c.find(0, 1), -1);
  EXPECT_GE(c.find(0, 2), 0);
  EXPECT_GE(c.find(1, 0), 0);
  EXPECT_GE(c.find(1, 1), 0);
  c.loaded(s);
  // Layer 1 at its share, its own slots vetoed: it falls back to the lowest slot of all, (0,3)
  // (no use yet).
  s = c.claim(1, 2, nullptr, [&](int v) { return c.layer_of(v) != 1; });
  ASSERT_GE(s, 0);
  EXPECT_EQ(c.find(0, 3), -1);
  EXPECT_GE(c.find(0, 2), 0);
  // The same with one ranking over the whole cache: (1,0) (1 use, oldest of the 1-use slots) goes.
  ExpertCache g(2, 8, 4096, 4 * 4096);
  g.set_layer_shares(false);
  put(g, 0, 0, 5);
  put(g, 0, 1, 5);
  put(g, 0, 2, 5);
  put(g, 1, 0, 1);
  put(g, 1, 1, 1);
  EXPECT_EQ(g.find(1, 0), -1);
  EXPECT_GE(g.find(0, 0), 0);
}

TEST(ExpertCache, FrequencyIsRememberedAfterEviction) {
  ExpertCache c(1, 8, 4096, 2 * 4096);
  put(c, 0, 1, 5);
  put(c, 0, 2, 1);
  put(c, 0, 3, 1);  // evicts (0,2)
  EXPECT_EQ(c.find(0, 2), -1);
  put(c, 0, 4, 1);  // evicts (0,3): (0,1) has 5 uses
  EXPECT_GE(c.find(0, 1), 0);
  EXPECT_EQ(c.uses(0, 2), 1u);  // remembered
  // (0,1) is evicted only once its count is matched and it is the older: bring (0,2) back
  // and use it until it outranks (0,1); then the cache keeps (0,2) over a newcomer.
  const int s = put(c, 0, 2, 5);  // evicts (0,4); (0,2) now 6 uses
  EXPECT_EQ(c.uses(0, 2), 6u);
  put(c, 0, 5, 1);  // must evict (0,1) (5 uses) rather than (0,2) (6 uses)
  EXPECT_EQ(c.find(0, 1), -1);
  EXPECT_EQ(c.find(0, 2), s);
}

TEST(ExpertCache, PinnedAndLoadingSlotsAreNeverEvicted) {
  ExpertCache c(1, 16, 4096, 3 * 4096);
  const int a = put(c, 0, 0, 1);
  const int b = put(c, 0, 1, 9);
  const int loading = c.claim(0, 2);  // being read
  ASSERT_GE(loading, 0);
  c.pin(a);
  c.pin(b);
  EXPECT_EQ(c.claim(0, 3), -1) << "every slot is pinned or loading";
  c.unpin(b);
  bool evicted = false;
  const int s = c.claim(0, 3, &evicted);
  EXPECT_EQ(s, b) << "the only unpinned loaded slot is taken, despite its 9 uses";
  EXPECT_TRUE(evicted);
  EXPECT_EQ(c.find(0, 0), a);
  EXPECT_EQ(c.find(0, 2), loading);
  // A veto keeps a slot too.
  c.loaded(s);
  c.loaded(loading);
  c.unpin(a);
  const int t = c.claim(0, 4, nullptr, [&](int slot) { return slot != a; });
  EXPECT_NE(t, a);
  EXPECT_NE(t, -1);
}

TEST(ExpertCache, DroppedSlotIsReusedFirst) {
  ExpertCache c(1, 8, 4096, 2 * 4096);
  const int a = c.claim(0, 0);
  c.drop(a);  // the read failed
  EXPECT_EQ(c.find(0, 0), -1);
  EXPECT_EQ(c.claim(0, 1), a);
  EXPECT_EQ(c.allocated(), 1);
}

TEST(ExpertCache, BudgetBelowOneSlotStillHoldsOneAndZeroHoldsAll) {
  EXPECT_EQ(ExpertCache(2, 8, 4096, 100).capacity(), 1);
  EXPECT_EQ(ExpertCache(2, 8, 4096, 0).capacity(), 16);
  EXPECT_EQ(ExpertCache(2, 8, 4096, 1ull << 40).capacity(), 16);
}

// A random workload: whatever happens, the memory allocated never exceeds the budget, slots are
// allocated only when needed, pinned experts stay, and find() agrees with a model of the cache.
TEST(ExpertCache, RandomWorkloadNeverExceedsBudgetNorLosesPinned) {
  std::mt19937 rng(7);
  size_t allocated = 0, peak = 0;
  const size_t slot = 8192;
  for (int budget_slots : {1, 2, 5, 17}) {
    auto alloc = [&](size_t n) {
      allocated += n;
      peak = std::max(peak, allocated);
      return std::aligned_alloc(4096, n);
    };
    auto release = [&](void* p) {
      allocated -= slot;
      std::free(p);
    };
    peak = 0;
    ExpertCache c(4, 32, slot, budget_slots * slot + 100, alloc, release);
    std::set<int> pinned;
    for (int step = 0; step < 5000; ++step) {
      const int layer = int(rng() % 4), expert = int(rng() % 32);
      int s = c.find(layer, expert);
      if (s < 0) {
        s = c.claim(layer, expert);
        if (s < 0) {
          EXPECT_EQ(int(pinned.size()), c.allocated()) << "claim failed with unpinned slots";
          for (int p : pinned) c.unpin(p);
          pinned.clear();
          continue;
        }
        if (rng() % 10 == 0) {
          c.drop(s);  // failed read
          continue;
        }
        c.loaded(s);
      }
      c.use(s);
      if (rng() % 3 == 0 && !pinned.count(s)) {
        c.pin(s);
        pinned.insert(s);
      }
      if (rng() % 4 == 0 && !pinned.empty()) {
        auto it = pinned.begin();
        std::advance(it, rng() % pinned.size());
        c.unpin(*it);
        pinned.erase(it);
      }
      for (int p : pinned) EXPECT_EQ(c.state(p), ExpertCache::State::Ready);
      ASSERT_LE(allocated, size_t(budget_slots) * slot);
      ASSERT_LE(c.allocated(), budget_slots);
    }
    for (int p : pinned) c.unpin(p);
    EXPECT_EQ(peak, size_t(budget_slots) * slot);
  }
  EXPECT_EQ(allocated, 0u);
}

// An allocator that records which thread asked, and can hold the background thread back.
struct TracingAlloc {
  std::mutex mu;
  std::thread::id main = std::this_thread::get_id();
  int on_main = 0, elsewhere = 0;
  std::atomic<bool> hold{false};
  ExpertCache::Alloc fn() {
    return [this](size_t n) -> void* {
      const bool is_main = std::this_thread::get_id() == main;
      while (!is_main && hold) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::lock_guard lock(mu);
      (is_main ? on_main : elsewhere)++;
      return std::aligned_alloc(4096, n);
    };
  }
  int main_count() {
    std::lock_guard lock(mu);
    return on_main;
  }
};

// Waits (at most 10 s) until the cache has prepared `slots` slots.
bool wait_prepared(const ExpertCache& c, int slots) {
  for (int i = 0; i < 10000 && c.allocated_bytes() < size_t(slots) * c.slot_bytes(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return c.allocated_bytes() == size_t(slots) * c.slot_bytes();
}

// A reserve of 3 on a budget of 5: three slots are prepared before anything is claimed, claims
// take them without allocating on the caller's thread, and the thread tops the reserve up to the
// budget, never past it.
TEST(ExpertCache, BackgroundThreadPreparesSlotsAhead) {
  TracingAlloc a;
  ExpertCache c(1, 16, 8192, 5 * 8192, a.fn(), {}, /*reserve=*/3, /*floor=*/0);
  ASSERT_TRUE(wait_prepared(c, 3));
  EXPECT_EQ(c.allocated(), 0);
  put(c, 0, 1);
  put(c, 0, 2);
  ASSERT_TRUE(wait_prepared(c, 5));
  for (int e = 3; e <= 5; ++e) put(c, 0, e);
  EXPECT_EQ(c.allocated(), 5);
  EXPECT_EQ(a.main_count(), 0);
  EXPECT_EQ(c.allocated_bytes(), 5u * 8192);
  // Full: the sixth evicts, and nothing more is allocated anywhere.
  bool evicted = false;
  EXPECT_GE(c.claim(0, 6, &evicted), 0);
  EXPECT_TRUE(evicted);
  EXPECT_EQ(c.allocated_bytes(), 5u * 8192);
}

// The background thread rests three times as long as each slot took: a 6 GB cache's pages cost
// ~30 s of a core on the virtual machines measured, and a thread taking them at full speed slowed
// a prompt on two cores by 20-40%. Each slot takes 10 ms here; between one allocation's end and the
// next one's start at least 30 ms pass.
TEST(ExpertCache, BackgroundThreadTakesAQuarterOfACore) {
  using Clock = std::chrono::steady_clock;
  std::mutex mu;
  std::vector<std::pair<Clock::time_point, Clock::time_point>> calls;
  auto alloc = [&](size_t n) {
    const auto start = Clock::now();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    void* p = std::aligned_alloc(4096, n);
    std::lock_guard lock(mu);
    calls.emplace_back(start, Clock::now());
    return p;
  };
  ExpertCache c(1, 16, 8192, 4 * 8192, alloc, {}, /*reserve=*/4, /*floor=*/0);
  ASSERT_TRUE(wait_prepared(c, 4));
  std::lock_guard lock(mu);
  ASSERT_EQ(calls.size(), 4u);
  for (size_t i = 1; i < calls.size(); ++i) {
    const auto took = calls[i - 1].second - calls[i - 1].first, rest = calls[i].first - calls[i - 1].second;
    EXPECT_GE(rest, 3 * took) << "slot " << i;
  }
}

// Past the floor, with nothing prepared, a claim evicts rather than allocate on the caller's
// thread; below the floor, or with nothing evictable, it allocates there.
TEST(ExpertCache, PastTheFloorEvictsRatherThanAllocate) {
  TracingAlloc a;
  a.hold = true;  // the background thread prepares nothing
  {
    ExpertCache c(1, 16, 8192, 8 * 8192, a.fn(), {}, /*reserve=*/4, /*floor=*/2);
    put(c, 0, 1);
    put(c, 0, 2);  // below the floor: allocated here
    EXPECT_EQ(a.main_count(), 2);
    bool evicted = false;
    const int s = c.claim(0, 3, &evicted);  // past the floor: (0,1) goes
    EXPECT_TRUE(evicted);
    EXPECT_EQ(c.find(0, 1), -1);
    EXPECT_EQ(a.main_count(), 2);
    c.pin(c.find(0, 2));  // (0,2) pinned and (0,3) loading: nothing evictable, so allocate
    EXPECT_GE(c.claim(0, 4), 0);
    EXPECT_EQ(a.main_count(), 3);
    EXPECT_EQ(c.allocated(), 3);
    c.loaded(s);
    a.hold = false;  // let the thread finish before the cache goes
  }
}

// Without a reserve nothing runs in the background: every slot is allocated on demand.
TEST(ExpertCache, NoReserveAllocatesOnDemand) {
  TracingAlloc a;
  ExpertCache c(1, 16, 8192, 4 * 8192, a.fn());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(c.allocated_bytes(), 0u);
  put(c, 0, 1);
  EXPECT_EQ(a.main_count(), 1);
  EXPECT_EQ(c.allocated_bytes(), 8192u);
}

// Below the floor a claim allocates on the caller's thread even when prepared slots wait; past it
// the prepared ones are taken.
TEST(ExpertCache, BelowTheFloorAllocatesHereEvenWithSlotsReady) {
  TracingAlloc a;
  ExpertCache c(1, 16, 8192, 8 * 8192, a.fn(), {}, /*reserve=*/3, /*floor=*/2);
  ASSERT_TRUE(wait_prepared(c, 3));
  put(c, 0, 1);
  put(c, 0, 2);
  EXPECT_EQ(a.main_count(), 2);
  put(c, 0, 3);
  EXPECT_EQ(a.main_count(), 2);
  EXPECT_EQ(c.allocated(), 3);
}

// A budget no larger than the floor (the default cache) runs no background thread even with a
// reserve: its slots are allocated on the caller's thread as claims need them.
TEST(ExpertCache, BudgetAtTheFloorPreparesNothing) {
  TracingAlloc a;
  ExpertCache c(1, 16, 8192, 4 * 8192, a.fn(), {}, /*reserve=*/4, /*floor=*/4);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(c.allocated_bytes(), 0u);
  for (int e = 1; e <= 4; ++e) put(c, 0, e);
  EXPECT_EQ(a.main_count(), 4);
  EXPECT_EQ(c.allocated_bytes(), 4u * 8192);
}

}  // namespace
}  // namespace swiftlet
