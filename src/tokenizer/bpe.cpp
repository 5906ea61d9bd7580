#include "tokenizer/bpe.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "core/error.h"

namespace swiftlet {
namespace {

uint64_t mix(uint64_t key) {
  // Fibonacci hashing; the top bits are well mixed for sequential ids.
  return key * 0x9E3779B97F4A7C15ull;
}

}  // namespace

BpeModel::BpeModel(const std::array<int32_t, 256>& byte_ids, const std::vector<Merge>& merges)
    : byte_ids_(byte_ids), merge_count_(merges.size()) {
  const size_t capacity = std::bit_ceil(std::max<size_t>(16, merges.size() * 2));
  slots_.assign(capacity, Slot{kEmpty, 0, -1});
  slot_mask_ = capacity - 1;
  const int shift = 64 - std::countr_zero(capacity);
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const Merge& m = merges[rank];
    const uint64_t key = pair_key(m.left, m.right);
    uint64_t i = mix(key) >> shift;
    while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & slot_mask_;
    // A repeated pair keeps its first (lowest) rank, like HF's merge map built in order.
    if (slots_[i].key == key) continue;
    slots_[i] = Slot{key, static_cast<uint32_t>(rank), m.result};
  }
}

const BpeModel::Slot* BpeModel::find(int32_t left, int32_t right) const {
  const uint64_t key = pair_key(left, right);
  const int shift = 64 - std::countr_zero(slot_mask_ + 1);
  uint64_t i = mix(key) >> shift;
  while (true) {
    const Slot& s = slots_[i];
    if (s.key == key) return &s;
    if (s.key == kEmpty) return nullptr;
    i = (i + 1) & slot_mask_;
  }
}

namespace {

// A small fast hash for short words (multiply-xorshift over 8-byte blocks); never 0, which
// marks an empty cache slot.
uint64_t hash_word(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  if (i < s.size()) {
    uint64_t w = 0;
    std::memcpy(&w, s.data() + i, s.size() - i);
    h = (h ^ w) * 0x94D049BB133111EBull;
    h ^= h >> 29;
  }
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return h | 1;
}

}  // namespace

bool BpeModel::cache_lookup(std::string_view word, uint64_t hash, std::vector<int32_t>& out) const {
  if (cache_slots_.empty()) return false;
  const size_t mask = cache_slots_.size() - 1;
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    const CacheSlot& slot = cache_slots_[i];
    if (slot.hash == 0) return false;
    if (slot.hash == hash && std::string_view(cache_keys_).substr(slot.key_offset, slot.key_length) == word) {
      const int32_t* ids = cache_ids_.data() + slot.ids_offset;
      out.insert(out.end(), ids, ids + slot.ids_length);
      return true;
    }
  }
}

void BpeModel::cache_insert(std::string_view word, uint64_t hash, std::span<const int32_t> ids) const {
  if (cache_slots_.empty() || cache_used_ >= kCacheSlots / 2) {
    cache_slots_.assign(kCacheSlots, CacheSlot{});
    cache_used_ = 0;
    cache_keys_.clear();
    cache_ids_.clear();
  }
  const size_t mask = cache_slots_.size() - 1;
  size_t i = hash & mask;
  while (cache_slots_[i].hash != 0) {
    if (cache_slots_[i].hash == hash &&
        std::string_view(cache_keys_).substr(cache_slots_[i].key_offset, cache_slots_[i].key_length) == word) {
      return;  // another thread got there first
    }
    i = (i + 1) & mask;
  }
  cache_slots_[i] = CacheSlot{hash, static_cast<uint32_t>(cache_keys_.size()),
                              static_cast<uint32_t>(cache_ids_.size()), static_cast<uint16_t>(word.size()),
                              static_cast<uint16_t>(ids.size())};
  ++cache_used_;
  cache_keys_.append(word);
  cache_ids_.insert(cache_ids_.end(), ids.begin(), ids.end());
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() == 1) {
    const int32_t id = byte_ids_[static_cast<uint8_t>(word[0])];
    if (id >= 0) out.push_back(id);
    return;
  }
  if (word.size() == 2) {
    // Two bytes merge into one token or stay two: one table lookup, no cache needed.
    const int32_t a = byte_ids_[static_cast<uint8_t>(word[0])];
    const int32_t b = byte_ids_[static_cast<uint8_t>(word[1])];
    if (a >= 0 && b >= 0) {
      if (const Slot* s = find(a, b)) {
        out.push_back(s->result);
      } else {
        out.push_back(a);
        out.push_back(b);
      }
      return;
    }
  }
  if (word.size() > kMaxCachedWordBytes) {
    merge_word(word, out);
    return;
  }
  const uint64_t hash = hash_word(word);
  {
    std::lock_guard lock(cache_mutex_);
    if (cache_lookup(word, hash, out)) return;
  }
  const size_t first = out.size();
  merge_word(word, out);
  std::lock_guard lock(cache_mutex_);
  cache_insert(word, hash, std::span<const int32_t>(out).subspan(first));
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;  // -1 once merged into its left neighbour
    int32_t prev;
    int32_t next;
  };
  struct Candidate {
    uint32_t rank;
    int32_t pos;  // index of the left symbol
    int32_t left;
    int32_t right;
    int32_t result;
  };
  // Min-heap on (rank, pos): lowest rank first, leftmost among equal ranks.
  const auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap;
  symbols.clear();
  heap.clear();

  for (char c : word) {
    const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
    if (id < 0) continue;
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{id, index - 1, index + 1});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  const auto push_pair = [&](int32_t pos) {
    const Symbol& l = symbols[pos];
    if (l.next < 0) return;
    const Symbol& r = symbols[l.next];
    if (const Slot* s = find(l.id, r.id)) {
      heap.push_back(Candidate{s->rank, pos, l.id, r.id, s->result});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) push_pair(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& l = symbols[c.pos];
    // Stale candidates (a neighbour changed since the push) fail one of these checks.
    if (l.id != c.left || l.next < 0) continue;
    Symbol& r = symbols[l.next];
    if (r.id != c.right) continue;
    l.id = c.result;
    l.next = r.next;
    if (r.next >= 0) symbols[r.next].prev = c.pos;
    r.id = -1;
    if (l.prev >= 0) push_pair(l.prev);
    push_pair(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

}  // namespace swiftlet
