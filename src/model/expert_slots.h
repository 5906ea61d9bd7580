// The bookkeeping of an expert cache whose slots live in memory the model's owner manages (the
// VRAM expert cache of model/gpu_expert_cache.cpp): which (layer, expert) sits in which slot, and
// which slot a missing expert takes. The policy is the host cache's, one for both
// (experts/expert_slots.h implements this over experts/expert_cache.h); the owner of the memory
// moves the bytes and keeps its own table of addresses. Slots are numbered 0 .. slots() - 1.
#pragma once

#include <functional>
#include <memory>

namespace swiftlet {

class ExpertSlots {
 public:
  virtual ~ExpertSlots() = default;
  virtual int slots() const = 0;
  // The slot holding (layer, expert), counted as a use and pinned (never evicted) until unpin;
  // -1 when the expert has no slot.
  virtual int use(int layer, int expert) = 0;
  // A slot for (layer, expert), which has none, counted as a use and pinned: a fresh slot while
  // there are any, else the lowest-ranked unpinned one, whose expert is returned in
  // *evicted_layer / *evicted_expert (-1 when nothing was evicted) for the owner to forget. -1
  // when every slot is pinned.
  virtual int place(int layer, int expert, int* evicted_layer, int* evicted_expert) = 0;
  virtual void unpin(int slot) = 0;
};

// Makes the bookkeeping of `slots` slots for `layers` x `experts` experts.
using MakeExpertSlots = std::function<std::unique_ptr<ExpertSlots>(int layers, int experts, int slots)>;

}  // namespace swiftlet
