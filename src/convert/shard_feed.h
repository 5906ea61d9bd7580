// Checkpoints converted shard by shard: only the shards' headers are read up front (from disk or
// with a range request), the tensors point into reserved address ranges, and each shard is
// fetched, mapped, converted and let go in turn (write_container's ShardFeed).
//
//   --from-hf ORG/REPO:            shard k+1 downloads while shard k converts; each is deleted once
//                                  its parts are written (HubShardFetch, hf_source.cpp)
//   --from-dir DIR --delete-source: the same over local shards, deleting each once converted
//
// The headers are kept in OUT.partial/heads/ until the container is complete, so that a rerun
// after a kill plans the same container without shards that were converted and deleted.
#pragma once

#include "convert/repack.h"
#include "format/safetensors.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace swiftlet {

struct ShardInfo {
  std::string name;  // file name in the checkpoint ("model-00001-of-00004.safetensors")
  uint64_t size = 0;
};

// The shards of a checkpoint directory `dir`: those model.safetensors.index.json names, else
// model.safetensors, else every *.safetensors file listed in `listed` (names).
std::vector<std::string> checkpoint_shard_names(const std::string& dir, const std::vector<std::string>& listed);

// The first bytes (the header) of each shard: from OUT.partial/heads/VERSION/NAME when an earlier
// run kept it, else from `read_head(name)`, then kept there. `version` names the checkpoint's
// version (a hub commit), so that the headers of another one are never taken for its own.
std::map<std::string, std::string> shard_heads(const std::string& output, const std::string& version,
                                               const std::vector<ShardInfo>& shards,
                                               const std::function<std::string(const ShardInfo&)>& read_head);

// The tensors of the shards in `dir`, every shard reserved (not read) from its header.
TensorSet reserved_checkpoint(const std::string& dir, const std::vector<ShardInfo>& shards,
                              const std::map<std::string, std::string>& heads);

// A ShardFeed over the reserved shards of `tensors` in `dir`: `fetch(shard)` makes a shard's file
// whole on disk (a download; nothing for local files) on a worker thread, one shard ahead of the
// writer while it holds at most one; a released shard is deleted when `delete_released`.
class ShardFiles : public ShardFeed {
 public:
  using Fetch = std::function<void(const ShardInfo&, const std::atomic<bool>& stop)>;
  ShardFiles(std::string dir, std::vector<ShardInfo> shards, const TensorSet& tensors, Fetch fetch,
             bool delete_released);
  ~ShardFiles() override;

  int shards() const override { return int(shards_.size()); }
  std::string shard_name(int s) const override { return shards_.at(size_t(s)).name; }
  uint64_t shard_bytes(int s) const override { return shards_.at(size_t(s)).size; }
  int shard_of(const std::string& tensor) const override;
  std::string dir() const override { return dir_; }
  bool deletes() const override { return delete_released_; }
  void plan(const std::vector<int>& order) override;
  void acquire(int s) override;
  void release(int s) override;

 private:
  void run();

  std::string dir_;
  std::vector<ShardInfo> shards_;
  std::vector<SafetensorsFile*> files_;  // by shard, in `tensors`
  std::map<std::string, int> shard_of_;
  Fetch fetch_;
  bool delete_released_;

  std::vector<int> order_;
  std::mutex mu_;
  std::condition_variable cv_;
  size_t acquired_ = 0;  // order_[0, acquired_) were handed to the writer
  size_t fetched_ = 0;   // order_[0, fetched_) are whole on disk
  size_t released_ = 0;
  bool asking_ = false;  // the writer waits for order_[acquired_]
  std::exception_ptr error_;
  std::atomic<bool> stop_{false};
  std::thread worker_;
};

// What a resumable build (OUT.partial) has made, one JSON line per part, each appended once the
// part is on disk: first {"key": K} (the plan it belongs to), then {"items": [i, ...]} (resident
// modules) or {"layer": l, "sums": [...]}. A line torn by a kill ends the reading; a journal of
// another plan starts over.
class BuildJournal {
 public:
  static constexpr const char* kFile = "progress.jsonl";

  BuildJournal(const std::filesystem::path& dir, const std::string& key);
  ~BuildJournal();
  BuildJournal(const BuildJournal&) = delete;
  BuildJournal& operator=(const BuildJournal&) = delete;

  bool fresh() const { return fresh_; }  // nothing of this plan was made before
  std::set<size_t>& items() { return items_; }
  std::map<int, std::vector<uint64_t>>& layers() { return layers_; }  // the experts' checksums

  void add_items(const std::vector<size_t>& done);
  void add_layer(int layer, const std::vector<uint64_t>& sums);

 private:
  void append(const std::string& line);

  std::string path_;
  int fd_ = -1;
  bool fresh_ = true;
  std::set<size_t> items_;
  std::map<int, std::vector<uint64_t>> layers_;
};

// The order in which write_container acquires shards and makes the parts that read them: shards in
// index order, each acquired before the first part that reads it and released after the last,
// each part made as soon as the last shard it reads is there (its step). On disk during step j:
// the shards read then, and the next one when they are at most one (ShardFiles fetches ahead only
// then; all of them when shards are not deleted).
struct ShardSchedule {
  std::vector<int> order;         // the shards read, in acquisition order
  std::vector<size_t> step;       // per part: made once order[step] is acquired
  std::vector<size_t> last_step;  // per order position: released after that step
  uint64_t total = 0;             // bytes of the shards read
  uint64_t peak = 0;              // most shard bytes on disk at once
  size_t most_shards = 0;         // how many shards that is
};
ShardSchedule schedule_shards(const std::vector<std::vector<int>>& reads, const std::vector<uint64_t>& shard_bytes,
                              bool deletes);

}  // namespace swiftlet
