// The bookkeeping of an expert cache: which (layer, expert) sits in which slot, what may be
// evicted, and what it costs in bytes. No IO here (qpack_experts.h drives the reads), so the
// policy can be tested on its own.
//
// Slots are `slot_bytes` each and allocated lazily, never more than budget / slot_bytes of them.
// With a reserve, a background thread allocates slots and writes to every page of them ahead of
// need (the first touch of fresh memory costs 4-21 us a 4 KiB page on the virtual machines
// measured: seconds for a cache of several GB), keeping up to `reserve` slots ready until the
// budget is allocated. Past `floor` slots (the size of the default cache), claim() takes a ready
// slot, else evicts, and allocates on the caller's thread only when nothing is ready and nothing
// can be evicted: a large cache starts as fast as the default one and grows as the thread
// prepares memory. A cache with room for every expert never evicts: it allocates here when
// nothing is ready. The first `floor` slots are allocated on the caller's thread (the reads touch
// them first) and the thread prepares only the rest, so a budget of at most `floor` slots runs no
// thread: measured on the default cache, reads into slots the thread had populated ran at 1.2-1.4
// GB/s against 1.9-2.0 into slots the reads faulted in (same disk and run; not understood yet).
// Eviction takes the evictable slot with the lowest (use count, last use): an expert's use count
// is remembered after it is evicted, so an expert that keeps coming back outranks one that was
// used once. With layer shares (the default), each layer is entitled to an even share of the
// slots: a layer holding its share or more replaces its own lowest-ranked expert, a layer below
// it takes the lowest-ranked slot of a layer above its share (either falls back to the lowest
// slot of all when there is none). Real routing ranks layers very differently, and one ranking
// over the whole cache starves some layers (docs/trained-model.md, "Routing and caching").
// A slot is evictable only when it is loaded and not pinned; slots being read and slots whose
// expert is in use (pinned between acquire and release) are never taken.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace swiftlet {

class ExpertCache {
 public:
  enum class State : uint8_t { Free, Loading, Ready };
  using Alloc = std::function<void*(size_t bytes)>;  // 4096-aligned memory
  using Free = std::function<void(void*)>;

  // budget_bytes 0: room for every expert. Budgets below one slot still get one slot.
  // reserve > 0: slots prepared ahead by a background thread, and allocations on the caller's
  // thread avoided past `floor` slots (see above); 0: none.
  ExpertCache(int layers, int experts, size_t slot_bytes, size_t budget_bytes, Alloc alloc = {},
              Free free = {}, int reserve = 0, int floor = 0);
  ~ExpertCache();
  ExpertCache(const ExpertCache&) = delete;
  ExpertCache& operator=(const ExpertCache&) = delete;

  // Off: one ranking over the whole cache, whatever layer the slots hold (for comparisons).
  void set_layer_shares(bool on) { shares_ = on; }
  int capacity() const { return capacity_; }          // slots allowed by the budget
  int allocated() const { return int(slots_.size()); }  // slots handed out so far
  // Bytes of every slot allocated, those prepared ahead and not handed out yet included.
  size_t allocated_bytes() const;
  size_t slot_bytes() const { return slot_bytes_; }

  // The slot holding (layer, expert), or -1.
  int find(int layer, int expert) const { return where_[key(layer, expert)]; }
  // A slot for (layer, expert), which must not be cached: a never-used slot while the budget
  // allows one, else the lowest-ranked evictable slot (its expert is dropped). The slot comes
  // back in state Loading; -1 when every slot is loading or pinned. *evicted is set when an
  // expert was dropped to make room.
  // may_evict, when given, vetoes victims (the lowest-ranked slot it accepts is taken).
  int claim(int layer, int expert, bool* evicted = nullptr,
            const std::function<bool(int slot)>& may_evict = {});
  // The (layer, expert) the last claim() that set *evicted dropped.
  std::pair<int, int> last_evicted() const { return last_evicted_; }
  // The read into a Loading slot finished: Ready (ok) or dropped (failed).
  void loaded(int slot);
  void drop(int slot);

  // Counts a use of the expert in `slot` (its frequency and recency).
  void use(int slot);
  // A pinned slot is never evicted (nor dropped): pin while the compute reads the expert.
  void pin(int slot);
  void unpin(int slot);

  State state(int slot) const { return meta_[size_t(slot)].state; }
  int pins(int slot) const { return meta_[size_t(slot)].pins; }
  uint8_t* data(int slot) const { return slots_[size_t(slot)]; }
  uint32_t uses(int layer, int expert) const { return freq_[key(layer, expert)]; }
  int layer_of(int slot) const { return meta_[size_t(slot)].layer; }
  int expert_of(int slot) const { return meta_[size_t(slot)].expert; }
  // Evictable slots, lowest rank (next victim) first. For tests and statistics.
  std::vector<int> eviction_order() const;

 private:
  struct Meta {
    State state = State::Free;
    int layer = -1, expert = -1;
    int pins = 0;
    uint64_t last = 0;  // tick of the last use, or of the load
  };
  using Rank = std::tuple<uint32_t, uint64_t, int>;  // (uses, last use, slot)
  int add_slot(uint8_t* p);
  uint8_t* take_ready(bool wait);
  uint8_t* allocate_now();
  void grow();

  size_t key(int layer, int expert) const { return size_t(layer) * size_t(experts_) + size_t(expert); }
  Rank rank(int slot) const;
  void update_evictable(int slot, bool before);
  int share(int layer) const { return capacity_ / layers_ + (layer < capacity_ % layers_ ? 1 : 0); }
  // The evictable slot to take for an expert of `layer` (see above), or -1.
  int victim(int layer, const std::function<bool(int slot)>& may_evict) const;

  int layers_, experts_;
  size_t slot_bytes_;
  int capacity_;
  Alloc alloc_;
  Free free_;
  std::vector<uint8_t*> slots_;
  std::vector<Meta> meta_;
  std::vector<int> where_;      // [layer * experts + expert] -> slot or -1
  std::vector<uint32_t> freq_;  // [layer * experts + expert] uses, kept across evictions
  std::set<Rank> evictable_;
  std::vector<std::set<Rank>> layer_evictable_;  // [layer] the evictable slots holding that layer
  std::vector<int> held_;                         // [layer] slots holding (or reading) that layer
  bool shares_ = true;
  std::vector<int> free_list_;  // allocated slots holding nothing (after a failed read)

  // Shared with the background thread, under mu_.
  int reserve_ = 0, floor_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint8_t*> ready_;  // prepared slots not handed out yet
  int planned_ = 0;              // slots allocated or being allocated, by either thread
  int grown_ = 0;                // of those, by the background thread (at most capacity - floor)
  bool stop_ = false;
  std::thread grower_;
  uint64_t tick_ = 0;
  std::pair<int, int> last_evicted_{-1, -1};
};

}  // namespace swiftlet
