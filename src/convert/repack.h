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
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace swiftlet {

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
};

// A Hugging Face (bf16: quantised to opts.bits) or MLX-quantised (bytes copied) checkpoint.
std::unique_ptr<RepackSource> open_checkpoint_source(const std::string& dir, const RepackOptions& opts);

// A llama.cpp GGUF model (qwen3next or qwen35moe; a file, a split model's part, or a directory
// holding one model): every tensor dequantised, then written at opts.bits (gguf_source.cpp).
std::unique_ptr<RepackSource> open_gguf_source(const std::string& path, const RepackOptions& opts);

RepackStats write_container(RepackSource& src, const RepackOptions& opts);

inline RepackStats repack_from_gguf(const std::string& path, const RepackOptions& opts) {
  auto src = open_gguf_source(path, opts);
  return write_container(*src, opts);
}

inline RepackStats repack_from_dir(const std::string& dir, const RepackOptions& opts) {
  auto src = open_checkpoint_source(dir, opts);
  return write_container(*src, opts);
}

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

}  // namespace swiftlet
