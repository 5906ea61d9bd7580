// Byte-level BPE merging (Sennrich et al. 2016; HF tokenizers models/bpe/word.rs semantics):
// start from one symbol per byte, repeatedly merge the adjacent pair with the lowest merge
// rank, leftmost first on ties. A min-heap of candidate pairs over a linked list of symbols
// makes a word of n bytes cost O(n log n), so a 1 MB "word" is as safe as a short one.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace swiftlet {

class BpeModel {
 public:
  struct Merge {
    int32_t left;
    int32_t right;
    int32_t result;
  };

  // byte_ids[b]: id of the token made of the single byte b (-1 if the vocabulary lacks it;
  // such bytes are dropped, as HF does without an unk token). merges: in rank order.
  BpeModel(const std::array<int32_t, 256>& byte_ids, const std::vector<Merge>& merges);
  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // Appends the ids of one pre-tokenized word given as raw bytes. Thread-safe.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  size_t merge_count() const { return merge_count_; }

 private:
  // Open-addressing hash table (pair of ids) -> (rank, result id).
  struct Slot {
    uint64_t key;
    uint32_t rank;
    int32_t result;
  };
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  const Slot* find(int32_t left, int32_t right) const;
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  std::array<int32_t, 256> byte_ids_;
  std::vector<Slot> slots_;
  uint64_t slot_mask_ = 0;
  size_t merge_count_ = 0;

  // Cache of word -> ids for short words (most words repeat): an open-addressing table over
  // two arenas, cleared when half full. Guarded by a mutex; encode() is const and shared.
  struct CacheSlot {
    uint64_t hash;  // 0 = empty
    uint32_t key_offset;
    uint32_t ids_offset;
    uint16_t key_length;
    uint16_t ids_length;
  };
  static constexpr size_t kMaxCachedWordBytes = 64;
  static constexpr size_t kCacheSlots = 1 << 18;
  bool cache_lookup(std::string_view word, uint64_t hash, std::vector<int32_t>& out) const;
  void cache_insert(std::string_view word, uint64_t hash, std::span<const int32_t> ids) const;

  mutable std::mutex cache_mutex_;
  mutable std::vector<CacheSlot> cache_slots_;
  mutable size_t cache_used_ = 0;
  mutable std::string cache_keys_;
  mutable std::vector<int32_t> cache_ids_;
};

}  // namespace swiftlet
