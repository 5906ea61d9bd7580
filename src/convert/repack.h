// Conversion of a model into a .qpack container (docs/qpack-format.md), streaming layer by layer:
// at most one chunk of experts and one resident tensor are held in memory at a time.
//
//   source (checkpoint dir / synthetic preset)  ->  write_container()  ->  OUT.qpack
//
// The container is written into OUT.tmp-<pid> (manifest.json last) and renamed to OUT only
// when complete, so an interrupted or failed run never leaves something that loads. Free disk
// space is checked before anything is written.
#pragma once

#include "format/hf_config.h"
#include "format/qpack.h"
#include "format/safetensors_writer.h"

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace swiftlet {

class TensorSet;

struct RepackOptions {
  std::string output;     // OUT.qpack
  int bits = 0;           // 0: default (4 for float inputs, as stored for MLX inputs); 4, 8, 16
  int group_size = 64;
  bool force = false;     // replace an existing container (atomically: the new one is complete first)
  std::string tokenizer;  // synthetic only: a tokenizer.json to embed (sizes the vocabulary)
  uint64_t seed = 1;      // synthetic only
  std::string source_name;  // manifest sourceCheckpoint; empty: the input path / preset
  int threads = 2;        // producer threads for expert blobs (quantising / generating)
  bool compress_tokenizer = false;  // write tokenizer.json as tokenizer.json.zst (zstd level 19)
  bool delete_source = false;  // --from-dir: convert shard by shard, deleting each once converted
  std::function<void(const std::string&)> log;  // progress lines; empty: quiet
};

struct RepackStats {
  std::string output;
  uint64_t resident_bytes = 0;  // model.safetensors
  uint64_t expert_bytes = 0;    // all layer files
  uint64_t total_bytes = 0;     // everything written
  double seconds = 0;
};

// Bytes of one output tensor: either owned or pointing into the source (a mapped checkpoint).
struct TensorBytes {
  std::vector<uint8_t> owned;
  const uint8_t* ptr = nullptr;
  size_t size = 0;
  const uint8_t* data() const { return ptr ? ptr : owned.data(); }
  size_t nbytes() const { return ptr ? size : owned.size(); }
};

// One resident module as written: its tensors (a Linear: weight, scales, biases) and how to make
// their bytes (called once, just before they are written).
struct ResidentItem {
  std::vector<TensorToWrite> tensors;  // data pointers unused
  std::function<std::vector<TensorBytes>()> produce;
  std::vector<std::string> inputs;  // the source tensors produce() reads (for a ShardFeed)
};

// The config.json text of a container: `config` (the model's HF config) with MLX's quantization
// block for `bits` (16: none) and `group_size`, and the modules quantised otherwise
// (`overrides`, by module path), under both "quantization" and "quantization_config" as mlx-lm
// writes them; a quantization block `config` had is dropped.
std::string quantized_config_json(nlohmann::ordered_json config, int bits, int group_size,
                                  const std::map<std::string, QuantSpec>& overrides);

// What a repack reads from. Implementations: a checkpoint directory (repack.cpp), a synthetic
// preset (synthetic.cpp).
class RepackSource {
 public:
  virtual ~RepackSource() = default;
  virtual std::string describe() const = 0;  // manifest.json sourceCheckpoint
  virtual const ModelConfig& config() const = 0;
  // The output config.json text (the model's HF config with the right quantization block).
  virtual std::string config_json() const = 0;
  // Extra files: container-relative name -> path of a file to copy.
  virtual std::vector<std::pair<std::string, std::string>> files() const = 0;
  virtual int quant_bits() const = 0;  // default bits of the container (16: not quantised)
  virtual int quant_group_size() const = 0;
  virtual std::vector<ResidentItem> resident() = 0;
  virtual std::array<ProjectionFormat, 3> expert_formats() const = 0;
  // Writes the sections of (layer, expert) into blob[0, layout.payload()). Thread-safe.
  virtual void expert(int layer, int expert, const QpackLayout& layout, uint8_t* blob) const = 0;
  virtual void layer_done(int layer) {}  // e.g. let the kernel drop the source's pages
  // The source tensors expert(layer, ...) reads (for a ShardFeed).
  virtual std::vector<std::string> layer_inputs(int layer) const { return {}; }
};

// A source whose tensors arrive shard by shard (a checkpoint downloaded from the hub, or one
// deleted as it is converted): write_container makes each part of the container once the shards
// it reads are there, in an order that keeps few of them at once, and says when each is needed
// no more.
class ShardFeed {
 public:
  virtual ~ShardFeed() = default;
  virtual int shards() const = 0;
  virtual std::string shard_name(int s) const = 0;
  virtual uint64_t shard_bytes(int s) const = 0;
  virtual int shard_of(const std::string& tensor) const = 0;  // -1: not in any shard
  virtual std::string dir() const = 0;  // where the shards are (for the free-space check)
  virtual bool deletes() const = 0;     // a released shard leaves the disk
  // The shards the writer will acquire, in order (each once); a feed may fetch ahead.
  virtual void plan(const std::vector<int>& order) = 0;
  virtual void acquire(int s) = 0;  // returns once the shard's tensors can be read
  virtual void release(int s) = 0;  // its tensors are read no more: the shard may go
};

// A Hugging Face (bf16: quantised to opts.bits) or MLX-quantised (bytes copied) checkpoint.
std::unique_ptr<RepackSource> open_checkpoint_source(const std::string& dir, const RepackOptions& opts);
// The same over tensors already opened (shards possibly reserved, not yet on disk); `dir` holds
// config.json and the tokenizer files.
std::unique_ptr<RepackSource> open_checkpoint_source(const std::string& dir, TensorSet tensors,
                                                     const RepackOptions& opts);

// A llama.cpp GGUF model (qwen3next or qwen35moe; a file, a split model's part, or a directory
// holding one model): every tensor dequantised, then written at opts.bits (gguf_source.cpp).
std::unique_ptr<RepackSource> open_gguf_source(const std::string& path, const RepackOptions& opts);

// Writes the container. With a feed, the parts are made as their shards arrive, and the
// container is built in OUT.partial, which a later run with the same source and options resumes
// (what it holds is neither fetched nor made again).
RepackStats write_container(RepackSource& src, const RepackOptions& opts, ShardFeed* feed = nullptr);

inline RepackStats repack_from_gguf(const std::string& path, const RepackOptions& opts) {
  auto src = open_gguf_source(path, opts);
  return write_container(*src, opts);
}

// A checkpoint directory converted shard by shard, each shard deleted once its parts are written
// (opts.delete_source; shard_feed.cpp). Resumable like a hub conversion.
RepackStats repack_from_dir_deleting(const std::string& dir, const RepackOptions& opts);

inline RepackStats repack_from_dir(const std::string& dir, const RepackOptions& opts) {
  if (opts.delete_source) return repack_from_dir_deleting(dir, opts);
  auto src = open_checkpoint_source(dir, opts);
  return write_container(*src, opts);
}

// A shard-by-shard build whose run was stopped after its container was complete (OUT.partial has
// its manifest) is moved into place; nullopt when there is none. The shard-by-shard converters
// call it first: the shards such a run deleted are not needed again.
std::optional<RepackStats> finish_interrupted_build(const RepackOptions& opts);

// Where write_container builds a container fed shard by shard (OUT.partial), and the folder in
// it where a feed may keep the shards' headers (removed with the build's other scratch files).
std::string partial_dir(const std::string& output);
inline constexpr const char* kShardHeadsDir = "heads";

// Throws Error with the numbers unless `dir`'s file system has `need` bytes (plus a margin) free.
void require_free_space(const std::string& dir, uint64_t need, const std::string& what,
                        const std::string& note = "");
// Renames the complete directory `tmp` to `out`; an existing `out` is swapped out atomically
// (renameat2 RENAME_EXCHANGE) and then deleted.
void move_into_place(const std::string& tmp, const std::string& out);

// Lets the kernel drop the pages of a read-only file mapping a repack is done with, so that
// converting a checkpoint larger than RAM does not keep it resident.
void release_source_pages(const void* p, size_t n);

// Makes write_container stop at its next check and clean up (for SIGINT / SIGTERM handlers:
// only sets an atomic flag). false clears the request.
void request_repack_interrupt(bool on = true);
// Throws Error("interrupted") once request_repack_interrupt() was called.
void check_repack_interrupt();

struct AddMissCopiesOptions {
  int bits = 2;     // 2 or 3
  int threads = 2;  // workers fitting the copies
  std::function<void(const std::string&)> log;
};
// Adds (or replaces) the low-bit copies of a complete container's experts, in place
// (format/miss_copy.h, docs/qpack.md section 9): written into miss_copies.tmp-<pid>/, made durable,
// moved into place, then listed in a new manifest.json (renamed over the old one). Interrupted or
// failed, the container stays as it was: copies the manifest does not list are never read, and a
// later run removes the leftovers. Returns the bytes written.
uint64_t add_miss_copies(const std::string& container, const AddMissCopiesOptions& opts);

}  // namespace swiftlet
