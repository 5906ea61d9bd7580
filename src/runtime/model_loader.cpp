#include "runtime/model_loader.h"

#include "core/error.h"
#include "experts/qpack_experts.h"
#include "experts/tensor_experts.h"
#include "format/qpack.h"
#include "format/safetensors.h"
#include "runtime/model_info.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>

namespace swiftlet {

namespace fs = std::filesystem;

LoadedModel::~LoadedModel() = default;

namespace {

std::string gb(uint64_t b) { return fmt::format("{:.2f} GB", double(b) / 1e9); }

}  // namespace

std::string MemoryPlan::describe() const {
  std::string s = fmt::format("expert cache {} ({} experts); resident weights {}, state {}, buffers {}, runtime {}",
                              gb(cache), cache_experts, gb(resident), gb(state), gb(buffers), gb(runtime));
  if (budget) s += fmt::format(" (RAM budget {})", gb(budget));
  return s;
}

uint64_t parse_bytes(const std::string& text, const char* what) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (...) {
    used = 0;
  }
  std::string unit = text.substr(used);
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  double mult = 0;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kb") mult = 1e3;
  else if (unit == "m" || unit == "mb") mult = 1e6;
  else if (unit == "g" || unit == "gb") mult = 1e9;
  else if (unit == "t" || unit == "tb") mult = 1e12;
  else if (unit == "kib") mult = 1024.0;
  else if (unit == "mib") mult = 1024.0 * 1024;
  else if (unit == "gib") mult = 1024.0 * 1024 * 1024;
  if (used == 0 || mult == 0 || !std::isfinite(v) || v < 0)
    fail("{}: cannot read '{}' as a size; write e.g. 4G, 3.5GB, 512M or 2GiB", what, text);
  return uint64_t(v * mult);
}

void apply_cache_flags(LoadOptions& load, const std::string& cache_gb, const std::string& cache_mb,
                       const std::string& ram_budget, const std::string& io, int64_t context) {
  int given = int(!cache_gb.empty()) + int(!cache_mb.empty()) + int(!ram_budget.empty());
  if (given > 1) fail("give only one of --cache-gb, --cache-mb and --ram-budget");
  if (cache_gb == "all") load.cache_bytes = 0;
  else if (!cache_gb.empty()) load.cache_bytes = parse_bytes(cache_gb + "G", "--cache-gb");
  if (!cache_mb.empty()) load.cache_bytes = parse_bytes(cache_mb + "M", "--cache-mb");
  if (load.cache_bytes && *load.cache_bytes == 0 && cache_gb != "all")
    fail("the expert cache cannot be empty: give at least one expert's worth, or 'all'");
  if (!ram_budget.empty()) load.ram_budget = parse_bytes(ram_budget, "--ram-budget");
  if (context <= 0) fail("--context must be positive, got {}", context);
  load.budget_context = context;
  load.io = parse_io_mode(io);
}

MemoryPlan plan_memory(const std::string& path, const LoadOptions& opts) {
  return plan_memory(summarize_model(path), opts);
}

MemoryPlan plan_memory(const ModelSummary& s, const LoadOptions& opts) {
  const ModelConfig& c = s.config;
  const RamEstimate r = estimate_peak_ram(s, 0, opts.budget_context, opts.budget_prompt);
  MemoryPlan p;
  p.budget = opts.ram_budget;
  p.resident = r.resident;
  // Each session: its state and two prefix-reuse snapshots.
  p.state = uint64_t(std::max(1, opts.budget_sessions)) * (r.kv_cache + 3 * r.linear_state);
  p.buffers = r.activations;
  p.runtime = 96ull << 20;  // code, libraries, tokenizer, heap (measured ~70-90 MB)
  // The CUDA runtime's host memory: measured +140 MB of peak RSS on the H200 (80B shape, default
  // cache: 2.66 GB with --gpu, 2.52 GB without).
  if (opts.gpu) p.runtime += 192ull << 20;
  const uint64_t stride = std::max<uint64_t>(1, s.expert_stride);
  const uint64_t all = uint64_t(c.num_layers) * uint64_t(c.num_experts) * stride;
  const uint64_t one_token = std::min(all, uint64_t(c.num_experts_per_tok) * uint64_t(c.num_layers) * stride);
  const uint64_t fixed = p.resident + p.state + p.buffers + p.runtime;
  const std::string parts = fmt::format("dense weights {:.2f}, state {:.2f}, buffers {:.2f}, runtime {:.2f}",
                                        double(p.resident) / 1e9, double(p.state) / 1e9, double(p.buffers) / 1e9,
                                        double(p.runtime) / 1e9);
  std::string why;
  if (opts.cache_bytes) {
    p.cache = *opts.cache_bytes == 0 ? all : std::min(all, *opts.cache_bytes);
    why = *opts.cache_bytes == 0 ? "every expert, as asked" : "the size asked for";
  } else if (opts.ram_budget) {
    const uint64_t least = uint64_t(std::max(1, c.num_experts_per_tok)) * stride;  // one layer's experts
    if (opts.ram_budget < fixed + least)
      fail("--ram-budget {} cannot be met: the resident weights take {}, the state{} at a {}-token context {}, "
           "working buffers {} and the runtime {}, which leaves {} for the expert cache, less than the {} one "
           "layer's {} experts need; raise the budget to at least {} (or lower the context{})",
           gb(opts.ram_budget), gb(p.resident),
           opts.budget_sessions > 1 ? fmt::format(" of {} sessions", opts.budget_sessions) : std::string(),
           opts.budget_context, gb(p.state), gb(p.buffers), gb(p.runtime),
           gb(opts.ram_budget > fixed ? opts.ram_budget - fixed : 0), gb(least), c.num_experts_per_tok,
           gb(fixed + least), opts.budget_sessions > 1 ? " or --sessions / --parallel" : "");
    p.cache = std::min(all, opts.ram_budget - fixed);
    why = fmt::format("RAM budget {} less {} ({} GB)", gb(opts.ram_budget), gb(fixed), parts);
  } else {
    // The default: what the machine can spare less what the process needs besides the cache and a
    // headroom. MemAvailable is the kernel's estimate of what can be allocated without swapping; it
    // counts page cache that would be dropped, programs' pages included. An eighth of it (at least
    // kMinHeadroom) is left for those, for other programs' growth and for the estimate's error.
    const MachineMemory m = read_machine_memory(opts.machine);
    p.spare = m.spare();
    std::string source = m.cgroup_binds()
                             ? fmt::format("the cgroup limit's room {} (limit {}, {} in use)", gb(p.spare),
                                           gb(m.cgroup_limit), gb(m.cgroup_used))
                             : fmt::format("MemAvailable {}", gb(p.spare));
    if (p.spare == 0) {
      p.cache = one_token;
      why = fmt::format("one token's experts: no memory reading ({} unreadable)", opts.machine.meminfo);
    } else {
      p.headroom = std::max(kMinHeadroom, p.spare / 8);
      const uint64_t margin = fixed + p.headroom;
      const uint64_t left = p.spare > margin ? p.spare - margin : 0;
      p.cache = std::clamp(left, one_token, all);
      const std::string how = fmt::format("{} less a {} margin ({}, headroom {:.2f} GB)", source, gb(margin), parts,
                                          double(p.headroom) / 1e9);
      if (left >= all) why = fmt::format("every expert: {} leaves {}", how, gb(left));
      else if (left <= one_token) why = fmt::format("one token's experts, the least: {} leaves {}", how, gb(left));
      else why = how;
    }
  }
  p.cache_experts = int(p.cache / stride);
  p.cache = uint64_t(p.cache_experts) * stride;
  p.reason = fmt::format("expert cache {} ({} experts): {}", gb(p.cache), p.cache_experts, why);
  return p;
}

namespace {

// A .qpack: resident tensors from model.safetensors (MLX names and conventions), routed experts
// streamed from packed_experts/.
std::unique_ptr<LoadedModel> load_qpack(const std::string& path, const LoadOptions& opts) {
  const QpackContainer qc = QpackContainer::open(path);
  auto lm = std::make_unique<LoadedModel>();
  lm->path = path;
  lm->model.config = qc.config;
  // Planned before the dense weights come in: the machine's reading counts them in the margin.
  lm->memory = plan_memory(summarize_qpack(qc), opts);
  lm->tensors = std::make_unique<TensorSet>(TensorSet::open_files({qc.path("model.safetensors")}, opts.resident));
  const NameScheme names = NameScheme::detect(*lm->tensors, lm->model.config);
  lm->model.weights = load_dense_weights(*lm->tensors, lm->model.config, names);
  QpackExpertsOptions eo;
  eo.verify = opts.verify_experts;
  eo.cache_bytes = std::max<uint64_t>(lm->memory.cache, qc.layout.expert_stride);
  eo.io = opts.io;
  eo.alloc = opts.cache_alloc;
  eo.free = opts.cache_free;
  eo.miss_copies = opts.miss_copies;
  lm->experts = std::make_unique<QpackExperts>(qc, std::move(eo));
  lm->model.experts = lm->experts.get();
  return lm;
}

}  // namespace

std::unique_ptr<LoadedModel> load_model(const std::string& path, const LoadOptions& opts) {
  if (!fs::exists(path)) fail("model '{}' does not exist", path);
  if (looks_like_qpack(path)) return load_qpack(path, opts);
  if (!fs::is_directory(path))
    fail("model '{}' is not a directory; pass a checkpoint directory holding config.json and "
         "*.safetensors", path);
  const std::string cfg_path = (fs::path(path) / "config.json").string();
  if (!fs::exists(cfg_path)) fail("'{}' has no config.json; is it a model directory?", path);
  auto lm = std::make_unique<LoadedModel>();
  lm->path = path;
  lm->model.config = ModelConfig::load(cfg_path);
  lm->tensors = std::make_unique<TensorSet>(TensorSet::open_dir(path));
  const NameScheme names = NameScheme::detect(*lm->tensors, lm->model.config);
  lm->model.weights = load_dense_weights(*lm->tensors, lm->model.config, names);
  lm->experts = std::make_unique<TensorExperts>(*lm->tensors, lm->model.config, names);
  lm->model.experts = lm->experts.get();
  return lm;
}

}  // namespace swiftlet
