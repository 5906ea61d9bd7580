#include "experts/expert_slots.h"

#include "experts/expert_cache.h"

#include <cstdint>
#include <tuple>

namespace swiftlet {

namespace {

class CacheSlots final : public ExpertSlots {
 public:
  // The cache hands out its slots in order (slot i is the i-th it allocates) and, without a
  // reserve thread, never touches their memory: each slot's "memory" is the address i + 1, a
  // number the cache only stores.
  CacheSlots(int layers, int experts, int slots)
      : cache_(layers, experts, 1, size_t(slots), [next = uintptr_t(0)](size_t) mutable {
          return reinterpret_cast<void*>(++next);
        }, [](void*) {}) {}

  int slots() const override { return cache_.capacity(); }

  int use(int layer, int expert) override {
    const int slot = cache_.find(layer, expert);
    if (slot < 0) return -1;
    cache_.use(slot);
    cache_.pin(slot);
    return slot;
  }

  int place(int layer, int expert, int* evicted_layer, int* evicted_expert) override {
    *evicted_layer = *evicted_expert = -1;
    bool evicted = false;
    const int slot = cache_.claim(layer, expert, &evicted);
    if (slot < 0) return -1;
    if (evicted) std::tie(*evicted_layer, *evicted_expert) = cache_.last_evicted();
    cache_.pin(slot);
    cache_.loaded(slot);
    cache_.use(slot);
    return slot;
  }

  void unpin(int slot) override { cache_.unpin(slot); }

 private:
  ExpertCache cache_;
};

}  // namespace

std::unique_ptr<ExpertSlots> make_expert_slots(int layers, int experts, int slots) {
  return std::make_unique<CacheSlots>(layers, experts, slots);
}

}  // namespace swiftlet
