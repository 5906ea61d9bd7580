// ExpertSlots (model/expert_slots.h) under the host cache's policy: an ExpertCache whose slots are
// numbers, not memory, so the VRAM expert cache evicts exactly as the host cache does (the lowest
// (use count, last use) among loaded, unpinned slots; use counts kept across evictions).
#pragma once

#include "model/expert_slots.h"

namespace swiftlet {

std::unique_ptr<ExpertSlots> make_expert_slots(int layers, int experts, int slots);

}  // namespace swiftlet
