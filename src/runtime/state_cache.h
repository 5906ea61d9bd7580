// The prefix state cache shared by every session of a model (docs/state-cache.md): whole model
// states (attention K/V, DeltaNet conv + recurrent states, the logits when at hand) saved after
// a prompt's prefixes, so that a new conversation sharing a long preamble with an earlier one
// (an agent's system prompt and tools) starts from the longest cached prefix and prefills only
// the rest. A DeltaNet state cannot be cut back to a shorter prefix, so states are kept at
// chosen positions: every `interval` prompt tokens, at the starts of messages, at a turn
// boundary, at a prompt's end (checkpoints()).
//
// Keys: a hash chain over blocks of `block` tokens, seeded by the model's identity and the
// format version: chain(0) = H(model, version), chain(k) = H(chain(k - 1), tokens of block k);
// a prefix of n tokens is keyed by H(chain(n / block), its tokens past the last whole block, n).
// An entry also holds its tokens, compared in full before use: a hash collision costs nothing.
//
// In RAM the entries are bounded by ram_bytes, least recently used out. With a directory each
// new entry is also written there (a background thread; state_file.h: atomic, checksummed), a
// miss in RAM looks there, and the directory is bounded by disk_bytes (least recently used
// file out; a use touches its file). Several processes may share the directory: names are
// unique per prefix and writes atomic; files vanishing under a listing are skipped. A file that
// is corrupt, truncated, of another format version or of another model is ignored and counted,
// never used (a corrupt one of this model is removed).
#pragma once

#include "runtime/state_file.h"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace swiftlet {

struct StateCacheOptions {
  uint64_t ram_bytes = uint64_t(2) << 30;  // entries kept in memory (0: none, files only)
  std::string dir;                         // "": memory only
  uint64_t disk_bytes = 0;                 // bound of the directory's state files (with dir)
  int block = 256;                         // tokens per link of the key chain
  int interval = 1024;                     // a checkpoint every this many prompt tokens (a multiple of block)
};

struct StateCacheStats {
  uint64_t lookups = 0;        // prompts looked up
  uint64_t hits_ram = 0, hits_disk = 0;
  uint64_t tokens_saved = 0;   // prompt tokens restored instead of prefilled
  uint64_t entries_ram = 0, bytes_ram = 0;
  uint64_t files_disk = 0, bytes_disk = 0;  // state files in the directory, as last listed
  uint64_t stored = 0;         // entries added
  uint64_t files_written = 0, write_failures = 0, writes_dropped = 0;  // dropped: the queue was full
  uint64_t evicted_ram = 0, evicted_disk = 0;
  uint64_t files_ignored = 0;  // corrupt, truncated, other version, other model
};

class StateCache {
 public:
  // Throws Error when the directory cannot be created or the options make no sense.
  StateCache(const Model& model, StateCacheOptions opts);
  ~StateCache();  // finishes the queued writes
  StateCache(const StateCache&) = delete;
  StateCache& operator=(const StateCache&) = delete;

  // The longest cached prefix of `prompt` longer than `have` tokens (a state of the whole
  // prompt only with its logits), from memory or else from the directory; null when none.
  std::shared_ptr<const SavedState> find(std::span<const int32_t> prompt, int64_t have);
  // Keeps a copy of `state` (its tokens are the key) and `logits` (null or empty: none);
  // nothing happens when that prefix is there already.
  void put(const SessionState& state, const std::vector<float>* logits);
  // Waits until every queued file is written.
  void flush();

  // Where a prompt fed from `from` to `size` tokens keeps checkpoints, ascending: the turn
  // boundary `turn` (0: none) and the end always; every interval and the starts of its messages
  // (`messages`, ascending: where an agent's preamble ends) when at least a block past the
  // previous checkpoint (each holds its prefix's K/V: a checkpoint per short message would cost
  // memory and disk quadratic in the prompt).
  std::vector<size_t> checkpoints(size_t from, size_t size, size_t turn, std::span<const size_t> messages = {}) const;

  StateCacheStats stats() const;
  const StateCacheOptions& options() const { return opts_; }
  uint64_t model_id() const { return model_id_; }
  // Key of the first n tokens, and of the chain link they end in (see the file comment).
  uint64_t key(std::span<const int32_t> tokens, size_t n) const;

 private:
  struct Entry {
    uint64_t key = 0;
    std::shared_ptr<const SavedState> state;
  };
  struct Write {
    std::string path;
    uint64_t key = 0;
    std::shared_ptr<const SavedState> state;
  };
  struct File {
    std::string name;
    int64_t tokens = 0;
    uint64_t key = 0;
  };
  std::vector<uint64_t> chain(std::span<const int32_t> tokens) const;  // [n / block + 1]
  uint64_t key_from(const std::vector<uint64_t>& chain, std::span<const int32_t> tokens, size_t n) const;
  std::string file_name(int64_t tokens, uint64_t key) const;
  std::vector<File> list_files();  // this model's names; refreshes the disk figures
  std::shared_ptr<const SavedState> find_on_disk(std::span<const int32_t> prompt, int64_t have,
                                                 const std::vector<uint64_t>& chain);
  void insert(uint64_t key, std::shared_ptr<const SavedState> s);  // with mu_ held
  void touch(int64_t tokens, uint64_t key);
  void scan_directory();
  void writer();
  void enforce_disk_budget();

  const ModelConfig& cfg_;
  StateCacheOptions opts_;
  uint64_t model_id_ = 0;
  std::string model_tag_;  // the model id in hex: file names start with it

  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recently used first
  StateCacheStats stats_;
  std::set<std::string> ignored_;  // files counted as ignored already

  std::condition_variable cv_;
  std::deque<Write> writes_;
  bool writing_ = false, stopping_ = false;
  std::thread writer_;
};

}  // namespace swiftlet
