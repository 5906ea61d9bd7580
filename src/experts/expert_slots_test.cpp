// The VRAM expert cache's slot bookkeeping (ExpertSlots over ExpertCache), on the CPU: fresh slots
// first, then the least used unpinned expert is evicted and named, pinned slots never are, and use
// counts outlive evictions. Worked by hand from the policy in experts/expert_cache.h.
#include "experts/expert_slots.h"

#include <gtest/gtest.h>

namespace swiftlet {
namespace {

struct Placed {
  int slot, evicted_layer, evicted_expert;
};

Placed place(ExpertSlots& s, int layer, int expert) {
  Placed p{};
  p.slot = s.place(layer, expert, &p.evicted_layer, &p.evicted_expert);
  return p;
}

TEST(ExpertSlots, FreshSlotsFirstThenTheLeastUsedIsEvicted) {
  auto s = make_expert_slots(2, 4, 2);
  ASSERT_EQ(s->slots(), 2);
  const Placed a = place(*s, 0, 1);
  EXPECT_EQ(a.slot, 0);
  EXPECT_EQ(a.evicted_layer, -1);
  s->unpin(a.slot);
  const Placed b = place(*s, 0, 2);
  EXPECT_EQ(b.slot, 1);
  EXPECT_EQ(b.evicted_layer, -1);
  s->unpin(b.slot);
  // A hit: (0, 1) now has two uses, (0, 2) one.
  EXPECT_EQ(s->use(0, 1), 0);
  s->unpin(0);
  EXPECT_EQ(s->use(1, 3), -1);
  // Full: (1, 3) takes the slot of the least used expert, (0, 2), and says so.
  const Placed c = place(*s, 1, 3);
  EXPECT_EQ(c.slot, 1);
  EXPECT_EQ(c.evicted_layer, 0);
  EXPECT_EQ(c.evicted_expert, 2);
  s->unpin(c.slot);
  EXPECT_EQ(s->use(0, 2), -1);
  EXPECT_EQ(s->use(1, 3), 1);
  s->unpin(1);
}

TEST(ExpertSlots, PinnedSlotsAreNeverEvicted) {
  auto s = make_expert_slots(1, 4, 2);
  const Placed a = place(*s, 0, 0);
  const Placed b = place(*s, 0, 1);
  // Both pinned (a group in flight): no slot for a third expert.
  EXPECT_EQ(place(*s, 0, 2).slot, -1);
  s->unpin(b.slot);
  // (0, 0) has as many uses and is older, so it would go first, but it is still pinned.
  const Placed c = place(*s, 0, 2);
  EXPECT_EQ(c.slot, b.slot);
  EXPECT_EQ(c.evicted_expert, 1);
  s->unpin(c.slot);
  s->unpin(a.slot);
  EXPECT_EQ(s->use(0, 0), a.slot);
  s->unpin(a.slot);
}

TEST(ExpertSlots, UseCountsOutliveEviction) {
  auto s = make_expert_slots(1, 8, 2);
  const Placed a = place(*s, 0, 0);  // 1 use
  s->unpin(a.slot);
  for (int i = 0; i < 2; ++i) s->unpin(s->use(0, 0));  // 3 uses
  s->unpin(place(*s, 0, 1).slot);                      // 1 use
  Placed p = place(*s, 0, 2);                          // evicts (0, 1): 1 use against 3
  EXPECT_EQ(p.evicted_expert, 1);
  s->unpin(p.slot);
  p = place(*s, 0, 1);  // back with 2 uses; evicts (0, 2), 1 use
  EXPECT_EQ(p.evicted_expert, 2);
  s->unpin(p.slot);
  p = place(*s, 0, 3);  // 1 use; evicts (0, 1), 2 uses against (0, 0)'s 3
  EXPECT_EQ(p.evicted_expert, 1);
  s->unpin(p.slot);
  p = place(*s, 0, 2);  // back with 2 uses: evicts (0, 3), 1 use, not (0, 0)
  EXPECT_EQ(p.evicted_expert, 3);
  s->unpin(p.slot);
  EXPECT_GE(s->use(0, 0), 0);
}

}  // namespace
}  // namespace swiftlet
