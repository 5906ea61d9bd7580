// Opens a model from disk: a Hugging Face / MLX checkpoint directory, or a .qpack container
// (a directory with manifest.json, or a path ending in .qpack), and wires its dense weights and
// its expert source together.
#pragma once

#include "core/machine_memory.h"
#include "experts/expert_cache.h"
#include "experts/expert_reader.h"
#include "io/mapped_file.h"
#include "model/qwen3_hybrid.h"
#include "runtime/model_info.h"

#include <memory>
#include <optional>
#include <string>

namespace swiftlet {

class TensorSet;

// How a .qpack's memory is shared out (bytes). `cache` is what the expert cache may hold.
struct MemoryPlan {
  uint64_t budget = 0;     // --ram-budget (0: none given)
  uint64_t resident = 0;   // dense weights
  uint64_t state = 0;      // KV cache at the planned context, DeltaNet state and its snapshots
  uint64_t buffers = 0;    // activations of a prefill chunk, logits
  uint64_t runtime = 0;    // code, heap, tokenizer
  uint64_t cache = 0;      // expert cache budget
  int cache_experts = 0;   // ... in experts
  // The default size (neither a size nor a budget given): what the machine can spare and the
  // headroom left beside the plan's figures (0 otherwise).
  uint64_t spare = 0, headroom = 0;
  std::string reason;  // how the size was chosen: "expert cache 9.60 GB (5423 experts): ..."
  std::string describe() const;  // one line with every figure
};

struct LoadedModel {
  std::string path;
  std::unique_ptr<TensorSet> tensors;
  std::unique_ptr<ExpertSource> experts;
  Model model;
  MemoryPlan memory;  // .qpack only
  ~LoadedModel();
};

struct LoadOptions {
  bool verify_experts = true;  // .qpack: check each expert's checksum when it is read
  // .qpack expert cache budget in bytes; 0: room for every expert. Unset: sized from
  // ram_budget when one is given, else from what the machine can spare (plan_memory).
  std::optional<uint64_t> cache_bytes;
  uint64_t ram_budget = 0;       // whole-process budget; refused with the numbers if unmeetable
  int64_t budget_context = 4096;  // context length the budget leaves room for
  int budget_sessions = 1;        // session states the budget leaves room for (swiftlet-server --sessions)
  int64_t budget_prompt = kPrefillChunk;  // prompt tokens processed at once (Session's prefill chunk)
  IoMode io = IoMode::Uring;
  // How the dense weights of a .qpack come into memory. Populate: measured on the 35B-shaped
  // container from a cold page cache, loading took 0.71 s (read: 0.70 s, map: 1.48 s) with the
  // same peak RSS, and the page cache stays the only copy.
  Residency resident = Residency::Populate;
  // The process also runs the CUDA runtime (--gpu): its host memory (driver, context, page-locked
  // staging) counts in the plan.
  bool gpu = false;
  // Where cache slots come from (e.g. pinned memory for GPU uploads); default the heap.
  ExpertCache::Alloc cache_alloc;
  ExpertCache::Free cache_free;
  // Where the default cache size reads the machine's memory (tests: a fake machine).
  MemoryFiles machine;
  // .qpack: open the low-bit copies of the experts (--on-miss low-bit; an Error when there are none).
  bool miss_copies = false;
};

// The plan for a .qpack under `opts` (throws Error when the budget cannot be met). The one rule
// for the expert cache's size, for the command line, the server and the library alike:
// - cache_bytes: that size (0: every expert), at most every expert;
// - ram_budget: the budget less the resident weights, state, buffers and runtime;
// - neither: what the machine can spare (read_machine_memory: MemAvailable, or a cgroup limit's
//   room when tighter) less the same figures and a headroom of an eighth of it (at least
//   kMinHeadroom), at most every expert and at least one token's experts (top-k x layers).
constexpr uint64_t kMinHeadroom = 512ull << 20;
MemoryPlan plan_memory(const std::string& qpack_path, const LoadOptions& opts);
MemoryPlan plan_memory(const ModelSummary& qpack, const LoadOptions& opts);
// The command-line flags --cache-gb (a number or "all"), --cache-mb, --ram-budget, --io and
// --context (each "" when not given) into `load`. Throws Error for bad or conflicting values.
void apply_cache_flags(LoadOptions& load, const std::string& cache_gb, const std::string& cache_mb,
                       const std::string& ram_budget, const std::string& io, int64_t context);
// "4G", "3.5GB", "512M", "1024MiB", "2e9" -> bytes; throws Error naming `what` otherwise.
uint64_t parse_bytes(const std::string& s, const char* what);

// Throws Error with a message naming the file and what to do.
std::unique_ptr<LoadedModel> load_model(const std::string& path, const LoadOptions& opts = {});

}  // namespace swiftlet
